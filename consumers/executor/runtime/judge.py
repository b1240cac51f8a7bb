"""The judge process: one job's tests, run against the candidate's answers.

A module of the runtime (standard library only; in the sandbox it arrives in the runtime's
bundle, runtime/importer.py; on the host, an ordinary module, tested there with forked processes).

The zygote forks a fresh judge per job next to the job's candidate; both die with the job, so
nothing a judge did reaches a later job. The judge runs the task's ``setup`` and tests with the
names the tests read bound as the candidate reported them (consumers/executor/runtime/proxies.py), and reports
events to the runner (PID 1, which only supervises) on a pipe only the judge holds:
``compiled``, ``syntax``, ``setup_error``, ``code_error``, ``code_ok``, ``test`` (i, ok, type,
msg), ``gone`` (i), ``tamper`` (kind, msg), ``paths`` (with ``record``: which calls gave plain
data), ``done``. A judge that does not end with ``done`` and exit status 0 fails the job.

:class:`Guards` keep completion-controlled code out of this process and its I/O out of the
completion's reach:

* **imports**: only from the standard library's directories, never a ``__main__`` module or one
  that works on import; a name the tests read is bound to a module only when the judge imported
  it itself, before the completion ran (:func:`preimport`), never because the candidate named it;
* **code from data**: ``eval``/``exec``/``compile`` of anything but the tests' own literals (or
  code objects the judge compiled from them), ``pickle``/``marshal`` loads of anything but bytes
  the judge pickled itself, and pickling the completion's objects, run in the candidate; what
  comes back is a value or a proxy;
* **files**: what the tests open must be a regular file or directory of the sandbox's own
  filesystems (or the judge's own output), never a pipe, socket or ``/proc`` entry, whatever
  links the completion left in ``/work``;
* **the tests' overrides reach the completion**: builtins the tests patched, ``sys.stdin``,
  ``sys.argv``, and ``mock.patch`` of standard-library attributes apply in the candidate for the
  length of each request (consumers/executor/runtime/candidate.py);
* ``unittest``: a TestCase run inside a test (``unittest.main()`` or a runner) that fails or
  errors fails that test; ``unittest.main()``'s successful ``SystemExit`` passes it.
"""

import builtins
import io
import os
import stat
import sys
import time
import types
from operator import is_not

from rollstream.consumers.executor.runtime.candidate import SOLUTION
from rollstream.consumers.executor.runtime.channel import LinkDown
from rollstream.consumers.executor.runtime.codec import (
    NEVER_IMPORT,
    ProtocolError,
    clip_text,
    environ_text,
    import_std,
    resolve_std_importing,
    run_setup,
    setup_classes_of,
)
from rollstream.consumers.executor.runtime.crossing import Judge, Refused, Rules, control_classes
from rollstream.consumers.executor.runtime.fromdata import (
    ExecGuard,
    NotPlain,
    guard_logging_config,
    plain_eval,
    plain_unmarshal,
    plain_unpickle,
    random_continues,
)
from rollstream.consumers.executor.runtime.proxies import (
    JudgeState,
    MirrorMeta,
    NeedsCandidate,
    RemoteBase,
    TypeMismatch,
    raises,
)

TEST_MODULE = "__main__"  # the tests' namespace is this process's __main__ (unittest.main, pickle)


def preimport(modules):
    """The standard-library modules the tests read by name without importing them (``math`` in
    ``assert math.isclose(f(2), 1.41)``), imported by the judge before the completion runs.
    Only these may be bound to a name the completion defines as a module."""
    found = {}
    for name in modules:
        module = import_std(name) if type(name) is str and name.isidentifier() else None
        if module is not None:
            found[name] = module
    return found


