"""The judge's side of the boundary: the completion's objects as proxies and mirror classes,
and the requests that use them.

Runs INSIDE the sandbox after ``codec.py`` and ``channel.py`` (standard library only; on the
host, an ordinary module). The judge process (consumers/executor/runtime/judge.py) holds one :class:`Judge`:

* the completion's functions, instances, generators and modules are *proxies*: every use is a
  request the candidate answers (:class:`Remote`; generators and built-in iterators are lazy
  :class:`RemoteIterator` s). A proxy equals only itself unless both sides of a comparison are
  the completion's objects, and hashes as the candidate said when it crossed, so no completion
  code decides whether one of its objects equals plain data;
* the completion's classes are *mirrors*: real classes of the judge (:class:`MirrorMeta`) whose
  bases are the mirrors of the completion's own bases and the standard library's exception
  classes and value types among its real ones. ``isinstance``, ``except InsufficientFunds``
  and ``raises(ValueError)`` work through them; an instance of a completion class derived from
  a value type (a namedtuple, an ``IntEnum``) is an instance of the mirror holding the plain
  value, so it compares as that value does;
* exceptions come back as themselves: a built-in or standard-library class is rebuilt by its own
  constructor with the args it was raised with; a completion class as an instance of its mirror.
  ``StopIteration`` raised by a call (not by ``next``) becomes ``RuntimeError`` (PEP 479), so it
  cannot quietly end the iteration a test is in;
* where the task's reference returns plain data from a call (``plain_paths``, "how the tests
  reached it": ``f()``, ``Stack().pop()``), the completion must too: one of its objects there is
  ``type_mismatch`` and fails the test.
"""

import builtins
import sys
import types

if __name__ != "__main__":  # on the host; in the sandbox these names come from the files above
    from rollstream.consumers.executor.runtime.channel import Channel, LinkDown, items
    from rollstream.consumers.executor.runtime.codec import (
        SIMPLE,
        NotTransferable,
        ProtocolError,
        Table,
        _text,
        resolve_std,
        std_name,
    )

JUDGE_PARITY, CANDIDATE_PARITY = 0, 1
# Standard-library classes the candidate may name by module and name (values and exceptions).
STD_VALUE_CLASSES = frozenset({
    ("collections", "OrderedDict"), ("collections", "defaultdict"), ("collections", "Counter"),
    ("collections", "deque"), ("decimal", "Decimal"), ("fractions", "Fraction"),
    ("datetime", "datetime"), ("datetime", "date"), ("datetime", "time"), ("datetime", "timedelta"),
    ("datetime", "timezone"),
})
# Modules the judge never imports, whoever asks (work on import, or a __main__).
NEVER_IMPORT = frozenset({"antigravity", "this", "__hello__", "__phello__", "idlelib", "turtledemo",
                          "tkinter", "turtle", "ensurepip", "venv", "pydoc", "webbrowser"})


class FailedCall(BaseException):
    """A call that could not be answered. BaseException, so that a test's ``except Exception``
    does not swallow it; the test fails whatever it catches."""


class CandidateGone(FailedCall):
    """The candidate exited, died or broke the protocol."""


class TypeMismatch(FailedCall):
    """The completion answered with one of its objects where the task's reference answers with
    plain data: the object is never asked whether it equals the expected value."""


class raises:
    """``with raises(ValueError): f(-1)`` (pytest.raises without pytest; ``match`` is a regex
    searched in ``str(exception)``)."""

    def __init__(self, expected, match=None):
        self.expected, self.match, self.value = expected, match, None

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None:
            raise AssertionError(f"DID NOT RAISE {self.expected}")
        if not issubclass(kind, self.expected) or issubclass(kind, FailedCall):
            return False
        if self.match is not None:
            import re

            if not re.search(self.match, str(value)):
                raise AssertionError(f"{str(value)[:200]!r} does not match {self.match!r}")
        self.value = value
        return True


# ---------------------------------------------------------------- the completion's objects

class _State:
    """The one judge of this process (a judge lives for one job)."""

    judge = None


