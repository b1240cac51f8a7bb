"""Signed verdicts (rollstream/attest.py, cli/verify.py): anyone with the public key can check a
verdict, only the executor's key can make one, and tampering with a verdict, a test or the code
after the fact is found; the private key is never in a config, a message or a repr."""

from __future__ import annotations

import msgspec
import pytest

from rollstream.attest import (
    Keyring,
    Signer,
    code_digest,
    load_signer,
    new_keypair,
    reward_payload,
    spec_digest,
)
from rollstream.cli.verify import check_audits, check_verdicts, compare, conditions, last_turns
from rollstream.config import AttestConfig, Config, ExecutorConfig
from rollstream.config_load import to_toml
from rollstream.consumers.executor.episodes import turn_code
from rollstream.errors import ConfigError
from rollstream.schemas import RewardScored, SandboxAudit, SandboxLimits, codec
from rollstream.schemas.events import TestResult
from rollstream.testing import make_action, make_reward

pytestmark = pytest.mark.unit

IMAGE, RUNTIME = "sha256:" + "ab" * 32, "runc+runner:0123456789abcdef"


@pytest.fixture
def keys(tmp_path):
    private, public, key_id = new_keypair(tmp_path / "keys", "exec-1")
    return private, public, key_id


def signed(signer: Signer, index: int = 0, reward: float = 1.0):
    action = make_action("g", index)
    verdict = make_reward("g", index, reward)
    claims = {"spec_sha256": spec_digest(action.reward), "code_sha256": code_digest(turn_code(action)),
              "image": IMAGE, "runtime": RUNTIME}
    return action, signer.sign_reward(verdict, **claims), claims


def test_a_signed_verdict_verifies_and_travels(keys) -> None:
    private, public, key_id = keys
    signer = load_signer(AttestConfig(key_file=str(private)))
    assert signer.key_id.startswith("ed25519-")  # no id configured: the fingerprint
    signer = load_signer(AttestConfig(key_file=str(private), key_id=key_id))
    _, verdict, _ = signed(signer)
    decoded = codec(RewardScored).decode(codec(RewardScored).encode(verdict))
    assert decoded.attestation == verdict.attestation and len(verdict.attestation.signature) == 64
    keyring = Keyring.load(public.parent)
    assert keyring.check_reward(decoded) is None
    assert Keyring.load(public).check_reward(decoded) is None  # one file works too


def test_tampering_with_a_verdict_or_its_claims_breaks_the_signature(keys) -> None:
    private, public, key_id = keys
    signer = load_signer(AttestConfig(key_file=str(private), key_id=key_id))
    keyring = Keyring.load(public.parent)
    _, verdict, _ = signed(signer, reward=0.0)
    for forged in (msgspec.structs.replace(verdict, reward=0.5, components={"tests": 0.5}),
                   msgspec.structs.replace(verdict, execution=msgspec.structs.replace(verdict.execution, tests_passed=0),
                                           outcome=None),
                   msgspec.structs.replace(verdict, attestation=msgspec.structs.replace(verdict.attestation,
                                                                                        image="sha256:other"))):
        assert keyring.check_reward(forged) == "the signature does not match the verdict"
    assert keyring.check_reward(msgspec.structs.replace(verdict, attestation=None)) == "unsigned"
    other = Signer(load_signer(AttestConfig(key_file=str(new_keypair(public.parent.parent / "o", "x")[0]))).__dict__[
        "_key"], "exec-1")  # another key claiming exec-1's id
    assert keyring.check_reward(signed(other)[1]) == "the signature does not match the verdict"
    assert Keyring().check_reward(verdict) == "signed with an unknown key 'exec-1'"


