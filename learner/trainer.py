"""The training step: model, AdamW, LR warm-up, gradient accumulation and clipping. No I/O.

One *step* trains on the rollouts of ``groups_per_step`` groups and advances the policy version
by one. It is split into ``updates_per_step`` mini-batches (one optimizer update each), each into
micro-batches of ``micro_batch`` rollouts whose gradients are accumulated (the loss uses the
mini-batch's token/sequence counts as denominators, so accumulation is exact).

pi_prox is the policy before the step's first update:

* ``updates_per_step == 1`` (default): every forward of the step runs on the pre-update
  weights, so pi_prox is the detached log-prob of the *same* forward (no extra pass; r = 1 and
  the clip is inactive, the IS weight still corrects for the behaviour policy).
* ``updates_per_step > 1``: pi_prox is recomputed for every rollout under ``no_grad`` before
  the first update; later updates see r != 1 and the clip acts.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from rollstream.config import LearnerConfig, OptimConfig
from rollstream.errors import ConfigError
from rollstream.learner.batch import (
    Batch,
    UpdatePlan,
    group_micro_batches,
    idle_batch,
    micro_batches,
    plan_step,
)
from rollstream.learner.lora import iter_merged_weights
from rollstream.learner.loss import get_policy_loss, token_logprobs
from rollstream.registry import Registry
from rollstream.schemas.events import AdvantagedRollout

if TYPE_CHECKING:
    from rollstream.learner.distributed import Ranks

MEAN_STATS = ("clip_frac_low", "clip_frac_high", "is_mean", "is_trunc_frac", "kl", "entropy")


@dataclass
class StepResult:
    loss: float
    grad_norm: float
    tokens: int
    sequences: int
    seconds: float
    lr: float
    stats: dict[str, float]
    ranks: list[dict[str, float]] | None = None  # several ranks: each one's figures (distributed.RANK_FIGURES)


def build_optimizer(model: torch.nn.Module, optim: OptimConfig) -> tuple[torch.optim.Optimizer, object]:
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=optim.lr, weight_decay=optim.weight_decay)
    warmup = optim.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0
    )
    return optimizer, scheduler


class Trainer:
    """Owns the policy's parameters and optimizer; ``step`` is the only thing that changes them.

    One step on two rollouts of a group, outside any stage (a tiny random model here; the learner
    stage builds it with ``learner.setup.build_trainer``)::

        >>> import torch
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> from rollstream.config import LearnerConfig
        >>> from rollstream.learner.trainer import Trainer
        >>> from rollstream.schemas import AdvantagedRollout
        >>> from rollstream.testing import make_rollout
        >>> _ = torch.manual_seed(0)
        >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
        ...                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
        >>> trainer = Trainer(model, LearnerConfig(dtype="float32"))
        >>> batch = [AdvantagedRollout(rollout=make_rollout("g", i), reward=r, advantage=a)
        ...          for i, (r, a) in enumerate([(1.0, 1.0), (0.0, -1.0)])]
        >>> result = trainer.step(batch)
        >>> result.tokens, result.sequences
        (8, 2)
    """

    def __init__(
        self,
        model: torch.nn.Module,
        settings: LearnerConfig,
        *,
        ref_model: torch.nn.Module | None = None,
        pad_id: int = 0,
        device: str | torch.device = "cpu",
        runner: torch.nn.Module | None = None,
        ranks: Ranks | None = None,
    ) -> None:
        self.model = model  # the parameters (FSDP: sharded in place; DDP: the module inside the wrapper)
        self.runner = runner if runner is not None else model  # what the forward is called on (DDP: its wrapper)
        self.ranks = ranks  # None: one rank, no torch.distributed
        self.settings = settings
        try:
            self.policy_loss = get_policy_loss(settings.loss.objective)
        except ValueError as exc:
            raise ConfigError(f"learner.loss.objective: {exc}") from None
        self.ref_model = ref_model
        self.pad_id = pad_id
        self.device = torch.device(device)
        self.optimizer, self.scheduler = build_optimizer(model, settings.optim)
        self.model.train()
        # One rank only: sharing runs two forwards per backward, which DDP's reducer and FSDP's
        # reshard-after-forward do not expect.
        self.share_prefix = settings.prefix_sharing and ranks is None
        self.dtype = getattr(torch, settings.dtype)
        # Called (in the training thread) before every optimizer update: an overlapped publish
        # still reading the weights makes it wait (learner.overlap_publish).
        self.before_update: Callable[[], object] | None = None

    def step(self, rollouts: Sequence[AdvantagedRollout]) -> StepResult:
        """One policy version's worth of training on ``rollouts`` (already filtered for staleness)."""
        started = time.perf_counter()
        s = self.settings
        return self.train(plan_step(rollouts, s.updates_per_step, s.micro_batch, 1), started=started)

    def train(self, plan: Sequence[UpdatePlan], rank: int = 0, *, started: float | None = None) -> StepResult:
        """Train this rank's share (``plan[u].shares[rank]``) of every update of a step. With several
        ranks every rank calls this with the same plan; the loss uses the update's global token and
        sequence counts, gradients are summed across ranks, and the result is the whole step's."""
        started = time.perf_counter() if started is None else started
        s = self.settings
        batches = []
        for update in plan:
            split = group_micro_batches if self.share_prefix else micro_batches
            mini = [b.to(self.device) for b in split(update.shares[rank], s.micro_batch, self.pad_id,
                                                     s.family_loss_weights, s.domain_loss_weights)]
            # Every rank runs as many micro-batches (FSDP's collectives pair up); an idle one adds nothing.
            mini += [idle_batch(self.pad_id, self.device) for _ in range(update.micro_batches - len(mini))]
            batches.append(mini)
        prox = None
        if len(plan) > 1:
            prox = [[self._logprobs_no_grad(self.runner, b) for b in mini] for mini in batches]
        total_loss, norms, weighted, is_max, tokens = 0.0, [], {k: 0.0 for k in MEAN_STATS}, 0.0, 0
        for u, mini in enumerate(batches):
            for m, batch in enumerate(mini):
                with self._gradient_sync(m == len(mini) - 1):
                    loss, stats = self._micro_step(
                        batch, None if prox is None else prox[u][m], plan[u].tokens, plan[u].sequences
                    )
                total_loss += loss
                tokens += int(stats["tokens"])
                is_max = max(is_max, stats["is_max"])
                for key in MEAN_STATS:
                    weighted[key] += stats[key] * stats["tokens"]
            norms.append(self._clip())
            if self.before_update is not None:
                self.before_update()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        lr = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        rank_report = None
        if self.ranks is not None:  # the step's figures are every rank's together
            total_loss, tokens, weighted, is_max, rank_report = self.ranks.reduce_step(
                total_loss, tokens, weighted, is_max, time.perf_counter() - started)
        stats = {k: v / max(tokens, 1) for k, v in weighted.items()}
        stats["is_max"] = is_max
        return StepResult(
            loss=total_loss / len(plan),
            grad_norm=max(norms),
            tokens=tokens,
            sequences=sum(len(share) for update in plan for share in update.shares),
            seconds=time.perf_counter() - started,
            lr=lr,
            stats=stats,
            ranks=rank_report,
        )

    def named_weights(self, dtype: torch.dtype | None) -> Iterator[tuple[str, torch.Tensor]]:
        """The weights to publish (LoRA merged), one tensor at a time (learner/lora.py)."""
        return iter_merged_weights(self.model, dtype)

    def save_sharded(self, location: str) -> None:
        """This rank's shards of model and optimizer (learner/sharded_checkpoint.py)."""
        from rollstream.learner.sharded_checkpoint import save_shards

        save_shards(location, self, self.ranks)

    def _gradient_sync(self, last: bool) -> Any:
        """DDP all-reduces the gradients once per update, at its last micro-batch."""
        no_sync = getattr(self.runner, "no_sync", None)
        return no_sync() if no_sync is not None and not last else contextlib.nullcontext()

    def _clip(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self._params(), self.settings.optim.grad_clip)
        full = getattr(norm, "full_tensor", None)  # FSDP: a DTensor (already the global norm)
        return float(full() if full is not None else norm)

    def _micro_step(
        self, batch: Batch, prox: torch.Tensor | None, step_tokens: int, step_sequences: int
    ) -> tuple[float, dict[str, float]]:
        logprobs, entropy = self._logprobs(self.runner, batch)  # [B, T]
        ref = self._ref_logprobs(batch) if self.settings.loss.kl_beta > 0 else None
        loss, stats = self.policy_loss(
            logprobs,
            logprobs.detach() if prox is None else prox,
            batch.behaviour_logprobs,
            batch.advantages,
            batch.loss_mask,
            self.settings.loss,
            ref_logprobs=ref,
            entropy=entropy,
            step_tokens=step_tokens,
            step_sequences=step_sequences,
            weights=batch.weights,
        )
        loss.backward()
        # A registered loss may report fewer statistics: those it leaves out read 0, its tokens the batch's.
        stats = {"tokens": float(batch.loss_mask.sum()), **dict.fromkeys(MEAN_STATS, 0.0), "is_max": 0.0, **stats}
        return float(loss.detach()), stats

    def _ref_logprobs(self, batch: Batch) -> torch.Tensor:
        """Log-probs under the frozen reference: a separate model, or (LoRA) the base model
        with the adapters switched off, which costs no memory."""
        if self.ref_model is not None:
            return self._logprobs_no_grad(self.ref_model, batch)
        disable = getattr(self.model, "disable_adapter", None)
        if disable is None:
            raise ValueError("kl_beta > 0 needs a reference model (or a LoRA model)")
        with disable():
            return self._logprobs_no_grad(self.runner, batch)

    def _logprobs(self, model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        return completion_logprobs(model, batch, share_prefix=self.share_prefix, dtype=self.dtype)

    def _logprobs_no_grad(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        with torch.no_grad():
            return self._logprobs(model, batch)[0]  # [B, T]

    def _params(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]


def _keeps_logits(model: torch.nn.Module) -> bool:
    """Whether ``model``'s forward takes ``logits_to_keep`` (Hugging Face causal LMs do; a PEFT
    wrapper passes it on to the model it wraps)."""
    model = getattr(model, "module", model)  # DDP's wrapper takes **kwargs; what it wraps decides
    inner = getattr(model, "get_base_model", lambda: model)()
    return "logits_to_keep" in inspect.signature(inner.forward).parameters


def completion_logprobs(model: torch.nn.Module, batch: Batch, *, share_prefix: bool = False,
                        dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """``token_logprobs`` of ``batch`` [B, T] (log-probs, entropy), with the vocabulary projection
    and the log-softmax computed only from the last position before the batch's first generated
    token on: the prompt positions before it get no logits (they would be [*, V] with V = 49152
    for SmolLM2, a quarter to a half of a step's work) and read 0, as position 0 does.
    Models without ``logits_to_keep`` get every position's logits, with the same result.

    ``share_prefix``: the tokens every row has in common before that position (a group's prompt)
    go through the model once, and the rows' remainders attend to its KV cache, expanded to the
    batch (gradients flow back through the expansion, so they are those of the unshared forward).
    ``dtype`` bfloat16: the forward runs under CPU/CUDA autocast (weights stay fp32)."""
    generated = batch.loss_mask.sum(0).nonzero()
    start = max(0, int(generated[0]) - 1) if len(generated) else 0
    length = batch.input_ids.shape[1]
    keeps = _keeps_logits(model)
    prefix = shared_prefix(batch.input_ids, start) if share_prefix and keeps else 0
    with _autocast(batch.input_ids.device, dtype):
        if prefix:
            logits = _prefix_shared_forward(model, batch, prefix, length - start)
        elif keeps:
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                           logits_to_keep=length - start).logits  # [B, T - start, V]
        else:
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, start:]
    logprobs, entropy = token_logprobs(logits, batch.input_ids[:, start:], batch.temperatures)
    if start == 0:
        return logprobs, entropy
    pad = logprobs.new_zeros(logprobs.shape[0], start)
    return torch.cat([pad, logprobs], dim=1), torch.cat([pad, entropy], dim=1)


def shared_prefix(input_ids: torch.Tensor, limit: int) -> int:
    """How many leading tokens every row of ``input_ids`` [B, T] shares, at most ``limit``;
    0 when there is nothing to share (one row, or fewer than 2 common tokens)."""
    if input_ids.shape[0] < 2 or limit < 2:
        return 0
    same = (input_ids[:, :limit] == input_ids[:1, :limit]).all(0)  # [limit]
    differs = (~same).nonzero()
    common = int(differs[0]) if len(differs) else limit
    return common if common >= 2 else 0


def _prefix_shared_forward(model: torch.nn.Module, batch: Batch, prefix: int, keep: int) -> torch.Tensor:
    """Logits [B, keep, V] of the last ``keep`` positions, the first ``prefix`` tokens (shared
    by every row) run once. The prefix's positions get no logits: ``keep <= T - prefix``."""
    rows = batch.input_ids.shape[0]
    head = model(input_ids=batch.input_ids[:1, :prefix], attention_mask=batch.attention_mask[:1, :prefix],
                 use_cache=True, logits_to_keep=1)
    cache = head.past_key_values
    if cache is None:  # a model that keeps no cache in training (gradient checkpointing): no sharing
        return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=keep).logits
    cache.batch_repeat_interleave(rows)  # [1, H, P, D] -> [B, H, P, D], differentiable
    return model(input_ids=batch.input_ids[:, prefix:], attention_mask=batch.attention_mask,
                 past_key_values=cache, use_cache=True, logits_to_keep=keep).logits  # [B, keep, V]