def _j():
    judge = _State.judge
    if judge is None:
        raise FailedCall("no job")
    return judge


class RemoteBase:
    """An object of the candidate's, held by ref. Equality and hashing are the judge's own
    unless both sides of a comparison are the candidate's objects."""

    __slots__ = ()

    def __getattr__(self, name):
        return _j().attribute(self, name)

    def __setattr__(self, name, value):
        _j().ask("set", self, [name, value])

    def __delattr__(self, name):
        _j().ask("del", self, [name])

    def __repr__(self):
        text = _j().op(self, "repr")
        return text if type(text) is str else "<completion object>"

    def __str__(self):
        text = _j().op(self, "str")
        return text if type(text) is str else "<completion object>"

    def __format__(self, spec):
        text = _j().op(self, "format", spec)
        if type(text) is not str:
            raise TypeError("format() of a completion object gave no str")
        return text

    def __eq__(self, other):
        judge = _j()
        if isinstance(other, RemoteBase) and not judge.decoding and type(self) is not RemoteIterator:
            return judge.op(self, "eq", other)
        return self is other

    def __ne__(self, other):
        judge = _j()
        if isinstance(other, RemoteBase) and not judge.decoding and type(self) is not RemoteIterator:
            return judge.op(self, "ne", other)
        return self is not other

    def __hash__(self):
        value = _j().hashes.get(_j().table.refs.get(id(self)))
        if value is None:
            raise TypeError("unhashable completion object")
        return value

    def __copy__(self):
        return _j().op(self, "copy")

    def __deepcopy__(self, memo=None):
        return _j().op(self, "deepcopy")

    def __reduce_ex__(self, protocol):
        raise _NeedsCandidate()

    def __reduce__(self):
        raise _NeedsCandidate()

    def __dir__(self):
        names = _j().op(self, "dir")
        return names if type(names) is list else []


class _NeedsCandidate(Exception):
    """pickle met a completion object: the whole dump is made by the candidate."""


class RemoteIterator(RemoteBase):
    """A generator or built-in iterator of the candidate's: lazy, one ``next`` per item."""

    __slots__ = ()

    def __iter__(self):
        return self

    def __next__(self):
        return _j().op(self, "next")


def _forward(op):
    def method(self, *args):
        return _j().op(self, op, *args)

    method.__name__ = f"__{op}__"
    return method


def _compare(op):
    def method(self, other):
        judge = _j()
        if isinstance(other, RemoteBase) and not judge.decoding:
            return judge.op(self, op, other)
        return NotImplemented

    method.__name__ = f"__{op}__"
    return method


BINARY_OPERATORS = ("add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "pow", "lshift", "rshift",
             "and", "or", "xor", "divmod")
UNARY = ("len", "iter", "next", "reversed", "bool", "int", "float", "index", "complex", "abs", "neg", "pos",
         "invert", "trunc", "floor", "ceil", "enter")


class Remote(RemoteBase):
    """Any other object of the candidate's: every use is a request."""

    __slots__ = ()

    def __call__(self, *args, **kwargs):
        return _j().call(self, args, kwargs)

    def __contains__(self, item):
        return _j().op(self, "contains", item) is True

    def __getitem__(self, key):
        return _j().op(self, "getitem", key)

    def __setitem__(self, key, value):
        _j().op(self, "setitem", key, value)

    def __delitem__(self, key):
        _j().op(self, "delitem", key)

    def __round__(self, *args):
        return _j().op(self, "round", *args)

    def __exit__(self, *exc):
        return _j().op(self, "exit", *_exc_info(exc))


for _name in UNARY:
    setattr(Remote, f"__{_name}__", _forward(_name))
for _name in BINARY_OPERATORS:
    setattr(Remote, f"__{_name}__", _forward(_name))
    setattr(Remote, f"__r{_name}__", _forward("r" + _name))
    if _name != "divmod":
        setattr(Remote, f"__i{_name}__", _forward("i" + _name))
for _name in ("lt", "le", "gt", "ge"):
    setattr(Remote, f"__{_name}__", _compare(_name))


