"""Signed verdicts: an executor signs each verdict it decides, anyone with its public key checks it.

Each ``RewardScored`` and ``SandboxAudit`` an executor with a key produces carries an
:class:`~rollstream.schemas.events.Attestation`: the digests of the reward spec (:func:`spec_digest`:
kind, entry point, tests, setup, program, a chain's steps, weights) and of the code that ran
(:func:`code_digest`), the sandbox image's id and the runtime (the container runtime and the
digest of the sandbox's runner source), and an Ed25519 signature (the ``cryptography`` package).

What is signed (v2, ``rollstream/verdict/v2``): every field the learner trains on and the verdict,
by name (:func:`reward_fields`): the whole rollout (rollout, group and task ids, sample index and
group size, family, prompt and completion tokens, behaviour log-probs, generated mask, log-prob
temperature, the policy versions, finish reason), the outcome, reward, components, error kind,
test counts and each test's result, and the claims above. The attestation carries a 16-byte
sha256 prefix of each field (``digests``) and the signature is over those, so a check names the
field that differs from what was signed (:meth:`Keyring.check_reward`: "changed after signing:
rollout.completion_token_ids"), and a verdict moved onto other tokens, another task, group or
policy version does not verify. An audit record signs its verdict, violations and egress
connections the same way (:func:`audit_fields`, ``rollstream/audit/v2``), and ``rollstream score``
its JSON verdicts (:func:`score_fields`, ``rollstream/score/v2``).

v1 (``rollstream/verdict/v1``, an attestation without ``digests``: archives of older executors)
still checks, over its one payload (:func:`reward_payload`: the verdict and the rollout id only);
its tokens, task, group and versions are not covered, which ``rollstream verify`` says. A v2
signature cannot be passed off as v1: the domains differ, so dropping the digests breaks it.

Keys: the private key is read from a file or an environment variable whose *name* is in the
config (``executor.attest.key_file`` / ``key_env``), never from the config itself, so it is never
in a run's config file, ``rollstream config show``, a log, an event or a child's command line.
Each signature names its key (``key_id``, the public key's fingerprint unless configured); a
:class:`Keyring` holds the public keys by id (their file's name) and by fingerprint, so keys rotate:
a new key with a new id signs from then on, the old public key still checks what it signed. ``rollstream keys new`` makes a pair; ``rollstream verify`` checks a run's archive.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from rollstream.errors import ConfigError

if TYPE_CHECKING:
    from rollstream.config import AttestConfig
    from rollstream.schemas.events import (
        Attestation,
        Connection,
        ExecutionRecord,
        RewardScored,
        RewardSpec,
        SandboxAudit,
    )

REWARD_DOMAIN = "rollstream/verdict/v1"
AUDIT_DOMAIN = "rollstream/audit/v1"
REWARD_DOMAIN_V2 = "rollstream/verdict/v2"
AUDIT_DOMAIN_V2 = "rollstream/audit/v2"
SCORE_DOMAIN_V2 = "rollstream/score/v2"
DIGEST_BYTES = 16  # of sha256 per field: 128-bit second preimages; ~30 fields, ~500 bytes a verdict
UNSIGNED = bytes(64)


def spec_digest(spec: RewardSpec) -> str:
    """sha256 of what decides a verdict in a reward spec (not its limits or penalties)."""
    fields = [spec.kind, spec.entry_point, list(spec.tests), spec.setup, spec.program,
              [[s.instruction, list(s.tests)] for s in spec.subtasks], sorted(spec.weights.items()),
              spec.all_or_nothing]
    if spec.assets:  # the files the tests read decide too (appended only then: older digests stay valid)
        fields.append(sorted([a.path, a.digest] for a in spec.assets))
    if spec.network:  # and the hosts they may reach
        fields.append(sorted(spec.network))
    if spec.language != "python":  # and what the program is compiled as (Python's digests stay as they were)
        fields.append(["language", spec.language])
    if spec.kind == "math_answer":  # an answer's verdict: the gold and where and how it is read
        fields.append(["answer", spec.answer, spec.answer_format, spec.answer_pattern, spec.answer_tolerance])
    return hashlib.sha256(msgspec.msgpack.encode(fields)).hexdigest()


def code_digest(code: str) -> str:
    return hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()


def _claims(attestation: Attestation) -> list[str]:
    a = attestation
    return [a.key_id, a.spec_sha256, a.code_sha256, a.image, a.runtime]


def reward_payload(reward: RewardScored, attestation: Attestation) -> bytes:
    """The bytes a v1 verdict's signature is over (kept so that archives older executors signed
    still check; new verdicts are signed under v2: :func:`reward_fields`)."""
    e = reward.execution
    fields = [REWARD_DOMAIN, reward.rollout.rollout_id, reward.outcome, float(reward.reward),
              sorted((k, float(v)) for k, v in reward.components.items()), e.error_kind, e.tests_passed, e.tests_total,
              e.tests_skipped, *_claims(attestation)]
    if e.test_results or e.test_results_omitted:  # each test's result (appended only then: older signatures hold)
        fields.append([[r.index, r.outcome, r.error_type, r.message, float(r.duration_s), r.node_id]
                       for r in e.test_results])
        fields.append(e.test_results_omitted)
    return msgspec.msgpack.encode(fields)


def audit_payload(audit: SandboxAudit, attestation: Attestation) -> bytes:
    """The bytes a v1 audit record's signature is over (see :func:`reward_payload`)."""
    return msgspec.msgpack.encode([
        AUDIT_DOMAIN, audit.rollout_id, audit.sandbox_id, audit.container_id, audit.verdict, audit.outcome,
        audit.code_sha256, sorted(audit.violations), *_claims(attestation)])


