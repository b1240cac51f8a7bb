"""The TRL side of ``bench/vs_trl.py``, run in a process of its own:
``python bench/vs_trl_trl.py SPEC_JSON``.

Trains TRL 1.16's ``GRPOTrainer`` for ``spec["steps"]`` optimizer steps on the bench's tasks, in
rollstream's epoch-0 order with TRL's shuffle off, scoring through a warm rollstream sandbox
pool (Docker: the executions run outside this process). At each step end it records the time,
this process's CPU seconds, the machine's busy seconds and the step's phases (generate, reward,
the whole generate-and-score phase, no-grad log-prob forwards, the training forward), timed by
wrapping the trainer's own methods; it writes them to ``spec["out"]``.

``bench/learning_vs_trl.py`` uses it too, with more of the spec: ``tasks_file`` (the tasks in the
order to train them, JSONL), ``loss_type``, and ``marks_s`` with ``t0`` and ``checkpoint_dir``: at
the first step end past each mark (seconds since ``t0``, the side's start) the model is saved as a
Hugging Face directory ``checkpoint_dir/mark-I``, and training stops at the step end past the last
mark.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import vs_trl_probe as probe  # noqa: E402


class SandboxScorer:
    """TRL reward function: scores completions through a warm sandbox pool run by an event loop of
    its own (TRL's reward functions are synchronous), with rollstream's executor rules."""

    __name__ = "rollstream_sandbox"

    def __init__(self, tasks: list[Any], concurrency: int = 4) -> None:
        from rollstream.config import ExecutorConfig

        self.tasks = {t.task_id: t for t in tasks}
        self.config = ExecutorConfig(pool_size=concurrency, concurrency=concurrency,
                                     owner=f"bench-vs-trl-{uuid.uuid4().hex[:6]}")
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.pool = self._run(self._open())

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def _open(self) -> Any:
        from rollstream.consumers.executor.pool import DockerSandboxPool

        pool = DockerSandboxPool(self.config)
        await pool.__aenter__()
        return pool

    def __call__(self, prompts: list[Any], completions: list[Any], task_id: list[str], **_: Any) -> list[float]:
        from rollstream.consumers.executor.rewards import default_registry
        from rollstream.consumers.executor.score import evaluate

        registry = default_registry()

        async def score_all() -> list[float]:
            gate = asyncio.Semaphore(self.config.concurrency)

            async def one(i: int) -> float:
                text = completions[i][-1]["content"] if isinstance(completions[i], list) else completions[i]
                async with gate:
                    ev = await evaluate(self.pool, registry, self.tasks[task_id[i]].reward, text, f"trl-{i}")
                return ev.scored.reward
            return await asyncio.gather(*(one(i) for i in range(len(completions))))

        return self._run(score_all())

    def close(self) -> None:
        self._run(self.pool.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def timed(phases: dict[str, float], name: str, method: Any, when: Any = None) -> Any:
    """``method`` that adds its wall time to ``phases[name]`` (only calls where ``when()`` holds)."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            if when is None or when():
                phases[name] += time.perf_counter() - started
    return wrapper


def main(spec: dict[str, Any]) -> None:
    import datasets
    import torch
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from bench.vs_trl import ordered_tasks
    from rollstream.models import load_model, load_tokenizer

    s = spec["settings"]
    if spec.get("tasks_file"):
        from rollstream.tasks.sources import jsonl_tasks

        tasks = jsonl_tasks(Path(spec["tasks_file"]))
    else:
        tasks = ordered_tasks()
    rows = [{"prompt": [{"role": m.role, "content": m.content} for m in t.chat()], "task_id": t.task_id}
            for t in tasks]
    model = load_model("smollm2", dtype=torch.float32)
    tokenizer = load_tokenizer("smollm2")
    scorer = SandboxScorer(tasks)
    phases: dict[str, float] = defaultdict(float)
    records: list[dict[str, Any]] = []

    class Stamp(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            busy, _ = probe.machine_jiffies()
            records.append({"step": state.global_step, "time": time.time(), "cpu_s": time.process_time(),
                            "machine_busy_s": busy / probe.HZ,
                            "phases": {f"{k}_s": v for k, v in phases.items()}})
            for name in phases:
                phases[name] = 0.0
            if marks and saved_marks(state, kwargs):
                control.should_training_stop = True

    marks = list(spec.get("marks_s") or [])
    checkpoints: list[dict[str, Any]] = []

    def saved_marks(state: Any, kwargs: dict[str, Any]) -> bool:
        """Save the model when this step ended past the next mark(s); True once the last mark is passed."""
        elapsed = time.time() - spec["t0"]
        if elapsed < marks[0]:
            return False
        passed = [m for m in marks if m <= elapsed]
        del marks[:len(passed)]
        path = Path(spec["checkpoint_dir"]) / f"mark-{len(checkpoints) + 1}"
        kwargs["model"].save_pretrained(path, safe_serialization=True)
        tokenizer.save_pretrained(path)
        checkpoints.append({"marks_s": passed, "time_s": round(elapsed, 2), "step": state.global_step,
                            "path": str(path), "saved_s": round(time.time() - spec["t0"] - elapsed, 2)})
        return not marks

    args = GRPOConfig(
        output_dir=str(Path(spec["out"]).parent / "trl-output"), per_device_train_batch_size=s["group_size"] *
        s["groups_per_step"], num_generations=s["group_size"], gradient_accumulation_steps=1,
        max_completion_length=s["max_new_tokens"], temperature=s["temperature"], top_p=s["top_p"], top_k=s["top_k"],
        learning_rate=s["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        **({"loss_type": s["loss_type"]} if "loss_type" in s else {}),
        max_grad_norm=s["grad_clip"], beta=s["kl_beta"], epsilon=s["clip_low"], epsilon_high=s["clip_high"],
        scale_rewards="group", shuffle_dataset=False, gradient_checkpointing=spec["gradient_checkpointing"],
        bf16=spec["bf16"], use_cpu=True, max_steps=spec["steps"], logging_steps=1, report_to=[],
        save_strategy="no", seed=s["seed"], dataloader_num_workers=0,
    )
    try:
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[scorer], args=args,
                              train_dataset=datasets.Dataset.from_list(rows), callbacks=[Stamp()])
        trainer._generate_and_score_completions = timed(phases, "score_phase", trainer._generate_and_score_completions)
        trainer._generate = timed(phases, "generate", trainer._generate)
        trainer._calculate_rewards = timed(phases, "reward", trainer._calculate_rewards)
        trainer._get_per_token_logps_and_entropies = timed(
            phases, "nograd_logprob_forward", trainer._get_per_token_logps_and_entropies,
            when=lambda: not torch.is_grad_enabled())
        trainer.compute_loss = timed(phases, "loss_forward", trainer.compute_loss)
        for name in ("score_phase", "generate", "reward", "nograd_logprob_forward", "loss_forward"):
            phases[name] = 0.0
        trainer.train()
    finally:
        scorer.close()
    Path(spec["out"]).write_text(json.dumps({
        "steps": records, "checkpoints": checkpoints, "torch_threads": torch.get_num_threads(), "torch_interop_threads":
        torch.get_num_interop_threads(), "trl_generation": "transformers generate (no vLLM on CPU)",
        "trained_order_first": [t.task_id for t in tasks[:4]]}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
