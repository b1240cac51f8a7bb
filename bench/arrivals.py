"""Generator arrival traces: how prompts reach the generator in a real multi-turn run, recorded from
its archive and replayed against a transformers backend (``bench/generator.py --continuous``).

A trace keeps, per group, when its first turn was issued (seconds after the run's first), its
chat messages and group size, and per sample the later turns of its episode: the observation
each one carried and how long after that sample's previous turn ended it was issued (the
execution and the stream between). The replay is closed-loop, as the run was: a later turn of a
sample is asked for that long after the replay's own previous turn of that sample ends, its
context being the prompt, the tokens the replay generated and the observation's tokens
(``consumers/generator/turns.py``), so a generator that batches badly delays the turns behind it
as it did in the run. The tokens generated are the replay's own (same seeds in every mode).

    python bench/arrivals.py record RUN_DIR bench/data/chain_arrivals.json
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollstream.consumers.generator.backends.base import Completion, GenerationRequest, Sampling
from rollstream.consumers.generator.backends.sampling import derive_seed
from rollstream.consumers.generator.chat import chat_prompt_ids
from rollstream.consumers.generator.turns import observation_ids


def record(run_dir: Path) -> dict[str, Any]:
    """The trace of a run (its archive under ``run_dir/archive``)."""
    from rollstream.archive import ArchiveStore

    store = ArchiveStore(str(run_dir / "archive"))
    ended: dict[tuple[str, int, int], float] = {}  # (group, sample, turn) -> when its action was made
    for _, action in store.events("actions"):
        ended[(action.rollout.group_id, action.rollout.sample_index, action.turn)] = action.generated_at
    groups: dict[str, dict[str, Any]] = {}
    later: list[tuple[str, int, int, float, str]] = []
    for _, prompt in store.events("prompts"):
        c = prompt.continuation
        if c is None:
            groups.setdefault(prompt.group_id, {
                "group_id": prompt.group_id, "issued_at": prompt.issued_at, "group_size": prompt.group_size,
                "messages": [{"role": m.role, "content": m.content} for m in prompt.messages], "turns": {}})
        else:
            later.append((prompt.group_id, c.sample_index, c.turn, prompt.issued_at, c.observation))
    for group_id, sample, turn, issued_at, observation in sorted(later, key=lambda x: (x[0], x[1], x[2])):
        previous = ended.get((group_id, sample, turn - 1))
        if group_id in groups and previous is not None:
            groups[group_id]["turns"].setdefault(str(sample), []).append(
                {"turn": turn, "delay_s": round(max(0.0, issued_at - previous), 3), "observation": observation})
    ordered = sorted(groups.values(), key=lambda g: g["issued_at"])
    start = ordered[0]["issued_at"] if ordered else 0.0
    for group in ordered:
        group["t"] = round(group.pop("issued_at") - start, 3)
    return {"source": str(run_dir), "groups": ordered,
            "later_turns": sum(len(v) for g in ordered for v in g["turns"].values())}


@dataclass
class Replay:
    """One replay's bookkeeping: every completion, in the order they ended."""

    started: float = field(default_factory=time.monotonic)
    completions: dict[str, Completion] = field(default_factory=dict)  # "group/sample#turn" -> completion
    ended_at: float = 0.0

    @property
    def tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.completions.values())


