"""The candidate: the completion's process, which answers the judge's requests.

A module of the runtime (standard library only; in the sandbox it arrives in the runtime's
bundle, runtime/importer.py; on the host, an ordinary module). The candidate is a fresh fork of the zygote, which never
loaded a job: it runs the task's ``setup``, then the completion's code, reports what it defines
under the names the tests read, then serves requests until the runner ends it (consumers/
judge.py for the other side). Everything here is honest serving code; the completion can change
any of it in its own process, and the judge believes only what it can decode.

What the tests hand over comes as it is in Python: their lists, dicts and the task's own class
instances as replicas whose changes go back (consumers/executor/runtime/codec.py); their functions, mocks and
streams as :class:`JudgeProxy` s, which the completion calls like the originals (the judge runs
them). For the length of a request the judge's overrides apply here too: a builtin the tests
patched (``input``), ``sys.stdin``/``sys.argv`` they replaced, ``mock.patch`` of a
standard-library function. Programs (``run_program``) get their input on a real descriptor 0,
so ``input()``, ``sys.stdin.buffer`` and ``open(0)`` all read it.
"""

import builtins
import os
import sys

from rollstream.consumers.executor.runtime.channel import Channel, items
from rollstream.consumers.executor.runtime.codec import (
    MUTABLE,
    ProtocolError,
    Table,
    clip_text,
    environ_apply,
    run_setup,
    setup_classes_of,
    std_name,
)
from rollstream.consumers.executor.runtime.programs import (
    COMPILE_ERROR,
    COMPILER_UNAVAILABLE,
    MESSAGE_CHARS,
    Built,
    CompileFailed,
    build,
    run_built,
    run_forked,
)
from rollstream.consumers.executor.runtime.proxies import (
    CANDIDATE_PARITY,
    JUDGE_PARITY,
    STD_VALUE_CLASSES,
    VALUE_BASES,
    builtin_base,
    exception_item,
    exception_value,
    flat_kwargs,
    value_base,
)

SOLUTION = "solution"  # the completion's module name
# What one call may print: it travels with the reply, within the frame's bytes, and the judge prints it where the
# tests' own prints go (their redirect_stdout, or the job's output, which the supervisor caps), so the job's
# output cap is not this one's: a call printing 150 KB into the tests' StringIO is honest.
PRINT_CAP = 8 << 20


class PrintCapture:
    """``sys.stdout``/``sys.stderr`` while the candidate serves: what a call prints travels with
    its reply and is printed by the judge, where the tests' ``redirect_stdout`` sees it."""

    def __init__(self):
        self.parts, self.size = [], 0

    def write(self, text):
        text = str(text)
        self.parts.append(text)
        self.size += len(text)
        return len(text)

    def flush(self):
        pass

    def isatty(self):
        return False

    def writable(self):
        return True

    def drain(self):
        text = "".join(self.parts)
        self.parts.clear()
        self.size = 0
        return text


class JudgeProxy:
    """An object of the tests' (a key function, a mock, a stream): every use is a request the
    judge answers."""

    __slots__ = ()

    def __call__(self, *args, **kwargs):
        return _ask("call", self, [items(args), items(flat_kwargs(kwargs))])

    def __getattr__(self, name):
        value = _ask("get", self, [name])
        return _BoundJudge(self, name) if value is _JUDGE_METHOD else value

    def __setattr__(self, name, value):
        _ask("set", self, [name, value])

    def __hash__(self):
        value = _CANDIDATE.hashes.get(_CANDIDATE.table.refs.get(id(self)))
        if value is None:
            raise TypeError("unhashable object of the tests")
        return value

    def __eq__(self, other):
        return self is other or _op(self, "eq", other)

    def __ne__(self, other):
        return self is not other and _op(self, "ne", other)


class _BoundJudge:
    __slots__ = ("owner", "name")

    def __init__(self, owner, name):
        self.owner, self.name = owner, name

    def __call__(self, *args, **kwargs):
        return _ask("callm", self.owner, [self.name, items(args), items(flat_kwargs(kwargs))])


def _judge_forward(op):
    def method(self, *args):
        return _op(self, op, *args)

    method.__name__ = f"__{op}__"
    return method