# v2: the signature is over one short digest per named field, which the attestation carries, so a
# check names each field that differs from what was signed (the digests left as signed), and the
# signature alone says whether the digests are the signer's.

def _wire(array: Any) -> bytes | None:
    return None if array is None else array.to_wire()


def _claim_fields(a: Attestation) -> list[tuple[str, Any]]:
    return [("attestation.key_id", a.key_id), ("attestation.spec_sha256", a.spec_sha256),
            ("attestation.code_sha256", a.code_sha256), ("attestation.image", a.image),
            ("attestation.runtime", a.runtime)]


def _execution_fields(e: ExecutionRecord) -> list[tuple[str, Any]]:
    return [("execution.error_kind", e.error_kind), ("execution.tests_passed", e.tests_passed),
            ("execution.tests_total", e.tests_total), ("execution.tests_skipped", e.tests_skipped),
            ("execution.test_results", [[[r.index, r.outcome, r.error_type, r.message, float(r.duration_s), r.node_id]
                                         for r in e.test_results], e.test_results_omitted])]


def reward_fields(reward: RewardScored, attestation: Attestation) -> list[tuple[str, Any]]:
    """What a v2 verdict signs, by name: all of its rollout (what the learner trains on: ids, task,
    group, family, prompt and completion tokens, behaviour log-probs, generated mask, temperature,
    policy versions, finish reason), the verdict (outcome, reward, components, error kind, test
    counts, each test's result) and the attestation's claims."""
    r = reward.rollout
    return [
        ("rollout.rollout_id", r.rollout_id), ("rollout.group_id", r.group_id),
        ("rollout.sample_index", r.sample_index), ("rollout.group_size", r.group_size),
        ("rollout.task_id", r.task_id), ("rollout.family", r.family),
        ("rollout.prompt_token_ids", _wire(r.prompt_token_ids)),
        ("rollout.completion_token_ids", _wire(r.completion_token_ids)),
        ("rollout.behaviour_logprobs", _wire(r.behaviour_logprobs)),
        ("rollout.generated_mask", _wire(r.generated_mask)),
        ("rollout.logprob_temperature", float(r.logprob_temperature)),
        ("rollout.policy_version_first", r.policy_version_first), ("rollout.policy_version_last", r.policy_version_last),
        ("rollout.issued_policy_version", r.issued_policy_version), ("rollout.finish_reason", r.finish_reason),
        ("outcome", reward.outcome), ("reward", float(reward.reward)),
        ("components", sorted((k, float(v)) for k, v in reward.components.items())),
        *_execution_fields(reward.execution), *_claim_fields(attestation)]