def test_each_tests_result_is_signed_and_a_record_without_them_signs_as_before(keys) -> None:
    """``rollstream replay`` and the report's failed tests read ``test_results``: a failing test
    rewritten as passed, its message or its node id changed, or one dropped, breaks the signature.
    A record without them is signed over exactly what an older executor signed (its signatures hold)."""
    private, public, key_id = keys
    signer = load_signer(AttestConfig(key_file=str(private), key_id=key_id))
    keyring = Keyring.load(public.parent)
    action, bare, claims = signed(signer, reward=0.5)
    results = [TestResult(index=0, outcome="passed", duration_s=0.001, node_id="test_x.py::test_a"),
               TestResult(index=1, outcome="failed", error_type="AssertionError", message="assert 2 == 3",
                          duration_s=0.002, node_id="test_x.py::test_b")]
    execution = msgspec.structs.replace(bare.execution, tests_passed=1, tests_total=2, test_results=results)
    verdict = signer.sign_reward(msgspec.structs.replace(bare, execution=execution, attestation=None, outcome=None),
                                 **claims)
    decoded = codec(RewardScored).decode(codec(RewardScored).encode(verdict))
    assert keyring.check_reward(decoded) is None

    def forged(**change):
        records = [msgspec.structs.replace(results[1], **change)] if change else []
        return msgspec.structs.replace(verdict, execution=msgspec.structs.replace(
            execution, test_results=[results[0], *records]))

    for forgery in (forged(outcome="passed", error_type="", message=""), forged(message="assert 3 == 3"),
                    forged(node_id="test_x.py::test_c"), forged(duration_s=0.5), forged(),
                    msgspec.structs.replace(verdict, execution=msgspec.structs.replace(execution,
                                                                                       test_results_omitted=3))):
        assert keyring.check_reward(forgery) == "the signature does not match the verdict"
    old = msgspec.msgpack.encode([  # the payload before per-test results were signed
        "rollstream/verdict/v1", bare.rollout.rollout_id, bare.outcome, float(bare.reward),
        sorted((k, float(v)) for k, v in bare.components.items()), bare.execution.error_kind,
        bare.execution.tests_passed, bare.execution.tests_total, bare.execution.tests_skipped,
        bare.attestation.key_id, bare.attestation.spec_sha256, bare.attestation.code_sha256, bare.attestation.image,
        bare.attestation.runtime])
    assert reward_payload(bare, bare.attestation) == old and keyring.check_reward(bare) is None


def test_keys_rotate_by_id(tmp_path) -> None:
    first = new_keypair(tmp_path, "2026-11")
    second = new_keypair(tmp_path, "2026-12")
    keyring = Keyring.load(tmp_path)
    for private, _, key_id in (first, second):
        signer = load_signer(AttestConfig(key_file=str(private), key_id=key_id))
        assert keyring.check_reward(signed(signer)[1]) is None


def test_the_private_key_is_read_from_where_the_config_says_and_never_shown(keys, monkeypatch) -> None:
    private, public, key_id = keys
    pem = private.read_text()
    monkeypatch.setenv("ROLLSTREAM_TEST_KEY", pem)
    signer = load_signer(AttestConfig(key_env="ROLLSTREAM_TEST_KEY", key_id=key_id))
    assert Keyring.load(public).check_reward(signed(signer)[1]) is None
    hex_key = Signer.__new__(Signer)  # the 32 raw bytes as hex work too
    from cryptography.hazmat.primitives import serialization

    raw = signer._key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                    serialization.NoEncryption()).hex()
    monkeypatch.setenv("ROLLSTREAM_TEST_KEY", raw)
    hex_key = load_signer(AttestConfig(key_env="ROLLSTREAM_TEST_KEY", key_id=key_id))
    assert Keyring.load(public).check_reward(signed(hex_key)[1]) is None
    shown = to_toml(Config(executor=ExecutorConfig(attest=AttestConfig(key_env="ROLLSTREAM_TEST_KEY",
                                                                       key_file=str(private)))))
    assert "ROLLSTREAM_TEST_KEY" in shown and str(private) in shown
    body = "".join(pem.splitlines()[1:-1])
    assert body[:40] not in shown and raw not in shown and raw not in repr(signer) and body[:40] not in repr(signer)
    monkeypatch.setenv("ROLLSTREAM_TEST_KEY", "not a key " + raw[:10])
    with pytest.raises(ConfigError) as bad:
        load_signer(AttestConfig(key_env="ROLLSTREAM_TEST_KEY"))
    assert raw[:10] not in str(bad.value) and "ROLLSTREAM_TEST_KEY" in str(bad.value)
    monkeypatch.delenv("ROLLSTREAM_TEST_KEY")
    with pytest.raises(ConfigError, match="is not set"):
        load_signer(AttestConfig(key_env="ROLLSTREAM_TEST_KEY"))
    assert load_signer(AttestConfig()) is None  # no key configured: verdicts unsigned