for _name in ("len", "iter", "next", "str", "repr", "bool", "contains", "getitem", "setitem", "delitem",
              "lt", "le", "gt", "ge", "format", "enter", "exit"):
    setattr(JudgeProxy, f"__{_name}__", _judge_forward(_name))


_JUDGE_METHOD = object()


class _Candidate:
    """The one candidate of this process."""

    def __init__(self):
        self.table = Table(CANDIDATE_PARITY)
        self.hashes = {}
        self.channel = None
        self.setup = {}  # name -> object the task's setup defined
        self.setup_ids = {}  # id(object) -> name
        self.namespace = None
        self.code = None
        self.out_cap = 1 << 16
        self.loop = None  # the event loop the completion's coroutines run on (made when first needed)
        self.watched = {}  # name the tests read -> what this module held under it when the judge last heard


_CANDIDATE = _Candidate()


def _ask(op, target, rest):
    message = _CANDIDATE.channel.call(op, [target, items(rest)])
    if message.what == "ok" and len(message.items) == 1:
        return message.items[0]
    if message.what == "exc" and len(message.items) == 1 and isinstance(message.items[0], BaseException):
        raise message.items[0]
    if message.what == "m":
        return _JUDGE_METHOD
    raise RuntimeError(f"the tests' object could not answer: {str(message.items)[:300]}")


def _op(target, name, *args):
    return _ask("op", target, [name, *args])


def _kwargs_of(flat):
    return dict(zip(flat[0::2], flat[1::2]))


# ---------------------------------------------------------------- the codec's rules for this side

def encode_other(x, encoder):
    candidate = _CANDIDATE
    name = candidate.setup_ids.get(id(x))
    if name is not None:
        return {"U": name}
    t = type(x)
    if isinstance(x, BaseException):
        if getattr(builtins, t.__name__, None) is t or std_name(t) is not None:
            return exception_item(x, encoder)
        return _handle(x, encoder, ["e", encoder.item(t), encoder.item(tuple(x.args)), clip_text(x, 4000),
                                    encoder.item({})])
    if isinstance(x, type):
        named = std_name(x)
        if named is not None and (named in STD_VALUE_CLASSES or issubclass(x, BaseException)):
            return {"st": list(named)}
        if named is None and x.__module__ != "builtins":
            return _handle(x, encoder, _class_desc(x, encoder))
        if named is not None:  # a standard-library class: its name, so the reference's record can say so
            return _handle(x, encoder, ["s", *named])
        return _handle(x, encoder, ["f", clip_text(getattr(x, "__qualname__", "class"), 100)])
    for base, kind in MUTABLE.items():  # a completion's subclass of a container: as the container,
        if isinstance(x, base):  # its content read with the container's own methods (codec.base_view)
            return encoder.container(x, kind)
    if t.__name__ == "module" and isinstance(getattr(x, "__name__", None), str):
        return _handle(x, encoder, ["m", x.__name__])
    if std_name(t) is None and t.__module__ != "builtins":  # an instance of a completion class
        base = value_base(t)
        plain = None if base is None else encoder.item(_plain_value(x, base))
        return _handle(x, encoder, ["i", encoder.item(t), plain])
    if _is_iterator(x, t):
        return _handle(x, encoder, ["g", t.__name__])
    named = std_name(x) if callable(x) else None
    if named is not None:  # a standard-library function (math.isclose): as above
        return _handle(x, encoder, ["s", *named])
    return _handle(x, encoder, ["f", t.__name__])


def _handle(x, encoder, desc):
    ref = encoder.table.add(x)
    encoder.added.append(ref)
    try:
        value = hash(x)
        if type(value) is not int:
            value = None
    except BaseException:
        value = None
    return {"h": [ref, value, desc]}


