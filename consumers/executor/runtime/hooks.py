"""The judge's process-wide hooks (:func:`install_guards`): ``open``, imports (:class:`ImportGuard`),
the audit hook of code from data, ``pickle``/``marshal``, ``unittest.mock``'s patches, ``asyncio.run``,
``unittest``'s results and ``random``'s seed, each consulting the current job's Guards
(runtime/guards.py); and where the judge may read from (:func:`stdlib_dirs`, :func:`package_dirs`,
:func:`allowed_devices`).

A module of the runtime (standard library only; in the sandbox it arrives in the runtime's
bundle, runtime/importer.py; on the host, an ordinary module). Installed once per process: in the
sandbox by the judge zygote before it forks any judge (runtime/zygotes.py).
"""

import builtins
import io
import os
import stat
import sys
import types

from rollstream.consumers.executor.runtime.codec import NEVER_IMPORT
from rollstream.consumers.executor.runtime.fromdata import ExecGuard, guard_logging_config
from rollstream.consumers.executor.runtime.guards import (
    JUDGE_CACHE,
    TEST_MODULE,
    Guards,
    builtins_for_tests,
    tests_eval,
    tests_exec,
)
from rollstream.consumers.executor.runtime.proxies import RemoteBase


def _regular_file(fd, devices):
    """Whether the open descriptor ``fd`` is a regular file of the sandbox's own filesystems."""
    try:
        info = os.fstat(fd)
    except (OSError, ValueError, OverflowError):
        return False
    return stat.S_ISREG(info.st_mode) and info.st_dev in devices


def install_guards(out_fds=(1, 2)):
    """The process-wide hooks of a judge (once per process: in the sandbox, by the judge zygote
    before it forks any judge). Without a current job they change nothing."""
    if getattr(install_guards, "done", False):
        return
    install_guards.done = True
    real_open, real_os_open = io.open, os.open
    allowed = allowed_devices()
    own = {_identity(fd) for fd in out_fds} - {None}

    def checked(fd, flags):
        """``fd`` if it is a regular file or directory of the sandbox (or the judge's own output);
        closed and refused otherwise. Non-blocking only if it was asked to be."""
        try:
            info = os.fstat(fd)
            mode = info.st_mode
            ok = ((stat.S_ISREG(mode) or stat.S_ISDIR(mode)) and info.st_dev in allowed) or stat.S_ISCHR(mode) \
                or (info.st_dev, info.st_ino) in own
            if not ok:
                raise PermissionError("the judge opens regular files of the sandbox only")
            if not flags & os.O_NONBLOCK:
                os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def checked_opener(path, flags):
        return checked(real_os_open(path, flags | os.O_NONBLOCK | os.O_NOCTTY, 0o666), flags)

    def guarded_open(file, mode="r", buffering=-1, encoding=None, errors=None, newline=None, closefd=True,
                     opener=None):
        if isinstance(file, int):  # os.fdopen(fd) of tempfile.mkstemp's fd: a regular file, never a pipe
            if file not in (0, 1, 2) and not _regular_file(file, allowed):
                raise PermissionError("the judge opens no descriptor but its standard streams and regular files")
            return real_open(file, mode, buffering, encoding, errors, newline, closefd)
        return real_open(file, mode, buffering, encoding, errors, newline, closefd, opener=opener or checked_opener)

    def guarded_os_open(path, flags, mode=0o777, *, dir_fd=None):
        return checked(real_os_open(path, flags | os.O_NONBLOCK | os.O_NOCTTY, mode, dir_fd=dir_fd), flags)

    builtins.open = io.open = guarded_open
    os.open = guarded_os_open
    stdlib = stdlib_dirs()
    sys.meta_path.insert(0, ImportGuard(stdlib + JUDGE_CACHE.get("trusted_dirs", ())))
    sys.addaudithook(ExecGuard(lambda: Guards.current, (tests_eval.__code__, tests_exec.__code__),
                               lambda path: _inside(os.path.normpath(path), stdlib, resolve=False)))
    if "logging.config" in sys.modules:
        guard_logging_config(sys.modules["logging.config"], _logging_may_name)
    import marshal
    import pickle

    real = (pickle.loads, pickle.dumps, marshal.loads)
    JUDGE_CACHE["unpickler"] = pickle.Unpickler

    def loads(kind, data, real_loads, kwargs):
        guards = Guards.current
        if guards is None:
            return real_loads(data, **kwargs)
        return guards.loads(kind, data, real_loads, kwargs)

    def dumps(obj, protocol, kwargs):
        guards = Guards.current
        if guards is None:
            return real[1](obj, protocol, **kwargs)
        return guards.dumps(obj, protocol, real[1], kwargs)

    def unmarshal(data, *args):
        if sys._getframe(1).f_globals.get("__name__", "").endswith("_bootstrap_external"):
            return real[2](data, *args)  # the import system reading a .pyc
        return loads("marshal", data, real[2], {})

    pickle.loads = lambda data, **kwargs: loads("pickle", data, real[0], kwargs)
    pickle.load = lambda file, **kwargs: loads("pickle", file.read(), real[0], kwargs)
    pickle.dumps = lambda obj, protocol=None, **kwargs: dumps(obj, protocol, kwargs)
    pickle.dump = lambda obj, file, protocol=None, **kwargs: file.write(dumps(obj, protocol, kwargs))
    pickle.Unpickler = _unpickler(loads, pickle.Unpickler, real[0])
    marshal.loads = unmarshal
    marshal.load = lambda file, *args: loads("marshal", file.read(), real[2], {})
    _track_unittest()
    if "unittest.mock" in sys.modules:
        _wrap_mock(sys.modules["unittest.mock"])
    if "asyncio.runners" in sys.modules:
        _wrap_asyncio(sys.modules["asyncio.runners"])
    _share_random()
    JUDGE_CACHE["builtins"] = dict(vars(builtins))  # what the tests' overrides are measured against
    JUDGE_CACHE["builtins_values"] = list(JUDGE_CACHE["builtins"].values())
    JUDGE_CACHE.pop("test_builtins", None)  # made again with the guarded open
    builtins_for_tests()