def bind(judge, namespace, report, wanted, entry_point, preimported):
    """Bind the completion's names the tests use: not those the task's setup defined (its own
    helpers stay the judge's; the entry point always comes from the completion), never a builtin
    (but the entry point). With a reference, a name is bound only as the reference binds it
    (:func:`_binding`); a name it does not bind is not bound. Returns the names bound to the
    completion's value as it is (and those it may still define), for :class:`LiveNames`."""
    if type(report) is not list or len(report) % 2:
        raise ProtocolError("a malformed name report")
    rules = judge.rules
    reported, by_ref, live = {}, {}, {}
    for index in range(0, len(report), 2):
        name, value = report[index], report[index + 1]
        if type(name) is not str or name not in wanted or name in reported:
            raise ProtocolError(f"a name that was not asked for: {str(name)[:200]!r}")
        reported[name] = value
        ref = judge.table.refs.get(id(value))
        if ref is not None:
            by_ref.setdefault(ref, []).append(name)
    for ref, names in by_ref.items():  # aliases: how the tests reach it is every name it has
        judge.paths.setdefault(ref, "|".join(sorted(names)))
    for name, value in reported.items():
        if name.startswith("__") or name in ("raises", "run_program") or (hasattr(builtins, name) and name != entry_point):
            continue
        if name in namespace and name != entry_point:
            continue
        ref = judge.table.refs.get(id(value)) if isinstance(value, RemoteBase) else None
        module, std = judge.modules.get(ref), judge.std_objects.get(ref)
        if rules.record:  # the reference itself: what it binds is what the task means
            kind = judge.bound[name] = _kind_of(judge, name, value, module, std)
        else:
            kind = rules.names.get(name) if rules.mode == "reference" else None
        bound = _binding(judge, name, value, kind, module, entry_point, preimported)
        if bound is not _UNBOUND:
            namespace[name] = bound
            if bound is value:
                live[name] = value
    if entry_point in namespace and entry_point not in reported:
        del namespace[entry_point]  # the setup's stub (HumanEval prompts) is not the answer
    for name in wanted:  # not defined yet: a later call may define it (`global cache; cache = {}`)
        if name not in reported and name not in namespace and _may_bind(name, entry_point):
            live[name] = _UNBOUND
    return live


def _may_bind(name, entry_point):
    """Whether the completion may bind ``name`` for the tests at all (a name the setup does not
    define: :func:`bind`)."""
    if name == entry_point:
        return True
    return not (name.startswith("__") or name in ("raises", "run_program") or hasattr(builtins, name)
                or name in sys.stdlib_module_names)


_UNBOUND = object()


def _kind_of(judge, name, value, module, std):
    """How the reference binds ``name``: ``m:<module>`` (a standard-library module, under its name
    or an alias), ``s:<module>:<qualname>`` (a standard-library class or function), ``o`` (an
    object of its own), ``p`` (plain data)."""
    if module is not None:
        return f"m:{module}" if import_std(module) is not None else "m"
    if std is not None:
        return f"s:{std[0]}:{std[1]}"
    return "o" if judge.handles_in(value, name, name) else "p"


def _binding(judge, name, value, kind, module, entry_point, preimported):
    """What the tests see under ``name``:

    * a standard-library module or object the reference binds there (``import datetime as dt``,
      ``from math import isclose``): the judge's own, whatever the completion bound;
    * a module the completion bound (no reference): the judge's own import of that module, under
      its own name or an alias that is no other module's name; never a completion object under a
      module's name (``math``, ``re`` read by tests that rely on the completion's import), unless
      it is the entry point or the reference binds an object of its own there (``chunk``);
    * with a reference: nothing where it binds nothing, :class:`Refused` for a completion object
      where it binds plain data, or for a standard-library class or function where it binds an
      object of its own (``InsufficientFunds = Exception`` would let ``except`` swallow the tests'
      failures); else the completion's value."""
    if kind is not None and kind.startswith("m:"):
        found = preimported.get(kind[2:]) or import_std(kind[2:])
        return _UNBOUND if found is None else found
    if kind is not None and kind.startswith("s:"):
        found = resolve_std_importing(*kind[2:].partition(":")[::2])
        return _UNBOUND if found is None else found
    if module is not None:
        if kind is not None or (name in sys.stdlib_module_names and name != module):
            return _UNBOUND
        found = preimported.get(module) or import_std(module)
        return _UNBOUND if found is None else found
    if name in sys.stdlib_module_names and name != entry_point and kind not in ("o", "p"):
        return _UNBOUND
    if judge.rules.mode == "reference":
        if kind is None:
            return _UNBOUND
        objects = judge.handles_in(value, name, name)
        if kind == "p" and objects:
            return Refused(f"type_mismatch: {name} is a completion object where the task's reference binds plain data")
        if kind == "o" and not objects:
            return Refused(f"type_mismatch: {name} is plain data or a standard-library object where the task's "
                           "reference binds an object of its own")
    return value


