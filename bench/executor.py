"""Executor fast path vs a fresh hardened container per execution.

Measures, in one run, with the same image, limits and hardening:

* ``executions_per_s``: a small function checked by 3 asserts, run through the warm pool
  (consumers/executor/pool.py: one fork of the in-container runner per execution, fed over the attach
  stream), ``--concurrency`` executions in flight over ``--pool-size`` containers;
* ``baseline_executions_per_s``: the same program (code + the 3 asserts) in a fresh container per
  execution (create, attach, start, wait, remove: what ``docker run --rm`` does), same concurrency;
* ``speedup`` = executions_per_s / baseline_executions_per_s.

Usage: ``python bench/executor.py --quick --json OUT`` (needs dockerd and the sandbox image:
``rollstream sandbox build --offline``). Starts only containers labelled with its own owner label
and removes them at the end. The last line printed is the JSON of the headline figures.

``--against REV`` measures the fast path only, this checkout against commit REV, in one run:
``python bench/executor.py --quick --against 2ebca11 --json OUT``. REV is checked out into a
temporary worktree (removed at the end, also on Ctrl-C); the sides alternate, this checkout then REV,
``--rounds`` times (A B A B by default), each in a child process whose ``PYTHONPATH`` (and working
directory) is that side's tree, so that the pool and the runtime it copies into the container
(consumers/executor/runtime/) are that tree's; the child reports where its sandbox module and runtime
came from and the run stops if they are not under the tree meant. Both sides do the same work: this
file's ``fast_path`` (same code, 3 asserts, executions, pool size, concurrency, image, limits; warmed up
first), using only the pool API every revision has (``ExecutorConfig``, ``DockerSandboxPool``, ``Job``),
each child with an owner label of its own, its containers removed when it ends (``--sign``: this
checkout also signs each execution's verdict and audit record, as an executor with a key does, and
``signing_us_per_execution`` says what that costs here). Reported:
``executions_per_s`` (this checkout) and ``against_executions_per_s`` (REV), each the median over the
rounds, ``executions_per_s_ratio`` = their ratio (target >= 0.9 against 2ebca11), the per-round figures
and ratios, ``against`` (the full hash), ``all_passed`` (every execution passed its 3 asserts on both
sides) and the machine's load average at the start. The last line printed holds the figures.

``--runtime runsc`` measures the warm pool under runc and under gVisor's runsc in one run
(``python bench/executor.py --quick --runtime runsc --json OUT``; runsc registered with dockerd:
`rollstream sandbox doctor`): the same fast path (same code, 3 asserts, executions, pool size,
concurrency), sides alternating ``--rounds`` times, each side a warm pool (no container per
execution). Reported: ``executions_per_s`` (runc) and ``executions_per_s_runsc``, each the median
over the rounds, ``runsc_ratio``, and ``container_ready_s`` (one container created, started and its
runner ready) per runtime.

``--forms`` measures the warm pool on the same 3 checks written as an assert list and as a pytest
file (``kind = "python_pytest"``: 3 test functions, run by the judge with pytest), sides alternating
``--rounds`` times: ``executions_per_s`` (assert list), ``executions_per_s_pytest`` and
``pytest_ratio`` (``python bench/executor.py --quick --forms --rounds 4 --json OUT``).

``--math`` measures the ``math_answer`` kind (docs/tasks.md, "Math answers"; no Docker): completions scored
through ``MathAnswer.check``, the executor's own path, over a real :class:`MathPool` (its worker processes
under RLIMIT_AS, a timeout per answer), ``--math-workers`` of them (default: the executor's, min(4, cpus)),
as many checks in flight as there are workers (``python bench/executor.py --math --quick --json OUT``). The
mix, for each task of the built-in math suite (``suite:math``): its reference solution and its wrong solution;
model-style variants of the right answer worded around the reference's working (as a decimal, exact or
rounded to 4 places; as ``\\frac``/``\\dfrac`` where the gold is a fraction; ``x = n`` for an equation;
thousands grouped as ``5{,}040``; "The answer is n." under the ``the_answer_is`` rule); the answer stated
without the box the task asks for; and a hedge (``\\boxed{gold} or \\boxed{wrong}``). Each has its expected verdict
(:func:`math_mix`): 1 for the reference and the equal forms, 0 for the wrong solution, the rounded decimal,
the unboxed answer and the hedge. The pool's workers are started (CAS loaded) before the clock starts:
``math_pool_start_s``. Reported: ``math_checks_per_s``, ``math_checks_per_s_per_core`` (per worker,
``math_workers``), the latency of one check (``math_latency_ms_p50``/``_p90``/``_p99``/``_max``, and the
median per variant), ``math_checks`` (``math_checks_compared`` of them reached the CAS: a hedge or a missing
answer is decided before it), ``math_correct_agree`` (the fraction of verdicts equal to the expected
one; each that is not is printed and the run fails), ``cpus`` and ``load_average_start``. ``--quick``: the
mix (1,170 completions) 5 times, seconds; otherwise 50 times. A completion recurs only a whole mix later, past
math-verify's own parse cache (20 entries): the gold's parse is cached per worker, as in the executor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from importlib import resources
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script: this checkout's code; --against's children import this
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # file, their side's tree on their path

import msgspec

from rollstream.config import ExecutorConfig

try:
    from rollstream.consumers.executor.jobs import Job
    from rollstream.consumers.executor.pool import OWNER_LABEL, DockerSandboxPool
except ModuleNotFoundError:  # an --against child in a tree from before 6fbdbb0 (one sandbox module)
    from rollstream.consumers.executor.sandbox import OWNER_LABEL, DockerSandboxPool, Job  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]

CODE = "def add(a, b):\n    return a + b\n"
TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 3) == 5"]
# The same three checks as a pytest file (kind "python_pytest"; --forms)
PYTEST_FILE = ("from solution import add\n\n\ndef test_a():\n    assert add(1, 2) == 3\n\n\n"
               "def test_b():\n    assert add(-1, 1) == 0\n\n\ndef test_c():\n    assert add(2, 3) == 5\n")


def stage_signing() -> Any:
    """What an executor with a key adds to each execution (docs/executor.md, "Attested verdicts"):
    its verdict and its audit record signed (an ephemeral Ed25519 key). Returns sign(result)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from rollstream.attest import Signer, code_digest, spec_digest
    from rollstream.schemas.events import RewardSpec, SandboxAudit, SandboxLimits
    from rollstream.testing import make_reward

    signer = Signer(Ed25519PrivateKey.generate(), "bench")
    limits = SandboxLimits(timeout_s=5, memory_mb=256, pids=64, cpus=1, output_bytes=65536, tmpfs_mb=16)

    def sign(result: Any) -> None:
        claims = {"spec_sha256": spec_digest(RewardSpec(tests=TESTS)), "code_sha256": code_digest(CODE),
                  "image": "sha256:bench", "runtime": "runc+runner:bench"}
        audit = SandboxAudit(sandbox_id=result.sandbox_id, container_id=result.container_id, rollout_id="b/0",
                             code_sha256=claims["code_sha256"], limits=limits, duration_s=result.duration_s,
                             output_bytes=result.output_bytes, verdict="none", violations=result.violations,
                             executed_at=time.time(), outcome="passed")
        signer.sign_reward(make_reward("b", 0, 1.0), **claims)
        signer.sign_audit(audit, **claims)

    return sign


