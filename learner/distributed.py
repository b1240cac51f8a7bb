"""Several ranks, one learner: torch.distributed (DDP or FSDP2 ``fully_shard``), started by torchrun.

Only rank 0 talks to Kafka and Redis (learner/train.py). For every step it plans the updates
(learner/batch.py ``plan_step``: the step's rollouts split across the ranks by tokens, the
global token and sequence counts as the loss's denominators) and sends the plan to every other
rank as one MessagePack message (:class:`Command`, bytes in a uint8 tensor over a gloo group,
never pickle). Every rank then trains its share (``Trainer.train``): DDP all-reduces and FSDP
reduce-scatters the gradients as a *sum* (each rank's loss already carries the global
denominators), so the update equals the one-rank update up to the order of the additions.
Publishing the weights and checkpointing are collectives too: rank 0 sends the command, every
rank takes part, rank 0 writes.

The ranks other than 0 run :func:`serve`: wait for a command, do it, until ``stop``. When a rank
dies its peers' collectives fail, the whole learner exits, and torchrun (``--max-restarts``)
starts every rank again, which resumes from the last checkpoint (learner/sharded_checkpoint.py).

Nothing here runs with one rank: ``rollstream learner`` without a launcher never initialises
torch.distributed.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
import torch
import torch.distributed as dist

from rollstream.config import LearnerConfig
from rollstream.errors import ConfigError
from rollstream.learner.batch import UpdatePlan, plan_step
from rollstream.schemas.arrays import dec_hook, enc_hook
from rollstream.schemas.events import AdvantagedRollout

log = logging.getLogger(__name__)


@dataclass
class Ranks:
    """This process's place among the learner's ranks and the groups it talks through."""

    rank: int
    world: int
    local_rank: int
    device: torch.device
    backend: str
    control: Any = None  # a gloo group for commands and step figures (CPU tensors, also under NCCL)
    allreduce_seconds: float = 0.0  # DDP: gradient all-reduce time of the running step (its comm hook)
    wrapped: Any = field(default=None, repr=False)  # the DDP wrapper, if any

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def reduce_step(self, loss: float, tokens: int, weighted: dict[str, float], is_max: float,
                    seconds: float) -> tuple[float, int, dict[str, float], float, list[dict[str, float]]]:
        """Every rank's step figures together (sums; the max of ``is_max``), and each rank's own
        (``RANK_FIGURES``: step and all-reduce seconds, device memory and state) on every rank."""
        started = time.perf_counter()
        keys = sorted(weighted)
        sums = torch.tensor([loss, float(tokens), *(weighted[k] for k in keys)], dtype=torch.float64)
        dist.all_reduce(sums, group=self.control)
        top = torch.tensor([is_max], dtype=torch.float64)
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=self.control)
        # FSDP's reduce-scatters overlap the backward and are not timed apart: its figure is the
        # wait here, for the slowest rank (DDP's adds its gradient all-reduces, timed by its hook).
        figures = {"step_seconds": seconds,
                   "allreduce_seconds": self.allreduce_seconds + time.perf_counter() - started,
                   **device_figures(self.device)}
        self.allreduce_seconds = 0.0
        mine = torch.tensor([figures.get(k, float("nan")) for k in RANK_FIGURES], dtype=torch.float64)
        every = [torch.zeros(len(RANK_FIGURES), dtype=torch.float64) for _ in range(self.world)]
        dist.all_gather(every, mine, group=self.control)
        values = sums.tolist()
        report = [{k: float(v) for k, v in zip(RANK_FIGURES, t.tolist()) if v == v} for t in every]  # NaN: none
        return values[0], int(round(values[1])), dict(zip(keys, values[2:])), float(top[0]), report


RANK_FIGURES = ("step_seconds", "allreduce_seconds", "device_memory_allocated_bytes", "device_memory_peak_bytes",
                "device_memory_reserved_bytes", "device_utilization_percent", "device_temperature_celsius")


def device_figures(device: torch.device) -> dict[str, float]:
    """Memory, utilisation and temperature of a CUDA ``device`` (the last two need NVML, through
    pynvml); nothing on a CPU."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return {}
    figures = {"device_memory_allocated_bytes": float(torch.cuda.memory_allocated(device)),
               "device_memory_peak_bytes": float(torch.cuda.max_memory_allocated(device)),
               "device_memory_reserved_bytes": float(torch.cuda.memory_reserved(device))}
    try:
        figures["device_utilization_percent"] = float(torch.cuda.utilization(device))
        figures["device_temperature_celsius"] = float(torch.cuda.temperature(device))
    except (ModuleNotFoundError, RuntimeError, AttributeError) as exc:  # no NVML here
        log.debug("no CUDA utilisation/temperature: %s", exc)
    return figures