class Guards:
    """One job's guard state (see the module docstring); the hooks themselves are installed once
    per process by :func:`install_guards` and consult the current job's Guards."""

    current = None  # the Guards of the job this process judges

    def __init__(self, judge, codes):
        self.judge = judge
        self.constants = set()  # ids of the str/bytes literals of the tests and setup
        self.keep = []
        self.codes = {id(code) for code in codes if isinstance(code, types.CodeType)}  # the runner compiled these
        for code in codes:
            self._constants(code)
        self.trusted_bytes = set()  # ids of bytes this judge pickled from its own objects
        self.unittest_failed = False
        self.unittest_run = 0  # unittest tests this test started, and how many of them it skipped
        self.unittest_skipped = 0
        self.random_shared = False  # the tests seeded the random module: the candidate shares its state
        warnings = sys.modules.get("warnings")
        self.warnings = None if warnings is None else (warnings.filters, warnings.showwarning,
                                                       warnings._showwarnmsg_impl)
        self.warning_registry = {}
        self.patches = []  # (patch, "module.attribute") of active mock.patch-es (see _wrap_mock)
        self.live = None  # the completion's names the tests read as it rebinds them (LiveNames)
        self.builtins_before = JUDGE_CACHE.get("builtins") or dict(vars(builtins))
        self.builtins_values = JUDGE_CACHE.get("builtins_values") or list(self.builtins_before.values())
        self.stdin = sys.stdin
        self.argv = list(sys.argv)
        data = getattr(os.environ, "_data", None)  # the environment and working directory as last sent
        self.environ_data = dict(data) if type(data) is dict else {}
        self.cwd = _cwd()

    def _constants(self, code):
        if not isinstance(code, types.CodeType):
            return
        for const in code.co_consts:
            if type(const) in (str, bytes):
                self.constants.add(id(const))
                self.keep.append(const)
            elif isinstance(const, types.CodeType):
                self._constants(const)

    def trusted(self, source):
        t = type(source)
        return t is types.CodeType or ((t is str or t is bytes) and id(source) in self.constants)

    def own_code(self, code):
        return id(code) in self.codes

    def trusted_text(self, text, indent=0):
        """Whether ``text`` is one of the tests' literals, as it is or indented by ``indent`` after
        each line break (timeit's reindent of a multi-line statement)."""
        if type(text) is not str:
            return False
        pad = "\n" + " " * indent
        return any(type(c) is str and (c == text or c.replace("\n", pad) == text) for c in self.keep)

    def delegate(self, mode, source, globals_, locals_, frame):
        """An ``eval``/``exec`` of a string the tests did not write, and that is not plain data
        (fromdata.plain_eval): run in the candidate's process, with the tests' namespace but never
        their builtins (what it writes there comes back under the rules; the builtins stay theirs).
        With a reference, only where the reference's run did so too: elsewhere the completion made
        a literal into code so that its own process would decide (``type_mismatch``)."""
        self.judge.delegating(mode)
        modules = None
        if globals_ is None:
            modules = {k: v for k, v in frame.f_globals.items()
                       if type(v) is types.ModuleType and v.__name__.partition(".")[0] in sys.stdlib_module_names}
            return self.judge.ask("eval", None, [mode, source, None, locals_, modules])
        sent = {k: v for k, v in globals_.items() if k != "__builtins__"}
        before = dict(sent)
        try:
            return self.judge.ask("eval", None, [mode, source, sent, sent if locals_ is globals_ else locals_, None])
        finally:  # new names come back; the tests' own names are never rebound or deleted by it
            changed = [k for k, v in before.items() if sent.get(k, _UNBOUND) is not v]
            globals_.update({k: v for k, v in sent.items() if k not in before and k != "__builtins__"})
            if changed:
                self.judge.mismatch(f"type_mismatch: code the completion made rebinds the tests' own "
                                    f"{', '.join(sorted(changed)[:5])}")

    def loads(self, kind, data, real, kwargs):
        """Pickle or marshal data: the judge's own bytes as they are; any other loaded here as plain
        data (fromdata); a pickle naming other classes by the candidate, where it must give an
        object of the completion's (never plain data the completion chose for it)."""
        if id(data) in self.trusted_bytes or self.trusted(data):
            return real(data, **kwargs) if kwargs else real(data)
        if type(data) is bytearray or isinstance(data, memoryview):
            data = bytes(data)
        if kind == "marshal":
            return plain_unmarshal(data, real)
        try:
            return plain_unpickle(data, sys.modules[TEST_MODULE], JUDGE_CACHE["unpickler"], kwargs)
        except NotPlain as exc:
            named = str(exc)
        self.judge.delegating("loads")
        value = self.judge.ask("loads", None, [kind, data])
        if not self.judge.handles_in(value, "<loads>", "<loads>"):
            import pickle

            raise pickle.UnpicklingError(f"a pickle naming {named[:200]} gave plain data: it is the completion's "
                                         "to say what its own classes hold, never what plain data is")
        return value

    def dumps(self, obj, protocol, real, kwargs):
        try:
            data = real(obj, protocol, **kwargs)
        except NeedsCandidate:
            return self.judge.ask("dumps", None, [obj, protocol])
        self.trusted_bytes.add(id(data))
        self.keep.append(data)
        return data

    def env(self):
        """The tests' overrides the candidate must see during the next request."""
        overrides = []
        before, current = self.builtins_before, vars(builtins)
        # by identity, in C while nothing changed (`!=` would ask a patched-in mock, which records it)
        if len(current) != len(before) or any(map(is_not, current.values(), self.builtins_values)):
            for name, value in current.items():
                if before.get(name) is not value and name != "_":
                    overrides += [f"builtins.{name}", value]
        if sys.stdin is not self.stdin:
            overrides += ["sys.stdin", sys.stdin]
        if sys.argv != self.argv:
            overrides += ["sys.argv", list(sys.argv)]
        data = getattr(os.environ, "_data", None)
        if type(data) is dict and data != self.environ_data:  # os.environ[k] = v, mock.patch.dict (in C)
            before, environ = environ_text(self.environ_data), environ_text()
            if before is not None and environ is not None:
                overrides += ["os.environ", [before, environ]]
            self.environ_data = dict(data)
        cwd = _cwd()
        if cwd is not None and cwd != self.cwd:  # os.chdir in the tests (a temporary directory)
            overrides += ["os.chdir", cwd]
            self.cwd = cwd
        for _, target in self.patches:  # mock.patch, monkeypatch (pytests.py): as the tests' module has it now
            try:
                module, _, attribute = target.rpartition(".")
                value = getattr(sys.modules[module], attribute, _UNBOUND)
            except BaseException:
                continue
            overrides += [target, value] if value is not _UNBOUND else ["-" + target, None]  # "-": deleted
        logging = sys.modules.get("logging")
        if logging is not None:
            levels = _logging_capture(logging)
            if levels is not None:  # the tests handle log records: the completion's come here too
                overrides += ["logging.capture", levels]
        if self.random_shared:
            overrides += ["random.state", sys.modules["random"].getstate()]
        if self.catching_warnings():
            overrides += ["warnings.capture", True]
        return overrides or None

    def catching_warnings(self):
        """Whether the tests catch or filter warnings now (``catch_warnings``, ``assertWarns``,
        ``simplefilter``): then the completion's warnings are issued again here."""
        warnings = sys.modules.get("warnings")
        if warnings is None or self.warnings is None:
            return False
        filters, show, impl = self.warnings
        return warnings.filters is not filters or warnings.showwarning is not show \
            or warnings._showwarnmsg_impl is not impl

    def extras(self, values):
        """What a reply carried besides its answer: the random generator's state after the
        call (the tests seeded it), the warnings the call issued (the tests catch them)."""
        if len(values) % 2:
            raise ProtocolError("malformed extras")
        for index in range(0, len(values), 2):
            kind, value = values[index], values[index + 1]
            if type(kind) is str and kind[:1] in ("=", "-"):  # the completion rebound a name the tests read
                if self.live is None:
                    raise ProtocolError("a name rebound before the names were bound")
                self.live.moved(kind[1:], kind[0] == "=", value)
            elif kind == "random" and self.random_shared:
                if type(value) is not list or len(value) != 2:
                    raise ProtocolError("a malformed random state")
                random = sys.modules["random"]
                try:
                    if random_continues(random, random.getstate(), value[0], value[1]):
                        random.setstate(value[0])
                except (TypeError, ValueError, OverflowError):
                    raise ProtocolError("a malformed random state") from None
            elif kind == "logs" and type(value) is list and "logging" in sys.modules:
                _handle_records(sys.modules["logging"], value)
            elif kind == "warnings" and type(value) is list:
                import warnings

                for entry in value[:1000]:
                    if type(entry) is not list or len(entry) != 4 or not isinstance(entry[0], Warning) \
                            or type(entry[2]) is not str or type(entry[3]) is not int:
                        raise ProtocolError("a malformed warning")
                    message, _, filename, line = entry
                    why = self.unwarnable(message)
                    if why is not None:  # never issued here: under an "error" filter it would be raised
                        self.judge.failed = self.judge.failed or why
                        continue
                    self.judge.candidate_errors.add(id(message))
                    self.judge.kept_errors.append(message)
                    warnings.warn_explicit(message, type(message), filename, line, module="solution",
                                           registry=self.warning_registry)

    def unwarnable(self, message):
        """Why a warning the completion issued may not be issued again here: a class of its own that
        is also a skip, a stop or an exit, or completion objects in its arguments."""
        mro = type(message).__mro__
        if not all(base in (object, BaseException, Exception) or issubclass(base, Warning)
                   or type(base) is MirrorMeta for base in mro) or isinstance(message, control_classes() or ()):
            return (f"the completion's warning {type(message).__name__} is also another exception (a skip, a stop, "
                    "StopIteration, an exit...): a test the completion skipped or stopped never passes")
        if self.judge.handles_in(list(message.args), f"{self.judge.test}|<warning>", "<warning>"):
            return "type_mismatch: a warning of the completion's carries objects of its own"
        return None