def _exc_info(exc):
    kind, value, _ = exc
    if kind is None:
        return (None, None, None)
    return (kind if isinstance(kind, type) and issubclass(kind, BaseException) else None, value, None)


class Method:
    """``obj.name`` known to be a method: calling it is one request."""

    __slots__ = ("owner", "name")

    def __init__(self, owner, name):
        self.owner, self.name = owner, name

    def __call__(self, *args, **kwargs):
        return _j().call_method(self.owner, self.name, args, kwargs)

    def __repr__(self):
        return f"<method {self.name} of a completion object>"


class MirrorMeta(type):
    """The metaclass of a judge-side mirror of a class the completion defines: a real class
    (``isinstance``, ``except``, ``raises`` work through its real bases); constructing it and its
    class attributes are requests."""

    def __call__(cls, *args, **kwargs):
        return _j().call(cls, args, kwargs)

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _j().attribute(cls, name)

    def __iter__(cls):
        return _j().op(cls, "iter")

    def __len__(cls):
        return _j().op(cls, "len")

    def __getitem__(cls, key):
        return _j().op(cls, "getitem", key)

    def __contains__(cls, item):
        return _j().op(cls, "contains", item) is True


VALUE_BASES = (int, float, complex, str, bytes, tuple, frozenset)


def _value_base(cls):
    for base in cls.__mro__:
        if base in VALUE_BASES:
            return base
    return None


def _mirror_getattr(self, name):
    return _j().attribute(self, name)


def _mirror_str(self):
    judge = _j()
    text = judge.texts.get(judge.table.refs.get(id(self)))
    if text is None:
        text = judge.op(self, "str")
    return text if type(text) is str else "<completion object>"


def _mirror_repr(self):
    text = _j().op(self, "repr")
    return text if type(text) is str else "<completion object>"


def _mirror_reduce(self, *args):
    raise _NeedsCandidate()


def _field(index):
    return property(lambda self: tuple.__getitem__(self, index))


def make_mirror(name, qualname, module, bases, methods, fields):
    """A judge-side class standing for a class of the completion's. Only the standard library's
    exception classes, the built-in value types and other mirrors are kept as bases."""
    kept = []
    for base in bases:
        if type(base) is MirrorMeta:
            kept.append(base)
        elif isinstance(base, type) and (base in VALUE_BASES or issubclass(base, BaseException)):
            if base is not BaseException or not kept:
                kept.append(base)
    if not any(issubclass(b, (RemoteBase, BaseException)) or b in VALUE_BASES for b in kept):
        kept.append(Remote)
    namespace = {"__module__": str(module)[:200], "__qualname__": str(qualname)[:200]}
    probe = type.__new__(type, "probe", tuple(kept), {})
    exception = issubclass(probe, BaseException)
    value = _value_base(probe)
    if exception:
        namespace.update(__getattr__=_mirror_getattr, __str__=_mirror_str, __reduce_ex__=_mirror_reduce)
    elif value is not None:
        namespace.update(__slots__=(), __getattr__=_mirror_getattr, __str__=_mirror_str, __repr__=_mirror_repr,
                         __format__=RemoteBase.__format__, __reduce_ex__=_mirror_reduce, __copy__=RemoteBase.__copy__,
                         __deepcopy__=RemoteBase.__deepcopy__)
        if value is tuple and fields is not None:
            namespace["_fields"] = tuple(fields)
            for index, field in enumerate(fields):
                if type(field) is str and field.isidentifier() and not field.startswith("_"):
                    namespace[field] = _field(index)
    else:
        namespace["__slots__"] = ()
    try:
        cls = MirrorMeta(str(name)[:200], tuple(kept), namespace)
    except TypeError:  # bases that cannot be combined here: keep the first
        cls = MirrorMeta(str(name)[:200], tuple(kept[:1]), namespace)
    return cls


# ---------------------------------------------------------------- the judge