def _connection(c: Connection) -> list[Any]:
    return [c.host, c.port, c.method, c.verdict, c.reason, c.sent, c.received, float(c.duration_s)]


def audit_fields(audit: SandboxAudit, attestation: Attestation) -> list[tuple[str, Any]]:
    """What a v2 audit record signs, by name: as v1, and its egress connections."""
    return [("rollout_id", audit.rollout_id), ("sandbox_id", audit.sandbox_id), ("container_id", audit.container_id),
            ("verdict", audit.verdict), ("outcome", audit.outcome), ("code_sha256", audit.code_sha256),
            ("violations", sorted(audit.violations)), ("connections", [_connection(c) for c in audit.connections]),
            *_claim_fields(attestation)]


_SCORE_KEYS = {"line", "task_id", "reward", "components", "execution", "outcome", "lost", "violations", "reference",
               "attestation"}


def score_fields(verdict: dict[str, Any], attestation: Attestation) -> list[tuple[str, Any]]:
    """What a v2 signature on a ``rollstream score`` JSON verdict signs, by name: its line and task,
    the keys echoed from its input (its ``id``), the verdict and the claims (the code's digest)."""
    from rollstream.schemas.events import ExecutionRecord

    echoed = {k: v for k, v in verdict.items() if k not in _SCORE_KEYS}
    execution = msgspec.convert(verdict.get("execution") or {}, ExecutionRecord)
    return [("line", verdict.get("line")), ("task_id", verdict.get("task_id")),
            ("echoed", json.dumps(echoed, sort_keys=True)), ("outcome", verdict.get("outcome")),
            ("reward", float(verdict.get("reward", 0.0))),
            ("components", sorted((k, float(v)) for k, v in (verdict.get("components") or {}).items())),
            *_execution_fields(execution), *_claim_fields(attestation)]


def field_digests(fields: list[tuple[str, Any]]) -> bytes:
    return b"".join(hashlib.sha256(msgspec.msgpack.encode(value)).digest()[:DIGEST_BYTES] for _, value in fields)


def signed_payload(domain: str, digests: bytes) -> bytes:
    """The bytes a v2 signature is over: the record's domain and its field digests."""
    return msgspec.msgpack.encode([domain, digests])


def changed_fields(fields: list[tuple[str, Any]], digests: bytes) -> list[str] | None:
    """The names of the fields whose digest is not the recorded one (None: the digests are not of
    this record's field list)."""
    if len(digests) != DIGEST_BYTES * len(fields):
        return None
    now = field_digests(fields)
    return [name for i, (name, _) in enumerate(fields)
            if now[i * DIGEST_BYTES:(i + 1) * DIGEST_BYTES] != digests[i * DIGEST_BYTES:(i + 1) * DIGEST_BYTES]]


