"""The executor stage against the real broker and real Docker: rewards and audit records per action,
dead-lettering of bad specs, hostile actions that do not stop the stage, and SIGKILL mid-batch
followed by a restart, after which every action has a reward (deduplicated by rollout_id)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from rollstream.config import Config, ExecutorConfig
from rollstream.config_load import to_toml
from rollstream.consumers.executor.stage import run
from rollstream.kafka import EventProducer, ensure_topics
from rollstream.schemas import DeadLetter, codec
from rollstream.schemas.events import ActionGenerated, PromptIssued, RewardScored, RewardSpec, SandboxAudit
from rollstream.testing import make_action, make_rollout
from tests.helpers import read_events

pytestmark = pytest.mark.sandbox
ROOT = Path(__file__).resolve().parents[3]  # the repository: its subprocesses import this checkout


def action(group: str, index: int, code: str, **spec) -> ActionGenerated:
    return msgspec.structs.replace(
        make_action(group, index),
        rollout=make_rollout(group, index),
        completion_text=f"```python\n{code}\n```",
        reward=RewardSpec(
            entry_point="add", tests=["assert add(1, 2) == 3", "assert add(0, 0) == 0"], **spec
        ),
    )


async def read_topic(config: Config, name: str, event: type, until, timeout_s: float = 60.0) -> list:
    return await read_events(config.infra, name, event, until, timeout_s)


async def while_staged(config: Config, *wanted: tuple[str, type, int]) -> list[list]:
    """Run the stage until each (topic, event type, count) has arrived, then stop it: the events of each."""
    stop = asyncio.Event()
    stage = asyncio.create_task(run(config, stop=stop))
    try:
        got = [await read_topic(config, name, event, lambda events, n=count: len(events) >= n)
               for name, event, count in wanted]
        assert not stage.done()
        return got
    finally:
        stop.set()
        await asyncio.wait_for(stage, 60)


def stage_config(config: Config, image: str, owner: str, **executor) -> Config:
    settings = dict(image=image, owner=owner, pool_size=2, concurrency=2) | executor
    return msgspec.structs.replace(config, executor=ExecutorConfig(**settings))


async def test_stage_scores_audits_and_survives_hostile_actions(
    config: Config, sandbox_image: str, owner: str
):
    config = stage_config(config, sandbox_image, owner)
    await ensure_topics(config.infra, ["actions", "rewards", "audit"])
    good = "def add(a, b):\n    return a + b"
    actions = [
        action("g1", 0, good),
        action("g1", 1, "def add(a, b):\n    return a - b"),
        action("g1", 2, "def add(a, b) return"),
        action("g1", 3, "while True:\n    pass", timeout_s=0.5),
        action(
            "g2",
            0,
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
            timeout_s=0.5,
        ),
        action("g2", 1, "import sys\nfor _ in range(1024):\n    sys.stdout.write('x' * (1 << 20))"),
        action("g2", 2, "x = bytearray(1 << 40)"),
        msgspec.structs.replace(action("g2", 3, good), completion_text="", error="prompt too long"),
        msgspec.structs.replace(action("g3", 0, good), reward=RewardSpec(kind="no_such_kind")),
        action("g3", 1, good),
        action("g3", 2, "import os\nos.write(4, b'\\x00\\x00\\x00\\x02{}')\ndef add(a, b):\n    return None"),
    ]
    async with EventProducer(config.infra, client_id="test") as producer:
        await producer.send_many([("actions", a) for a in actions])
    rewards, audits = await while_staged(config, ("rewards", RewardScored, 10), ("audit", SandboxAudit, 9))
    by_id = {r.rollout.rollout_id: r for r in rewards}
    assert len(rewards) == 10 and len(by_id) == 10
    expected = {
        "g1/0": ("none", 1.0),
        "g1/1": ("none", 0.5),
        "g1/2": ("syntax", -0.5),
        "g1/3": ("timeout", -0.2),
        "g2/0": ("timeout", -0.2),
        "g2/1": ("output_limit", -0.2),
        "g2/2": ("oom", -0.2),
        "g2/3": ("infra", 0.0),
        "g3/1": ("none", 1.0),
        "g3/2": ("tamper", -0.2),  # an object where its answer should be: an attack on the verdict
    }
    assert {k: (r.execution.error_kind, r.reward) for k, r in by_id.items()} == expected
    assert {k: r.outcome for k, r in by_id.items()} == {
        "g1/0": "passed", "g1/1": "failed", "g1/2": "error", "g1/3": "timeout", "g2/0": "timeout", "g2/1": "error",
        "g2/2": "oom", "g2/3": "infra", "g3/1": "passed", "g3/2": "violation"}
    assert by_id["g2/3"].components == {}  # infra: no reward, not a reward of 0
    assert all(a.outcome == by_id[a.rollout_id].outcome for a in audits)
    assert by_id["g1/0"].rollout == actions[0].rollout  # carried through unchanged
    assert sorted(a.rollout_id for a in audits) == sorted(k for k in expected if k != "g2/3")
    assert {a.rollout_id: a.verdict for a in audits}["g2/0"] == "timeout"
    tampered = next(a for a in audits if a.rollout_id == "g3/2")
    assert tampered.verdict == "tamper" and "tamper:protocol" in tampered.violations
    assert by_id["g3/2"].execution.tamper == "protocol"
    letters = await read_topic(config, "actions.dlq", DeadLetter, lambda got: len(got) >= 1, timeout_s=10)
    assert len(letters) == 1 and "no_such_kind" in letters[0].reason
    assert codec(ActionGenerated).decode(letters[0].value).rollout.rollout_id == "g3/0"


async def test_sigkill_mid_batch_then_restart_loses_no_action(
    config: Config, sandbox_image: str, owner: str, tmp_path: Path
):
    config = stage_config(config, sandbox_image, owner, pool_size=2, concurrency=2)
    await ensure_topics(config.infra, ["actions", "rewards", "audit"])
    n = 40
    slow = "import time\ntime.sleep(0.15)\ndef add(a, b):\n    return a + b"
    actions = [
        action(f"k{i // 4}", i % 4, slow if i % 3 else "def add(a, b):\n    return a * b") for i in range(n)
    ]
    async with EventProducer(config.infra, client_id="test") as producer:
        await producer.send_many([("actions", a) for a in actions])
    path = tmp_path / "executor.toml"
    path.write_text(to_toml(config))
    script = (
        "import asyncio, sys\nfrom rollstream.config_load import load_config\nfrom rollstream.consumers.executor.stage import run\n"
        "asyncio.run(run(load_config(sys.argv[1], environ={})))\n"
    )

    def start() -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", script, str(path)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    first = start()
    try:
        partial = await read_topic(config, "rewards", RewardScored, lambda got: len(got) >= 8, timeout_s=90)
        assert 8 <= len(partial) < n, "kill it mid-batch"
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    second = start()
    try:
        wanted = {a.rollout.rollout_id for a in actions}
        rewards = await read_topic(
            config,
            "rewards",
            RewardScored,
            lambda got: {r.rollout.rollout_id for r in got} >= wanted,
            timeout_s=120,
        )
    finally:
        os.kill(second.pid, signal.SIGTERM)
        assert second.wait(timeout=60) == 0  # SIGTERM: finish, commit, exit 0
    by_id: dict[str, set[float]] = {}
    for r in rewards:
        by_id.setdefault(r.rollout.rollout_id, set()).add(r.reward)
    assert set(by_id) == wanted  # every action got a reward
    assert all(len(values) == 1 for values in by_id.values())  # duplicates (if any) agree
    assert {rid: values.pop() for rid, values in by_id.items()} == {
        a.rollout.rollout_id: (1.0 if "time.sleep" in a.completion_text else 0.5)
        for a in actions  # a*b: 0*0 == 0
    }


LEAKS = ("jane.roe@acme-mail.com", "+1 (415) 555-2671", "8.8.4.4", "4111 1111 1111 1111", "AKIAIOSFODNN7EXAMPLE",
         "ghp_abcdefghijklmnopqrstuvwxyz0123456789", "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789ABCD")
PLACEHOLDERS = ("<EMAIL>", "<PHONE>", "<IP_ADDRESS>", "<CREDIT_CARD>", "<SECRET>", "<SECRET>", "<SECRET>")


async def test_personal_data_and_secrets_are_scrubbed_from_what_leaves_the_sandbox(
    config: Config, sandbox_image: str, owner: str
):
    """Each kind printed to stderr reaches ``rewards`` (what the archive sinks) as its placeholder,
    the task's own IP address is kept, and a continuation's observation is scrubbed while the
    model's own turn is not rewritten."""
    config = stage_config(config, sandbox_image, owner)
    await ensure_topics(config.infra, ["actions", "rewards", "audit", "prompts"])
    printed = "; ".join(LEAKS) + "; parsed 93.184.216.34"
    code = f"import sys\nprint({printed!r}, file=sys.stderr)\ndef add(a, b):\n    return a + b"
    tests = ["assert add(1, 2) == 3", "assert add(0, 0) == 0, 'parsed 93.184.216.34'"]
    once = msgspec.structs.replace(action("g9", 0, code), reward=RewardSpec(entry_point="add", tests=tests))
    failing = f"import sys\nprint({printed!r}, file=sys.stderr)\nraise ValueError('no user jane.roe@acme-mail.com')"
    again = msgspec.structs.replace(action("g9", 1, failing), reward=RewardSpec(entry_point="add", tests=tests),
                                    max_turns=2)
    async with EventProducer(config.infra, client_id="test") as producer:
        await producer.send_many([("actions", once), ("actions", again)])
    rewards, prompts = await while_staged(config, ("rewards", RewardScored, 1), ("prompts", PromptIssued, 1))
    tail = rewards[0].execution.stderr_tail
    assert rewards[0].reward == 1.0 and all(leak not in tail for leak in LEAKS), tail
    assert tail.strip() == "; ".join(PLACEHOLDERS) + "; parsed 93.184.216.34"  # the task's own address kept
    continuation = prompts[0].continuation
    assert continuation is not None and all(leak not in continuation.observation for leak in LEAKS)
    assert "<EMAIL>" in continuation.observation and "<SECRET>" in continuation.observation
    assert all(leak not in m.content for m in prompts[0].messages for leak in LEAKS)
    assistant = [m.content for m in continuation.messages if m.role == "assistant"]
    assert assistant == [again.completion_text] and "jane.roe@acme-mail.com" in assistant[0]  # never rewritten


