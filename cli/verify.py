"""``rollstream verify --run RUN``: every archived verdict checked against what ran, by anyone with
the executors' public keys; ``rollstream keys new``: a key pair for an executor.

For each ``RewardScored`` of the run's archive (rollstream/attest.py):

* its signature, by a key of the keyring (``executor.attest.public_keys`` or ``--keys``: by the
  file's name or the key's fingerprint), over the verdict, its rollout (everything the learner
  trains on) and its claims; an unsigned verdict or an unknown key is a finding, and so is a
  field changed after signing, by name ("changed after signing: rollout.completion_token_ids");
  a verdict signed under v1 (older executors: its rollout not covered) is counted and said;
* its rollout against the rollout its action carries (a verdict moved onto other tokens, task,
  group or versions, even one signed under v1, shows here, by field);
* its claims against the archive: the spec digest against the reward spec its action carried,
  the code digest against the code of its last turn (a test edited, a completion swapped, after
  the fact, shows here);
* and for a sample of them (``--sample N``, default 20; ``--all``), the verdict reproduced: the
  last turn scored again in a sandbox as the executor scores it; a different outcome (or reward,
  for a single turn) is a finding, and a sandbox image or runtime other than the one the verdict
  names is said, since the verdict was then re-scored under other conditions.

Every ``SandboxAudit`` is checked the same way (signature and claims). ``--scores FILE`` checks
the signed JSON verdicts of ``rollstream score`` instead of an archive. Exit status 0 when every
verdict verifies and reproduces, 1 otherwise; ``--json OUT`` writes the findings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rollstream.attest import Keyring, code_digest, is_v1, load_signer, new_keypair, spec_digest
from rollstream.config import AttestConfig, Config
from rollstream.errors import ConfigError
from rollstream.schemas.events import ActionGenerated, RewardScored, Rollout, SandboxAudit

DEFAULT_SAMPLE = 20


@dataclass(frozen=True)
class Finding:
    rollout_id: str
    kind: str  # signature | rollout | spec | code | no_action | audit | score | reproduce | error
    detail: str


def register(name: str, parser: argparse.ArgumentParser) -> Any:
    if name == "keys":
        add_keys_arguments(parser)
        return lambda args, config: keys_main(args)
    add_arguments(parser)
    return lambda args, config: asyncio.run(verify_main(config, args))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", help="a run directory or id (default: the archive of the config)")
    parser.add_argument("--archive", help="an archive root instead of a run")
    parser.add_argument("--scores", help="check the signed JSON verdicts `rollstream score` wrote here instead")
    parser.add_argument("--keys", help="the public keys (a directory of <key id>.pub, or one file); default "
                                       "executor.attest.public_keys")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--sample", type=int, default=DEFAULT_SAMPLE,
                       help=f"re-score this many verdicts, chosen at random (default {DEFAULT_SAMPLE}; 0: none)")
    which.add_argument("--all", action="store_true", help="re-score every verdict")
    parser.add_argument("--seed", type=int, default=0, help="of the sample (default 0)")
    parser.add_argument("--json", dest="json_out", help="write the findings as JSON here")


def add_keys_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["new"], help="new: write a new Ed25519 key pair")
    parser.add_argument("--dir", required=True, help="where to write <key id>.key (mode 0600) and <key id>.pub")
    parser.add_argument("--id", default="", help="the key's id (default: its fingerprint)")


def keys_main(args: argparse.Namespace) -> int:
    private, public, key_id = new_keypair(Path(args.dir), args.id)
    signer = load_signer(AttestConfig(key_file=str(private)))
    assert signer is not None
    named = "" if key_id == signer.key_id else f", executor.attest.key_id = \"{key_id}\" to sign under this id"
    print(f"key {key_id} (fingerprint {signer.key_id}): private {private} (give the "
          f"executors executor.attest.key_file = \"{private}\", or its contents in the variable named by "
          f"executor.attest.key_env{named}; without it verdicts name the key by its fingerprint, which "
          f"`rollstream verify` finds in {public} as well), public {public} (for `rollstream verify --keys`)")
    return 0


def last_turns(actions: list[ActionGenerated]) -> dict[str, ActionGenerated]:
    """Each rollout's last recorded turn (the one its verdict is for)."""
    out: dict[str, ActionGenerated] = {}
    for action in actions:
        known = out.get(action.rollout.rollout_id)
        if known is None or action.turn > known.turn:
            out[action.rollout.rollout_id] = action
    return out