def _class_desc(cls, encoder):
    bases = []
    for base in cls.__bases__:
        if base in VALUE_BASES or (std_name(base) is None and base.__module__ != "builtins"):
            bases.append(encoder.item(base))  # a value type by name, a completion or setup class by handle/name
        elif issubclass(base, BaseException):
            bases.append({"st": list(std_name(base) or ("builtins", builtin_base(base)))})
        elif value_base(base) is not None:  # IntEnum, StrEnum: the value type they derive from
            bases.append(encoder.item(value_base(base)))
    own = [klass for klass in cls.__mro__ if std_name(klass) is None and klass.__module__ != "builtins"]
    methods, attrs = set(), set()
    for klass in own:
        for name, value in vars(klass).items():
            if name.startswith("_"):
                continue
            if callable(value) or isinstance(value, (classmethod, staticmethod)):
                methods.add(name)
            else:
                attrs.add(name)
    info = {"attrs": sorted(attrs - methods)}
    fields = getattr(cls, "_fields", None) if issubclass(cls, tuple) else None
    if isinstance(fields, tuple) and all(type(f) is str for f in fields):
        info["fields"] = list(fields)
    doc = cls.__dict__.get("__doc__")
    if type(doc) is str:
        info["doc"] = doc[:10000]
    dataclass = cls.__dict__.get("__dataclass_fields__")
    if type(dataclass) is dict:
        info["dataclass"] = [[f.name, bool(f.init), bool(f.compare)] for f in dataclass.values()
                             if str(getattr(f, "_field_type", "")) == "_FIELD" and type(f.name) is str]
        params = cls.__dict__.get("__dataclass_params__")
        info["compares"] = [bool(getattr(params, "eq", False)) and _generated(cls, "__eq__"),
                            bool(getattr(params, "order", False)) and _generated(cls, "__lt__")]
    enum = sys.modules.get("enum")
    if enum is not None and issubclass(cls, enum.Enum):
        info["enum"] = True
    return ["c", clip_text(cls.__name__, 200), clip_text(cls.__qualname__, 200), clip_text(cls.__module__, 200), bases,
            sorted(methods), encoder.item(info)]


def _generated(cls, name):
    """Whether ``cls``'s ``name`` is the one ``dataclasses`` wrote (not the class's own)."""
    code = getattr(cls.__dict__.get(name), "__code__", None)
    return code is not None and code.co_filename == "<string>"


def _plain_value(x, base):
    if base is int:
        return int.__index__(x)
    if base is float:
        return float.__float__(x)
    if base is complex:
        return complex(complex.real.__get__(x), complex.imag.__get__(x))
    if base is str:
        return str.__str__(x)
    if base is bytes:
        return bytes.__bytes__(x)
    if base is tuple:
        return tuple(tuple.__iter__(x))
    return frozenset(frozenset.__iter__(x))


def _is_iterator(x, t):
    return (t.__module__ in ("builtins", "itertools", "collections", "_collections")
            and hasattr(t, "__next__") and hasattr(t, "__iter__"))


def decode_other(tag, x, decoder):
    candidate = _CANDIDATE
    if tag == "h":
        if type(x) is not list or len(x) != 3 or type(x[0]) is not int:
            raise ProtocolError("a malformed handle")
        ref, value, _ = x
        proxy = object.__new__(JudgeProxy)
        candidate.table.add(proxy, None, ref)
        candidate.hashes[ref] = value
        return proxy
    if tag == "E":
        return exception_value(x, decoder)
    if tag == "m":
        return __import__(x) and sys.modules[x]
    if tag == "st":
        module, qualname = x
        found = __import__(module) and sys.modules[module]
        for part in qualname.split("."):
            found = getattr(found, part)
        return found
    if tag == "U":
        return candidate.setup[x]
    raise ProtocolError(f"an unknown tag {str(tag)[:20]!r}")


# ---------------------------------------------------------------- serving

def serve(message):
    """Answer one request of the judge's: ``(status, items, extras)``."""
    shared = {}
    restore = _apply_env(message.env, shared)
    try:
        values = message.items
        target = values[0] if len(values) == 2 else None
        rest = values[-1]
        result = OPS[message.what](target, *rest)
        status, reply = ("m", []) if result is _IS_METHOD else ("ok", [result])
    except BaseException as exc:  # whatever the completion raised, as it is
        status, reply = "exc", [exc]
    finally:
        extras = restore()
    printed = CAPTURED_OUT.size + CAPTURED_ERR.size
    if printed > PRINT_CAP:
        CAPTURED_OUT.drain()
        CAPTURED_ERR.drain()
        return "fail", [f"printed {printed} characters in one call"]
    if _CANDIDATE.watched:
        moved = _moved_names()
        if moved:
            extras = moved if extras is None else extras + moved
    return status, reply, extras


