"""Runs the learner stage in its own process, for the crash/resume test.

``python -m tests.learner.learner_proc CONFIG.toml [--resume] [--step-sleep S]``: ``--step-sleep``
slows every optimizer step down so the test can SIGKILL the process between checkpoints. Under
torchrun every rank runs it (learner.parallel ddp or fsdp).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time


def crash_points(args: argparse.Namespace) -> None:
    """``--kill-after-publishing V``: the process SIGKILLs itself right after it published policy
    version V (a crash at a known point: after a step's weights went out, before the next
    checkpoint). ``--term-after-step S``: it sends itself SIGTERM right after step S was logged
    (a stop request while the run goes on)."""
    import os
    import signal

    from rollstream.learner import checkpoint, publish

    if args.kill_after_publishing is not None:
        publish_version = publish.set_learner_version

        async def publish_then_die(client, infra, version: int) -> None:  # type: ignore[no-untyped-def]
            await publish_version(client, infra, version)
            if version == args.kill_after_publishing:
                os.kill(os.getpid(), signal.SIGKILL)

        publish.set_learner_version = publish_then_die  # type: ignore[assignment]
    if args.term_after_step is not None:
        append = checkpoint.append_step_log

        def log_then_stop(root, record):  # type: ignore[no-untyped-def]
            append(root, record)
            if record["step"] == args.term_after_step:
                os.kill(os.getpid(), signal.SIGTERM)

        checkpoint.append_step_log = log_then_stop  # type: ignore[assignment]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--kill-after-publishing", type=int, default=None, metavar="VERSION")
    parser.add_argument("--term-after-step", type=int, default=None, metavar="STEP")
    parser.add_argument("--step-sleep", type=float, default=0.0)
    args = parser.parse_args()
    crash_points(args)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.WARNING)

    from rollstream.config_load import load_config
    from rollstream.learner import train
    from rollstream.learner.trainer import Trainer

    if args.step_sleep:  # Trainer.train: what every rank runs for a step (one rank: inside Trainer.step)
        original = Trainer.train

        def slow_train(self, *a, **kw):  # type: ignore[no-untyped-def]
            result = original(self, *a, **kw)
            time.sleep(args.step_sleep)
            return result

        Trainer.train = slow_train  # type: ignore[method-assign]
    asyncio.run(train.run(load_config(args.config, environ={}), resume=args.resume))


if __name__ == "__main__":
    main()