def check_verdicts(rewards: list[RewardScored], actions: dict[str, ActionGenerated], keyring: Keyring
                   ) -> list[Finding]:
    """Signature and claims of each verdict (pure: no sandbox)."""
    from rollstream.consumers.executor.episodes import turn_code

    findings = []
    for reward in rewards:
        rollout_id = reward.rollout.rollout_id
        why = keyring.check_reward(reward)
        action = actions.get(rollout_id)
        moved = rollout_changes(reward.rollout, action.rollout) if action is not None else []
        if moved:
            findings.append(Finding(rollout_id, "rollout", f"its rollout is not its action's: {', '.join(moved)}"))
        if why is not None:
            findings.append(Finding(rollout_id, "signature", why))
            continue
        attestation = reward.attestation
        assert attestation is not None
        if action is None:
            findings.append(Finding(rollout_id, "no_action", "its action is not in the archive: its claims cannot "
                                                              "be checked"))
            continue
        if spec_digest(action.reward) != attestation.spec_sha256:
            findings.append(Finding(rollout_id, "spec", "the reward spec its action carries is not the one it was "
                                                        "scored against"))
        if code_digest(turn_code(action)) != attestation.code_sha256:
            findings.append(Finding(rollout_id, "code", "the code of its action is not the code that was scored"))
    return findings


def rollout_changes(scored: Rollout, generated: Rollout) -> list[str]:
    """The fields of a verdict's rollout that are not those of the rollout its action carried."""
    return [f"rollout.{name}" for name in Rollout.__struct_fields__ if getattr(scored, name) != getattr(generated, name)]


def check_scores(path: str, keyring: Keyring) -> tuple[int, list[Finding]]:
    """(verdicts, findings) of a ``rollstream score`` output: each verdict line's signature."""
    verdicts, findings = 0, []
    for number, text in enumerate(Path(path).read_text().splitlines(), 1):
        if not text.strip():
            continue
        try:
            verdict = json.loads(text)
        except json.JSONDecodeError as exc:
            findings.append(Finding(f"line {number}", "score", f"not JSON: {exc}"))
            continue
        if "error" in verdict:  # a line score could not score: no verdict to sign
            continue
        verdicts += 1
        why = keyring.check_score(verdict)
        if why is not None:
            findings.append(Finding(f"line {verdict.get('line', number)}", "score", why))
    return verdicts, findings


def check_audits(audits: list[SandboxAudit], keyring: Keyring) -> list[Finding]:
    findings = []
    for audit in audits:
        why = keyring.check_audit(audit)
        if why is not None:
            findings.append(Finding(audit.rollout_id, "audit", f"audit record of {audit.sandbox_id or '-'}: {why}"))
        elif audit.attestation is not None and audit.code_sha256 and audit.attestation.code_sha256 != audit.code_sha256:
            findings.append(Finding(audit.rollout_id, "audit", "the audit's code digest is not the one it attests"))
    return findings


def compare(before: RewardScored, after: RewardScored, action: ActionGenerated) -> Finding | None:
    """A re-scored verdict against the recorded one: None when it reproduces."""
    if after.outcome != before.outcome:
        return Finding(before.rollout.rollout_id, "reproduce",
                       f"recorded {before.outcome}, re-scored {after.outcome} ({after.execution.error_message[:200]})")
    if abs(after.reward - before.reward) > 1e-9:
        return Finding(before.rollout.rollout_id, "reproduce", f"recorded reward {before.reward:+.4f}, re-scored "
                                                               f"{after.reward:+.4f} (turn {action.turn})")
    return None


def conditions(before: RewardScored, image: str, runtime: str) -> list[str]:
    """What differs between the conditions a verdict names and those it was re-scored under."""
    a = before.attestation
    if a is None:
        return []
    out = []
    if a.image != image:
        out.append(f"image {a.image[:24]} -> {image[:24]}")
    if a.runtime != runtime:
        out.append(f"runtime {a.runtime} -> {runtime}")
    return out