def _moved_names():
    """The names the tests read that the completion's module rebound (``global counter; counter +=
    1``) or deleted since the judge last heard, as extras: ``"=name", value`` or ``"-name", None``.
    In Python the tests read the module's current value (``solution.counter``, or the bare name of
    a shared namespace); the judge rebinds its copy (guards.py ``LiveNames``)."""
    namespace, watched, moved = _CANDIDATE.namespace, _CANDIDATE.watched, None
    for name, before in watched.items():
        now = namespace.get(name, _MISSING)
        if now is not before:
            watched[name] = now
            moved = moved or []
            moved += ["-" + name, None] if now is _MISSING else ["=" + name, now]
    return moved


_IS_METHOD = object()
CAPTURED_OUT, CAPTURED_ERR = PrintCapture(), PrintCapture()


def _get(target, name):
    value = getattr(target, name)
    if callable(value) and getattr(value, "__self__", None) is target and not isinstance(value, type):
        return _IS_METHOD
    return value


def _set(target, name, value):
    setattr(target, name, value)


def _del(target, name):
    delattr(target, name)


def _call(target, args, kwargs):
    return target(*args, **_kwargs_of(kwargs))


def _callm(target, name, args, kwargs):
    return getattr(target, name)(*args, **_kwargs_of(kwargs))


def _run(_, stdin):
    if isinstance(_CANDIDATE.code, Built):
        return list(run_built(_CANDIDATE.code, stdin, _CANDIDATE.out_cap))
    return list(run_program_here(_CANDIDATE.code, stdin, _CANDIDATE.out_cap))


def _eval(_, mode, source, globals_, locals_, modules):
    """``eval``/``exec`` of something the tests did not write themselves: here, never in the
    judge. Without namespaces of its own it sees the completion's names and the tests' modules."""
    namespace = dict(_CANDIDATE.namespace) if globals_ is None else dict(globals_)
    if globals_ is None and type(modules) is dict:
        namespace.update(modules)
    namespace.setdefault("__builtins__", builtins)
    run = builtins.eval if mode == "eval" else builtins.exec
    result = run(source, namespace, locals_ if locals_ is not None else namespace)
    if globals_ is not None:  # what the code defined goes back into the tests' own dict
        for key, value in namespace.items():
            if key != "__builtins__" and (key not in globals_ or globals_[key] is not value):
                globals_[key] = value
    return result


def _subclass(_, name, qualname, bases, attributes):
    """The tests' class derived from the completion's ``bases`` (judge side: crossing.Crossing.subclassed),
    made here from them: the tests' methods, static and class methods and properties' parts call the
    tests' functions (the judge runs them, on the instance as it crossed: ``self.sound()`` in the
    completion's ``speak`` reaches the tests' ``sound``), their other attributes are values."""
    namespace = {"__module__": "__main__", "__qualname__": str(qualname)}
    for entry in attributes:
        key, kind, *parts = entry
        if kind == "m":
            namespace[key] = _tests_function(parts[0], key)
        elif kind in ("s", "c"):
            namespace[key] = (staticmethod if kind == "s" else classmethod)(_tests_function(parts[0], key))
        elif kind == "p":
            namespace[key] = property(*(None if part is None else _tests_function(part, key) for part in parts))
        else:
            namespace[key] = parts[0]
    return type(str(name), tuple(bases), namespace)


def _tests_function(proxy, name):
    def forwarded(*args, **kwargs):
        return proxy(*args, **kwargs)

    forwarded.__name__ = forwarded.__qualname__ = str(name)
    return forwarded


