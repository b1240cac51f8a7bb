"""The executor's scrubbing of its outgoing records (consumers/executor/scrub.py), without Docker."""

from __future__ import annotations

import time

import msgspec
import pytest

from rollstream.consumers.executor.scrub import Scrubber
from rollstream.metrics import StageMetrics
from rollstream.schemas.events import (
    ExecutionRecord,
    RewardScored,
    RewardSpec,
    SandboxAudit,
    SandboxLimits,
    TestResult,
)
from rollstream.testing import make_rollout

pytestmark = pytest.mark.unit

SPEC = RewardSpec(entry_point="parse", tests=["assert parse('93.184.216.34') == 4"])


def scored(stderr: str, message: str = "") -> RewardScored:
    record = ExecutionRecord(sandbox_id="s", exit_code=0, duration_s=0.1, error_kind="none", stderr_tail=stderr,
                             error_message=message)
    return RewardScored(rollout=make_rollout("g", 0), reward=1.0, components={}, execution=record, executor_id="e",
                        scored_at=time.time())


def count(metrics: StageMetrics, kind: str) -> float:
    return metrics.registry.get_sample_value("rollstream_executor_scrubbed_total", {"kind": kind}) or 0.0


def test_each_kind_is_replaced_and_counted_and_the_task_s_text_is_kept() -> None:
    metrics = StageMetrics("executor")
    scrubber = Scrubber(metrics)
    reward = scored("mail a.b@corp-mail.com, key AKIAIOSFODNN7EXAMPLE, from 8.8.4.4 and 93.184.216.34",
                    "ValueError: no card 4111 1111 1111 1111")
    out = scrubber.reward(reward, SPEC)
    assert out.execution.stderr_tail == "mail <EMAIL>, key <SECRET>, from <IP_ADDRESS> and 93.184.216.34"
    assert out.execution.error_message == "ValueError: no card <CREDIT_CARD>"
    assert {k: count(metrics, k) for k in ("EMAIL", "SECRET", "IP_ADDRESS", "CREDIT_CARD", "PHONE")} == {
        "EMAIL": 1, "SECRET": 1, "IP_ADDRESS": 1, "CREDIT_CARD": 1, "PHONE": 0}
    assert out.rollout == reward.rollout and out.reward == reward.reward


def test_clean_records_pass_untouched_and_scrub_false_turns_it_off() -> None:
    clean = scored("Traceback (most recent call last):\n  line 3\nAssertionError: 12 != 13")
    assert Scrubber().reward(clean, SPEC) is clean
    leaky = scored("token ghp_abcdefghijklmnopqrstuvwxyz0123456789")
    assert Scrubber(enabled=False).reward(leaky, SPEC) is leaky
    audit = SandboxAudit(sandbox_id="s", container_id="c", rollout_id="g/0", code_sha256="x",
                         limits=SandboxLimits(timeout_s=1, memory_mb=1, pids=1, cpus=1, output_bytes=1, tmpfs_mb=1),
                         duration_s=0.1, output_bytes=0, verdict="violation", executed_at=time.time(),
                         violations=["judge_failed:bad reply from 8.8.4.4", "stray_processes:2"])
    out = Scrubber().audit(audit, SPEC)
    assert out.violations == ["judge_failed:bad reply from <IP_ADDRESS>", "stray_processes:2"]
    assert msgspec.structs.replace(out, violations=audit.violations) == audit


async def test_the_stage_s_path_scrubs_off_the_event_loop_only_what_the_prefilter_passes() -> None:
    scrubber = Scrubber()
    clean = scored("ok: 3 items")
    assert await scrubber.outgoing(clean, [], SPEC) == (clean, [])
    leaky = scored("from 8.8.4.4")
    reward, audits = await scrubber.outgoing(leaky, [], SPEC)
    assert reward.execution.stderr_tail == "from <IP_ADDRESS>" and audits == []


async def test_each_test_s_result_message_is_scrubbed_and_the_rest_of_it_kept() -> None:
    """A failing assert's message carries both sides it compared: what the completion returned
    (an address it printed back, a key it leaked) is scrubbed there as in the tails; the task's
    own text, the other fields and the clean results stay as they were."""
    metrics = StageMetrics("executor")
    results = [TestResult(index=0, outcome="passed", duration_s=0.001),
               TestResult(index=1, outcome="failed", error_type="AssertionError", duration_s=0.002,
                          message="assert 'mail a.b@corp-mail.com from 93.184.216.34' == 4", node_id="t.py::test_b"),
               TestResult(index=2, outcome="failed", error_type="AssertionError", message="assert 12 == 13")]
    record = ExecutionRecord(sandbox_id="s", exit_code=0, duration_s=0.1, error_kind="none", tests_passed=1,
                             tests_total=3, test_results=results)
    leaky = RewardScored(rollout=make_rollout("g", 0), reward=1 / 3, components={}, execution=record,
                         executor_id="e", scored_at=time.time())
    reward, _ = await Scrubber(metrics).outgoing(leaky, [], SPEC)  # the prefilter reads the messages too
    out = reward.execution.test_results
    assert out[1].message == "assert 'mail <EMAIL> from 93.184.216.34' == 4" and count(metrics, "EMAIL") == 1
    assert msgspec.structs.replace(out[1], message=results[1].message) == results[1]
    assert out[0] is results[0] and out[2] is results[2]
    assert msgspec.structs.replace(reward.execution, test_results=results) == record