class LiveNames:
    """The completion's module-level names as the tests read them *now*. In Python the tests share
    the completion's module (``import solution; solution.counter``, or the bare name where the
    tests run in its namespace): after ``hit()`` does ``global counter; counter += 1`` they read
    the new value. The candidate says with each reply which of the names the tests read its
    module rebound or deleted (candidate.py ``_moved_names``); the judge rebinds them in the
    tests' namespace and in its ``solution`` module, where the tests have not bound them to
    something else themselves. Only names :func:`bind` bound to the completion's value as it was
    (never a name the setup defines, a builtin's, a module's or one the reference binds to a
    standard-library object); the new value arrives at a point of its own (``3|counter``) and is
    checked there like a call's result (crossing.Judge.check): without a reference an object of
    the completion's is opaque, so a counter rebound to an object that claims equality compares
    with nothing."""

    def __init__(self, judge, spaces, live, names):
        self.judge, self.spaces, self.names = judge, spaces, frozenset(names)
        self.last = dict(live)  # name -> what the judge bound there last (_UNBOUND: nothing)

    def moved(self, name, present, value):
        if name not in self.names:
            raise ProtocolError(f"a name that was not asked for: {str(name)[:200]!r}")
        before = self.last.get(name, _NOT_LIVE)
        if before is _NOT_LIVE:
            return
        judge = self.judge
        ref = judge.table.refs.get(id(value)) if isinstance(value, RemoteBase) else None
        if present and ref is not None and ref in judge.modules:  # a module: never bound because the completion
            del self.last[name]  # named it (bind); what the tests hold stays
            return
        if present:
            try:
                refused = judge.check(value, f"{judge.test}|{name}", name, lazy=True)
            except TypeMismatch as exc:  # the call fails; and the name, for whatever reads it later
                self.rebind(name, before, Refused(str(exc)))
                raise
            value = value if refused is None else refused
        self.rebind(name, before, value if present else _UNBOUND)

    def rebind(self, name, before, value):
        for space in self.spaces:
            if space.get(name, _UNBOUND) is before:  # not rebound by the tests themselves
                if value is _UNBOUND:
                    space.pop(name, None)
                else:
                    space[name] = value
        self.last[name] = value