def signing_cost_us(n: int = 2000) -> float:
    """Microseconds the signing of one execution's verdict and audit record takes, here."""
    from types import SimpleNamespace

    sign = stage_signing()
    result = SimpleNamespace(sandbox_id="s", container_id="c", duration_s=0.01, output_bytes=0, violations=[])
    started = time.perf_counter()
    for _ in range(n):
        sign(result)
    return (time.perf_counter() - started) / n * 1e6


async def fast_path(config: ExecutorConfig, n: int, concurrency: int, *, sign: bool = False,
                    pytest_file: bool = False) -> tuple[float, int]:
    """(executions/s, how many passed all 3 asserts) through the warm pool; with ``sign``, each
    execution's verdict and audit record are signed as a stage with a key does; with
    ``pytest_file``, the 3 checks are a pytest file's 3 test functions."""
    signer = stage_signing() if sign else None
    form = {"tests": [PYTEST_FILE], "pytest": True} if pytest_file else {"tests": TESTS}
    async with DockerSandboxPool(config) as pool:
        for i in range(min(50, n)):  # warm-up: containers started, runner forked a few times
            await pool.execute(Job(job_id=f"w{i}", code=CODE, **form))
        gate = asyncio.Semaphore(concurrency)

        async def one(i: int) -> bool:
            async with gate:
                result = await pool.execute(Job(job_id=str(i), code=CODE, **form))
            if signer is not None:
                signer(result)
            return sum(1 for e in result.events if e.get("e") == "test" and e.get("ok")) == 3

        started = time.perf_counter()
        passed = await asyncio.gather(*(one(i) for i in range(n)))
        return n / (time.perf_counter() - started), sum(passed)