def _autocast(device: torch.device, dtype: torch.dtype) -> Any:
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def sequence_logprob(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Sum of the log-probs of each rollout's generated tokens [B] (for tests and evaluation)."""
    with torch.no_grad():
        return (completion_logprobs(model, batch)[0] * batch.loss_mask).sum(1)


class SimTrainer(Trainer):
    """``learner.backend = "sim"``: a step costs ``learner.backend.per_token_s`` per completion token of its batch
    and changes no weight (no forward, no backward); the scheduler still advances, so checkpoints,
    versions and fates are those of a real run. For capacity planning (docs/capacity.md)."""

    def step(self, rollouts: Sequence[AdvantagedRollout]) -> StepResult:
        started = time.perf_counter()
        tokens = sum(len(r.rollout.completion_token_ids) for r in rollouts)
        time.sleep(self.settings.backend.per_token_s * tokens)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()  # no gradients: no parameter moves (it keeps the scheduler's order of calls)
        self.scheduler.step()
        return StepResult(loss=0.0, grad_norm=0.0, tokens=tokens, sequences=len(rollouts),
                          seconds=time.perf_counter() - started, lr=lr,
                          stats={**dict.fromkeys(MEAN_STATS, 0.0), "is_max": 1.0})


# Learner backends by their config tag (``learner.backend.kind``): the trainer class a single-process
# learner builds (several ranks always train for real). More register through the entry-point group.
TRAINERS: Registry[type[Trainer]] = Registry("learner backend", "rollstream.learner_backends", "TRAINERS.register",
                                             {"torch": Trainer, "sim": SimTrainer})