class Judge:
    """One job's judge: the channel to the candidate, the objects that crossed and what the
    task's reference says about the calls (``plain_paths``)."""

    def __init__(self, read_fd, write_fd, *, plain_paths=(), record=False):
        self.table = Table(JUDGE_PARITY)
        self.setup_objects = {}
        self.setup_names = {}  # id(setup function or class) -> its name (they cross by name)
        self.channel = Channel(read_fd, write_fd, self.table, CANDIDATE_PARITY, self.encode_other,
                               self.decode_other, serve=self.serve, random_ids=True)
        self.channel.on_receive = self.printed
        self.hashes = {}  # ref -> the candidate's hash of a handle (None: unhashable)
        self.texts = {}  # ref -> str() of a candidate exception
        self.paths = {}  # ref -> how the tests reached the object ("f()", "Stack().pop()")
        self.methods = {}  # mirror class -> names of its methods (no request until called)
        self.kinds = {}  # ref -> handle kind ("m": module, with its name in modules)
        self.modules = {}  # ref -> the name of a module the candidate holds
        self.plain_paths = frozenset(plain_paths)
        self.record = record
        self.recorded = {}  # path -> every result plain so far
        self.decoding = False
        self.gone = None  # why the candidate can no longer answer
        self.tamper = None  # (kind, detail) of the first attack seen
        self.failed = None  # why a call of the current test failed
        self.candidate_errors = set()  # ids of exceptions raised on the candidate's behalf
        self.env = None  # the overrides for the candidate (Guards)

    def set_setup(self, objects):
        """What the task's setup defined: its classes' instances are replicated, its functions
        and classes cross by name (the candidate ran the same setup)."""
        self.setup_objects = objects
        classes = {k: v for k, v in objects.items() if isinstance(v, type)}
        self.setup_names = {id(v): k for k, v in objects.items() if isinstance(v, (type, types.FunctionType))}
        self.channel.setup_ids = {id(v): k for k, v in classes.items()}
        self.channel.setup_classes = classes

    # ------------------------------------------------------------ requests to the candidate

    def ask(self, op, target, rest=(), path=None, env=True, iterating=False):
        if self.gone is not None:
            self.fail(self.gone)
        self.decoding = True
        try:
            message = self.channel.call(op, [target, items(rest)] if target is not None else [items(rest)],
                                        self.env() if env and self.env is not None else None)
        except NotTransferable as exc:
            self.decoding = False
            raise TypeError(f"cannot pass this to the completion: {exc}") from None
        except ProtocolError as exc:
            self.decoding = False
            self.set_tamper("protocol", exc)
            self.fail(self.gone)
        except (LinkDown, OSError) as exc:
            self.decoding = False
            self.gone = self.gone or getattr(exc, "reason", "the candidate is gone")
            self.fail(self.gone)
        finally:
            self.decoding = False
        return self.answer(message, path, iterating)

    def answer(self, message, path, iterating):
        status, values = message.what, message.items
        if status == "ok" and len(values) == 1:
            value = values[0]
            if path is not None:
                self.check(path, value)
            return value
        if status == "m":
            return _METHOD
        if status == "exc" and len(values) == 1 and isinstance(values[0], BaseException):
            error = values[0]
            if isinstance(error, FailedCall):
                self.set_tamper("protocol", "a FailedCall from the candidate")
                self.fail(self.gone)
            if isinstance(error, (StopIteration, StopAsyncIteration)) and not iterating:
                wrapped = RuntimeError(f"the completion raised {type(error).__name__}")  # PEP 479
                wrapped.__cause__ = error
                error = wrapped
            self.candidate_errors.add(id(error))
            self._keep = error  # the id stays this error's while it is raised
            raise error
        if status == "fail" and len(values) == 1 and type(values[0]) is str:
            self.fail(f"the call failed: {values[0][:300]}")
        self.set_tamper("protocol", "a malformed reply")
        self.fail(self.gone)

    def check(self, path, value):
        """What the task's reference says about this call: plain data back, or ``type_mismatch``."""
        if self.record:
            self.recorded[path] = self.recorded.get(path, True) and is_plain(value)
        elif path in self.plain_paths and not is_plain(value):
            self.failed = self.failed or f"type_mismatch: {path} gave a completion object"
            raise TypeMismatch(f"type_mismatch: {path} returned a {type(value).__name__} where the "
                               "task's reference returns plain data")
        if isinstance(value, RemoteBase) or type(value) is MirrorMeta or type(type(value)) is MirrorMeta:
            ref = self.table.refs.get(id(value))
            if ref is not None:
                self.paths.setdefault(ref, path)

    def path(self, target, suffix):
        ref = self.table.refs.get(id(target))
        base = self.paths.get(ref)
        return None if base is None else base + suffix

    def call(self, target, args, kwargs):
        return self.ask("call", target, [items(args), items(_flat_kwargs(kwargs))], self.path(target, "()"))

    def call_method(self, owner, name, args, kwargs):
        return self.ask("callm", owner, [name, items(args), items(_flat_kwargs(kwargs))],
                        self.path(owner, f".{name}()"))

    def op(self, target, name, *args):
        path = self.path(target, "[*]") if name == "next" else None
        return self.ask("op", target, [name, *args], path, iterating=name == "next")

    def attribute(self, target, name):
        cls = target if type(target) is MirrorMeta else type(target)
        if name in self.methods.get(cls, ()):
            return Method(target, name)
        value = self.ask("get", target, [name], self.path(target, f".{name}"))
        if value is _METHOD:
            if type(cls) is MirrorMeta:
                self.methods.setdefault(cls, set()).add(name)
            return Method(target, name)
        return value

    def fail(self, why):
        why = why or "the candidate is gone"
        self.failed = self.failed or why
        raise CandidateGone(why) if self.gone else FailedCall(why)

    def set_tamper(self, kind, detail):
        if self.tamper is None:
            self.tamper = (kind, _text(detail, 500))
        self.gone = self.gone or f"tamper: {kind}"

    def printed(self, message):
        """What the candidate printed during a call goes where the tests' own prints go."""
        if message.out:
            sys.stdout.write(message.out)
        if message.err:
            sys.stderr.write(message.err)

    # ------------------------------------------------------------ requests from the candidate

    def serve(self, message):
        """A request of the candidate's: only on objects the judge handed it, only public names."""
        try:
            op, values = message.what, message.items
            if not values or type(values[-1]) is not list:
                raise ProtocolError("a malformed request")
            target = values[0] if len(values) == 2 else None
            rest = values[-1]
            if target is None or self.table.refs.get(id(target)) is None or isinstance(target, RemoteBase):
                raise ProtocolError("a request about something the judge never handed over")
            if op in ("get", "set", "callm") and (not rest or type(rest[0]) is not str or rest[0].startswith("_")):
                return "exc", [AttributeError("the tests' objects answer public names only")]
            if op == "call":
                args, kwargs = rest
                return "ok", [target(*args, **_kwargs(kwargs))]
            if op == "callm":
                name, args, kwargs = rest
                return "ok", [getattr(target, name)(*args, **_kwargs(kwargs))]
            if op == "get":
                return "ok", [getattr(target, rest[0])]
            if op == "set":
                setattr(target, rest[0], rest[1])
                return "ok", [None]
            if op == "op" and rest and type(rest[0]) is str and rest[0] in JUDGE_OPS:
                return "ok", [JUDGE_OPS[rest[0]](target, *rest[1:])]
            raise ProtocolError(f"an unknown request {str(op)[:20]!r}")
        except ProtocolError as exc:
            self.set_tamper("protocol", exc)
            return "fail", ["protocol error"]
        except FailedCall:
            raise
        except BaseException as exc:
            return "exc", [exc]

    # ------------------------------------------------------------ the codec's rules for this side

    def encode_other(self, x, encoder):
        t = type(x)
        if isinstance(x, BaseException):
            return exception_item(x, encoder)
        name = self.setup_names.get(id(x))
        if name is not None:
            return {"U": name}
        if t is types.ModuleType:
            module = getattr(x, "__name__", None)
            if type(module) is str and module.partition(".")[0] in sys.stdlib_module_names:
                return {"m": module}
        if t in (types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType,
                 types.ClassMethodDescriptorType, type, types.FunctionType):
            named = std_name(x)
            if named is not None:
                return {"st": list(named)}
        ref = encoder.table.add(x)
        encoder.added.append(ref)
        try:
            value = hash(x)
        except BaseException:
            value = None
        return {"h": [ref, value, ["o", _type_name(x), callable(x)]]}

    def decode_other(self, tag, x, decoder):
        if tag == "h":
            return self.materialize(x, decoder)
        if tag == "E":
            return exception_value(x, decoder)
        if tag == "st" and type(x) is list and len(x) == 2:
            found = resolve_std(x[0], x[1])
            if isinstance(found, type) and (tuple(x) in STD_VALUE_CLASSES or issubclass(found, BaseException)):
                return found
            raise ProtocolError("a standard-library name the judge does not take from the candidate")
        if tag == "U" and type(x) is str and x in self.setup_objects:
            return self.setup_objects[x]
        raise ProtocolError(f"an unknown tag {str(tag)[:20]!r}")

    def materialize(self, x, decoder):
        """The judge's stand-in for a handle the candidate sent: a proxy, a mirror class or an
        instance of one."""
        if type(x) is not list or len(x) != 3 or type(x[0]) is not int or type(x[2]) is not list or not x[2]:
            raise ProtocolError("a malformed handle")
        ref, value, desc = x
        table = self.table
        if ref % 2 != CANDIDATE_PARITY or ref in table.objects:
            raise ProtocolError("a handle under a ref that is not the candidate's to make")
        if value is not None and type(value) is not int:
            raise ProtocolError("a malformed hash")
        kind = desc[0]
        if kind == "c" and len(desc) == 6:
            _, name, qualname, module, bases, methods = desc
            fields = None
            if type(methods) is list and methods and type(methods[0]) is list:
                fields, methods = methods[0], methods[1:]
            base_values = [decoder.item(b) for b in bases] if type(bases) is list else None
            if base_values is None or type(methods) is not list or not all(type(m) is str for m in methods):
                raise ProtocolError("a malformed class")
            if fields is not None and not all(type(f) is str for f in fields):
                raise ProtocolError("malformed fields")
            obj = make_mirror(name, qualname, module, base_values, methods, fields)
            self.methods[obj] = set(methods)
        elif kind == "i" and len(desc) == 3:
            cls = decoder.item(desc[1])
            if type(cls) is not MirrorMeta:
                raise ProtocolError("an instance of something that is not a class")
            base = _value_base(cls)
            if base is not None:
                plain = decoder.item(desc[2])
                if type(plain) is not base:
                    raise ProtocolError("a value instance without its value")
                obj = base.__new__(cls, plain)
            elif issubclass(cls, BaseException):
                raise ProtocolError("an exception sent as an instance")
            else:
                obj = object.__new__(cls)
        elif kind == "e" and len(desc) == 5:
            cls = decoder.item(desc[1])
            args, text = decoder.item(desc[2]), desc[3]
            if type(cls) is not MirrorMeta or not issubclass(cls, BaseException) or type(args) is not tuple:
                raise ProtocolError("a malformed exception")
            obj = _new_exception(cls, args)
            self.texts[ref] = _text(text, 4000) if type(text) is str else None
        elif kind == "g" and len(desc) == 2:
            obj = object.__new__(RemoteIterator)
        elif kind == "m" and len(desc) == 2 and type(desc[1]) is str:
            obj = object.__new__(Remote)
            self.modules[ref] = desc[1]
        elif kind == "f" and len(desc) == 2:
            obj = object.__new__(Remote)
        else:
            raise ProtocolError("a malformed handle")
        table.add(obj, None, ref)
        self.hashes[ref] = value
        return obj