async def baseline(config: ExecutorConfig, n: int, concurrency: int) -> tuple[float, int]:
    """(executions/s, how many printed ok) with a fresh hardened container per execution."""
    import aiodocker

    from rollstream.consumers.executor.hardening import hardened_config
    from rollstream.consumers.executor.jobs import limits_from_config
    from rollstream.consumers.executor.pool import LABEL

    program = CODE + "\n".join(TESTS) + "\nprint('ok')\n"
    body = hardened_config(
        config.image,
        limits_from_config(config),
        {LABEL: "1", OWNER_LABEL: config.owner},
        ["python3", "-I", "-c", program],
        interactive=False,
    )
    body["HostConfig"]["AutoRemove"] = (
        False  # removed by us after reading the exit code, like `docker run --rm`
    )
    gate = asyncio.Semaphore(concurrency)
    async with aiodocker.Docker() as docker:

        async def one() -> bool:
            async with gate:
                container = await docker.containers.create(body)
                try:
                    async with container.attach(stdout=True, stderr=True) as stream:
                        await container.start()
                        output = b""
                        while (message := await stream.read_out()) is not None:
                            output += message.data
                    status = await container.wait()
                    return status.get("StatusCode") == 0 and output.strip() == b"ok"
                finally:
                    await container.delete(force=True)

        await one()  # warm-up (image layers in the page cache)
        started = time.perf_counter()
        passed = await asyncio.gather(*(one() for _ in range(n)))
        return n / (time.perf_counter() - started), sum(passed)


async def cleanup(owner: str) -> None:
    import aiodocker

    async with aiodocker.Docker() as docker:
        found = await docker.containers.list(
            all=True, filters=json.dumps({"label": [f"{OWNER_LABEL}={owner}"]})
        )
        for container in found:
            try:
                await container.delete(force=True)
            except aiodocker.DockerError:
                pass


async def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """One side of --against, in a child whose path holds that side's checkout: the fast path on its pool,
    and where the pool and the runtime it sends into the container came from."""
    config = ExecutorConfig(
        image=spec["image"],
        owner=spec["owner"],
        pool_size=spec["pool_size"],
        concurrency=spec["concurrency"],
        recycle_after=1_000_000,
    )
    try:
        rate, passed = await fast_path(config, spec["executions"], spec["concurrency"], sign=spec.get("sign", False))
    finally:
        await cleanup(spec["owner"])
    return {
        "executions_per_s": rate,
        "passed": passed,
        "sandbox": sys.modules[DockerSandboxPool.__module__].__file__,
        "runtime": str(resources.files("rollstream.consumers.executor.runtime")),
    }


# What an --against child runs, its working directory and PYTHONPATH the side's tree: rollstream is
# imported from there, then this file (argv[1]) as a module, its measure() given the spec (argv[2]).
CHILD = """\
import asyncio, importlib.util, json, sys
spec = importlib.util.spec_from_file_location("bench_executor", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
print(json.dumps(asyncio.run(bench.measure(json.loads(sys.argv[2])))))
"""


def git(*args: str, check: bool = True) -> str:
    """``git args`` in this checkout, its output."""
    done = subprocess.run(["git", "-C", str(ROOT), *args], check=check, capture_output=True, text=True)
    return done.stdout.strip()