def _callsuper(target, cls, name, args, kwargs):
    """``cls``'s own ``name`` (found down ``cls``'s MRO, never from ``target``'s class, which holds
    the tests' override) bound to ``target`` and called: ``super().__init__(...)`` or an inherited
    method of the tests' class."""
    for klass in cls.__mro__:
        if name in vars(klass):
            found = vars(klass)[name]
            bind = getattr(type(found), "__get__", None)
            method = found if bind is None else bind(found, target, type(target))
            return method(*args, **_kwargs_of(kwargs))
    raise AttributeError(f"{cls.__name__!r} object has no attribute {name!r}")


def _compile(_, *args):
    return builtins.compile(*args)


def _loads(_, kind, data):
    if kind == "marshal":
        import marshal

        return marshal.loads(data)
    import pickle

    return pickle.loads(data)


def _dumps(_, obj, protocol):
    import pickle

    return pickle.dumps(obj, protocol)


def _operator(target, op, *args):
    return CANDIDATE_OPERATORS[op](target, *args)


def _await(awaitable):
    """Run the completion's awaitable to its end on this process's own event loop (kept for the
    job: an asynchronous generator stays bound to it between its items)."""
    import asyncio

    loop = _CANDIDATE.loop
    if loop is None:
        loop = _CANDIDATE.loop = asyncio.new_event_loop()

    async def run():
        return await awaitable

    return loop.run_until_complete(run())


def _own(target, other, name):
    """``target == other`` asked of ``target``'s own class only (not ``other``'s reflected method)."""
    result = getattr(type(target), name)(target, other)
    if result is NotImplemented:
        if name in ("__eq__", "__ne__"):
            return (target is other) == (name == "__eq__")
        raise TypeError(f"{name} is not supported between these objects")
    return result


def _candidate_operators():
    import copy
    import math
    import operator as o

    table = {
        "len": len, "iter": iter, "next": next, "reversed": reversed, "str": str, "repr": repr, "bool": bool,
        "int": int, "float": float, "index": o.index, "complex": complex, "abs": abs, "neg": o.neg, "pos": o.pos,
        "invert": o.invert, "trunc": math.trunc, "floor": math.floor, "ceil": math.ceil, "hash": hash, "dir": dir,
        "round": round, "format": format, "copy": copy.copy, "deepcopy": copy.deepcopy,
        "contains": lambda t, item: item in t, "getitem": o.getitem, "setitem": o.setitem, "delitem": o.delitem,
        "eq": o.eq, "ne": o.ne, "lt": o.lt, "le": o.le, "gt": o.gt, "ge": o.ge,
        **{f"{name}own": (lambda n: lambda t, other: _own(t, other, f"__{n}__"))(name)
           for name in ("eq", "ne", "lt", "le", "gt", "ge")},
        "enter": lambda t: type(t).__enter__(t), "exit": lambda t, *exc: type(t).__exit__(t, *exc),
        "divmod": divmod, "rdivmod": lambda t, other: divmod(other, t),
        "await": _await, "aiter": lambda t: t.__aiter__(), "anext": lambda t: _await(t.__anext__()),
    }
    for name in ("add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "pow", "lshift", "rshift",
                 "and", "or", "xor"):
        function = getattr(o, name + "_" if name in ("and", "or") else name)
        table[name] = function
        table["r" + name] = (lambda f: lambda t, other: f(other, t))(function)
        table["i" + name] = getattr(o, "i" + (name + "_" if name in ("and", "or") else name).rstrip("_"))
    return table


CANDIDATE_OPERATORS = _candidate_operators()
OPS = {"call": _call, "callm": _callm, "get": _get, "set": _set, "del": _del, "op": _operator, "run": _run,
       "eval": _eval, "compile": _compile, "loads": _loads, "dumps": _dumps, "subclass": _subclass,
       "callsuper": _callsuper}


