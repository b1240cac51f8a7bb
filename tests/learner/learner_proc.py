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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--step-sleep", type=float, default=0.0)
    args = parser.parse_args()
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.WARNING)

    from rollstream.config import load_config
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