def run_side(tree: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """measure(spec) in a child process that imports the checkout at ``tree``; checks that it did."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(Path(__file__).resolve()), json.dumps(spec)],
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        timeout=600,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("sandbox", "runtime"):
        if not Path(result[name]).resolve().is_relative_to(tree.resolve()):
            raise SystemExit(f"the child meant to run {tree} imported its {name} from {result[name]}")
    return result


def alternate(args: argparse.Namespace, trees: dict[str, Path], executions: int) -> dict[str, list[dict]]:
    """The sides in turn, ``args.rounds`` times (this, against, this, against, ...): each side's runs."""
    runs: dict[str, list[dict]] = {side: [] for side in trees}
    owners: list[str] = []
    try:
        for i in range(args.rounds):
            for side, tree in trees.items():
                spec = {
                    "image": args.image,
                    "owner": f"bench-{side}-{uuid.uuid4().hex[:8]}",
                    "pool_size": args.pool_size,
                    "concurrency": args.concurrency,
                    "executions": executions,
                    **({"sign": True} if args.sign and side == "this" else {}),
                }
                owners.append(spec["owner"])
                run = run_side(tree, spec)
                runs[side].append(run)
                print(
                    f"round {i + 1}/{args.rounds} {side}: {run['executions_per_s']:.1f} executions/s, "
                    f"{run['passed']}/{executions} passed ({Path(run['sandbox']).parents[2]})",
                    flush=True,
                )
    finally:  # a child stopped before its own cleanup (Ctrl-C, timeout, failure) leaves containers
        for owner in owners:
            asyncio.run(cleanup(owner))
    return runs


def against(args: argparse.Namespace) -> None:
    """--against REV: this checkout's fast path vs REV's, alternating, in one run (see the docstring)."""
    from bench.common import report

    commit = git("rev-parse", "--verify", f"{args.against}^{{commit}}")
    executions = 1000 if args.quick else 5000
    load = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="rollstream-against-"))
    tree = tmp / commit[:12]
    try:
        git("worktree", "add", "--detach", str(tree), commit)
        runs = alternate(args, {"this": ROOT, "against": tree}, executions)
    finally:
        git("worktree", "remove", "--force", str(tree), check=False)
        git("worktree", "prune", check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    rates = {side: [run["executions_per_s"] for run in side_runs] for side, side_runs in runs.items()}
    this, other = statistics.median(rates["this"]), statistics.median(rates["against"])
    all_passed = all(run["passed"] == executions for side_runs in runs.values() for run in side_runs)
    figures = {
        "executions_per_s": round(this, 1),
        "against_executions_per_s": round(other, 1),
        "executions_per_s_ratio": round(this / other, 3),
        "against": commit,
        "all_passed": all_passed,
        "executions_per_s_rounds": [round(r, 1) for r in rates["this"]],
        "against_executions_per_s_rounds": [round(r, 1) for r in rates["against"]],
        "executions_per_s_ratio_rounds": [round(a / b, 3) for a, b in zip(rates["this"], rates["against"])],
        "rounds": args.rounds,
        "executions": executions,
        "pool_size": args.pool_size,
        "concurrency": args.concurrency,
        "signing": args.sign,
        "signing_us_per_execution": round(signing_cost_us(), 1) if args.sign else None,
        "head": git("rev-parse", "HEAD"),
        "head_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "load_average_start": [round(x, 2) for x in load],
        "cpus": os.cpu_count(),
    }
    print(
        f"this checkout {this:.1f} executions/s vs {commit[:7]} {other:.1f}/s (medians of {args.rounds} "
        f"rounds): ratio {this / other:.3f}, per round {figures['executions_per_s_ratio_rounds']}; "
        f"all passed: {all_passed}"
    )
    report(figures, args.json)
    if not all_passed:
        raise SystemExit("wrong results: not every execution passed its 3 asserts (see the rounds above)")


async def compare(args: argparse.Namespace) -> None:
    """The default run: the fast path (and one container sequentially) vs a fresh container each."""
    n_fast, n_base = (1000, 12) if args.quick else (5000, 40)
    owner = f"bench-{uuid.uuid4().hex[:8]}"
    config = ExecutorConfig(
        image=args.image,
        owner=owner,
        pool_size=args.pool_size,
        concurrency=args.concurrency,
        recycle_after=1_000_000,
    )
    try:
        rate, ok = await fast_path(config, n_fast, args.concurrency)
        sequential, _ = await fast_path(
            ExecutorConfig(image=args.image, owner=owner, pool_size=1, recycle_after=1_000_000),
            n_fast // 2,
            1,
        )
        base, base_ok = await baseline(config, n_base, args.concurrency)
    finally:
        await cleanup(owner)
    if ok != n_fast or base_ok != n_base:
        raise SystemExit(f"wrong results: fast path {ok}/{n_fast}, baseline {base_ok}/{n_base} passed")
    figures = {
        "executions_per_s": round(rate, 1),
        "speedup": round(rate / base, 1),
        "baseline_executions_per_s": round(base, 2),
        "sequential_executions_per_s": round(sequential, 1),
        "executions": n_fast,
        "baseline_executions": n_base,
        "pool_size": args.pool_size,
        "concurrency": args.concurrency,
    }
    print(
        f"fast path: {n_fast} executions, {rate:.1f}/s ({args.concurrency} in flight over {args.pool_size} "
        f"warm containers; one container sequentially: {sequential:.1f}/s)"
    )
    print(f"baseline: {n_base} fresh hardened containers, {base:.2f}/s; speedup {rate / base:.1f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures))


async def forms(args: argparse.Namespace) -> None:
    """``--forms``: the warm pool on the same 3 checks as an assert list and as a pytest file,
    alternating sides (A B A B ...)."""
    n = 300 if args.quick else 2000
    owner = f"bench-{uuid.uuid4().hex[:8]}"
    sides = ("asserts", "pytest")
    rates: dict[str, list[float]] = {side: [] for side in sides}
    load = [round(x, 2) for x in os.getloadavg()]
    config = ExecutorConfig(image=args.image, owner=owner, pool_size=args.pool_size, concurrency=args.concurrency,
                            recycle_after=1_000_000)
    try:
        for index in range(args.rounds):
            for side in sides if index % 2 == 0 else tuple(reversed(sides)):
                rate, ok = await fast_path(config, n, args.concurrency, pytest_file=side == "pytest")
                if ok != n:
                    raise SystemExit(f"wrong results with {side}: {ok}/{n} executions passed their 3 checks")
                rates[side].append(rate)
                print(f"round {index + 1}/{args.rounds} {side}: {rate:.1f} executions/s", flush=True)
    finally:
        await cleanup(owner)
    plain, pytest_rate = (statistics.median(rates[side]) for side in sides)
    figures = {
        "executions_per_s": round(plain, 1),
        "executions_per_s_pytest": round(pytest_rate, 1),
        "pytest_ratio": round(pytest_rate / plain, 3),
        "executions_per_s_rounds": {side: [round(r, 1) for r in rates[side]] for side in sides},
        "executions": n, "rounds": args.rounds, "pool_size": args.pool_size, "concurrency": args.concurrency,
        "load_average_before": load, "head": git("rev-parse", "HEAD"),
        "head_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }
    print(f"assert list {plain:.1f} executions/s, pytest file {pytest_rate:.1f}/s (medians of {args.rounds} rounds): "
          f"ratio {pytest_rate / plain:.3f}")
    from bench.common import report

    report(figures, args.json)


async def runtimes(args: argparse.Namespace) -> None:
    """``--runtime R``: the warm pool under runc and under R, the same work, alternating sides."""
    n = 300 if args.quick else 2000
    owner = f"bench-{uuid.uuid4().hex[:8]}"
    sides = ("runc", args.runtime)
    rates: dict[str, list[float]] = {side: [] for side in sides}
    starts: dict[str, list[float]] = {side: [] for side in sides}
    load = [round(x, 2) for x in os.getloadavg()]
    try:
        for index in range(args.rounds):
            for side in sides if index % 2 == 0 else tuple(reversed(sides)):
                config = ExecutorConfig(image=args.image, owner=owner, pool_size=args.pool_size,
                                        concurrency=args.concurrency, recycle_after=1_000_000, runtime=side)
                started = time.perf_counter()
                async with DockerSandboxPool(msgspec.structs.replace(config, pool_size=1)):
                    starts[side].append(time.perf_counter() - started)  # one warm container, ready
                rate, ok = await fast_path(config, n, args.concurrency)
                if ok != n:
                    raise SystemExit(f"wrong results under {side}: {ok}/{n} executions passed their 3 asserts")
                rates[side].append(rate)
                print(f"round {index + 1}/{args.rounds} {side}: {rate:.1f} executions/s, "
                      f"a container ready in {starts[side][-1]:.2f} s", flush=True)
    finally:
        await cleanup(owner)
    runc, other = (statistics.median(rates[side]) for side in sides)
    figures = {
        "executions_per_s": round(runc, 1),
        f"executions_per_s_{args.runtime}": round(other, 1),
        f"{args.runtime}_ratio": round(other / runc, 3),
        "container_ready_s": {side: round(statistics.median(starts[side]), 2) for side in sides},
        "executions_per_s_rounds": {side: [round(r, 1) for r in rates[side]] for side in sides},
        "executions": n, "rounds": args.rounds, "pool_size": args.pool_size, "concurrency": args.concurrency,
        "load_average_before": load,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures))


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, linearly interpolated between the closest ranks
    (numpy's default): the 50th of [1, 2, 3, 4] is 2.5, the 100th the largest."""
    if not values:
        raise ValueError("no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside 0-100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _decimal(value: Any) -> str | None:
    """``value`` (a Fraction) as an exact decimal, or None when it has none (a denominator other than 2s and 5s)."""
    from decimal import Decimal

    denominator = value.denominator
    for prime in (2, 5):
        while denominator % prime == 0:
            denominator //= prime
    if denominator != 1:
        return None
    if value.denominator == 1:
        return f"{value.numerator}.0"
    return str(Decimal(value.numerator) / Decimal(value.denominator))


def math_mix(tasks: list[Any]) -> list[tuple[str, str, Any, str, float]]:
    """The completions ``--math`` scores: (task id, variant, reward spec, completion, expected ``answer``
    component) for each task (a ``math_answer`` task whose gold is an integer or a reduced fraction, with a
    reference solution ``working\\n\\n... \\boxed{gold}...`` and a wrong solution), in task order."""
    from fractions import Fraction

    from rollstream.consumers.executor.answers import boxed

    mix = []
    for task in tasks:
        spec, gold = task.reward, task.reward.answer
        value = Fraction(gold)
        work = task.reference_solution.split("\n\n")[0]
        wrong = boxed(task.wrong_solutions[0])[-1]

        def says(answer: str, work: str = work) -> str:
            return f"{work}\n\nThe answer is $\\boxed{{{answer}}}$."

        rows = [("reference", spec, task.reference_solution, 1.0), ("wrong", spec, task.wrong_solutions[0], 0.0)]
        exact = _decimal(value)
        if exact is not None:
            rows.append(("decimal", spec, says(exact), 1.0))
        else:  # rounded to 4 places: not equal (no tolerance; math-verify rounds at 6)
            rows.append(("decimal_rounded", spec, says(f"{float(value):.4f}"), 0.0))
        if value.denominator > 1:
            sign, a, b = "-" if value < 0 else "", abs(value.numerator), value.denominator
            rows.append(("frac", spec, says(f"{sign}\\frac{{{a}}}{{{b}}}"), 1.0))
            rows.append(("dfrac", spec, says(f"{sign}\\dfrac{{{a}}}{{{b}}}"), 1.0))
        elif abs(value) >= 1000:
            rows.append(("thousands", spec, says(f"{value.numerator:,}".replace(",", "{,}")), 1.0))
        if task.family == "linear_equations":
            rows.append(("assignment", spec, says(f"x = {gold}"), 1.0))
        rows.append(("the_answer_is", msgspec.structs.replace(spec, answer_format="the_answer_is"),
                     f"{work}\n\nThe answer is {gold}.", 1.0))
        rows.append(("no_box", spec, f"{work}\n\nSo the answer is {gold}.", 0.0))  # the task asks for \boxed{}
        rows.append(("hedge", spec, f"{work}\n\nIt is $\\boxed{{{gold}}}$ or $\\boxed{{{wrong}}}$.", 0.0))
        mix.extend((task.task_id, variant, s, text, expected) for variant, s, text, expected in rows)
    return mix


async def math_checks(args: argparse.Namespace) -> None:
    """``--math``: the math_answer kind's checks/s and latency over a real MathPool (see the docstring)."""
    from bench.common import report
    from rollstream.consumers.executor.answers import MathAnswer, MathPool
    from rollstream.tasks.sources import load_tasks

    load = [round(x, 2) for x in os.getloadavg()]
    mix = math_mix(load_tasks(["suite:math"]))
    repeats = 5 if args.quick else 50  # a completion recurs a mix later: past the CAS's own caches (20)
    kind = MathAnswer(MathPool(args.math_workers))
    workers = kind.pool.size
    try:
        started = time.perf_counter()  # every worker started and its CAS loaded, each with one check
        firsts = [row for row in mix if row[1] == "reference"][:workers]  # each reaches the pool
        await asyncio.gather(*(kind.check(spec, text) for _, _, spec, text, _ in firsts))
        pool_start = time.perf_counter() - started
        if kind.pool.started != workers:
            raise SystemExit(f"the warm-up started {kind.pool.started} workers, not {workers}")
        gate = asyncio.Semaphore(workers)
        latencies: list[float] = []
        by_variant: dict[str, list[float]] = {}
        disagree: list[str] = []
        compared = 0  # checks that reached the CAS (a hedge, no answer: decided before it)

        async def one(task_id: str, variant: str, spec: Any, text: str, expected: float) -> None:
            nonlocal compared
            async with gate:
                began = time.perf_counter()
                scored = await kind.check(spec, text)
                took = (time.perf_counter() - began) * 1000
            latencies.append(took)
            by_variant.setdefault(variant, []).append(took)
            check = scored.execution.answer_check if scored.execution else None
            compared += bool(check and check.gold_parsed)
            got = scored.components.get("answer")
            if got != expected:
                disagree.append(f"{task_id} {variant}: expected {expected:g}, got {got} (error_kind "
                                f"{scored.execution.error_kind if scored.execution else '?'}, read "
                                f"{check.extracted if check else ''!r}: {check.reason if check else ''})")

        started = time.perf_counter()
        await asyncio.gather(*(one(*row) for _ in range(repeats) for row in mix))
        elapsed = time.perf_counter() - started
        killed = kind.pool.killed
    finally:
        kind.close()
    n = len(latencies)
    rate = n / elapsed
    figures = {
        "math_checks_per_s": round(rate, 1),
        "math_checks_per_s_per_core": round(rate / workers, 1),
        "math_workers": workers,
        "math_latency_ms_p50": round(percentile(latencies, 50), 2),
        "math_latency_ms_p90": round(percentile(latencies, 90), 2),
        "math_latency_ms_p99": round(percentile(latencies, 99), 2),
        "math_latency_ms_max": round(max(latencies), 2),
        "math_checks": n,
        "math_correct_agree": round(1 - len(disagree) / n, 4),
        "math_pool_start_s": round(pool_start, 2),
        "cpus": os.cpu_count(),
        "load_average_start": load,
        "math_latency_ms_p50_by_variant": {v: round(percentile(t, 50), 2) for v, t in sorted(by_variant.items())},
        "math_checks_by_variant": {v: len(t) for v, t in sorted(by_variant.items())},
        "math_checks_compared": compared,
        "math_tasks": len({row[0] for row in mix}),
        "math_repeats": repeats,
        "math_workers_killed": killed,
        "concurrency": workers,
        "head": git("rev-parse", "HEAD"),
        "head_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }
    for line in disagree[:50]:
        print("disagree:", line)
    print(f"math_answer: {n} checks ({len(mix)} completions x {repeats}) over {workers} workers, {rate:.1f}/s "
          f"({rate / workers:.1f}/s per worker); latency p50 {figures['math_latency_ms_p50']} ms, p99 "
          f"{figures['math_latency_ms_p99']} ms, max {figures['math_latency_ms_max']} ms; pool start "
          f"{pool_start:.2f} s; verdicts as expected: {n - len(disagree)}/{n}")
    report(figures, args.json)
    if disagree:
        raise SystemExit(f"{len(disagree)} verdicts differ from the expected ones (printed above)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small run (< 2 min; with --against < 5 min)")
    parser.add_argument("--math", action="store_true",
                        help="the math_answer kind's checks/s and latency over a real MathPool (no Docker)")
    parser.add_argument("--math-workers", type=int, default=None,
                        help="--math: the pool's workers (default: the executor's, min(4, cpus))")
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--image", default="rollstream-sandbox:latest")
    parser.add_argument("--pool-size", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--against", metavar="REV", help="fast path only: this checkout vs commit REV")
    parser.add_argument("--rounds", type=int, default=2, help="--against: rounds of (this, REV)")
    parser.add_argument("--sign", action="store_true",
                        help="--against: this checkout signs each execution's verdict and audit record, as an "
                             "executor with a key does (docs/executor.md)")
    parser.add_argument("--runtime", choices=["runsc"],
                        help="the warm pool under runc and under this runtime, the same work, sides alternating "
                             "(executions_per_s, executions_per_s_RUNTIME)")
    parser.add_argument("--forms", action="store_true",
                        help="the warm pool on the same 3 checks as an assert list and as a pytest file, sides "
                             "alternating (executions_per_s, executions_per_s_pytest, pytest_ratio)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.against and args.runtime:
        parser.error("--against and --runtime are separate runs")
    if args.math:
        asyncio.run(math_checks(args))
    elif args.forms:
        asyncio.run(forms(args))
    elif args.runtime:
        asyncio.run(runtimes(args))
    elif args.against:
        against(args)
    else:
        asyncio.run(compare(args))


if __name__ == "__main__":
    main()
