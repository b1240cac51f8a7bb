"""Signed verdicts (rollstream/attest.py, cli/verify.py): anyone with the public key can check a
verdict, only the executor's key can make one, and tampering with a verdict, a test or the code
after the fact is found; the private key is never in a config, a message or a repr."""

from __future__ import annotations

import argparse
import json

import msgspec
import pytest

from rollstream.attest import (
    DIGEST_BYTES,
    Keyring,
    Signer,
    code_digest,
    field_digests,
    is_v1,
    load_signer,
    new_keypair,
    reward_fields,
    reward_payload,
    spec_digest,
)
from rollstream.cli.verify import check_audits, check_verdicts, compare, conditions, keys_main, last_turns
from rollstream.config import AttestConfig, Config, ExecutorConfig
from rollstream.config_load import to_toml
from rollstream.consumers.executor.episodes import turn_code
from rollstream.errors import ConfigError
from rollstream.schemas import RewardScored, SandboxAudit, SandboxLimits, codec
from rollstream.schemas.events import Connection, TestResult
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


def rollout_moved(verdict: RewardScored, **change) -> RewardScored:
    return msgspec.structs.replace(verdict, rollout=msgspec.structs.replace(verdict.rollout, **change))


def test_tampering_with_a_verdict_its_rollout_or_its_claims_fails_naming_the_field(keys) -> None:
    """What the learner trains on is signed field by field: a verdict moved onto other tokens,
    log-probs, mask, task, group or policy versions, its reward or its claims edited, fails and
    says which field differs from what was signed."""
    private, public, key_id = keys
    signer = load_signer(AttestConfig(key_file=str(private), key_id=key_id))
    keyring = Keyring.load(public.parent)
    _, verdict, _ = signed(signer, reward=0.0)
    assert len(verdict.attestation.digests) == DIGEST_BYTES * len(reward_fields(verdict, verdict.attestation))
    r = verdict.rollout
    forgeries = [
        (rollout_moved(verdict, completion_token_ids=[11, 12, 13, 99]), "rollout.completion_token_ids"),
        (rollout_moved(verdict, behaviour_logprobs=[-0.5, -0.5, -0.5, -0.25]), "rollout.behaviour_logprobs"),
        (rollout_moved(verdict, prompt_token_ids=[1, 2, 4]), "rollout.prompt_token_ids"),
        (rollout_moved(verdict, generated_mask=[1, 1, 0, 1]), "rollout.generated_mask"),
        (rollout_moved(verdict, task_id="t/other"), "rollout.task_id"),
        (rollout_moved(verdict, group_id="g2"), "rollout.group_id"),
        (rollout_moved(verdict, family="other"), "rollout.family"),
        (rollout_moved(verdict, policy_version_first=r.policy_version_first + 1), "rollout.policy_version_first"),
        (rollout_moved(verdict, policy_version_last=7), "rollout.policy_version_last"),
        (rollout_moved(verdict, issued_policy_version=7), "rollout.issued_policy_version"),
        (rollout_moved(verdict, logprob_temperature=0.7), "rollout.logprob_temperature"),
        (msgspec.structs.replace(verdict, reward=0.5, components={"tests": 0.5}), "reward, components"),
        (msgspec.structs.replace(verdict, execution=msgspec.structs.replace(verdict.execution, tests_passed=0),
                                 outcome=None), "outcome, execution.tests_passed"),
        (msgspec.structs.replace(verdict, attestation=msgspec.structs.replace(verdict.attestation,
                                                                              image="sha256:other")),
         "attestation.image"),
    ]
    for forged, field in forgeries:
        assert keyring.check_reward(forged) == f"changed after signing: {field}"
    # a whole signed verdict's attestation moved onto another rollout's verdict
    other = make_reward("g", 1, 0.0)
    moved = msgspec.structs.replace(other, attestation=verdict.attestation)
    assert keyring.check_reward(moved) == "changed after signing: rollout.rollout_id, rollout.sample_index"
    # the digests rewritten to match the forgery: the signature is not over them
    forged = rollout_moved(verdict, completion_token_ids=[11, 12, 13, 99])
    rewritten = msgspec.structs.replace(forged, attestation=msgspec.structs.replace(
        verdict.attestation, digests=field_digests(reward_fields(forged, verdict.attestation))))
    assert keyring.check_reward(rewritten).startswith("the signature does not match its field digests")
    # a v2 signature passed off as v1 (digests dropped) does not check either
    stripped = msgspec.structs.replace(verdict, attestation=msgspec.structs.replace(verdict.attestation, digests=b""))
    assert keyring.check_reward(stripped) == "the signature does not match the verdict (v1)"
    assert keyring.check_reward(msgspec.structs.replace(verdict, attestation=None)) == "unsigned"
    other = Signer(load_signer(AttestConfig(key_file=str(new_keypair(public.parent.parent / "o", "x")[0]))).__dict__[
        "_key"], "exec-1")  # another key claiming exec-1's id
    assert keyring.check_reward(signed(other)[1]).startswith("the signature does not match its field digests")
    assert Keyring().check_reward(verdict) == "signed with an unknown key 'exec-1'"
    assert keyring.check_reward(codec(RewardScored).decode(codec(RewardScored).encode(verdict))) is None