async def rescore(config: Config, chosen: list[tuple[RewardScored, ActionGenerated]], *, backend: Any = None
                  ) -> tuple[list[Finding], list[str]]:
    """(findings, notes on conditions) of re-scoring ``chosen`` as the executor does."""
    from rollstream.consumers.executor.episodes import after_turn
    from rollstream.consumers.executor.jobs import sandbox_identity
    from rollstream.consumers.executor.rewards import default_registry
    from rollstream.consumers.executor.stage import score_turn

    registry = default_registry()
    gate = asyncio.Semaphore(config.executor.concurrency)

    async def one(pool: Any, before: RewardScored, action: ActionGenerated) -> tuple[Finding | None, list[str]]:
        try:
            async with gate:
                scored, _, result = await score_turn(pool, registry, action, "verify", config.executor.max_timeout_s,
                                                     attempts=config.executor.infra_attempts)
        except (ValueError, OSError) as exc:
            return Finding(before.rollout.rollout_id, "error", f"could not be scored again: {exc}"), []
        kind, after = after_turn(action, scored, result.events if result is not None else [])
        if kind != "rewards":
            return Finding(before.rollout.rollout_id, "reproduce", "re-scored, its episode would go on"), []
        return compare(before, after, action), conditions(before, *sandbox_identity(pool))

    async def all_of(pool: Any) -> tuple[list[Finding], list[str]]:
        results = await asyncio.gather(*(one(pool, b, a) for b, a in chosen))
        return [f for f, _ in results if f is not None], sorted({n for _, notes in results for n in notes})

    if backend is not None:
        return await all_of(backend)
    from rollstream.consumers.executor.pool import DockerSandboxPool

    async with DockerSandboxPool(config.executor) as pool:
        return await all_of(pool)


def read_archive(root: str) -> tuple[list[RewardScored], dict[str, ActionGenerated], list[SandboxAudit]]:
    """(each rollout's first recorded verdict, each rollout's last turn, every audit record)."""
    from rollstream.archive import ArchiveStore

    store = ArchiveStore(root)
    if not store.exists():
        raise ConfigError(f"no archive at {root}")
    rewards: dict[str, RewardScored] = {}
    for _, reward in store.events("rewards"):
        rewards.setdefault(reward.rollout.rollout_id, reward)
    actions = last_turns([action for _, action in store.events("actions")])
    audits = [audit for _, audit in store.events("audit")]
    return list(rewards.values()), actions, audits


async def verify_main(config: Config, args: argparse.Namespace) -> int:
    from rollstream.cli.records import archive_of

    keys = args.keys or config.executor.attest.public_keys
    if not keys:
        raise ConfigError("rollstream verify needs the executors' public keys: --keys PATH or "
                          "executor.attest.public_keys")
    keyring = Keyring.load(keys)
    if getattr(args, "scores", None):
        count, findings = check_scores(args.scores, keyring)
        for finding in findings:
            print(f"NOT VERIFIED {finding.rollout_id}: {finding.kind}: {finding.detail}")
        print(f"{count} scored verdicts in {args.scores}: {len(findings)} findings")
        if args.json_out:
            Path(args.json_out).write_text(json.dumps({"verdicts": count, "findings": [asdict(f) for f in findings]},
                                                      indent=1) + "\n")
        return 0 if count and not findings else 1
    root = archive_of(config, args.run, args.archive)
    rewards, actions, audits = await asyncio.to_thread(read_archive, root)
    if not rewards:
        print(f"verify: no verdicts in {root}")
        return 1
    findings = check_verdicts(rewards, actions, keyring) + check_audits(audits, keyring)
    bad = {f.rollout_id for f in findings}
    candidates = [(r, actions[r.rollout.rollout_id]) for r in rewards
                  if r.rollout.rollout_id not in bad and r.rollout.rollout_id in actions and r.outcome != "infra"]
    chosen = candidates if args.all else random.Random(args.seed).sample(candidates, min(args.sample, len(candidates)))
    notes: list[str] = []
    if chosen:
        print(f"verify: re-scoring {len(chosen)} of {len(rewards)} verdicts", file=sys.stderr)
        found, notes = await rescore(config, chosen)
        findings += found
    for finding in findings:
        print(f"NOT VERIFIED {finding.rollout_id}: {finding.kind}: {finding.detail}")
    for note in notes:
        print(f"re-scored under other conditions than recorded: {note}")
    v1 = sum(is_v1(r.attestation) for r in rewards if r.rollout.rollout_id not in bad)
    if v1:
        print(f"{v1} verdicts signed under v1 (older executors): their signatures cover the verdict and the "
              f"rollout id, not the tokens, task, group or policy versions (checked against their actions only)")
    print(f"{len(rewards)} verdicts and {len(audits)} audit records in {root}: {len(findings)} findings "
          f"({len(rewards) - len({f.rollout_id for f in findings if f.kind != 'audit'})} verdicts verify); "
          f"{len(chosen)} re-scored")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({
            "verdicts": len(rewards), "audits": len(audits), "rescored": len(chosen), "conditions": notes,
            "signed_v1": v1,
            "findings": [asdict(f) for f in findings]}, indent=1) + "\n")
    return 0 if not findings else 1
