"""A learner's trainer on any number of ranks (torchrun, or one plain process), for
test_sharded_checkpoint.py: ``save`` takes one step and checkpoints as the learner stage does (the
sharded format with ranks or a URL, else the single-process one); ``resume`` builds the trainer
from the latest checkpoint. Both then write the whole model and optimizer state (gathered) and
the lineage to OUT (rank 0), to be compared across rank counts.

``[torchrun --nproc-per-node N -m] tests.learner.dist_ckpt save|resume CONFIG.toml OUT.pt``
"""

from __future__ import annotations

import os
import sys
import time

import torch

from rollstream.config_load import load_config
from rollstream.learner import checkpoint as ckpt
from rollstream.learner import sharded_checkpoint as sharded_ckpt
from rollstream.learner.distributed import Leader, init_ranks, serve, shutdown
from rollstream.learner.train import build_trainer
from tests.helpers import group


def full_state(trainer) -> tuple[dict, dict]:  # type: ignore[no-untyped-def]
    """Model and optimizer state, whole (a collective with several ranks), on the CPU."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_state_dict(trainer.model, trainer.optimizer, options=options)


def main() -> None:
    mode, config_path, out = sys.argv[1:4]
    config = load_config(config_path, environ={})
    c = config.learner
    ranks = init_ranks(c)
    leader_rank = ranks is None or ranks.leader
    resume_from = sharded_ckpt.latest_checkpoint(c.checkpoint.dir) if mode == "resume" else None
    trainer, tokenizer, lineage, offsets = build_trainer(config, resume_from, ranks)
    if ranks is not None and not ranks.leader:
        serve(trainer, ranks)
    else:
        handle = Leader(trainer, ranks) if ranks is not None else trainer
        if mode == "save":
            handle.step(group("s1", [1.0, -1.0, 0.5, -0.25, 0.75], seed=1, length=7).rollouts)
            state = ckpt.CheckpointState(step=1, policy_version=1, groups_consumed=1, offsets={0: 5, 2: 9},
                                         lora=c.lora is not None, written_at=time.time())
            extra = {"recent_groups.txt": "s1"}
            if ranks is not None or sharded_ckpt.is_url(c.checkpoint.dir):
                sharded_ckpt.save_checkpoint(c.checkpoint.dir, state, handle, tokenizer=tokenizer, keep=2,
                                             shard_bytes=c.checkpoint.shard_bytes, extra_files=extra)
            else:
                from rollstream.learner.lora import merged_state_dict

                ckpt.save_checkpoint(c.checkpoint.dir, state, model=trainer.model, tokenizer=tokenizer,
                                     optimizer=trainer.optimizer, scheduler=trainer.scheduler,
                                     merged_weights=merged_state_dict(trainer.model) if c.lora else None,
                                     extra_files=extra)
        if ranks is not None:
            handle.close()
    model_state, optim_state = full_state(trainer)
    if leader_rank:
        torch.save({"model": model_state, "optim": optim_state, "lr": trainer.scheduler.get_last_lr(),
                    "lineage": [lineage.step, lineage.version, lineage.groups_consumed, list(lineage.recent)],
                    "offsets": offsets, "resumed_from": resume_from}, out)
    shutdown(ranks)
    # gloo's threads still abort a rank now and then in C++ teardown at interpreter exit ("terminate
    # called without an active exception", SIGABRT: CI 2026-12-05) although every rank met at the
    # barrier: the report is written, so leave without the interpreter's teardown
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
