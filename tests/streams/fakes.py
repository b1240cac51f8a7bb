"""Builders of RewardScored events for the stream's tests and its benchmark."""

from __future__ import annotations

import time

from schemas import ExecutionRecord, RewardScored, Rollout


def make_reward(
    group_id: str,
    sample_index: int,
    reward: float,
    *,
    group_size: int = 4,
    task_id: str = "task-0",
    family: str = "fam",
    completion_tokens: int = 16,
) -> RewardScored:
    rollout = Rollout(
        rollout_id=f"{group_id}/{sample_index}",
        group_id=group_id,
        sample_index=sample_index,
        group_size=group_size,
        task_id=task_id,
        family=family,
        prompt_token_ids=list(range(1, 17)),
        completion_token_ids=list(range(100, 100 + completion_tokens)),
        behaviour_logprobs=[-0.5] * completion_tokens,
        policy_version_first=0,
        policy_version_last=0,
        issued_policy_version=0,
        finish_reason="stop",
    )
    return RewardScored(
        rollout=rollout,
        reward=reward,
        components={"tests": reward},
        execution=ExecutionRecord(sandbox_id="sb", exit_code=0, duration_s=0.01, error_kind="none"),
        executor_id="fake",
        scored_at=time.time(),
    )