def _apply_env(env, shared):
    """The judge's overrides, for the length of one request; returns their undo, which returns
    what the reply carries back (the random generator's state, the warnings the call issued)."""
    if not env:
        return _nothing
    undo, extras, caught = [], None, None
    undo_logging, logged = [], None
    for index in range(0, len(env) - 1, 2):
        target, value = env[index], env[index + 1]
        if type(target) is not str:
            continue
        if target == "random.state":  # the tests seeded the generator: this call continues their sequence
            import random

            try:
                random.setstate(value)
            except BaseException:
                continue
            _SEEDED.clear()
            if not getattr(random.seed, "_noted", False):
                random.seed = _noting_seed(random.seed)
            extras = extras or []
            extras.append(random)
            continue
        if target == "os.environ":  # the tests changed the environment: so does this process, for good
            if type(value) is list and len(value) == 2 and all(type(v) is str for v in value):
                environ_apply(*value)
            continue
        if target == "os.chdir":  # the tests moved: so does this process, for good
            try:
                os.chdir(value)
            except BaseException:
                pass
            continue
        if target == "logging.capture":  # the tests handle log records: this call's go back to them
            logged = _capture_logs(value, undo_logging)
            continue
        if target == "warnings.capture":  # the tests catch warnings: this call's go back to them
            import warnings

            caught = warnings.catch_warnings(record=True)
            log = caught.__enter__()
            warnings.simplefilter("always")
            continue
        deleted = target[:1] == "-"  # the tests deleted the attribute (monkeypatch.delattr)
        owner_name, _, attribute = target[deleted:].rpartition(".")
        try:
            owner = sys.modules.get(owner_name) or __import__(owner_name) and sys.modules[owner_name]
            old = getattr(owner, attribute, _MISSING)
            if not deleted:
                setattr(owner, attribute, value)
            elif old is not _MISSING:
                delattr(owner, attribute)
            else:
                continue
        except BaseException:
            continue
        undo.append((owner, attribute, old))

    def restore():
        for owner, attribute, old in reversed(undo):
            if old is _MISSING:
                delattr(owner, attribute)
            else:
                setattr(owner, attribute, old)
        for undo_one in reversed(undo_logging):
            undo_one()
        back = []
        if logged:
            back += ["logs", logged]
        if extras:
            back += ["random", [extras[0].getstate(), _SEEDED[-1] if _SEEDED else None]]
        if caught is not None:
            caught.__exit__(None, None, None)
            back += ["warnings", [[w.message if isinstance(w.message, Warning) else w.category(str(w.message)),
                                   None, str(w.filename)[:500], w.lineno if type(w.lineno) is int else 0]
                                  for w in log[:1000]]]
        return back or None

    return restore


_MISSING = object()
_SEEDED = []  # the last seed the completion gave random.seed during this call (the judge checks the state against it)


def _noting_seed(seed):
    def noting(a=None, version=2):
        _SEEDED[:] = [[a, version] if type(a) in (int, str, bytes, float) else None]
        return seed(a, version)

    noting._noted = True
    return noting


def _capture_logs(levels, undo):
    """For one call: the tests' logger levels here, and every record the completion's loggers
    handle also sent back (its own handlers still run; the interpreter's last-resort handler does
    not, the tests' side has handlers). Returns the list the records go to."""
    logging = sys.modules.get("logging")
    if logging is None or type(levels) is not list:
        return None
    for index in range(0, len(levels) - 1, 2):
        name, level = levels[index], levels[index + 1]
        if type(name) is str and type(level) is int:
            logger = logging.getLogger(name or None)
            undo.append(lambda logger=logger, level=logger.level: logger.setLevel(level))
            logger.setLevel(level)
    records = []
    handle_all = logging.Logger.callHandlers

    def forwarding(self, record):
        if len(records) < 1000:
            try:
                records.append(_log_record(logging, record))
            except BaseException:  # a record the completion made unreadable: not sent
                pass
        handle_all(self, record)

    manager, last_resort = logging.Logger.manager, logging.lastResort
    warned = manager.emittedNoHandlerWarning
    logging.Logger.callHandlers, logging.lastResort, manager.emittedNoHandlerWarning = forwarding, None, True

    def restore():
        logging.Logger.callHandlers, logging.lastResort = handle_all, last_resort
        manager.emittedNoHandlerWarning = warned
    undo.append(restore)
    return records