async def test_a_stage_with_a_key_signs_every_verdict_and_audit_record(config: Config, sandbox_image: str, owner: str,
                                                                      tmp_path):
    from rollstream.attest import Keyring, new_keypair
    from rollstream.cli.verify import check_audits, check_verdicts, last_turns
    from rollstream.config import AttestConfig

    private, public, key_id = new_keypair(tmp_path / "keys", "exec-test")
    config = stage_config(config, sandbox_image, owner, attest=AttestConfig(key_file=str(private), key_id=key_id))
    await ensure_topics(config.infra, ["actions", "rewards", "audit"])
    actions = [action("s1", 0, "def add(a, b):\n    return a + b"), action("s1", 1, "def add(a, b):\n    return a - b"),
               msgspec.structs.replace(action("s1", 2, "x"), completion_text="", error="prompt too long")]
    async with EventProducer(config.infra, client_id="test") as producer:
        await producer.send_many([("actions", a) for a in actions])
    rewards, audits = await while_staged(config, ("rewards", RewardScored, 3), ("audit", SandboxAudit, 2))
    keyring = Keyring.load(public)
    assert all(r.attestation is not None and r.attestation.key_id == key_id for r in rewards)
    assert check_verdicts(rewards, last_turns(actions), keyring) == [] and check_audits(audits, keyring) == []
    [one] = [r for r in rewards if r.rollout.rollout_id == "s1/0"]
    assert one.attestation.image.startswith("sha256:") and "+runner:" in one.attestation.runtime
    assert one.reward == 1.0 and one.outcome == "passed"


