"""The judge's guards: one job's guard state (:class:`Guards`), the completion's names the tests
read as it rebinds them (:class:`LiveNames`) and the tests' builtins (code from data sent to the
candidate).

A module of the runtime (standard library only; in the sandbox it arrives in the runtime's
bundle, runtime/importer.py; on the host, an ordinary module). The process-wide hooks that
consult the current job's Guards are runtime/hooks.py's; the judge that makes one per job is
runtime/judge.py.

:class:`Guards` keep completion-controlled code out of this process and its I/O out of the
completion's reach:

* **imports**: only from the standard library's directories, never a ``__main__`` module or one
  that works on import; a name the tests read is bound to a module only when the judge imported
  it itself, before the completion ran (judge.py :func:`preimport`), never because the candidate named it;
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
import os
import sys
import types
from operator import is_not

from rollstream.consumers.executor.runtime.codec import ProtocolError, environ_text
from rollstream.consumers.executor.runtime.fromdata import (
    NotPlain,
    plain_eval,
    plain_unmarshal,
    plain_unpickle,
    random_continues,
)
from rollstream.consumers.executor.runtime.proxies import MirrorMeta, NeedsCandidate, RemoteBase, TypeMismatch
from rollstream.consumers.executor.runtime.valuecheck import Refused, control_classes

TEST_MODULE = "__main__"  # the tests' namespace is this process's __main__ (unittest.main, pickle)

JUDGE_CACHE = {}  # what a judge process computes once, before the zygote forks (hooks.py)

UNBOUND = object()  # no value: a name not bound (judge.py bind, LiveNames)


class Guards:
    """One job's guard state (see the module docstring); the hooks themselves are installed once
    per process by :func:`install_guards` and consult the current job's Guards."""

    current = None  # the Guards of the job this process judges

    def __init__(self, crossing, codes):
        self.crossing = crossing
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
        self.crossing.delegating(mode)
        modules = None
        if globals_ is None:
            modules = {k: v for k, v in frame.f_globals.items()
                       if type(v) is types.ModuleType and v.__name__.partition(".")[0] in sys.stdlib_module_names}
            return self.crossing.ask("eval", None, [mode, source, None, locals_, modules])
        sent = {k: v for k, v in globals_.items() if k != "__builtins__"}
        before = dict(sent)
        try:
            return self.crossing.ask("eval", None, [mode, source, sent, sent if locals_ is globals_ else locals_, None])
        finally:  # new names come back; the tests' own names are never rebound or deleted by it
            changed = [k for k, v in before.items() if sent.get(k, UNBOUND) is not v]
            globals_.update({k: v for k, v in sent.items() if k not in before and k != "__builtins__"})
            if changed:
                self.crossing.mismatch(f"type_mismatch: code the completion made rebinds the tests' own "
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
        self.crossing.delegating("loads")
        value = self.crossing.ask("loads", None, [kind, data])
        if not self.crossing.handles_in(value, "<loads>", "<loads>"):
            import pickle

            raise pickle.UnpicklingError(f"a pickle naming {named[:200]} gave plain data: it is the completion's "
                                         "to say what its own classes hold, never what plain data is")
        return value

    def dumps(self, obj, protocol, real, kwargs):
        try:
            data = real(obj, protocol, **kwargs)
        except NeedsCandidate:
            return self.crossing.ask("dumps", None, [obj, protocol])
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
                value = getattr(sys.modules[module], attribute, UNBOUND)
            except BaseException:
                continue
            overrides += [target, value] if value is not UNBOUND else ["-" + target, None]  # "-": deleted
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
                        self.crossing.failed = self.crossing.failed or why
                        continue
                    self.crossing.candidate_errors.add(id(message))
                    self.crossing.kept_errors.append(message)
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
        if self.crossing.handles_in(list(message.args), f"{self.crossing.test}|<warning>", "<warning>"):
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
    checked there like a call's result (valuecheck.ValueCheck.check): without a reference an object of
    the completion's is opaque, so a counter rebound to an object that claims equality compares
    with nothing."""

    def __init__(self, crossing, spaces, live, names):
        self.crossing, self.spaces, self.names = crossing, spaces, frozenset(names)
        self.last = dict(live)  # name -> what the judge bound there last (UNBOUND: nothing)

    def moved(self, name, present, value):
        if name not in self.names:
            raise ProtocolError(f"a name that was not asked for: {str(name)[:200]!r}")
        before = self.last.get(name, _NOT_LIVE)
        if before is _NOT_LIVE:
            return
        crossing = self.crossing
        ref = crossing.table.refs.get(id(value)) if isinstance(value, RemoteBase) else None
        if present and ref is not None and ref in crossing.modules:  # a module: never bound because the completion
            del self.last[name]  # named it (bind); what the tests hold stays
            return
        if present:
            try:
                refused = crossing.check(value, f"{crossing.test}|{name}", name, lazy=True)
            except TypeMismatch as exc:  # the call fails; and the name, for whatever reads it later
                self.rebind(name, before, Refused(str(exc)))
                raise
            value = value if refused is None else refused
        self.rebind(name, before, value if present else UNBOUND)

    def rebind(self, name, before, value):
        for space in self.spaces:
            if space.get(name, UNBOUND) is before:  # not rebound by the tests themselves
                if value is UNBOUND:
                    space.pop(name, None)
                else:
                    space[name] = value
        self.last[name] = value


_NOT_LIVE = object()


def tests_eval(source, globals=None, locals=None):
    if Guards.current.trusted(source):
        frame = sys._getframe(1)
        return builtins.eval(source, frame.f_globals if globals is None else globals,
                             (frame.f_locals if globals is None else globals) if locals is None else locals)
    plain, value = plain_eval(source, "eval")  # constants and operators: evaluated here
    if plain:
        return value
    return Guards.current.delegate("eval", source, globals, locals, sys._getframe(1))


def tests_exec(source, globals=None, locals=None, **kwargs):
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


def tests_compile(source, filename, mode, flags=0, dont_inherit=False, optimize=-1, **kwargs):
    if Guards.current.trusted(source) or isinstance(source, types.CodeType):
        return builtins.compile(source, filename, mode, flags, dont_inherit, optimize)
    Guards.current.crossing.delegating("compile")
    return Guards.current.crossing.ask("compile", None, [source, filename, mode, flags, dont_inherit, optimize])


def builtins_for_tests():
    """The tests' builtins: the process's own, with code from data sent to the candidate (built
    once per process: in the sandbox by the judge zygote)."""
    found = JUDGE_CACHE.get("test_builtins")
    if found is None:
        found = JUDGE_CACHE["test_builtins"] = dict(vars(builtins), eval=tests_eval, exec=tests_exec, compile=tests_compile)
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

