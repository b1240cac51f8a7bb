"""Where a stage's compute runs: the CPU cores its threads may use.

On a machine the generator and the learner share (``rollstream run`` on a laptop or a 2-core
VM), OpenMP threads of two torch processes on the same cores oversubscribe them: a parallel
region waits at its barrier for a thread the kernel has descheduled, and both stages crawl.
Giving each stage cores of its own (``generator.cpus`` / ``learner.cpus``, with
``torch_threads`` no larger than that) avoids it; docs/learner.md ("Thread placement") has the
measurements.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rollstream.errors import ConfigError

if TYPE_CHECKING:
    from rollstream.config import Config

log = logging.getLogger(__name__)


def available() -> set[int]:
    """The cores this process may run on now."""
    return set(os.sched_getaffinity(0))


def pin(cpus: Sequence[int], stage: str) -> None:
    """Restrict every thread of this process (and the threads it starts later) to ``cpus``.
    Empty: leave the placement to the kernel. A core this process may not use is a config error."""
    if not cpus:
        return
    wanted = set(cpus)
    allowed = available()
    if not wanted <= allowed:
        raise ConfigError(f"{stage}.cpus = {sorted(wanted)} names cores this process cannot use "
                          f"(allowed: {sorted(allowed)}); set it to a subset, or [] to let the kernel place it")
    for tid in os.listdir("/proc/self/task"):  # threads inherit their creator's mask: pin the ones already running
        try:
            os.sched_setaffinity(int(tid), wanted)
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile
            continue
    log.info("%s pinned to cores %s", stage, sorted(wanted))


def split(config: Config, cores: Sequence[int], *, generators: int = 1, learner_ranks: int = 1
          ) -> tuple[list[str], str]:
    """Config overrides that give one learner and one generator on this machine disjoint cores
    (the learner the first half, rounded up; the generator the rest), each with as many torch
    threads as cores unless its ``torch_threads`` is set; and a line saying what was chosen, or why
    nothing was. Applies only to torch on CPU for both, one generator and one learner rank,
    neither placed already, and at least two cores."""
    g, lr = config.generator, config.learner
    if g.cpus or lr.cpus:
        return [], "placement: as configured (generator.cpus / learner.cpus)"
    if not (g.backend.kind == "transformers" and g.device == "cpu" and lr.backend.kind == "torch" and lr.device == "cpu"):
        return [], "placement: left to the kernel (the generator or the learner does not compute on this CPU)"
    if generators != 1 or learner_ranks != 1:
        return [], "placement: left to the kernel (more than one generator or learner rank)"
    cores = sorted(cores)
    if len(cores) < 2:
        return [], "placement: left to the kernel (one core)"
    half = (len(cores) + 1) // 2
    learner_cores, generator_cores = cores[:half], cores[half:]
    learner_threads = lr.torch_threads or len(learner_cores)
    generator_threads = min(g.torch_threads or len(generator_cores), len(generator_cores))
    overrides = [f"learner.cpus={learner_cores}", f"generator.cpus={generator_cores}",
                 f"learner.torch_threads={learner_threads}", f"generator.torch_threads={generator_threads}"]
    return overrides, (f"placement: learner on cores {learner_cores} ({learner_threads} torch threads), "
                       f"generator on cores {generator_cores} ({generator_threads}); --placement none to "
                       "leave it to the kernel")
