"""The job model of the sandbox backends: what one execution is asked to do and what it did.

:class:`Job` (code + setup + tests + limits, and what the judge lets cross from the completion:
``tested_names``, ``tested_modules``), :class:`RunResult` (what happened, with the violations
seen), the :class:`SandboxBackend` protocol the warm Docker pool (consumers/executor/pool.py) and the
simulated backend (consumers/executor/sim_sandbox.py) implement, and the limits an executor's config
gives them. No I/O here.
"""

from __future__ import annotations

import ast
import builtins
import functools
import sys
from typing import Any, Literal, Protocol

import msgspec

from rollstream.config import ExecutorConfig
from rollstream.consumers.executor.runtime.candidate import SOLUTION
from rollstream.schemas.events import Asset, SandboxLimits

TAIL_BYTES = 4000  # fits ExecutionRecord's ShortText tails
WORKSPACE_BYTES = 256 << 10  # an episode's files carried between turns, at most
# Names a test never takes from the completion: the judge's builtins and its helpers.
JUDGE_NAMES = frozenset(dir(builtins)) | {"raises", "run_program", "__assert_explain__"}  # the judge's own


class Job(msgspec.Struct, frozen=True, kw_only=True):
    """One program to run: ``setup``, then ``code`` (as ``<completion>``), then each test.

    With ``trust = "judge"`` the tests run in a judge process of their own and reach the
    completion only through the names in ``names`` (those the tests read that the completion
    may define; ``entry_point`` always among them); ``modules`` are the standard-library modules
    the tests read by name without importing them (the judge imports them itself, before the
    completion runs); ``rules`` what the task's reference says about what may cross
    (consumers/executor/runtime/crossing.py ``Rules``: ``{"mode": "record"}`` on the reference itself;
    ``{}``, a task without one, the strictest reading). See consumers/executor/runtime/judge.py. With
    ``program`` the code is a whole program: tests call ``run_program(stdin)`` for its standard output."""

    job_id: str
    code: str
    setup: str = ""
    tests: list[str] = []
    timeout_s: float = 5.0
    memory_mb: int = 256
    entry_point: str = ""
    names: list[str] = []
    modules: list[str] = []
    program: bool = False
    # with ``program``: the program's language; besides "python" it is built first in a pool of the
    # language image (runtime/programs.py), and its tests still run over run_program(stdin)
    language: str = "python"
    pytest: bool = False  # each test a pytest file (runtime/pytests.py)
    trust: Literal["judge", "in_process"] = "judge"
    rules: dict[str, Any] = {}
    files: list[tuple[str, bytes]] = []  # an episode's workspace, written into /work before the code runs
    collect_files: bool = False  # return the files the job left in /work (the next turn's workspace)
    assets: list[Asset] = []  # read-only under /assets: the job runs in the pool keyed by this set
    network: list[str] = []  # hosts reachable through the egress proxy: the pool is keyed by these too
    test_hook: str | None = None  # tests only (a pool started with test_hooks): code run in the judge first
    # tests only (a pool started with test_hooks): make the runner fail on purpose, one of
    # RUNNER_HOOKS (runtime/supervisor.py)
    runner_hook: str | None = None

    def __post_init__(self) -> None:
        if not self.names:
            msgspec.structs.force_setattr(self, "names", list(tested_names(tuple(self.tests), self.entry_point)))
        if not self.modules:
            msgspec.structs.force_setattr(self, "modules", list(tested_modules(tuple(self.tests))))


@functools.lru_cache(maxsize=4096)
def tested_names(tests: tuple[str, ...], entry_point: str = "") -> tuple[str, ...]:
    """The names the tests read that the completion may define (the judge binds those the
    task's setup does not define): every name loaded anywhere in a test, but the judge's
    builtins and helpers and the names the tests bind themselves (``result = f(1)``: a global of
    the completion's called ``result`` is not the tests' result, even where their assignment did
    not run); the entry point always; and the names the tests take from the completion's module
    (``from solution import add``, ``solution.add`` after ``import solution``, and what the tests
    patch there: ``mock.patch("solution.helper")``, ``monkeypatch.setattr(solution, "helper", ...)``).
    Cached: a group shares its tests."""
    loaded, bound = _loaded_and_bound(tests)
    names = (loaded - bound) | ({entry_point} if entry_point else set()) | _from_solution(tests)
    return tuple(sorted(n for n in names if n == entry_point or n not in JUDGE_NAMES))