_NOT_LIVE = object()


def _tests_eval(source, globals=None, locals=None):
    if Guards.current.trusted(source):
        frame = sys._getframe(1)
        return builtins.eval(source, frame.f_globals if globals is None else globals,
                             (frame.f_locals if globals is None else globals) if locals is None else locals)
    plain, value = plain_eval(source, "eval")  # constants and operators: evaluated here
    if plain:
        return value
    return Guards.current.delegate("eval", source, globals, locals, sys._getframe(1))


def _tests_exec(source, globals=None, locals=None, **kwargs):
    frame = sys._getframe(1)
    if Guards.current.trusted(source):
        return builtins.exec(source, frame.f_globals if globals is None else globals,
                             (frame.f_locals if globals is None else globals) if locals is None else locals)
    plain, assigned = plain_eval(source, "exec")  # assignments of constants: made here
    if plain:
        target = locals if locals is not None else globals if globals is not None else frame.f_locals
        target.update(assigned)
        return None
    return Guards.current.delegate("exec", source, globals, locals, frame)


def _tests_compile(source, filename, mode, flags=0, dont_inherit=False, optimize=-1, **kwargs):
    if Guards.current.trusted(source) or isinstance(source, types.CodeType):
        return builtins.compile(source, filename, mode, flags, dont_inherit, optimize)
    Guards.current.judge.delegating("compile")
    return Guards.current.judge.ask("compile", None, [source, filename, mode, flags, dont_inherit, optimize])


def builtins_for_tests():
    """The tests' builtins: the process's own, with code from data sent to the candidate (built
    once per process: in the sandbox by the judge zygote)."""
    found = JUDGE_CACHE.get("test_builtins")
    if found is None:
        found = JUDGE_CACHE["test_builtins"] = dict(vars(builtins), eval=_tests_eval, exec=_tests_exec, compile=_tests_compile)
    return found