_METHOD = object()  # the answer to a "get" of a callable attribute


def _flat_kwargs(kwargs):
    return [v for pair in kwargs.items() for v in pair]


def _kwargs(flat):
    if type(flat) is not list or len(flat) % 2 or not all(type(k) is str for k in flat[0::2]):
        raise ProtocolError("malformed keyword arguments")
    return dict(zip(flat[0::2], flat[1::2]))


def _type_name(x):
    try:
        return str(type(x).__name__)[:100]
    except BaseException:
        return "object"


JUDGE_OPS = {
    "len": len, "iter": iter, "next": next, "str": str, "repr": repr, "bool": bool, "hash": hash,
    "contains": lambda target, item: item in target,
    "getitem": lambda target, key: target[key],
    "setitem": lambda target, key, value: target.__setitem__(key, value),
    "delitem": lambda target, key: target.__delitem__(key),
    "eq": lambda target, other: target == other, "ne": lambda target, other: target != other,
    "lt": lambda target, other: target < other, "le": lambda target, other: target <= other,
    "gt": lambda target, other: target > other, "ge": lambda target, other: target >= other,
    "format": format,
    "enter": lambda target: type(target).__enter__(target),
    "exit": lambda target, *exc: type(target).__exit__(target, *exc),
}


def is_plain(value):
    """Whether ``value`` holds none of the completion's objects (its value-type instances count
    as plain: they compare as their base type; its iterators are checked item by item)."""
    stack, seen = [value], set()
    while stack:
        x = stack.pop()
        t = type(x)
        if t in SIMPLE or t is bytes:
            continue
        if t is MirrorMeta:
            return False
        if isinstance(x, RemoteBase):
            if t is RemoteIterator:
                continue
            return False
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, (list, tuple, set, frozenset)) or t.__name__ == "deque":
            stack.extend(x)
        elif type(t) is MirrorMeta and issubclass(t, BaseException):
            return False
    return True