def _log_record(logging, record):
    try:
        message = record.getMessage()
    except BaseException:
        message = clip_text(record.msg, 10000)
    exc_text = None
    if record.exc_info:
        try:
            exc_text = logging.Formatter().formatException(record.exc_info)
        except BaseException:
            exc_text = None
    return [clip_text(record.name, 500), int(record.levelno), clip_text(record.levelname, 100), str(message)[:10000],
            clip_text(record.pathname, 500), int(record.lineno or 0), clip_text(record.funcName, 200),
            None if exc_text is None else exc_text[:10000], float(record.created)]


def _nothing():
    return None


def run_program_here(code, stdin, out_cap):
    """Run a whole program (a code object) as ``__main__`` of a process of its own, forked from
    this one, with ``stdin`` on a real descriptor 0 and its descriptor 1 captured; returns
    (stdout text, exit status), as a program run by a shell would: ``os._exit`` after a flush
    keeps what was flushed, an uncaught exception prints its traceback and exits 1."""
    return run_forked(lambda source, sink: _program_child(code, source, sink), stdin, out_cap)


def _program_child(code, source, sink):
    status = 1
    try:
        os.dup2(source, 0)
        os.dup2(sink, 1)
        sys.stdin = open(0, closefd=False, encoding="utf-8", errors="surrogateescape")
        sys.stdout = open(1, "w", closefd=False, encoding="utf-8")
        sys.stdout.reconfigure(write_through=True)  # print() and sys.stdout.buffer.write() keep their order
        sys.stderr = open(2, "w", closefd=False, encoding="utf-8", errors="backslashreplace")
        sys.argv = ["solution"]
        try:
            exec(code, {"__name__": "__main__", "__builtins__": builtins})
            status = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                status = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
        except BaseException as exc:
            print_exception(exc)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
    finally:
        os._exit(status & 0xFF if status >= 0 else 1)


# ---------------------------------------------------------------- the candidate's life

def candidate_main(code_text, setup, names, program, req_fd, resp_fd, out_cap):
    """Run the completion and serve the judge until it hangs up (or the runner ends this
    process); returns an exit status.

    First messages: ``compiled`` or ``syntax`` (type, line, msg), then ``ready`` with ``ok``
    (name, value, ... for the names the tests read that it defines), ``code_error`` (type, msg,
    line) or ``setup_error`` (type, msg)."""
    candidate = _CANDIDATE
    candidate.__init__()
    candidate.out_cap = out_cap
    module = type(sys)(SOLUTION)  # a real module, so that its classes pickle by name
    namespace = module.__dict__
    namespace["__builtins__"] = builtins
    sys.modules[SOLUTION] = module
    candidate.namespace = namespace
    channel = candidate.channel = Channel(req_fd, resp_fd, candidate.table, JUDGE_PARITY, encode_other,
                                          decode_other, serve=serve, printed=_printed)
    if type(program) is list:  # [language, compile bound]: a program in another language, built here first
        return _built_program(candidate, channel, code_text, *program)
    try:
        code = compile(code_text, "<completion>", "exec")
    except (SyntaxError, ValueError) as exc:
        print_exception(exc)
        channel.send("syntax", 0, "", [type(exc).__name__, getattr(exc, "lineno", None),
                                       str(getattr(exc, "msg", exc))[:500]])
        return 1
    except (MemoryError, RecursionError) as exc:
        channel.send("syntax", 0, "", [type(exc).__name__, None, "too complex to compile"])
        return 1
    candidate.code = code
    channel.send("compiled", 0, "", [])
    failed = run_setup(setup, namespace)
    if failed is not None:
        channel.send("ready", 0, "setup_error", [type(failed).__name__, clip_text(failed, 500)])
        return 1
    candidate.setup = {k: v for k, v in namespace.items() if k != "__builtins__"}
    classes = setup_classes_of(namespace)
    candidate.setup_ids = {id(v): k for k, v in candidate.setup.items()
                           if isinstance(v, type) or type(v).__name__ == "function"}
    channel.setup_ids = {id(v): k for k, v in classes.items()}
    channel.setup_classes = classes
    if not program:
        try:
            exec(code, namespace)
        except BaseException as exc:  # SystemExit too: the tests never get an answer
            print_exception(exc)
            channel.send("ready", 0, "code_error", [type(exc).__name__, clip_text(exc, 500), line_of(exc)])
            return 1
    report = []
    served = namespace.get("__getattr__")  # PEP 562: a name the module does not hold, its __getattr__ serves
    for name in names:
        if name in namespace:
            report += [name, namespace[name]]
        elif served is not None and callable(served) and not name.startswith("__"):
            try:
                report += [name, served(name)]  # what `from solution import name` would get (AttributeError: none)
            except BaseException:
                continue
    sys.stdout.flush()
    sys.stderr.flush()
    sys.stdout, sys.stderr = CAPTURED_OUT, CAPTURED_ERR
    try:
        channel.send("ready", 0, "ok", [items(report)])
    except BaseException as exc:  # a value that cannot cross: the names go unreported
        _complain(f"candidate: cannot report its names: {type(exc).__name__}: {clip_text(exc, 300)}")
        channel.send("ready", 0, "ok", [items([])])
    else:  # from now on the judge hears when the module rebinds one of them (serve)
        candidate.watched = {name: namespace.get(name, _MISSING) for name in names}
    return serve_requests(channel)