@functools.lru_cache(maxsize=4096)
def _from_solution(tests: tuple[str, ...]) -> frozenset[str]:
    """The names the tests import from the completion's module, or read as attributes of it."""
    found: set[str] = set()
    for tree in _trees(tests):
        aliases = set()  # what `import solution [as s]` binds
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == SOLUTION and not node.level:
                found.update(a.name for a in node.names if a.name != "*")
            elif isinstance(node, ast.Import):
                aliases.update(a.asname or a.name for a in node.names if a.name == SOLUTION)
        for node in ast.walk(tree):  # patch targets: mock.patch("solution.helper"), monkeypatch's string form
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                module, dot, rest = node.value.partition(".")
                name = rest.partition(".")[0]
                if module == SOLUTION and dot and name.isidentifier():
                    found.add(name)
        if aliases:
            found.update(node.attr for node in ast.walk(tree)
                         if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                         and node.value.id in aliases)
            # mock.patch.object(solution, "helper"), monkeypatch.setattr(solution, "helper", ...), getattr(...)
            found.update(node.args[1].value for node in ast.walk(tree)
                         if isinstance(node, ast.Call) and len(node.args) >= 2
                         and isinstance(node.args[0], ast.Name) and node.args[0].id in aliases
                         and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
                         and node.args[1].value.isidentifier())
    return frozenset(found)


@functools.lru_cache(maxsize=4096)
def tested_modules(tests: tuple[str, ...]) -> tuple[str, ...]:
    """Standard-library modules the tests read by name but never bind themselves (``math`` in
    ``assert math.isclose(f(2), 1.41)``, relying on the completion's ``import math``): the judge
    imports these itself, before the completion runs, and binds nothing else to a module."""
    loaded, bound = _loaded_and_bound(tests)
    return tuple(sorted(n for n in loaded - bound if n in sys.stdlib_module_names))


@functools.lru_cache(maxsize=4096)
def _loaded_and_bound(tests: tuple[str, ...]) -> tuple[frozenset[str], frozenset[str]]:
    """(the names the tests read, the names they bind: assignments, imports, definitions)."""
    loaded, bound = set(), set()
    for tree in _trees(tests):
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
            elif isinstance(node, ast.alias):
                bound.add((node.asname or node.name).partition(".")[0])
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
    return frozenset(loaded), frozenset(bound)


def _trees(tests: tuple[str, ...]) -> list[ast.AST]:
    trees = []
    for source in tests:
        try:
            trees.append(ast.parse(source))
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            continue  # the judge reports the broken test
    return trees


class RunResult(msgspec.Struct, frozen=True, kw_only=True):
    """What one execution did. ``events`` are the harness's reports (see runner.harness)."""

    sandbox_id: str
    container_id: str
    exit_code: int | None = None
    signal: int | None = None
    duration_s: float = 0.0
    timed_out: bool = False
    output_limit: bool = False
    oom_killed: bool = False
    output_bytes: int = 0
    stdout_tail: str = ""
    stderr_tail: str = ""
    events: list[dict[str, Any]] = []
    violations: list[str] = []
    runner_died: bool = False
    recycled: bool = False
    files: list[tuple[str, bytes]] = []  # with collect_files: the regular files the job left in /work
    files_truncated: bool = False  # some were left out (links, over the size or count caps)
    in_process_tests: list[int] = []  # trust "mixed": the tests whose events came from an in-process run
    connections: list[dict[str, Any]] = []  # through the egress proxy (runtime/egress.py's records)


class SandboxBackend(Protocol):
    """Runs untrusted jobs. ``execute`` raises SandboxError only when the job could not be run
    for reasons of the backend itself (then it is safe to retry); anything the code does is a
    RunResult."""

    @property
    def limits(self) -> SandboxLimits: ...

    async def execute(self, job: Job) -> RunResult: ...


def sandbox_identity(backend: Any) -> tuple[str, str]:
    """(image, runtime) a backend decides verdicts under ("unknown" where it does not say: the
    sim backend, a pool not started)."""
    return getattr(backend, "image_id", "") or "unknown", getattr(backend, "runtime", "") or "unknown"


def limits_from_config(config: ExecutorConfig) -> SandboxLimits:
    return SandboxLimits(
        timeout_s=config.default_timeout_s,
        memory_mb=config.memory_mb,
        pids=config.pids,
        cpus=config.cpus,
        output_bytes=config.output_bytes,
        tmpfs_mb=config.tmpfs_mb,
    )
