"""``rollstream verify`` on a run archive through the real sandbox: signed verdicts verify and
reproduce; a verdict, a test or a completion changed in the archive afterwards is found; a verdict
recorded under another image is said to be re-scored under other conditions."""

from __future__ import annotations

import argparse
import json
import time
from types import SimpleNamespace

import msgspec
import pytest

from rollstream.archive import ArchiveStore
from rollstream.attest import Signer, code_digest, load_signer, new_keypair, spec_digest
from rollstream.cli.verify import verify_main
from rollstream.config import AttestConfig, Config, ExecutorConfig
from rollstream.consumers.archiver.stage import build_tables
from rollstream.consumers.executor.episodes import turn_code
from rollstream.consumers.executor.pool import DockerSandboxPool
from rollstream.consumers.executor.rewards import default_registry
from rollstream.consumers.executor.stage import score_turn
from rollstream.schemas import ActionGenerated, RewardScored, codec
from rollstream.schemas.events import RewardSpec
from rollstream.testing import make_action

pytestmark = pytest.mark.sandbox

SPEC = RewardSpec(entry_point="add", tests=["assert add(1, 2) == 3", "assert add(2, 2) == 4"])
CODES = ["def add(a, b):\n    return a + b", "def add(a, b):\n    return a - b", "def add(a, b) return"]


def write(root: str, name: str, events: list, event_type: type) -> None:
    encode = codec(event_type).encode
    records = [SimpleNamespace(offset=i, timestamp=int(time.time() * 1000), key=b"g", value=encode(e))
               for i, e in enumerate(events)]
    [(hour, table)], _ = build_tables(name, records)
    ArchiveStore(root).write_file(name, 0, hour, table)


async def signed_run(pool: DockerSandboxPool, signer: Signer, *, image: str | None = None
                     ) -> tuple[list[ActionGenerated], list[RewardScored]]:
    """Actions scored and signed as an executor with a key does."""
    actions, rewards = [], []
    for i, code in enumerate(CODES):
        action = msgspec.structs.replace(make_action("g", i), reward=SPEC, completion_text=f"```python\n{code}\n```")
        reward, _, _ = await score_turn(pool, default_registry(), action, "exec")
        rewards.append(signer.sign_reward(reward, spec_sha256=spec_digest(action.reward),
                                          code_sha256=code_digest(turn_code(action)),
                                          image=image or pool.image_id, runtime=pool.runtime))
        actions.append(action)
    return actions, rewards


def args(root: str, keys: str, out: str) -> argparse.Namespace:
    return argparse.Namespace(run=None, archive=root, keys=keys, sample=20, all=True, seed=0, json_out=out)


async def test_verify_checks_signatures_claims_and_reproduces_verdicts(sandbox_image, owner, tmp_path, capsys):
    private, public, key_id = new_keypair(tmp_path / "keys", "exec-1")
    signer = load_signer(AttestConfig(key_file=str(private), key_id=key_id))
    executor = ExecutorConfig(image=sandbox_image, owner=owner, pool_size=1, concurrency=2)
    config = Config(executor=executor)
    async with DockerSandboxPool(executor) as pool:
        actions, rewards = await signed_run(pool, signer)
    assert [r.outcome for r in rewards] == ["passed", "failed", "error"]

    honest = str(tmp_path / "honest")
    write(honest, "actions", actions, ActionGenerated)
    write(honest, "rewards", rewards, RewardScored)
    out = tmp_path / "honest.json"
    assert await verify_main(config, args(honest, str(public), str(out))) == 0, capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["verdicts"] == 3 and report["rescored"] == 3 and report["findings"] == [] and not report["conditions"]

    # after the fact: a verdict changed, a test changed, a completion swapped
    tampered = str(tmp_path / "tampered")
    forged = msgspec.structs.replace(rewards[0], reward=0.5, components={"tests": 0.5})
    edited = [actions[0], msgspec.structs.replace(actions[1], reward=msgspec.structs.replace(
        SPEC, tests=["assert add(1, 2) == -1", "assert add(2, 2) == 0"])),
        msgspec.structs.replace(actions[2], completion_text=f"```python\n{CODES[0]}\n```")]
    write(tampered, "actions", edited, ActionGenerated)
    write(tampered, "rewards", [forged, rewards[1], rewards[2]], RewardScored)
    out = tmp_path / "tampered.json"
    assert await verify_main(config, args(tampered, str(public), str(out))) == 1
    found = {(f["rollout_id"], f["kind"]) for f in json.loads(out.read_text())["findings"]}
    assert found == {("g/0", "signature"), ("g/1", "spec"), ("g/2", "code")}
    printed = capsys.readouterr().out
    assert "NOT VERIFIED g/0: signature: changed after signing: reward, components" in printed
    assert "NOT VERIFIED g/1: spec" in printed

    # a signed verdict moved onto other completion tokens: named by its signature and its action
    moved_tokens = str(tmp_path / "moved_tokens")
    rollout = msgspec.structs.replace(rewards[0].rollout, completion_token_ids=[7, 7, 7, 7])
    write(moved_tokens, "actions", actions, ActionGenerated)
    write(moved_tokens, "rewards", [msgspec.structs.replace(rewards[0], rollout=rollout), *rewards[1:]], RewardScored)
    assert await verify_main(config, args(moved_tokens, str(public), str(out))) == 1
    assert {(f["kind"], f["detail"]) for f in json.loads(out.read_text())["findings"]} == {
        ("rollout", "its rollout is not its action's: rollout.completion_token_ids"),
        ("signature", "changed after signing: rollout.completion_token_ids")}
    capsys.readouterr()

    # verdicts recorded under another sandbox image: re-scored, and said to be under other conditions
    moved = str(tmp_path / "moved")
    async with DockerSandboxPool(executor) as pool:
        actions, rewards = await signed_run(pool, signer, image="sha256:" + "0" * 64)
    write(moved, "actions", actions, ActionGenerated)
    write(moved, "rewards", rewards, RewardScored)
    out = tmp_path / "moved.json"
    assert await verify_main(config, args(moved, str(public), str(out))) == 0
    assert json.loads(out.read_text())["conditions"] == [f"image sha256:{'0' * 17} -> {pool.image_id[:24]}"]
    assert "re-scored under other conditions than recorded: image" in capsys.readouterr().out
