"""Signed verdicts: an executor signs each verdict it decides, anyone with its public key checks it.

Each ``RewardScored`` and ``SandboxAudit`` an executor with a key produces carries an
:class:`~rollstream.schemas.events.Attestation`: the digests of the reward spec (:func:`spec_digest`:
kind, entry point, tests, setup, program, a chain's steps, weights) and of the code that ran
(:func:`code_digest`), the sandbox image's id and the runtime (the container runtime and the
digest of the sandbox's runner source), and an Ed25519 signature (the ``cryptography`` package)
over them together with the verdict (:func:`reward_payload`, :func:`audit_payload`: outcome,
reward, components, error kind, test counts, each test's result where the record has them; the
rollout id binds it to its rollout).

Keys: the private key is read from a file or an environment variable whose *name* is in the
config (``executor.attest.key_file`` / ``key_env``), never from the config itself, so it is never
in a run's config file, ``rollstream config show``, a log, an event or a child's command line.
Each signature names its key (``key_id``); a :class:`Keyring` holds the public keys by id, so keys
rotate: a new key with a new id signs from then on, the old public key still checks what it
signed. ``rollstream keys new`` makes a pair; ``rollstream verify`` checks a run's archive.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from rollstream.errors import ConfigError

if TYPE_CHECKING:
    from rollstream.config import AttestConfig
    from rollstream.schemas.events import Attestation, RewardScored, RewardSpec, SandboxAudit

REWARD_DOMAIN = "rollstream/verdict/v1"
AUDIT_DOMAIN = "rollstream/audit/v1"
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
    return hashlib.sha256(msgspec.msgpack.encode(fields)).hexdigest()


def code_digest(code: str) -> str:
    return hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()


def _claims(attestation: Attestation) -> list[str]:
    a = attestation
    return [a.key_id, a.spec_sha256, a.code_sha256, a.image, a.runtime]


def reward_payload(reward: RewardScored, attestation: Attestation) -> bytes:
    """The bytes a verdict's signature is over (the attestation's own signature left out)."""
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
    return msgspec.msgpack.encode([
        AUDIT_DOMAIN, audit.rollout_id, audit.sandbox_id, audit.container_id, audit.verdict, audit.outcome,
        audit.code_sha256, sorted(audit.violations), *_claims(attestation)])


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

    def sign_reward(self, reward: RewardScored, *, spec_sha256: str, code_sha256: str, image: str,
                    runtime: str) -> RewardScored:
        unsigned = self._attestation(spec_sha256, code_sha256, image, runtime)
        signature = self._key.sign(reward_payload(reward, unsigned))
        return msgspec.structs.replace(reward, attestation=msgspec.structs.replace(unsigned, signature=signature))

    def sign_audit(self, audit: SandboxAudit, *, spec_sha256: str, code_sha256: str, image: str,
                   runtime: str) -> SandboxAudit:
        unsigned = self._attestation(spec_sha256, code_sha256, image, runtime)
        signature = self._key.sign(audit_payload(audit, unsigned))
        return msgspec.structs.replace(audit, attestation=msgspec.structs.replace(unsigned, signature=signature))


def load_signer(config: AttestConfig) -> Signer | None:
    """The executor's signer from ``executor.attest`` (None: no key configured, verdicts unsigned).
    ConfigError (saying where, never what) when the key cannot be read."""
    if config.key_file:
        try:
            data = Path(config.key_file).read_bytes()
        except OSError as exc:
            raise ConfigError(f"executor.attest.key_file {config.key_file}: {exc.strerror or exc}") from None
        return Signer(_private_key(data, f"executor.attest.key_file {config.key_file}"), config.key_id)
    if config.key_env:
        value = os.environ.get(config.key_env)
        if not value:
            raise ConfigError(f"executor.attest.key_env: the environment variable {config.key_env} is not set")
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
    """Public keys by id: what checks a signature."""

    def __init__(self, keys: dict[str, Any] | None = None) -> None:
        self.keys = dict(keys or {})

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
            keys[file.name.removesuffix(".pub")] = key
        return cls(keys)

    def _check(self, attestation: Attestation | None, payload: Any) -> str | None:
        from cryptography.exceptions import InvalidSignature

        if attestation is None:
            return "unsigned"
        key = self.keys.get(attestation.key_id)
        if key is None:
            return f"signed with an unknown key {attestation.key_id!r}"
        try:
            key.verify(attestation.signature, payload(attestation))
        except InvalidSignature:
            return "the signature does not match the verdict"
        return None

    def check_reward(self, reward: RewardScored) -> str | None:
        """None when ``reward`` carries a valid signature of a known key, else why not."""
        return self._check(reward.attestation, lambda a: reward_payload(reward, a))

    def check_audit(self, audit: SandboxAudit) -> str | None:
        return self._check(audit.attestation, lambda a: audit_payload(audit, a))