def launched_world() -> int:
    """The world size a launcher (torchrun) gave this process; 1 without one."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_ranks(settings: LearnerConfig) -> Ranks | None:
    """Join the launcher's process group; None for one rank (nothing is initialised then)."""
    world = launched_world()
    if world <= 1:
        return None
    if settings.parallel == "none":
        raise ConfigError(f"started as {world} ranks but learner.parallel = 'none': set 'ddp' or 'fsdp'")
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    die_with_launcher()
    bound_heap()
    cuda = settings.device.startswith("cuda")
    device = torch.device(f"cuda:{local_rank}") if cuda else torch.device(settings.device)
    backend = settings.dist_backend if settings.dist_backend != "auto" else ("nccl" if cuda else "gloo")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, **_attempt_store(world))
    control = dist.new_group(backend="gloo") if backend != "gloo" else dist.group.WORLD
    log.info("rank %d of %d (%s, %s, parallel %s)", rank, world, backend, device, settings.parallel)
    return Ranks(rank=rank, world=world, local_rank=local_rank, device=device, backend=backend, control=control)


def _attempt_store(world: int) -> dict[str, Any]:
    """Under torchrun's agent store: the process group's keys under a prefix of this restart
    attempt. torchrun (2.13, --standalone) keeps its store across restarts, and gloo's rendezvous
    would read the dead ranks' addresses left in it (connection refused until the restart fails).
    Other launchers: torch's env:// as it is."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    from datetime import timedelta

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size=world,
                          is_master=False, timeout=timedelta(minutes=10))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefixed = dist.PrefixStore(f"/rollstream/attempt_{attempt}/", store)
    return {"store": prefixed, "rank": int(os.environ["RANK"]), "world_size": world}


def die_with_launcher() -> None:
    """Under torchrun: end this rank when its launcher dies, even by SIGKILL (which it cannot pass
    on), so that a restarted learner never meets a rank 0 of the dead one still consuming."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    import ctypes

    launcher = os.getppid()
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != launcher:  # it died before the request took effect
        os._exit(1)