def _logging_capture(logging):
    """``["", root level, name, level, ...]`` (the levels the tests set) when the tests have a
    log handler anywhere (``assertLogs``, ``basicConfig``, their own handler); else None."""
    root = logging.root
    found = bool(root.handlers)
    levels = ["", root.level]
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger):
            found = found or bool(logger.handlers)
            if logger.level:
                levels += [name, logger.level]
    return levels if found else None


LOG_FIELDS = (("name", str), ("levelno", int), ("levelname", str), ("msg", str), ("pathname", str),
              ("lineno", int), ("funcName", str), ("exc_text", (str, type(None))), ("created", float))


def _handle_records(logging, records):
    """The completion's log records (plain data, checked field by field), handled by the tests'
    loggers as if logged here: the level was decided in the candidate, under the tests' levels."""
    for entry in records[:1000]:
        if type(entry) is not list or len(entry) != len(LOG_FIELDS) \
                or not all(isinstance(v, kind) and type(v) is not bool for v, (_, kind) in zip(entry, LOG_FIELDS)):
            raise ProtocolError("a malformed log record")
        fields = dict(zip((name for name, _ in LOG_FIELDS), entry))
        fields.update(args=None, filename=os.path.basename(fields["pathname"]),
                      module=os.path.splitext(os.path.basename(fields["pathname"]))[0])
        logging.getLogger(fields["name"] or None).handle(logging.makeLogRecord(fields))