def _private_key(data: bytes, where: str) -> Any:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    text = data.strip()
    try:
        if text.startswith(b"-----BEGIN"):
            key = serialization.load_pem_private_key(text, password=None)
        else:
            key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(text.decode("ascii")))
    except (ValueError, TypeError, UnicodeDecodeError) as exc:  # never the key itself in the message
        raise ConfigError(f"{where}: not an Ed25519 private key (PEM PKCS#8, or 64 hex digits): "
                          f"{type(exc).__name__}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"{where}: the key is not an Ed25519 key")
    return key


def fingerprint(public_key: Any) -> str:
    from cryptography.hazmat.primitives import serialization

    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519-" + hashlib.sha256(raw).hexdigest()[:16]


class Signer:
    """An executor's private key and its id."""

    def __init__(self, key: Any, key_id: str = "") -> None:
        self._key = key
        self.key_id = key_id or fingerprint(key.public_key())

    def __repr__(self) -> str:  # never the key
        return f"Signer(key_id={self.key_id!r})"

    def public_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self._key.public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo)

    def _attestation(self, spec_sha256: str, code_sha256: str, image: str, runtime: str) -> Attestation:
        from rollstream.schemas.events import Attestation

        return Attestation(key_id=self.key_id, spec_sha256=spec_sha256, code_sha256=code_sha256, image=image[:4096],
                           runtime=runtime[:4096], signature=UNSIGNED)

    def _signed(self, domain: str, fields: Callable[[Attestation], list[tuple[str, Any]]],
                claims: dict[str, str]) -> Attestation:
        unsigned = self._attestation(**claims)
        digests = field_digests(fields(unsigned))
        return msgspec.structs.replace(unsigned, digests=digests,
                                       signature=self._key.sign(signed_payload(domain, digests)))

    def sign_reward(self, reward: RewardScored, *, spec_sha256: str, code_sha256: str, image: str,
                    runtime: str) -> RewardScored:
        attestation = self._signed(REWARD_DOMAIN_V2, lambda a: reward_fields(reward, a),
                                   {"spec_sha256": spec_sha256, "code_sha256": code_sha256, "image": image,
                                    "runtime": runtime})
        return msgspec.structs.replace(reward, attestation=attestation)

    def sign_audit(self, audit: SandboxAudit, *, spec_sha256: str, code_sha256: str, image: str,
                   runtime: str) -> SandboxAudit:
        attestation = self._signed(AUDIT_DOMAIN_V2, lambda a: audit_fields(audit, a),
                                   {"spec_sha256": spec_sha256, "code_sha256": code_sha256, "image": image,
                                    "runtime": runtime})
        return msgspec.structs.replace(audit, attestation=attestation)

    def sign_score(self, verdict: dict[str, Any], *, spec_sha256: str, code_sha256: str, image: str,
                   runtime: str) -> dict[str, Any]:
        """A ``rollstream score`` JSON verdict with its ``attestation`` (bytes as base64)."""
        attestation = self._signed(SCORE_DOMAIN_V2, lambda a: score_fields(verdict, a),
                                   {"spec_sha256": spec_sha256, "code_sha256": code_sha256, "image": image,
                                    "runtime": runtime})
        return {**verdict, "attestation": msgspec.to_builtins(attestation)}


def load_signer(config: AttestConfig) -> Signer | None:
    """The executor's signer from ``executor.attest`` (None: no key configured, verdicts unsigned).
    ConfigError (saying where and what to do, never the key) when the key cannot be read."""
    fix = ("make a pair with `rollstream keys new --dir DIR` and point executor.attest.key_file at its .key, "
           "or empty executor.attest.key_file and key_env to leave verdicts unsigned")
    if config.key_file:
        try:
            data = Path(config.key_file).read_bytes()
        except OSError as exc:
            raise ConfigError(f"executor.attest.key_file {config.key_file}: the signing key cannot be read "
                              f"({exc.strerror or exc}): {fix}") from None
        return Signer(_private_key(data, f"executor.attest.key_file {config.key_file}"), config.key_id)
    if config.key_env:
        value = os.environ.get(config.key_env)
        if not value:
            raise ConfigError(f"executor.attest.key_env: the environment variable {config.key_env} is not set "
                              f"(it should hold the signing key): set it, or {fix}")
        return Signer(_private_key(value.encode(), f"the environment variable {config.key_env}"), config.key_id)
    return None