async def test_an_episode_the_learner_can_no_longer_train_ends_instead_of_continuing(
    config: Config, sandbox_image: str, owner: str
):
    """With the learner's version in Redis 5 and rl.max_staleness 1, a failing turn whose episode
    began at v0 ends (its reward is sent, no continuation), while one that began at v4 goes on."""
    from rollstream.redis import connect
    from rollstream.weights import set_learner_version

    config = stage_config(config, sandbox_image, owner)
    config = msgspec.structs.replace(config, rl=msgspec.structs.replace(config.rl, max_staleness=1))
    await ensure_topics(config.infra, ["actions", "rewards", "audit", "prompts"])
    redis = connect(config.infra.redis_url)
    try:
        await set_learner_version(redis, config.infra.key_prefix, 5)
    finally:
        await redis.aclose()
    wrong = "def add(a, b):\n    return a - b"
    old, fresh = (msgspec.structs.replace(action("st", i, wrong), max_turns=3,
                                          rollout=msgspec.structs.replace(make_rollout("st", i), policy_version_first=v,
                                                                          policy_version_last=v))
                  for i, v in ((0, 0), (1, 4)))
    async with EventProducer(config.infra, client_id="test") as producer:
        await producer.send_many([("actions", old), ("actions", fresh)])
    rewards, prompts = await while_staged(config, ("rewards", RewardScored, 1), ("prompts", PromptIssued, 1))
    assert [r.rollout.sample_index for r in rewards] == [0] and rewards[0].execution.tests_total == 2
    assert [p.continuation.sample_index for p in prompts] == [1]