def v1_signed(signer: Signer, verdict: RewardScored, claims: dict) -> RewardScored:
    """A verdict as an executor before v2 signed it (attestation without digests, v1 payload)."""
    unsigned = signer._attestation(**claims)
    return msgspec.structs.replace(verdict, attestation=msgspec.structs.replace(
        unsigned, signature=signer._key.sign(reward_payload(verdict, unsigned))))


def test_each_tests_result_is_signed_and_v1_signatures_still_check(keys) -> None:
    """``rollstream replay`` and the report's failed tests read ``test_results``: a failing test
    rewritten as passed, its message or its node id changed, or one dropped, fails naming
    ``execution.test_results``. A verdict an older executor signed (v1, no digests) still checks
    over exactly the payload it signed, and an edit of it still fails."""
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
        assert keyring.check_reward(forgery) == "changed after signing: execution.test_results"
    unsigned = msgspec.structs.replace(bare, attestation=None)
    old = v1_signed(signer, unsigned, claims)
    assert reward_payload(old, old.attestation) == msgspec.msgpack.encode([  # the v1 payload, byte for byte
        "rollstream/verdict/v1", bare.rollout.rollout_id, bare.outcome, float(bare.reward),
        sorted((k, float(v)) for k, v in bare.components.items()), bare.execution.error_kind,
        bare.execution.tests_passed, bare.execution.tests_total, bare.execution.tests_skipped,
        old.attestation.key_id, old.attestation.spec_sha256, old.attestation.code_sha256, old.attestation.image,
        old.attestation.runtime])
    old = codec(RewardScored).decode(codec(RewardScored).encode(old))
    assert is_v1(old.attestation) and not is_v1(verdict.attestation)
    assert keyring.check_reward(old) is None
    assert keyring.check_reward(msgspec.structs.replace(old, reward=1.0, components={"tests": 1.0})) == (
        "the signature does not match the verdict (v1)")
    v1_with_results = v1_signed(signer, msgspec.structs.replace(verdict, attestation=None), claims)
    assert keyring.check_reward(v1_with_results) is None
    assert keyring.check_reward(msgspec.structs.replace(v1_with_results, execution=forged(message="x").execution)) \
        == "the signature does not match the verdict (v1)"


def test_keys_new_with_an_id_and_key_file_alone_verifies(tmp_path, capsys) -> None:
    """``rollstream keys new --id X`` writes X.key/X.pub; an executor given only key_file signs under
    the key's fingerprint, which the keyring finds whatever the .pub file is called."""
    assert keys_main(argparse.Namespace(action="new", dir=str(tmp_path), id="exec-7")) == 0
    said = capsys.readouterr().out
    private, public = tmp_path / "exec-7.key", tmp_path / "exec-7.pub"
    assert f'key_file = "{private}"' in said and 'key_id = "exec-7"' in said and str(public) in said
    signer = load_signer(AttestConfig(key_file=str(private)))
    assert signer.key_id.startswith("ed25519-") and signer.key_id in said
    for keyring in (Keyring.load(tmp_path), Keyring.load(public)):
        assert keyring.check_reward(signed(signer)[1]) is None
        assert keyring.check_reward(signed(load_signer(AttestConfig(key_file=str(private), key_id="exec-7")))[1]) \
            is None
    stranger = new_keypair(tmp_path / "other", "exec-8")[0]  # a key the keyring does not hold
    fp = load_signer(AttestConfig(key_file=str(stranger))).key_id
    assert Keyring.load(tmp_path).check_reward(signed(load_signer(AttestConfig(key_file=str(stranger))))[1]) == (
        f"signed with an unknown key {fp!r}")
    (tmp_path / f"{fp}.pub").write_bytes(public.read_bytes())  # named as another key's fingerprint
    with pytest.raises(ConfigError, match="named as the fingerprint"):
        Keyring.load(tmp_path)


def test_a_key_that_cannot_be_read_is_a_loud_error_naming_the_file(tmp_path) -> None:
    missing = tmp_path / "nope.key"
    with pytest.raises(ConfigError) as error:
        load_signer(AttestConfig(key_file=str(missing)))
    assert str(missing) in str(error.value) and "cannot be read" in str(error.value)
    assert "rollstream keys new" in str(error.value)
    garbage = tmp_path / "garbage.key"
    garbage.write_text("not a key")
    with pytest.raises(ConfigError, match="not an Ed25519 private key"):
        load_signer(AttestConfig(key_file=str(garbage)))


