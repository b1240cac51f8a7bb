"""`rollstream inspect` shows what an execution tried to reach through the egress proxy (pure: a
stand-in for the archive's reader): the allowed hosts in one line, each denied connection with why."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rollstream.cli.records import gather, render
from rollstream.schemas.events import Connection, ExecutionRecord, RewardScored, SandboxAudit, SandboxLimits
from rollstream.testing import make_action, make_prompt
from tests.cli.test_inspect_turns import Archive

pytestmark = pytest.mark.unit


class WithAudit(Archive):
    def files(self):
        return [SimpleNamespace(topic=name) for name in self._events]


def test_inspect_shows_the_connections_an_execution_made() -> None:
    action = make_action("g", 0)
    record = ExecutionRecord(sandbox_id="s", exit_code=0, duration_s=0.1, error_kind="none", tests_passed=1,
                             tests_total=1)
    reward = RewardScored(rollout=action.rollout, reward=1.0, components={"tests": 1.0}, execution=record,
                          executor_id="e", scored_at=2.0)
    limits = SandboxLimits(timeout_s=5, memory_mb=256, pids=64, cpus=1, output_bytes=1024, tmpfs_mb=16)
    audit = SandboxAudit(sandbox_id="s", container_id="c", rollout_id=action.rollout.rollout_id, code_sha256="x",
                         limits=limits, duration_s=0.1, output_bytes=0, verdict="none", executed_at=1.0, connections=[
                             Connection(host="api.test", port=443, method="CONNECT", verdict="allowed", sent=10,
                                        received=20),
                             Connection(host="evil.test", port=80, method="GET", verdict="denied",
                                        reason="evil.test:80 is not in the task's network allowlist")])
    other = SandboxAudit(**{**{f: getattr(audit, f) for f in audit.__struct_fields__}, "rollout_id": "elsewhere/0"})
    found = gather(WithAudit({"prompts": [make_prompt("g", 1)], "actions": [action], "rewards": [reward],
                              "audit": [audit, other]}), "g", None)
    [sample] = found["samples"]
    assert [c["verdict"] for c in sample["connections"]] == ["allowed", "denied"]
    text = render(found)
    assert "egress: 1 connection(s) allowed (api.test:443)" in text
    assert "egress denied: GET evil.test:80: evil.test:80 is not in the task's network allowlist" in text