def serve_requests(channel):
    """Answer the judge's requests until it hangs up; 0."""
    while True:
        message = channel.next_request()  # under the channel's lock; served outside it
        if message is None:
            return 0
        if message.kind != "q":
            raise ProtocolError(f"an unexpected {message.kind!r} message")
        channel.answer(message)


def _built_program(candidate, channel, source, language, compile_timeout_s):
    """A program in another language: built (runtime/programs.py), then served like a Python
    program (``run``), nothing of it run before a test asks. A build that fails is the job's
    ``syntax`` message of type ``CompileError`` with the compiler's first errors; one the machinery
    could not run (no compiler in this image) says so in a type of its own."""
    try:
        candidate.code = build(language, source, float(compile_timeout_s))
    except CompileFailed as exc:
        channel.send("syntax", 0, "", [COMPILE_ERROR, None, str(exc)[:MESSAGE_CHARS]])
        return 1
    except (OSError, KeyError) as exc:
        channel.send("syntax", 0, "", [COMPILER_UNAVAILABLE, None, clip_text(exc, 500)])
        return 1
    channel.send("compiled", 0, "", [])
    sys.stdout.flush()
    sys.stderr.flush()
    sys.stdout, sys.stderr = CAPTURED_OUT, CAPTURED_ERR
    channel.send("ready", 0, "ok", [items([])])
    return serve_requests(channel)


def _printed():
    return CAPTURED_OUT.drain(), CAPTURED_ERR.drain()


def _complain(text):
    try:
        os.write(2, (text + "\n").encode())
    except OSError:
        pass


def line_of(exc):
    line, tb = None, exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<completion>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def print_exception(exc):
    """Print like the interpreter would (no source lines: the code is not a file), skipping the
    runtime's own frames. By hand: the traceback module pulls a dozen modules in."""
    try:
        if isinstance(exc, SyntaxError):
            lines = [f'  File "{exc.filename}", line {exc.lineno}\n']
            if exc.text:
                lines.append(f"    {exc.text.strip()}\n")
            lines.append(f"{type(exc).__name__}: {exc.msg}\n")
        else:
            frames, tb = [], exc.__traceback__
            while tb is not None:
                code = tb.tb_frame.f_code
                if code.co_filename.rpartition("/")[0] != RUNTIME_FILES:
                    frames.append(f'  File "{code.co_filename}", line {tb.tb_lineno}, in {code.co_name}\n')
                tb = tb.tb_next
            if len(frames) > 40:
                frames = frames[:20] + [f"  [... {len(frames) - 40} more frames ...]\n"] + frames[-20:]
            text = clip_text(exc, 2000)
            lines = ["Traceback (most recent call last):\n", *frames,
                     f"{type(exc).__name__}: {text}\n" if text else f"{type(exc).__name__}\n"]
        sys.stderr.write("".join(lines))
        sys.stderr.flush()
    except BaseException:
        pass


# The runtime's own files (their frames are left out of what print_exception prints): this
# package's directory on the host, <runner>/ in the container (runtime/importer.py).
RUNTIME_FILES = print_exception.__code__.co_filename.rpartition("/")[0]