async def replay(trace: dict[str, Any], tokenizer: Any, sampling: Sampling,
                 generate: Callable[[list[GenerationRequest]], Awaitable[list[Completion]]], *,
                 groups: int | None = None, first_turn_scale: float = 0.0) -> Replay:
    """Play ``trace`` (its first ``groups`` groups) through ``generate``, closed-loop (see the module
    docstring); ``generate`` is called once per arrival: a group's first turn, or one later turn.
    First turns arrive at their recorded offsets times ``first_turn_scale`` (0: all at once, so the
    generator is never idle for want of work and the replay measures its throughput); later turns
    after their recorded delays."""
    result = Replay()
    tasks: list[asyncio.Task[None]] = []

    async def sample_turns(group: dict[str, Any], index: int, context: list[int], first: Completion) -> None:
        generated = list(first.token_ids)
        for turn in group["turns"].get(str(index), []):
            await asyncio.sleep(turn["delay_s"])
            observed = observation_ids(tokenizer, turn["observation"], generated)
            context = context + generated + observed
            seed = derive_seed(0, f"{group['group_id']}#{turn['turn']}", index)
            [done] = await generate([GenerationRequest(f"{group['group_id']}/{index}", context, sampling, seed,
                                                       turn=turn["turn"], more_turns=True)])
            result.completions[f"{group['group_id']}/{index}#{turn['turn']}"] = done
            generated = list(done.token_ids)

    async def play(group: dict[str, Any]) -> None:
        await asyncio.sleep(group["t"] * first_turn_scale)
        prompt = chat_prompt_ids(tokenizer, group["messages"])
        # every group of a trace is a chain's: a turn may follow each (the trace does not say which is
        # an episode's last, so every finished row is kept, as the run's first turns were)
        requests = [GenerationRequest(f"{group['group_id']}/{i}", prompt, sampling, derive_seed(0, group["group_id"], i),
                                      more_turns=True) for i in range(group["group_size"])]
        firsts = await generate(requests)
        for i, done in enumerate(firsts):
            result.completions[f"{group['group_id']}/{i}#1"] = done
        await asyncio.gather(*(sample_turns(group, i, prompt, done) for i, done in enumerate(firsts)))

    for group in trace["groups"][:groups]:
        tasks.append(asyncio.create_task(play(group)))
    await asyncio.gather(*tasks)
    result.ended_at = time.monotonic()
    return result


class OneCallAtATime:
    """The generator stage before continuous batching: arrivals queue, and one generate call at a
    time takes up to ``max_batch_prompts`` of them (waiting ``batch_wait_ms`` for more after the
    first); a call ends when its longest row does."""

    def __init__(self, backend: Any, max_batch_prompts: int = 4, batch_wait_ms: int = 50) -> None:
        self.backend = backend
        self.max_batch_prompts = max_batch_prompts
        self.batch_wait_s = batch_wait_ms / 1000
        self.queue: asyncio.Queue[tuple[list[GenerationRequest], asyncio.Future[list[Completion]]]] = asyncio.Queue()
        self.worker: asyncio.Task[None] | None = None
        self.calls = 0

    async def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        if self.worker is None:
            self.worker = asyncio.create_task(self._work())
        future: asyncio.Future[list[Completion]] = asyncio.get_running_loop().create_future()
        await self.queue.put((requests, future))
        return await future

    async def _work(self) -> None:
        while True:
            batch = [await self.queue.get()]
            deadline = time.monotonic() + self.batch_wait_s
            while len(batch) < self.max_batch_prompts:
                try:
                    batch.append(await asyncio.wait_for(self.queue.get(), max(0.0, deadline - time.monotonic())))
                except TimeoutError:
                    break
            flat: list[GenerationRequest] = [r for requests, _ in batch for r in requests]
            self.calls += 1
            done = await self.backend.generate(flat)
            at = 0
            for requests, future in batch:
                future.set_result(done[at: at + len(requests)])
                at += len(requests)

    async def aclose(self) -> None:
        if self.worker is not None:
            self.worker.cancel()


def same_tokens(a: Replay, b: Replay) -> float:
    """The fraction of completions both replays made with identical tokens."""
    keys = set(a.completions) & set(b.completions)
    same = sum(a.completions[k].token_ids == b.completions[k].token_ids for k in keys)
    return same / max(1, len(set(a.completions) | set(b.completions)))


def main(argv: Sequence[str]) -> None:
    if len(argv) != 3 or argv[0] != "record":
        raise SystemExit("usage: python bench/arrivals.py record RUN_DIR OUT.json")
    trace = record(Path(argv[1]))
    Path(argv[2]).write_text(json.dumps(trace, indent=1) + "\n")
    print(f"{len(trace['groups'])} groups, {trace['later_turns']} later turns -> {argv[2]}")


if __name__ == "__main__":
    main(sys.argv[1:])
