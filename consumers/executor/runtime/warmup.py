"""PID 1's warm-up, in the sandbox (a module of the runtime, in its bundle,
runtime/importer.py; standard library only): what every job uses is imported
and run once, here, on made-up data, so that the zygotes share it copy-on-write."""

import ctypes
import gc
import json
import os
import sys

from rollstream.consumers.executor.runtime.candidate import candidate_main
from rollstream.consumers.executor.runtime.guards import Guards
from rollstream.consumers.executor.runtime.hooks import allowed_devices, stdlib_dirs
from rollstream.consumers.executor.runtime.judge import judge_main
from rollstream.consumers.executor.runtime.printing import CAPTURED_ERR, CAPTURED_OUT, print_exception
from rollstream.consumers.executor.runtime.proxies import CrossingState
from rollstream.consumers.executor.runtime.zygotes import event_line

# Modules every job is likely to use, imported once before the zygote forks (shared pages).
PRELOAD = ("math", "re", "collections", "itertools", "functools", "operator", "string", "heapq", "bisect",
           "copy", "random", "json", "decimal", "fractions", "datetime", "enum", "io", "contextlib",
           "pickle", "unittest", "unittest.result", "typing", "dataclasses", "textwrap", "statistics",
           "importlib.machinery", "sysconfig", "stat")


class Quitter:
    """``exit()`` and ``quit()``, which the interpreter's ``site`` module would add (the runner
    runs without it): programs that end with ``exit()`` work as in a plain interpreter."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Use {self.name}() or Ctrl-D (i.e. EOF) to exit"

    def __call__(self, code=None):
        raise SystemExit(code)


def warm_up():
    """Import and exercise, in PID 1, what every job will use, so that it is built once and
    shared copy-on-write instead of rebuilt in each child; then freeze the heap so no child's GC
    walks (and copies) it. Only made-up data passes through here: the zygote, forked next, must
    hold nothing of any job."""
    import builtins

    for name in ("exit", "quit"):
        if not hasattr(builtins, name):
            setattr(builtins, name, Quitter(name))
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            continue
    namespace = {"__name__": "warmup"}
    exec(compile("def f(x):\n    return [x, {'a': 1}, 'x' * 2]\n", "<warmup>", "exec"), namespace)
    exec(compile("assert f(1)[0] == 1", "<warmup test>", "exec"), namespace)
    json.loads(event_line({"e": "test", "i": 0, "ok": False, "line": None, "msg": "\u00e9"}))
    try:
        exec(compile("def g():\n    1 / 0\ng()", "<warmup>", "exec"), namespace)
    except ZeroDivisionError as exc:
        stderr, sys.stderr = sys.stderr, open(os.devnull, "w")
        try:
            print_exception(exc)
        finally:
            sys.stderr.close()
            sys.stderr = stderr
    stdlib_dirs()
    allowed_devices()
    _warm_protocol()
    gc.collect()
    gc.freeze()
    ctypes.CDLL(None).malloc_trim(0)  # give back what the imports and the warm-up freed: fewer pages per fork


WARM_CODE = """
class S:
    def __init__(self):
        self.items = []
    def push(self, x):
        self.items.append(x)
    def pop(self):
        return self.items.pop()
    def __len__(self):
        return len(self.items)
def f(x):
    if x < 0:
        raise ValueError('negative')
    return [x, 1.5, 'x', None, True, (x,), {x: {x}}]
def g(n):
    yield from range(n)
"""
WARM_TESTS = (
    "assert f(1) == [1, 1.5, 'x', None, True, (1,), {1: {1}}]",
    "s = S()\ns.push([1, (2,)])\nassert s.pop() == [1, (2,)] and len(s) == 0",
    "with raises(ValueError):\n    f(-1)",
    "assert list(g(3)) == [0, 1, 2]\nassert f(2) != f(3)",
)


def _warm_protocol(rounds=12):
    """Made-up jobs between a judge and a candidate, each side run here in turn against the other
    in a fork: the interpreter specialises the code both sides run, here, once, instead of in
    every job's fork. (Forks, not threads: importing threading alone would cost every later fork
    a hundred page faults.)"""
    saved = sys.stdout, sys.stderr, sys.argv, sys.modules.get("__main__")
    tests = [compile(t, f"<warm {i}>", "exec") for i, t in enumerate(WARM_TESTS)]
    names = ["S", "f", "g", "s"]
    part = (None, tests, names, "f", [], {"mode": "reference", "objects": ["1|S()"],
                                         "names": {"S": "o", "f": "o", "g": "o"}}, False)
    try:
        for side in ("judge", "candidate"):
            for _ in range(rounds):
                req_r, req_w = os.pipe()
                resp_r, resp_w = os.pipe()
                pid = os.fork()
                if pid == 0:  # the other side
                    try:
                        if side == "judge":
                            os.close(req_w)
                            candidate_main(WARM_CODE, None, names, False, req_r, resp_w, 1 << 16)
                        else:
                            os.close(req_r)
                            judge_main(part, resp_r, req_w, lambda event: None, guarded=False)
                    finally:
                        os._exit(0)
                try:
                    if side == "judge":
                        judge_main(part, resp_r, req_w, lambda event: None, guarded=False)
                    else:
                        os.close(req_w)
                        req_w = None
                        candidate_main(WARM_CODE, None, names, False, req_r, resp_w, 1 << 16)
                finally:
                    for fd in (req_r, req_w, resp_r, resp_w):
                        if fd is not None:
                            os.close(fd)
                    os.waitpid(pid, 0)
    finally:
        sys.stdout, sys.stderr, sys.argv = saved[:3]
        sys.modules["__main__"] = saved[3]
        sys.modules.pop("solution", None)
        Guards.current = None  # the zygotes hold no job, made-up or not
        CrossingState.crossing = None
        CAPTURED_OUT.drain()
        CAPTURED_ERR.drain()