def test_verify_finds_a_test_or_a_completion_changed_after_the_fact(keys) -> None:
    private, public, key_id = keys
    signer = load_signer(AttestConfig(key_file=str(private), key_id=key_id))
    keyring = Keyring.load(public)
    actions, verdicts = {}, []
    for i in range(3):
        action, verdict, _ = signed(signer, i)
        actions[action.rollout.rollout_id], verdicts = action, [*verdicts, verdict]
    assert check_verdicts(verdicts, actions, keyring) == []
    actions["g/1"] = msgspec.structs.replace(actions["g/1"], reward=msgspec.structs.replace(
        actions["g/1"].reward, tests=["assert add(1, 2) == 4"]))  # a test edited
    actions["g/2"] = msgspec.structs.replace(actions["g/2"], completion_text="```python\ndef add(a, b): return 3\n```")
    verdicts[0] = msgspec.structs.replace(verdicts[0], reward=0.9, components={"tests": 0.9})  # a verdict edited
    found = {(f.rollout_id, f.kind) for f in check_verdicts(verdicts, actions, keyring)}
    assert found == {("g/0", "signature"), ("g/1", "spec"), ("g/2", "code")}
    # the last turn of an episode is the one a verdict is for
    later = msgspec.structs.replace(actions["g/0"], turn=2)
    assert last_turns([actions["g/0"], later, actions["g/1"]])["g/0"].turn == 2


def test_a_reproduced_verdict_and_the_conditions_it_was_reproduced_under(keys) -> None:
    private, _, key_id = keys
    signer = load_signer(AttestConfig(key_file=str(private), key_id=key_id))
    action, verdict, _ = signed(signer)
    assert compare(verdict, make_reward("g", 0, 1.0), action) is None
    failed = make_reward("g", 0, 0.0)
    failed = msgspec.structs.replace(failed, execution=msgspec.structs.replace(failed.execution, tests_passed=0),
                                     outcome=None)
    assert compare(verdict, failed, action).kind == "reproduce"
    assert conditions(verdict, IMAGE, RUNTIME) == []
    assert conditions(verdict, "sha256:cd", "runsc+runner:0123456789abcdef") == [
        f"image {IMAGE[:24]} -> sha256:cd", "runtime runc+runner:0123456789abcdef -> runsc+runner:0123456789abcdef"]


def test_audit_records_are_signed_and_checked(keys) -> None:
    private, public, key_id = keys
    signer = load_signer(AttestConfig(key_file=str(private), key_id=key_id))
    limits = SandboxLimits(timeout_s=5, memory_mb=256, pids=64, cpus=1, output_bytes=1024, tmpfs_mb=16)
    audit = SandboxAudit(sandbox_id="s", container_id="c", rollout_id="g/0", code_sha256=code_digest("x = 1"),
                         limits=limits, duration_s=0.1, output_bytes=0, verdict="none", executed_at=1.0,
                         outcome="passed")
    good = signer.sign_audit(audit, spec_sha256="s", code_sha256=code_digest("x = 1"), image=IMAGE, runtime=RUNTIME)
    keyring = Keyring.load(public)
    assert check_audits([good], keyring) == []
    forged = msgspec.structs.replace(good, violations=[])  # unchanged content: still fine
    assert check_audits([forged], keyring) == []
    forged = msgspec.structs.replace(good, verdict="timeout", outcome="timeout")
    assert [f.kind for f in check_audits([forged, msgspec.structs.replace(good, attestation=None)], keyring)] == [
        "audit", "audit"]