def exception_item(exc, encoder):
    """An exception of a built-in or standard-library class (or the nearest built-in base of
    any other class) as ``{"E": [class, args, attributes, text]}``."""
    cls = type(exc)
    if getattr(builtins, cls.__name__, None) is cls:
        spec = cls.__name__
    else:
        named = std_name(cls)
        spec = ["std", *named, _builtin_base(cls)] if named is not None else _builtin_base(cls)
    attributes = getattr(exc, "__dict__", None)
    attributes = {k: v for k, v in attributes.items() if type(k) is str and not k.startswith("__")} if type(attributes) is dict else {}
    return {"E": [spec, encoder.item(tuple(exc.args)), encoder.item(attributes), _text(exc, 4000)]}


def _builtin_base(cls):
    for base in cls.__mro__:
        if getattr(builtins, base.__name__, None) is base:
            return base.__name__
    return "Exception"


def exception_value(x, decoder):
    """An exception from ``{"E": ...}``, built by its own class's constructor (a built-in or
    standard-library class: trusted code) with the args it was raised with."""
    if type(x) is not list or len(x) != 4:
        raise ProtocolError("a malformed exception")
    spec, args, attributes, text = x
    args, attributes = decoder.item(args), decoder.item(attributes)
    if type(args) is not tuple or type(attributes) is not dict:
        raise ProtocolError("a malformed exception")
    if type(spec) is str:
        cls = getattr(builtins, spec, None)
    elif type(spec) is list and len(spec) == 4 and spec[0] == "std":
        cls = resolve_std(spec[1], spec[2])
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            cls = getattr(builtins, spec[3], None) if type(spec[3]) is str else None
    else:
        cls = None
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        raise ProtocolError("an exception of no known class")
    error = _new_exception(cls, args)
    for key, value in attributes.items():
        if type(key) is str and not key.startswith("_"):
            try:
                setattr(error, key, value)
            except BaseException:
                pass
    return error


def _new_exception(cls, args):
    base = next((b for b in cls.__mro__ if getattr(builtins, b.__name__, None) is b), BaseException)
    try:
        error = cls(*args) if type(cls) is not MirrorMeta else base.__new__(cls, *args)
        if type(cls) is MirrorMeta:
            base.__init__(error, *args)
    except BaseException:
        error = base.__new__(cls)
        error.args = args
    return error
