"""Chaos: kill any stage process at any time, restart it, and lose no group nor train one twice.

The pipeline runs with simulated backends (docs/capacity.md) on a local broker and a Redis of its
own with append-only persistence (``appendfsync always``), two processes per stage where the
stage allows it (generators, executors, stream workers; one sampler, one learner). A random stage
process is SIGKILLed every 15-30 s and started again (the learner with ``--resume``: each kill
costs a consumer-group rebalance), and Redis is killed and restarted once. Then the sampler is
stopped, the pipeline drains, and the accounting reads the topics (``prompts``, ``fates``) and
the stream's set of dropped groups (cli/chaos.py):

* ``lost_groups``: issued, and after the drain neither trained, filtered, dropped as stale nor
  dropped by the stream with a reason. Must be 0.
* ``duplicate_trained_groups``: trained twice in the surviving model lineage (a learner killed
  after a step and before its checkpoint legitimately retrains that step's groups in the next
  lineage). Must be 0.
* ``kills``, ``restarts``, ``groups_trained``, and ``trained_fraction`` = groups trained while the
  kills went on ÷ groups trained in the same time by the same pipeline without kills (>= 0.5).

With ``--learner-ranks N`` the learner trains on N ranks (ddp, the tiny model, under torchrun)
and a quarter of the kills SIGKILL one learner rank instead (``Drill.kill_rank``): torchrun ends
the learner and starts it again, resuming from its checkpoint, without the drill's help.

Usage: ``python bench/chaos.py --quick --json OUT`` (about 5 minutes). The last line printed
holds the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import report
from rollstream.cli.chaos import Drill, PrivateRedis, drill_config, surviving_fates, wait_drained
from rollstream.config_load import load_config
from rollstream.infra import free_port, start_broker, stop_pid


def trained_by(fates: list[Any], until: float) -> int:
    return len({f.group_id for f in surviving_fates(fates) if f.fate == "trained" and f.decided_at <= until})


def phase(work: Path, name: str, bootstrap: str, redis: PrivateRedis, model: Path, seconds: float, *,
          chaos: bool, rng: random.Random, every: tuple[float, float], max_turns: int = 1,
          learner_ranks: int = 1) -> dict[str, Any]:
    config_path = drill_config(work, name, bootstrap, redis.url, model, max_turns=max_turns,
                               learner_ranks=learner_ranks)
    config = load_config(str(config_path))
    drill = Drill(config_path, work / name / "logs")
    drill.start_all()
    redis_restarted = False
    try:
        started = time.monotonic()
        next_kill = started + rng.uniform(*every)
        while time.monotonic() - started < seconds:
            time.sleep(0.5)
            drill.check_alive()
            if chaos and time.monotonic() >= next_kill:
                if learner_ranks > 1 and rng.random() < 0.25:  # one learner rank, mid-step or not
                    print(f"[{time.monotonic() - started:5.0f} s] killed learner rank {drill.kill_rank(rng)}",
                          flush=True)
                else:
                    victim = drill.kill_random(rng)
                    print(f"[{time.monotonic() - started:5.0f} s] killed {victim.name}", flush=True)
                next_kill = time.monotonic() + rng.uniform(*every)
            if chaos and not redis_restarted and time.monotonic() - started > seconds / 2:
                redis.restart()
                redis_restarted = True
                print(f"[{time.monotonic() - started:5.0f} s] restarted Redis", flush=True)
        active_end = time.time()
        drill.stop(("sampler",))
        result = asyncio.run(wait_drained(config, timeout_s=180, learner_runs=drill.learner_runs_expected()))
    finally:
        drill.stop()
    figures = result.figures()
    figures.update(kills=drill.kills, restarts=drill.restarts, trained_in_time=trained_by(result.fates, active_end),
                   killed=dict(drill.killed), lost=result.lost[:20], duplicates=result.duplicate_trained[:20])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two 100 s phases (about 5 minutes in all)")
    parser.add_argument("--seconds", type=float, default=None, help="length of each phase (default 300; quick 100)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--multi-turn", action="store_true",
                        help="episodes of up to 2 turns (the executor's feedback between them)")
    parser.add_argument("--learner-ranks", type=int, default=1,
                        help="train with this many learner ranks (ddp, the tiny model); the kills then include "
                             "single ranks (torchrun restarts the learner)")
    parser.add_argument("--json", dest="json_out", help="write the headline figures here")
    args = parser.parse_args()
    seconds = args.seconds or (100.0 if args.quick else 300.0)
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="rollstream-chaos-"))
    from rollstream.testing import make_tiny_model_dir

    model = make_tiny_model_dir(work / "tiny", max_positions=2048)
    port = free_port()
    broker = start_broker(port, work / "broker.log")
    redis = PrivateRedis(work / "redis", free_port())
    redis.start()
    try:
        bootstrap = f"127.0.0.1:{port}"
        turns = 2 if args.multi_turn else 1
        calm = phase(work, "calm", bootstrap, redis, model, seconds, chaos=False, rng=rng, every=(15, 30),
                     max_turns=turns, learner_ranks=args.learner_ranks)
        print(f"without kills: {calm['trained_in_time']} groups trained in {seconds:.0f} s", flush=True)
        storm = phase(work, "storm", bootstrap, redis, model, seconds, chaos=True, rng=rng, every=(15, 30),
                      max_turns=turns, learner_ranks=args.learner_ranks)
        print(f"with {storm['kills']} kills: {storm['trained_in_time']} groups trained; lost {storm['lost']}, "
              f"trained twice {storm['duplicates']}", flush=True)
    finally:
        redis.kill()
        stop_pid(broker.pid)
        shutil.rmtree(work, ignore_errors=True)
    report({
        "seconds": seconds,
        "max_turns": turns,
        "killed": storm["killed"],
        "groups_issued": storm["groups_issued"],
        "groups_filtered": storm["groups_filtered"],
        "groups_dropped_by_stream": storm["groups_dropped_by_stream"],
        "groups_dead_lettered": storm["groups_dead_lettered"],
        "learner_runs": storm["learner_runs"],
        "turns_continued": storm["turns_continued"],
        "kills": storm["kills"],
        "restarts": storm["restarts"],
        "groups_trained": storm["groups_trained"],
        "trained_fraction": round(storm["trained_in_time"] / max(calm["trained_in_time"], 1), 3),
        "lost_groups": storm["lost_groups"],
        "duplicate_trained_groups": storm["duplicate_trained_groups"],
    }, args.json_out)


if __name__ == "__main__":
    main()
