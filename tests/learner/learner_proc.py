"""Runs the learner stage in its own process, for the crash/resume test.

``python -m tests.learner.learner_proc CONFIG.toml [--resume] [--step-sleep S]``: ``--step-sleep``
slows every optimizer step down so the test can SIGKILL the process between checkpoints.
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

    from rollstream.config_load import load_config
    from rollstream.learner import train
    from rollstream.learner.trainer import Trainer

    if args.step_sleep:
        original = Trainer.step

        def slow_step(self, rollouts):  # type: ignore[no-untyped-def]
            result = original(self, rollouts)
            time.sleep(args.step_sleep)
            return result

        Trainer.step = slow_step  # type: ignore[method-assign]
    asyncio.run(train.run(load_config(args.config, environ={}), resume=args.resume))


if __name__ == "__main__":
    main()