def _wrap_mock(mock):
    """Record every ``mock.patch`` of a module attribute the tests enter, so the candidate sees it
    too (installed when ``unittest.mock`` is imported, before any test can enter a patch)."""
    patch = mock._patch
    enter, exit_ = patch.__enter__, patch.__exit__

    def entered(self):
        result = enter(self)
        guards = Guards.current
        try:
            target = self.getter()
            name = getattr(target, "__name__", None)
            if guards is not None and type(target) is types.ModuleType and type(name) is str:
                guards.patches.append((self, f"{name}.{self.attribute}"))
        except BaseException:
            pass
        return result

    def exited(self, *exc):
        guards = Guards.current
        if guards is not None:
            guards.patches[:] = [(p, t) for p, t in guards.patches if p is not self]
        return exit_(self, *exc)

    patch.__enter__, patch.__exit__ = entered, exited


class _AfterImport:
    """A loader that runs ``then(module)`` once the module it loads has run."""

    def __init__(self, loader, then):
        self.loader, self.then = loader, then

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.then(module)


def _share_random():
    """``random.seed``/``setstate`` by the tests: from then on the candidate's generator has the
    judge's state for every request, and the judge takes its state back after each (the tests'
    reproducibility under a seed holds across the boundary)."""
    import random

    for name in ("seed", "setstate"):
        original = getattr(random, name)

        def shared(*args, _original=original, **kwargs):
            result = _original(*args, **kwargs)
            if Guards.current is not None:
                Guards.current.random_shared = True
            return result

        setattr(random, name, shared)


def _wrap_asyncio(runners):
    """``asyncio.run(f())`` of the completion's coroutine: the candidate runs it (Remote.__await__)."""
    runner = runners.Runner
    real = runner.run

    def run(self, coro, *, context=None):
        if isinstance(coro, RemoteBase):
            coro = _awaiting(coro)
        return real(self, coro, context=context)

    runner.run = run


async def _awaiting(awaitable):
    return await awaitable