def _cwd():
    try:
        return os.getcwd()
    except OSError:
        return None


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
    sys.addaudithook(ExecGuard(lambda: Guards.current, (_tests_eval.__code__, _tests_exec.__code__),
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


JUDGE_CACHE = {}


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


# ---------------------------------------------------------------- the test loop

def judge_main(part, read_fd, write_fd, report, guarded=True, run_files=None):
    """Run one job's setup and tests against the candidate at the other end of the pipes;
    ``report(dict)`` records events. ``part`` is what the runner sent (trusted). ``guarded``:
    install the guards if this process has not (off only for the runner's warm-up).
    ``run_files`` runs a job's pytest files (runtime/pytests.py ``run_pytest_files``, which the
    zygotes pass: pytests.py builds on this module, so this one does not import it)."""
    setup, tests, names, entry_point, modules, rules, pytest_files = part  # pytest_files: runtime/pytests.py
    preimported = preimport(modules)
    namespace_module = types.ModuleType(TEST_MODULE)
    namespace = namespace_module.__dict__
    judge = Judge(read_fd, write_fd, rules=Rules(rules))
    JudgeState.judge = judge
    if guarded:
        install_guards()
    guards = Guards(judge, [setup, *tests])
    Guards.current = guards
    judge.env = guards.env
    judge.extras = guards.extras
    namespace.update(__builtins__=builtins_for_tests(), raises=raises,
                     run_program=lambda stdin="": _run_program(judge, stdin), __assert_explain__=explain)
    sys.modules[TEST_MODULE] = namespace_module
    sys.argv = ["tests"]
    guards.argv = list(sys.argv)
    failed = run_setup(setup, namespace)
    if failed is not None:
        report({"e": "setup_error", "type": type(failed).__name__, "msg": clip_text(failed, 500)})
        return finish(judge, report)
    setup_objects = {k: v for k, v in namespace.items()
                     if k not in ("__builtins__", "raises", "run_program", "__assert_explain__")}
    judge.set_setup(setup_objects, setup_classes_of(namespace))
    status, detail = first_messages(judge)
    if status == "syntax":
        kind, line, msg = (detail + [None, None, None])[:3]
        report({"e": "syntax", "type": _short(kind), "line": line if type(line) is int else None, "msg": _short(msg, 500)})
        return finish(judge, report)
    if status in ("gone", "tamper"):
        if detail == "compiled":
            report({"e": "compiled"})
        return finish(judge, report, tests, 0)
    report({"e": "compiled"})
    if status == "setup_error":
        report({"e": "setup_error", "type": _short(_at(detail, 0)), "msg": _short(_at(detail, 1), 500)})
        return finish(judge, report)
    if status == "code_error":
        line = _at(detail, 2)
        report({"e": "code_error", "type": _short(_at(detail, 0)), "msg": _short(_at(detail, 1), 500),
                "line": line if type(line) is int else None})
        return finish(judge, report)
    try:
        if status != "ok" or len(detail) != 1:
            raise ProtocolError("an unknown ready status")
        live = bind(judge, namespace, detail[0], set(names), entry_point, preimported)
        sys.modules[SOLUTION] = module = solution_module(namespace, names)
        guards.live = LiveNames(judge, (namespace, module.__dict__), live, names)
    except ProtocolError as exc:
        judge.set_tamper("protocol", exc)
        return finish(judge, report, tests, 0)
    report({"e": "code_ok"})
    if pytest_files:
        if run_files is None:
            raise RuntimeError("a job of pytest files, and no runner of them given")
        run_files(namespace, tests, report, judge)
        return finish(judge, report)
    for index, test in enumerate(tests):
        if judge.gone is not None:  # nothing more will be answered: the rest fail unrun
            return finish(judge, report, tests, index, gone_reported=True)
        started = time.perf_counter()
        event = run_test(judge, guards, namespace, index, test)
        event["d"] = round(time.perf_counter() - started, 6)
        report(event)
        if judge.gone is not None and judge.tamper is None:
            report({"e": "gone", "i": index, "msg": judge.gone[:300]})
    return finish(judge, report)


def solution_module(namespace, names):
    """The completion's module as the tests import it (``from solution import add``, ``import
    solution``): the names the tests read, each as :func:`bind` bound it (the task's setup's
    own where it defines one); a name the completion does not define is not there (an
    ``ImportError``, as in Python)."""
    module = types.ModuleType(SOLUTION)
    module.__dict__.update({name: namespace[name] for name in names
                            if name in namespace and name not in ("raises", "run_program", "__assert_explain__")})
    return module


def run_test(judge, guards, namespace, index, test):
    """One test: passed only if it ran to its end. A skip the tests declare themselves
    (``@unittest.skip``, ``skipTest``, ``raise unittest.SkipTest`` in the test's code) reports the
    test as skipped: neither passed nor failed. With a reference, skipping more of a test than
    the reference's run did is the completion's doing: the test fails."""
    judge.failed = None
    judge.test = str(index)
    guards.unittest_failed = False
    guards.unittest_run = guards.unittest_skipped = 0
    skipped = None
    try:
        if isinstance(test, str):
            raise SyntaxError(f"the task's test does not compile: {test}")
        exec(test, namespace)
    except SystemExit as exc:  # unittest.main(): a success exits with a false code
        ok = id(exc) not in judge.candidate_errors and not exc.code
        event = {"e": "test", "i": index, "ok": ok} if ok else _failure(index, exc)
    except BaseException as exc:
        control = _skip_class()
        if control is not None and isinstance(exc, control) and judge.failed is None:
            skipped = clip_text(exc, 300)  # the test's own skip (a completion's never arrives as one)
        event = _failure(index, exc)
    else:
        event = {"e": "test", "i": index, "ok": True}
    if event["ok"] and guards.unittest_failed:
        event = {"e": "test", "i": index, "ok": False, "type": "AssertionError", "msg": "a unittest test failed"}
    whole = skipped is not None or (event["ok"] and guards.unittest_run and guards.unittest_skipped == guards.unittest_run)
    count = -1 if whole else guards.unittest_skipped
    if judge.rules.record:
        if count:
            judge.skips[str(index)] = count
    elif count and judge.rules.mode == "reference":
        allowed = judge.rules.skips.get(str(index), 0)
        if allowed != -1 and (count == -1 or count > allowed):
            judge.failed = judge.failed or ("skipped: the test skipped where the task's reference ran it (a skip "
                                            "the completion caused never passes)")
            whole = False
    if whole and judge.failed is None:
        return {"e": "test", "i": index, "ok": False, "skip": True, "type": "SkipTest",
                "msg": skipped or f"all {guards.unittest_run} unittest tests skipped"}
    if judge.failed is not None:
        event = {"e": "test", "i": index, "ok": False, "type": failure_type(judge.failed), "msg": judge.failed[:300]}
    return event


_SCALARS = (bool, float, complex, type(None))


def plain_repr(value, budget=120, depth=0):
    """``value`` as text when it is plain data (the exact built-in types, containers of them, within
    ``budget`` characters and 3 levels), else its type's name: nothing of the completion runs (a
    proxy's type is the judge's own class; no ``__repr__`` but the built-ins' is called)."""
    kind = type(value)
    if kind in _SCALARS:
        return repr(value)
    if kind is int:
        return repr(value) if value.bit_length() <= 256 else f"<int of {value.bit_length()} bits>"
    if kind in (str, bytes):
        return repr(value[:budget]) + (f"... ({len(value)} long)" if len(value) > budget else "")
    if kind in (list, tuple, set, frozenset, dict) and depth < 3:
        items = list(value.items()) if kind is dict else list(value) if kind in (list, tuple) else None
        if items is None:  # a set: its items' order is the set's own; only plain ones are shown
            items = list(value)
        shown, used = [], 0
        for item in items:
            text = (f"{plain_repr(item[0], budget, depth + 1)}: {plain_repr(item[1], budget, depth + 1)}"
                    if kind is dict else plain_repr(item, budget, depth + 1))
            used += len(text) + 2
            if used > budget and shown:
                shown.append(f"... {len(items) - len(shown)} more")
                break
            shown.append(text)
        body = ", ".join(shown)
        if kind is list:
            return f"[{body}]"
        if kind is tuple:
            return f"({body}{',' if len(items) == 1 else ''})"
        if kind is dict:
            return "{" + body + "}"
        return f"{kind.__name__}({{{body}}})" if items else f"{kind.__name__}()"
    return f"<{kind.__name__}>" if kind.__module__ == "builtins" else "<an object>"


def explain(left, op, right):
    """The message of a failing ``assert left <op> right`` (runtime/supervisor.py ``explained_asserts``)."""
    return f"{plain_repr(left)} {op} {plain_repr(right)}"


def failure_type(why):
    for prefix, kind in (("type_mismatch", "TypeMismatch"), ("too_large", "TooLarge"), ("skipped", "SkipTest"),
                         ("test_object", "TestObject")):
        if why.startswith(prefix):
            return kind
    return "FailedCall"


def _skip_class():
    case = sys.modules.get("unittest.case")
    return getattr(case, "SkipTest", None) if case is not None else None


def _failure(index, exc):
    return {"e": "test", "i": index, "ok": False, "type": type(exc).__name__, "msg": clip_text(exc, 300)}


def first_messages(judge):
    """The candidate's first messages: (status, detail)."""
    channel = judge.channel
    judge.decoding = True
    try:
        message = channel.receive()
        if message is None:
            raise LinkDown("the candidate exited or died")
        if message.kind == "syntax":
            return "syntax", message.items
        if message.kind != "compiled":
            raise ProtocolError("expected the compile status")
        try:
            message = channel.receive()
            if message is None:
                raise LinkDown("the candidate exited or died")
        except LinkDown as exc:
            judge.gone = judge.gone or exc.reason
            return "gone", "compiled"
        if message.kind != "ready":
            raise ProtocolError("expected the ready message")
        return message.what, message.items
    except ProtocolError as exc:
        judge.set_tamper("protocol", exc)
        return "tamper", None
    except LinkDown as exc:
        judge.gone = judge.gone or exc.reason
        return "gone", None
    finally:
        judge.decoding = False


def _run_program(judge, stdin):
    """The program's standard output for this standard input (tests call it by name)."""
    if not isinstance(stdin, (str, bytes)):
        raise TypeError("run_program takes the standard input as str or bytes")
    result = judge.ask("run", None, [stdin])
    if type(result) is not list or len(result) != 2 or type(result[0]) is not str:
        judge.set_tamper("protocol", "a malformed program result")
        judge.fail(judge.gone)
    return result[0]


def finish(judge, report, tests=(), start=None, gone_reported=False):
    """Report what is left: the tests from ``start`` on fail unrun, any tamper, the record of
    plain calls, then done."""
    if start is not None:
        why = (judge.gone or "the candidate exited or died")[:300]
        if judge.tamper is None and not gone_reported:
            report({"e": "gone", "i": start, "msg": why})
        for index in range(start, len(tests)):
            report({"e": "test", "i": index, "ok": False, "type": "FailedCall", "msg": why})
    if judge.tamper is not None:
        report({"e": "tamper", "kind": judge.tamper[0], "msg": judge.tamper[1]})
    if judge.rules.record:  # what the reference produced: the rules for the task's other jobs
        report({"e": "paths", "objects": sorted(judge.recorded_steps)[:4096],
                "names": sorted(f"{name}:{kind}" for name, kind in judge.bound.items()),
                "skips": sorted(f"{index}:{count}" for index, count in judge.skips.items()),
                "delegated": sorted(judge.delegated)[:4096], "suppressed": sorted(judge.suppressed)[:4096]})
    report({"e": "done"})
    return 0


def _at(detail, index):
    return detail[index] if type(detail) is list and len(detail) > index else None


def _short(value, limit=100):
    return value[:limit] if type(value) is str else ""