def bound_heap(threshold: int = 128 << 10) -> None:
    """Return freed large blocks to the system at once (glibc: a fixed mmap threshold). By default
    glibc raises the threshold after each large free, so FSDP's per-layer gather and reduce buffers
    end up in a heap it never shrinks: 1.2 GB more resident memory per rank after two steps of a
    135M model here, most of what sharding saves."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, threshold)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):  # not glibc
        pass


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks (a Hugging Face model names their class in ``_no_split_modules``)."""
    base = getattr(model, "get_base_model", lambda: model)()
    names = set(getattr(base, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ConfigError(f"learner.parallel = 'fsdp': cannot find the blocks of {type(base).__name__} "
                          "(its _no_split_modules names none)")
    return layers


def shard(model: torch.nn.Module, ranks: Ranks) -> torch.nn.Module:
    """FSDP2: every block its own unit, the rest (embeddings, norm, head) the root's. Gradients
    are summed, not averaged (the loss already has the global denominators)."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    for layer in decoder_layers(model):
        fully_shard(layer)
    fully_shard(model)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)
    return model


def replicate(model: torch.nn.Module, ranks: Ranks) -> torch.nn.Module:
    """DDP, with a comm hook that sums the gradients (the default averages) and times it."""
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [ranks.device.index] if ranks.device.type == "cuda" else None
    wrapper = DistributedDataParallel(model, device_ids=device_ids, gradient_as_bucket_view=True)

    def summed(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks real annotations, if any
        started = time.perf_counter()
        future = dist.all_reduce(bucket.buffer(), async_op=True).get_future()

        def done(fut: Any) -> torch.Tensor:
            state.allreduce_seconds += time.perf_counter() - started
            return fut.value()[0]

        return future.then(done)

    wrapper.register_comm_hook(ranks, summed)
    ranks.wrapped = wrapper
    return wrapper


def parallelize(model: torch.nn.Module, ranks: Ranks, mode: str,
                ref_model: torch.nn.Module | None) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module | None]:
    """(model holding the parameters, what the forward is called on, reference model) for ``mode``."""
    model = model.to(ranks.device)
    if ref_model is not None:
        ref_model = ref_model.to(ranks.device)
    if mode == "fsdp":
        model = shard(model, ranks)
        if ref_model is not None:  # frozen, sharded as well: its forwards pair up like the policy's
            ref_model = shard(ref_model, ranks)
        return model, model, ref_model
    if mode == "ddp":
        return model, replicate(model, ranks), ref_model
    raise ConfigError(f"learner.parallel = {mode!r} with {ranks.world} ranks")


# --- commands from rank 0 ------------------------------------------------------------------------


class Command(msgspec.Struct, frozen=True, kw_only=True):
    """What rank 0 asks every rank to do next."""

    op: Literal["resume", "step", "weights", "save", "stop"]
    updates: list[UpdatePlan] = []  # step: the plan
    dtype: str = ""  # weights: the dtype to gather them in ("" = as trained)
    path: str = ""  # save: the checkpoint directory (URL); resume: the checkpoint every rank loads


_encoder = msgspec.msgpack.Encoder(enc_hook=enc_hook)
_decoder = msgspec.msgpack.Decoder(Command, dec_hook=dec_hook)


def send(ranks: Ranks, command: Command) -> None:
    """Rank 0: broadcast ``command`` (its MessagePack bytes) to every rank."""
    data = _encoder.encode(command)
    size = torch.tensor([len(data)], dtype=torch.int64)
    dist.broadcast(size, src=0, group=ranks.control)
    dist.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8), src=0, group=ranks.control)


def receive(ranks: Ranks) -> Command:
    """Ranks > 0: the next command of rank 0."""
    size = torch.zeros(1, dtype=torch.int64)
    dist.broadcast(size, src=0, group=ranks.control)
    data = torch.empty(int(size[0]), dtype=torch.uint8)
    dist.broadcast(data, src=0, group=ranks.control)
    return _decoder.decode(data.numpy().tobytes())


class Leader:
    """Rank 0's handle on the whole learner: the trainer's interface, each call also sent to the
    other ranks, which do their part of it (:func:`serve`)."""

    def __init__(self, trainer: Any, ranks: Ranks) -> None:
        self.trainer, self.ranks = trainer, ranks

    def __getattr__(self, name: str) -> Any:  # model, optimizer, scheduler, settings, ...
        return getattr(self.trainer, name)

    def step(self, rollouts: Sequence[AdvantagedRollout]) -> Any:
        started = time.perf_counter()
        s = self.trainer.settings
        plan = plan_step(rollouts, s.updates_per_step, s.micro_batch, self.ranks.world)
        send(self.ranks, Command(op="step", updates=plan))
        return self.trainer.train(plan, 0, started=started)

    def named_weights(self, dtype: torch.dtype | None) -> Iterator[tuple[str, torch.Tensor]]:
        send(self.ranks, Command(op="weights", dtype=dtype_name(dtype)))
        yield from self.trainer.named_weights(dtype)

    def save_sharded(self, path: str) -> None:
        """Every rank writes its shards of model and optimizer to ``path`` (the caller adds the rest)."""
        from rollstream.learner.sharded_checkpoint import save_shards

        send(self.ranks, Command(op="save", path=path))
        save_shards(path, self.trainer, self.ranks)

    def close(self) -> None:
        send(self.ranks, Command(op="stop"))


def dtype_name(dtype: torch.dtype | None) -> str:
    return "" if dtype is None else str(dtype).removeprefix("torch.")


def serve(trainer: Any, ranks: Ranks) -> None:
    """Ranks > 0: do what rank 0 says until it says stop. SIGTERM is left to rank 0 (torchrun
    sends it to every rank): rank 0 finishes its step and checkpoints, which needs this rank."""
    from rollstream.learner.sharded_checkpoint import save_shards

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        command = receive(ranks)
        if command.op == "stop":
            return
        if command.op == "step":
            trainer.train(command.updates, ranks.rank)
        elif command.op == "weights":
            for _ in trainer.named_weights(getattr(torch, command.dtype) if command.dtype else None):
                pass  # rank 0 keeps them; the gather needs every rank
        elif command.op == "save":
            save_shards(command.path, trainer, ranks)


def shutdown(ranks: Ranks | None, *, settle: bool = True) -> None:
    """Leave the process group. ``settle``: first meet every rank at a barrier, so that no rank
    tears its gloo pairs down while a peer still works (a rank that did aborted at exit with
    "terminate called without an active exception"). Without it (a rank failed, the others may be
    gone): tear down at once, never waiting on a peer that will not come."""
    if ranks is None or not dist.is_initialized():
        return
    if settle:
        dist.barrier(group=ranks.control)
    dist.destroy_process_group()