def _track_unittest():
    import unittest.result

    result = unittest.result.TestResult
    started, skipped = result.startTest, result.addSkip

    def start(self, test, _original=started):
        if Guards.current is not None:
            Guards.current.unittest_run += 1
        return _original(self, test)

    def skip(self, test, reason, _original=skipped):
        if Guards.current is not None:
            Guards.current.unittest_skipped += 1
        return _original(self, test, reason)

    result.startTest, result.addSkip = start, skip
    for name in ("addError", "addFailure", "addUnexpectedSuccess"):
        original = getattr(result, name)

        def failed(self, *args, _original=original):
            if Guards.current is not None:
                Guards.current.unittest_failed = True
            return _original(self, *args)

        setattr(result, name, failed)
    original_subtest = result.addSubTest

    def subtest(self, test, subtest, err, _original=original_subtest):
        if err is not None and Guards.current is not None:
            Guards.current.unittest_failed = True
        return _original(self, test, subtest, err)

    result.addSubTest = subtest


def _unpickler(loads, base, real_loads):
    class Unpickler(base):
        def __init__(self, file, **kwargs):
            self._rs_file = file
            super().__init__(io.BytesIO(b""), **kwargs)

        def load(self):
            return loads("pickle", self._rs_file.read(), real_loads, {})

    return Unpickler


class ImportGuard:
    """First on ``sys.meta_path``: no module from outside the standard library's directories (so
    nothing from ``/work``), no ``__main__`` module, none that works on import."""

    def __init__(self, allowed):
        self.allowed = allowed

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if name.rpartition(".")[2] == "__main__" or top in NEVER_IMPORT:
            raise ImportError(f"the judge does not import {name}")
        if name in sys.builtin_module_names:
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return None
        origin = spec.origin or ""
        locations = list(spec.submodule_search_locations or [])
        if not all(_inside(p, self.allowed) for p in ([origin] if spec.has_location else []) + locations):
            raise ImportError(f"the judge imports from the standard library only, not {origin or name}")
        if name == "unittest.mock":
            spec.loader = _AfterImport(spec.loader, _wrap_mock)
        elif name == "logging.config":
            spec.loader = _AfterImport(spec.loader, lambda module: guard_logging_config(module, _logging_may_name))
        elif name == "asyncio.runners":
            spec.loader = _AfterImport(spec.loader, _wrap_asyncio)
        return spec


def _inside(path, allowed, resolve=True):
    real = os.path.realpath(path) if resolve else path
    return any(real == a or real.startswith(a + os.sep) for a in allowed)


def _logging_may_name(found):
    """What a logging configuration may name in the judge (fromdata.guard_logging_config)."""
    if found is sys.stdout or found is sys.stderr or found is sys.stdin or isinstance(found, RemoteBase):
        return True
    module = getattr(found, "__module__", None) if isinstance(found, (type, types.FunctionType)) else None
    return type(module) is str and (module == TEST_MODULE or module.partition(".")[0] in ("logging", "io"))


def stdlib_dirs():
    """The standard library's directories (computed once, in the runner before the zygote forks:
    sysconfig costs milliseconds the first time)."""
    if JUDGE_CACHE.get("stdlib") is None:
        JUDGE_CACHE["stdlib"] = _find_stdlib_dirs()
    return JUDGE_CACHE["stdlib"]



def _find_stdlib_dirs():
    import sysconfig

    paths = sysconfig.get_paths()
    return tuple({os.path.realpath(paths[key]) for key in ("stdlib", "platstdlib") if paths.get(key)}
                 | {os.path.realpath(os.path.dirname(os.__file__))}
                 | {os.path.realpath(p) for p in sys.path if p and "lib-dynload" in p})


def package_dirs(names):
    """Where the imported packages (or single-file modules) ``names`` live: the image's own
    read-only code the judge may import from besides the standard library (pytest's)."""
    found = set()
    for name in names:
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if type(path) is str:
            path = os.path.realpath(path)
            found.add(os.path.dirname(path) if getattr(module, "__path__", None) is not None else path)
    return tuple(sorted(found))


def allowed_devices():
    """The sandbox's own filesystems: its root, ``/work`` and a keyed pool's read-only ``/assets``
    (computed once, like the above)."""
    if JUDGE_CACHE.get("devices") is None:
        JUDGE_CACHE["devices"] = _find_devices()
    return JUDGE_CACHE["devices"]


def _find_devices():
    devices = set()
    for path in ("/", "/work", "/usr", "/tmp", "/assets", os.path.dirname(os.__file__)):
        try:
            devices.add(os.stat(path).st_dev)
        except OSError:
            continue
    return devices


def _identity(fd):
    try:
        info = os.fstat(fd)
        return (info.st_dev, info.st_ino)
    except OSError:
        return None