def test_score_verdicts_are_signed_and_checked(keys) -> None:
    private, public, key_id = keys
    signer = load_signer(AttestConfig(key_file=str(private), key_id=key_id))
    keyring = Keyring.load(public)
    verdict = {"line": 3, "task_id": "t/0", "id": "c-3", "reward": 0.5, "components": {"tests": 0.5},
               "execution": msgspec.to_builtins(make_reward("g", 0, 0.5).execution), "outcome": "passed"}
    good = json.loads(json.dumps(signer.sign_score(verdict, spec_sha256="s", code_sha256=code_digest("x"),
                                                   image=IMAGE, runtime=RUNTIME)))
    assert keyring.check_score(good) is None
    assert keyring.check_score({**good, "reward": 1.0}) == "changed after signing: reward"
    assert keyring.check_score({**good, "id": "c-4"}) == "changed after signing: echoed"
    assert keyring.check_score({**good, "task_id": "t/1", "line": 4}) == "changed after signing: line, task_id"
    assert keyring.check_score(verdict) == "unsigned"
    assert keyring.check_score({**good, "attestation": {"key_id": key_id}}).startswith("unreadable")


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
    honest = dict(actions)
    actions["g/1"] = msgspec.structs.replace(actions["g/1"], reward=msgspec.structs.replace(
        actions["g/1"].reward, tests=["assert add(1, 2) == 4"]))  # a test edited
    actions["g/2"] = msgspec.structs.replace(actions["g/2"], completion_text="```python\ndef add(a, b): return 3\n```")
    verdicts[0] = msgspec.structs.replace(verdicts[0], reward=0.9, components={"tests": 0.9})  # a verdict edited
    found = {(f.rollout_id, f.kind) for f in check_verdicts(verdicts, actions, keyring)}
    assert found == {("g/0", "signature"), ("g/1", "spec"), ("g/2", "code")}
    # a verdict moved onto other tokens: its signature names the field, and so does its action
    findings = check_verdicts([rollout_moved(verdicts[1], completion_token_ids=[10, 11, 12, 99])], honest, keyring)
    assert [(f.kind, f.detail) for f in findings] == [
        ("rollout", "its rollout is not its action's: rollout.completion_token_ids"),
        ("signature", "changed after signing: rollout.completion_token_ids")]
    # a v1 verdict (its tokens not signed) moved onto other tokens: found by its action
    old = v1_signed(signer, make_reward("g", 2), signed(signer, 2)[2])
    assert check_verdicts([old], {"g/2": signed(signer, 2)[0]}, keyring) == []
    assert [(f.kind, f.detail) for f in check_verdicts([rollout_moved(old, task_id="t/9")],
                                                       {"g/2": signed(signer, 2)[0]}, keyring)] == [
        ("rollout", "its rollout is not its action's: rollout.task_id")]
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
    assert keyring.check_audit(forged) == "changed after signing: verdict, outcome"
    # its egress connections are signed: one dropped, added or edited afterwards is named
    calls = [Connection(host="pypi.org", port=443, method="CONNECT", verdict="allowed", sent=10, received=20),
             Connection(host="evil.example", port=80, method="GET", verdict="denied", reason="not allowed")]
    egress = signer.sign_audit(msgspec.structs.replace(audit, connections=calls), spec_sha256="s",
                               code_sha256=code_digest("x = 1"), image=IMAGE, runtime=RUNTIME)
    egress = codec(SandboxAudit).decode(codec(SandboxAudit).encode(egress))
    assert keyring.check_audit(egress) is None
    for changed in ([calls[0]], [], [calls[0], msgspec.structs.replace(calls[1], verdict="allowed")],
                    [msgspec.structs.replace(calls[0], received=2000), calls[1]]):
        assert keyring.check_audit(msgspec.structs.replace(egress, connections=changed)) == (
            "changed after signing: connections")


def test_the_spec_digest_binds_a_program_s_language_and_a_math_task_s_answer() -> None:
    """A verdict moved onto a spec that differs in what decides it fails verification: the
    language a program is compiled as, a math task's gold answer and how the answer is read. A
    Python task's digest is what it was before those fields."""
    from rollstream.schemas.events import RewardSpec

    tests = ["assert run_program('') == '1\\n'"]
    assert spec_digest(RewardSpec(program=True, tests=tests)) != spec_digest(
        RewardSpec(program=True, tests=tests, language="cpp"))
    math = RewardSpec(kind="math_answer", answer="12", weights={"answer": 1.0})
    assert len({spec_digest(math), spec_digest(msgspec.structs.replace(math, answer="13")),
                spec_digest(msgspec.structs.replace(math, answer_format="gsm8k")),
                spec_digest(msgspec.structs.replace(math, answer_tolerance=0.01))}) == 4
    python = RewardSpec(entry_point="f", tests=["assert f() == 1"])
    assert spec_digest(python) == "e4a5724052701bd7b173c0cb88831b4c0348c624329b671a696eb7f16069d710"  # as before