def new_keypair(directory: Path, key_id: str = "") -> tuple[Path, Path, str]:
    """Write a new Ed25519 pair under ``directory``: ``<id>.key`` (PEM PKCS#8, mode 0600) and
    ``<id>.pub``; returns (private path, public path, key id)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    key_id = key_id or fingerprint(key.public_key())
    if not key_id.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise ConfigError(f"key id {key_id!r}: letters, digits, '-', '_' and '.' only")
    directory.mkdir(parents=True, exist_ok=True)
    private, public = directory / f"{key_id}.key", directory / f"{key_id}.pub"
    if private.exists() or public.exists():
        raise ConfigError(f"{private} or {public} exists already: choose another key id")
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
    public.write_bytes(Signer(key, key_id).public_pem())
    return private, public, key_id


class Keyring:
    """Public keys by id (the file's name) and by fingerprint: what checks a signature. A verdict
    signed with no ``key_id`` configured names its key by fingerprint, found whatever the file's
    name (``rollstream keys new --id X`` writes ``X.pub``)."""

    def __init__(self, keys: dict[str, Any] | None = None) -> None:
        self.keys = dict(keys or {})
        self.by_fingerprint = {fingerprint(key): key for key in self.keys.values()}

    @classmethod
    def load(cls, path: str | Path) -> Keyring:
        """Every ``<key id>.pub`` of a directory, or one file (its id: its name without ``.pub``)."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        root = Path(path)
        files = sorted(root.glob("*.pub")) if root.is_dir() else [root]
        if not files or not all(f.is_file() for f in files):
            raise ConfigError(f"no public keys at {root} (a directory of <key id>.pub files, or one such file)")
        keys = {}
        for file in files:
            try:
                key = serialization.load_pem_public_key(file.read_bytes())
            except ValueError as exc:
                raise ConfigError(f"{file}: not a PEM public key ({exc})") from None
            if not isinstance(key, Ed25519PublicKey):
                raise ConfigError(f"{file}: not an Ed25519 public key")
            key_id = file.name.removesuffix(".pub")
            if key_id.startswith("ed25519-") and key_id != fingerprint(key):  # would shadow another key's id
                raise ConfigError(f"{file}: named as the fingerprint {key_id} but its key's is {fingerprint(key)}")
            keys[key_id] = key
        return cls(keys)

    def key(self, key_id: str) -> Any:
        return self.keys.get(key_id) or self.by_fingerprint.get(key_id)

    def _check(self, attestation: Attestation | None, v1_payload: Callable[[Attestation], bytes], domain: str,
               fields: Callable[[Attestation], list[tuple[str, Any]]]) -> str | None:
        from cryptography.exceptions import InvalidSignature

        if attestation is None:
            return "unsigned"
        key = self.key(attestation.key_id)
        if key is None:
            return f"signed with an unknown key {attestation.key_id!r}"

        def valid(payload: bytes) -> bool:
            try:
                key.verify(attestation.signature, payload)
            except InvalidSignature:
                return False
            return True

        if not attestation.digests:  # signed under v1: one payload, so no field can be named
            return None if valid(v1_payload(attestation)) else "the signature does not match the verdict (v1)"
        changed = changed_fields(fields(attestation), attestation.digests)
        genuine = valid(signed_payload(domain, attestation.digests))
        if changed is None:
            return "its field digests are not those of this kind of record"
        if changed and genuine:
            return f"changed after signing: {', '.join(changed)}"
        if changed:
            return f"the signature does not match its field digests, and these differ from them: {', '.join(changed)}"
        return None if genuine else "the signature does not match its field digests (they were rewritten, or " \
                                    "another key signed)"

    def check_reward(self, reward: RewardScored) -> str | None:
        """None when ``reward`` carries a valid signature of a known key, else why not (naming the
        fields changed since it was signed, for a v2 signature)."""
        return self._check(reward.attestation, lambda a: reward_payload(reward, a), REWARD_DOMAIN_V2,
                           lambda a: reward_fields(reward, a))

    def check_audit(self, audit: SandboxAudit) -> str | None:
        return self._check(audit.attestation, lambda a: audit_payload(audit, a), AUDIT_DOMAIN_V2,
                           lambda a: audit_fields(audit, a))

    def check_score(self, verdict: dict[str, Any]) -> str | None:
        """A ``rollstream score`` JSON verdict (v2 only: score signed nothing before)."""
        from rollstream.schemas.events import Attestation

        raw = verdict.get("attestation")
        if raw is None:
            return "unsigned"
        try:
            attestation = msgspec.convert(raw, Attestation)
            if not attestation.digests:
                return "its attestation carries no field digests"
            return self._check(attestation, lambda a: b"", SCORE_DOMAIN_V2, lambda a: score_fields(verdict, a))
        except (msgspec.ValidationError, TypeError, ValueError) as exc:
            return f"unreadable: {exc}"


def is_v1(attestation: Attestation | None) -> bool:
    """Signed under v1: its rollout (tokens, task, group, versions) is not covered by the signature."""
    return attestation is not None and not attestation.digests
