"""A multi-turn episode end to end, on the real broker and real Docker sandboxes: a scripted policy
(each sample's answers in turn: the task's reference solution, the suite's wrong solution) fails
turn 1, gets the executor's observation back as a continuation, and passes turn 2. The final
reward carries the whole trajectory: turn 1's tokens, the observation's (masked out), turn 2's;
the behaviour log-probs of the model's tokens; the reward less the per-turn penalty."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec
import pytest

from rollstream.config import Config, ExecutorConfig, ScriptedConfig
from rollstream.consumers.executor import stage as executor
from rollstream.consumers.generator import stage as generator
from rollstream.consumers.generator.backends.scripted import LOGPROB
from rollstream.consumers.generator.turns import observation_ids
from rollstream.kafka import EventProducer, ensure_topics
from rollstream.models import load_tokenizer
from rollstream.schemas.events import ActionGenerated, Message, PromptIssued, RewardScored
from rollstream.tasks.sources import load_tasks
from rollstream.testing import make_tiny_model_dir
from tests.helpers import read_events

pytestmark = pytest.mark.e2e
TASK = "bits/bit_length"  # its reference passes; the suite's wrong solution for it fails a test


def scripted(config: Config, tmp_path: Path, sandbox_image: str, owner: str) -> tuple[Config, Path]:
    """The scripted generator on a tiny model with room for several turns, and Docker sandboxes."""
    model = make_tiny_model_dir(tmp_path / "tiny", max_positions=2048)
    return msgspec.structs.replace(
        config, generator=msgspec.structs.replace(config.generator, backend=ScriptedConfig(), model=str(model)),
        executor=ExecutorConfig(image=sandbox_image, owner=owner, pool_size=2, concurrency=2)), model


@asynccontextmanager
async def running(config: Config, prompt: PromptIssued) -> AsyncIterator[None]:
    """``prompt`` on ``prompts``, a generator and an executor running until the block ends."""
    await ensure_topics(config.infra, ["prompts", "actions", "rewards", "audit"])
    async with EventProducer(config.infra, client_id="test") as producer:
        await producer.send("prompts", prompt)
    stop = asyncio.Event()
    stages = [asyncio.create_task(generator.run(config, stop=stop)),
              asyncio.create_task(executor.run(config, stop=stop))]
    try:
        yield
        assert not any(s.done() for s in stages)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*stages), 60)


async def test_fail_turn_one_read_the_observation_pass_turn_two(config: Config, tmp_path: Path,
                                                                 sandbox_image: str, owner: str) -> None:
    config, tiny_model_dir = scripted(config, tmp_path, sandbox_image, owner)
    [task] = [t for t in load_tasks(config.sampler.sources) if t.task_id == TASK]
    reward = msgspec.structs.replace(task.reward, turn_penalty=0.1)
    prompt = PromptIssued(group_id="mt", task_id=TASK, family=task.family, messages=task.chat(), group_size=2,
                          reward=reward, max_turns=2, issued_policy_version=0, issued_at=0.0)
    async with running(config, prompt):
        rewards = await read_events(config.infra, "rewards", RewardScored, lambda got: len(got) >= 2, 120)
        prompts = await read_events(config.infra, "prompts", PromptIssued, lambda got: len(got) >= 2, 10)
        actions = await read_events(config.infra, "actions", ActionGenerated, lambda got: len(got) >= 3, 10)
    by_id = {r.rollout.rollout_id: r for r in rewards}
    assert sorted(by_id) == ["mt/0", "mt/1"] and len(rewards) == 2

    # sample 0 passed at once: one turn, no mask (every token the model's), no penalty
    first = by_id["mt/0"]
    assert first.execution.passed and first.reward == 1.0 and first.rollout.generated_mask is None

    # sample 1 failed turn 1: the executor sent one continuation for it, with what went wrong
    [continuation] = [p for p in prompts if p.continuation is not None]
    c = continuation.continuation
    assert (continuation.group_id, c.sample_index, c.turn, continuation.max_turns) == ("mt", 1, 2, 2)
    assert "tests passed" in c.observation and "Failed: assert" in c.observation
    assert continuation.messages == [Message(role="user", content=c.observation)]
    turns = {(a.rollout.sample_index, a.turn): a for a in actions}
    assert sorted(turns) == [(0, 1), (1, 1), (1, 2)]
    turn1, turn2 = turns[(1, 1)], turns[(1, 2)]
    assert "len(bin(n))" in turn1.completion_text and "len(bin(n))" not in turn2.completion_text
    assert list(c.completion_token_ids) == list(turn1.rollout.completion_token_ids)
    assert c.policy_versions == [0] and turn2.policy_versions == [0]  # every version used, recorded

    # the episode's reward: turn 2 passed, less one turn's penalty; the whole trajectory
    second = by_id["mt/1"]
    assert second.execution.passed and abs(second.reward - 0.9) < 1e-9
    tokenizer = load_tokenizer(str(tiny_model_dir))
    one = list(turn1.rollout.completion_token_ids)
    observed = observation_ids(tokenizer, c.observation, one)
    two = list(turn2.rollout.completion_token_ids)[len(one) + len(observed):]
    rollout = second.rollout
    assert rollout == turn2.rollout  # carried unchanged from the generator
    assert list(rollout.prompt_token_ids) == list(turn1.rollout.prompt_token_ids)
    assert list(rollout.completion_token_ids) == one + observed + two and two
    assert list(rollout.generated_mask) == [1] * len(one) + [0] * len(observed) + [1] * len(two)
    assert list(rollout.behaviour_logprobs) == [LOGPROB] * len(one) + [0.0] * len(observed) + [LOGPROB] * len(two)
    assert tokenizer.decode(two, skip_special_tokens=True) == turn2.completion_text
    assert "<|im_start|>user" in tokenizer.decode(observed)  # the observation is a user turn of the template


async def test_a_subtask_chain_is_built_step_by_step_with_the_code_carried(config: Config, tmp_path: Path,
                                                                         sandbox_image: str, owner: str) -> None:
    """The scripted policy answers each step of a built-in chain with that step's reference: the
    executor tests each turn on its step with the earlier steps' code before it, hands out the next
    step, and rewards the episode by its progress less the turns it took."""
    config, _ = scripted(config, tmp_path, sandbox_image, owner)
    [task] = [t for t in load_tasks(config.sampler.sources) if t.task_id == "chains/stack"]
    steps = len(task.reward.subtasks)
    prompt = PromptIssued(group_id="ch", task_id=task.task_id, family=task.family, messages=task.chat(),
                          group_size=1, reward=msgspec.structs.replace(task.reward, turn_penalty=0.05),
                          max_turns=task.max_turns, issued_policy_version=0, issued_at=0.0)
    async with running(config, prompt):
        rewards = await read_events(config.infra, "rewards", RewardScored, lambda got: len(got) >= 1, 120)
        actions = await read_events(config.infra, "actions", ActionGenerated, lambda got: len(got) >= steps, 10)
        prompts = await read_events(config.infra, "prompts", PromptIssued, lambda got: len(got) >= steps, 10)
    [reward] = rewards
    assert reward.components == {"progress": 1.0} and abs(reward.reward - (1.0 - 0.05 * (steps - 1))) < 1e-9
    assert [(a.turn, a.subtask_index) for a in actions] == [(i + 1, i) for i in range(steps)]
    handed = [p.continuation for p in prompts if p.continuation is not None]
    assert [c.subtask_index for c in handed] == list(range(1, steps))
    for c, subtask in zip(handed, task.reward.subtasks[1:]):
        assert subtask.instruction in c.observation
    # the code carried into the last step is every earlier step's, in order
    assert all(s.reference.strip() in handed[-1].carried_code for s in task.reward.subtasks[:-1])
    mask = list(reward.rollout.generated_mask)
    assert mask[0] == 1 and 0 in mask and mask[-1] == 1  # model turns with observations between them


READER = "def recall():\n    return open('notes.txt').read()\n"  # the task's reference: reads what turn 1 wrote
WRITER = "open('notes.txt', 'w').write('remembered')\n\ndef recall():\n    return 'not yet'\n"


async def test_the_files_an_episode_wrote_are_there_in_its_next_turn_and_no_other(
        config: Config, tmp_path: Path, sandbox_image: str, owner: str) -> None:
    """Sample 0 writes notes.txt in turn 1 (and fails), then reads it in turn 2 and passes. Sample 1
    reads first, in the same sandboxes, and fails: another episode's file is not there."""
    import json

    tasks, answers = tmp_path / "tasks.jsonl", tmp_path / "answers.jsonl"
    tasks.write_text(json.dumps({"task_id": "ws/recall", "family": "ws", "prompt": "Write recall().",
                                 "reference_solution": READER, "max_turns": 2,
                                 "reward": {"tests": ["assert recall() == 'remembered'"]}}) + "\n")
    answers.write_text(json.dumps({"task_id": "ws/recall", "completion": WRITER}) + "\n")
    config, _ = scripted(config, tmp_path, sandbox_image, owner)
    config = msgspec.structs.replace(
        config, sampler=msgspec.structs.replace(config.sampler, sources=[f"jsonl:{tasks}"]),
        generator=msgspec.structs.replace(config.generator, backend=ScriptedConfig(answers=str(answers))))
    [task] = load_tasks(config.sampler.sources)
    # answers in order: [READER, WRITER]; sample i, turn t gets answer (i + t - 1) mod 2
    prompt = PromptIssued(group_id="ws", task_id=task.task_id, family=task.family, messages=task.chat(), group_size=2,
                          reward=task.reward, max_turns=2, issued_policy_version=0, issued_at=0.0)
    async with running(config, prompt):
        rewards = await read_events(config.infra, "rewards", RewardScored, lambda got: len(got) >= 2, 120)
        prompts = await read_events(config.infra, "prompts", PromptIssued, lambda got: len(got) >= 3, 10)
    by_id = {r.rollout.rollout_id: r for r in rewards}
    writer_first, reader_first = by_id["ws/1"], by_id["ws/0"]
    assert writer_first.execution.passed  # turn 2 read what its own turn 1 wrote
    assert not reader_first.execution.passed  # never saw the other episode's notes.txt
    carried = {p.continuation.sample_index: p.continuation.workspace for p in prompts if p.continuation is not None}
    assert [(f.path, f.data) for f in carried[1]] == [("notes.txt", b"remembered")]
    assert carried[0] == []  # the reader wrote nothing
