"""The judge's side of the boundary: the completion's objects as proxies and mirror classes,
and the requests that use them.

A module of the runtime (standard library only; in the sandbox it arrives in the runtime's
bundle, runtime/importer.py; on the host, an ordinary module). The judge process (consumers/executor/runtime/judge.py) holds one
``Crossing`` (consumers/executor/runtime/crossing.py; what may cross, and where: valuecheck.py):

* the completion's functions, instances, generators and modules are *proxies*: every use is a
  request the candidate answers (:class:`Remote`; generators and built-in iterators are lazy
  :class:`RemoteIterator` s). A proxy equals only itself unless both sides of a comparison are
  the completion's objects (and then not for an enum's members, which equal by identity, nor
  without a reference for opaque ones: crossing.Crossing.opaque_compare), and hashes as the
  candidate said when it crossed, so no completion code decides whether one of its objects
  equals plain data;
* the completion's classes are *mirrors*: real classes of the judge (:class:`MirrorMeta`) whose
  bases are the mirrors of the completion's own bases and the standard library's exception
  classes and value types among its real ones. ``isinstance``, ``except InsufficientFunds``
  and ``raises(ValueError)`` work through them; an instance of a completion class derived from
  a value type (a namedtuple, an ``IntEnum``) is an instance of the mirror holding the plain
  value, so it compares, hashes and prints as that value does (the base type's own methods,
  never the subclass's); a mirror of a class derived from one of the setup's classes has that
  class among its bases; a dataclass's mirror has its fields (``dataclasses.asdict`` works) and,
  where ``dataclasses`` wrote its comparisons, compares here, field by field;
* exceptions come back as themselves: a built-in or standard-library class is rebuilt by its own
  constructor with the args it was raised with; a completion class as an instance of its mirror.
  ``StopIteration`` raised by a call (not by ``next``) becomes ``RuntimeError`` (PEP 479), so it
  cannot quietly end the iteration a test is in;
* a coroutine of the completion's can be awaited (``asyncio.run(f())``): the candidate runs it.
"""

import builtins

from rollstream.consumers.executor.runtime.codec import ProtocolError, clip_text, resolve_std, std_name

JUDGE_PARITY, CANDIDATE_PARITY = 0, 1
# Standard-library classes the candidate may name by module and name (values and exceptions).
STD_VALUE_CLASSES = frozenset({
    ("collections", "OrderedDict"), ("collections", "defaultdict"), ("collections", "Counter"),
    ("collections", "deque"), ("decimal", "Decimal"), ("fractions", "Fraction"),
    ("datetime", "datetime"), ("datetime", "date"), ("datetime", "time"), ("datetime", "timedelta"),
    ("datetime", "timezone"),
})


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

class CrossingState:
    """The one judge of this process (a judge lives for one job)."""

    crossing = None


def current_crossing():
    crossing = CrossingState.crossing
    if crossing is None:
        raise FailedCall("no job")
    return crossing


class RemoteBase:
    """An object of the candidate's, held by ref. Equality and hashing are the judge's own
    unless both sides of a comparison are the candidate's objects."""

    __slots__ = ()

    def __getattr__(self, name):
        return current_crossing().attribute(self, name)

    def __setattr__(self, name, value):
        current_crossing().ask("set", self, [name, value])

    def __delattr__(self, name):
        current_crossing().ask("del", self, [name])

    def __repr__(self):
        text = current_crossing().op(self, "repr")
        return text if type(text) is str else "<completion object>"

    def __str__(self):
        text = current_crossing().op(self, "str")
        return text if type(text) is str else "<completion object>"

    def __format__(self, spec):
        text = current_crossing().op(self, "format", spec)
        if type(text) is not str:
            raise TypeError("format() of a completion object gave no str")
        return text

    def __eq__(self, other):
        crossing = current_crossing()
        if crossing.opaque and not crossing.decoding and type(self) not in IDENTITY and type(other) not in IDENTITY:
            found = crossing.opaque_compare(self, "eq", other)
            if found is not None:
                return found
        if isinstance(other, RemoteBase) and not crossing.decoding and type(self) is not RemoteIterator \
                and type(self) not in IDENTITY and type(other) not in IDENTITY:
            return crossing.op(self, "eq", other)
        return self is other

    def __ne__(self, other):
        crossing = current_crossing()
        if crossing.opaque and not crossing.decoding and type(self) not in IDENTITY and type(other) not in IDENTITY:
            found = crossing.opaque_compare(self, "ne", other)
            if found is not None:
                return found
        if isinstance(other, RemoteBase) and not crossing.decoding and type(self) is not RemoteIterator \
                and type(self) not in IDENTITY and type(other) not in IDENTITY:
            return crossing.op(self, "ne", other)
        return self is not other

    def __hash__(self):
        value = current_crossing().hashes.get(current_crossing().table.refs.get(id(self)))
        if value is None:
            raise TypeError("unhashable completion object")
        return value

    def __copy__(self):
        return current_crossing().op(self, "copy")

    def __deepcopy__(self, memo=None):
        return current_crossing().op(self, "deepcopy")

    def __reduce_ex__(self, protocol):
        raise NeedsCandidate()

    def __reduce__(self):
        raise NeedsCandidate()

    def __dir__(self):
        names = current_crossing().op(self, "dir")
        return names if type(names) is list else []


# Mirrors of the completion's enums: their members are singletons, equal by identity only (what an
# enum's == is), so a member that claims to equal everything equals nothing else here.
IDENTITY = set()


class NeedsCandidate(Exception):
    """pickle met a completion object: the whole dump is made by the candidate."""


class RemoteIterator(RemoteBase):
    """A generator or built-in iterator of the candidate's: lazy, one ``next`` per item. It may
    stand where the reference gives plain data (its items are checked), so it answers nothing
    but its items and a generator's own methods: its text is the judge's."""

    __slots__ = ()

    def __iter__(self):
        return self

    def __getattr__(self, name):
        if name in ("send", "throw", "close"):
            return Method(self, name)
        raise AttributeError(f"a completion iterator has no attribute {name!r} the tests may read")

    def __repr__(self):
        return "<iterator of the completion>"

    __str__ = __repr__

    def __format__(self, spec):
        return format(repr(self), spec)

    def __next__(self):
        return current_crossing().op(self, "next")


def _forward(op):
    def method(self, *args):
        return current_crossing().op(self, op, *args)

    method.__name__ = f"__{op}__"
    return method


def _compare(op):
    def method(self, other):
        crossing = current_crossing()
        if crossing.opaque and not crossing.decoding:
            found = crossing.opaque_compare(self, op, other)
            if found is not None:
                return found
        if isinstance(other, RemoteBase) and not crossing.decoding:
            return crossing.op(self, op, other)
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
        return current_crossing().call(self, args, kwargs)

    def __contains__(self, item):
        return current_crossing().op(self, "contains", item) is True

    def __getitem__(self, key):
        return current_crossing().op(self, "getitem", key)

    def __setitem__(self, key, value):
        current_crossing().op(self, "setitem", key, value)

    def __delitem__(self, key):
        current_crossing().op(self, "delitem", key)

    def __round__(self, *args):
        return current_crossing().op(self, "round", *args)

    def __exit__(self, *exc):
        return current_crossing().op(self, "exit", *_exc_info(exc))

    @property
    def __doc__(self):  # functools.wraps metadata: the completion's, not this class's
        return current_crossing().attribute(self, "__doc__")

    @property
    def __module__(self):
        return current_crossing().attribute(self, "__module__")

    def __await__(self):
        """``await f()`` of the completion's coroutine: the candidate runs it to its end."""
        return current_crossing().op(self, "await")
        yield  # a generator: what an awaitable's __await__ returns

    def __aiter__(self):
        return current_crossing().op(self, "aiter")

    def __anext__(self):
        return _RemoteStep(self)


class _RemoteStep:
    """``await it.__anext__()`` of the completion's asynchronous iterator."""

    __slots__ = ("owner",)

    def __init__(self, owner):
        self.owner = owner

    def __await__(self):
        return current_crossing().op(self.owner, "anext")
        yield


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
        return current_crossing().call_method(self.owner, self.name, args, kwargs)

    def __repr__(self):
        return f"<method {self.name} of a completion object>"


class MirrorMeta(type):
    """The metaclass of a judge-side mirror of a class the completion defines: a real class
    (``isinstance``, ``except``, ``raises`` work through its real bases); constructing it and its
    class attributes are requests.

    A class the tests derive from mirrors (``class Dog(Animal): def sound(self): ...``) is made
    in both processes (crossing.Crossing.subclassed): here as the tests wrote it, and in the
    candidate as a subclass of the completion's own classes whose attributes are the tests'
    (their methods run here, called by the completion's as ``self.sound()``); the tests' class
    stands for the candidate's, so its instances live in the candidate like the completion's, and
    what it inherits (``speak``, ``super().__init__(...)``) is asked of the completion's class by
    name (:class:`Inherited`)."""

    def __new__(mcls, name, bases, namespace, mirror=False):
        cls = super().__new__(mcls, name, bases, namespace)
        if not mirror:
            current_crossing().subclassed(cls)
        return cls

    def __init__(cls, name, bases, namespace, mirror=False):
        super().__init__(name, bases, namespace)

    def __call__(cls, *args, **kwargs):
        return current_crossing().call(cls, args, kwargs)

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return current_crossing().attribute(cls, name)

    def __iter__(cls):
        return current_crossing().op(cls, "iter")

    def __len__(cls):
        return current_crossing().op(cls, "len")

    def __bool__(cls):  # a class is true (`if category:` in warnings), whatever its metaclass says of len()
        return True

    def __getitem__(cls, key):
        return current_crossing().op(cls, "getitem", key)

    def __contains__(cls, item):
        return current_crossing().op(cls, "contains", item) is True


VALUE_BASES = (int, float, complex, str, bytes, tuple, frozenset)


def value_base(cls):
    for base in cls.__mro__:
        if base in VALUE_BASES:
            return base
    return None


def _mirror_getattr(self, name):
    return current_crossing().attribute(self, name)


def _mirror_str(self):
    crossing = current_crossing()
    text = crossing.texts.get(crossing.table.refs.get(id(self)))
    if text is None:
        text = crossing.op(self, "str")
    return text if type(text) is str else "<completion object>"


def _mirror_reduce(self, *args):
    raise NeedsCandidate()


def _value_copy(base, x):
    """A copy of an instance of a completion subclass of a value type: its base type's value
    (read with the base type's own methods; the subclass's copy hooks never run)."""
    if base is str:
        return str.__str__(x)
    if base is bytes:
        return bytes(memoryview(x))
    if base is tuple:
        return tuple(tuple.__iter__(x))
    if base is frozenset:
        return frozenset(frozenset.__iter__(x))
    return base.__pos__(x) if base in (int, float, complex) else x


def _field(index):
    return property(lambda self: tuple.__getitem__(self, index))


def _value_text(base, fields):
    """str/repr/format of an instance of a completion subclass of a value type: the base
    type's own (a namedtuple's as collections.namedtuple writes it), never the subclass's."""
    if base is tuple and fields is not None:
        def text(self):
            values = tuple.__iter__(self)
            return f"{type(self).__name__}(" + ", ".join(f"{f}={v!r}" for f, v in zip(fields, values)) + ")"

        return text, text, lambda self, spec: format(text(self), spec)
    show = base.__repr__
    return (base.__str__ if base is not bytes else show), show, base.__format__


class _Forwarded:
    """A name the completion's class defines, on a mirror whose bases include one of the setup's
    classes: the completion's attribute, not the setup class's (which the judge also holds)."""

    __slots__ = ("name", "method")

    def __init__(self, name, method):
        self.name, self.method = name, method

    def __get__(self, obj, owner=None):
        target = owner if obj is None else obj
        return Method(target, self.name) if self.method else current_crossing().attribute(target, self.name)


class Inherited:
    """A method of the completion's class ``owner``, on its mirror once the tests derive a class
    from it (MirrorMeta): read from an instance of the tests' class (``dog.speak()``, which the
    tests' class does not define, or ``super().speak()`` / ``super().__init__(...)`` in one of its
    methods) it is ``owner``'s own, bound to that instance in the candidate (``callsuper``), never
    the candidate's lookup from the instance's class, which would find the tests' override again;
    read from the completion's own instances and classes it is what it was (a request by name)."""

    __slots__ = ("owner", "name")

    def __init__(self, owner, name):
        self.owner, self.name = owner, name

    def __get__(self, obj, owner=None):
        crossing = current_crossing()
        if obj is None:
            return crossing.attribute(self.owner if owner is None else owner, self.name)
        if type(obj) in crossing.tests_classes or self.name == "__init__":
            return _Super(obj, self.owner, self.name)
        return Method(obj, self.name)


class _Super:
    """``owner``'s ``name`` bound to the instance ``obj`` (:class:`Inherited`): calling it is one
    request."""

    __slots__ = ("obj", "owner", "name")

    def __init__(self, obj, owner, name):
        self.obj, self.owner, self.name = obj, owner, name

    def __call__(self, *args, **kwargs):
        return current_crossing().call_super(self.obj, self.owner, self.name, args, kwargs)

    def __repr__(self):
        return f"<method {self.name} of a completion class>"


def _dataclass_fields(specs):
    """``__dataclass_fields__`` for a mirror of a completion dataclass (names only: what
    ``asdict``, ``astuple``, ``fields`` and ``replace`` read)."""
    import dataclasses

    found = {}
    for spec in specs:
        if type(spec) is not list or len(spec) not in (2, 3) or type(spec[0]) is not str or not spec[0].isidentifier():
            continue
        field = dataclasses.field(init=spec[1] is not False)
        field.name = spec[0]
        field._field_type = dataclasses._FIELD
        found[spec[0]] = field
    return found


def make_mirror(name, qualname, module, bases, methods, info, setup_classes=()):
    """A judge-side class standing for a class of the completion's. Only the standard library's
    exception classes, the built-in value types, the setup's classes and other mirrors are kept
    as bases. ``info``: the class's ``doc``, a namedtuple's ``fields``, a dataclass's
    ``dataclass`` fields, and ``attrs`` (its public class attributes that are not methods)."""
    kept, setup = [], []
    for base in bases:
        if type(base) is MirrorMeta:
            kept.append(base)
        elif isinstance(base, type) and (base in VALUE_BASES or issubclass(base, BaseException)):
            if base is not BaseException or not kept:
                kept.append(base)
        elif isinstance(base, type) and base in setup_classes:
            setup.append(base)
    if not any(issubclass(b, (RemoteBase, BaseException)) or b in VALUE_BASES for b in kept):
        kept.append(Remote)
    doc = info.get("doc")
    namespace = {"__module__": str(module)[:200], "__qualname__": str(qualname)[:200],
                 "__doc__": doc[:10000] if type(doc) is str else None}
    probe = MirrorMeta.__new__(MirrorMeta, "probe", tuple(kept), {}, mirror=True)
    exception = issubclass(probe, BaseException)
    value = value_base(probe)
    fields = info.get("fields")
    fields = tuple(fields) if type(fields) is list and all(type(f) is str for f in fields) else None
    if exception:
        namespace.update(__getattr__=_mirror_getattr, __str__=_mirror_str, __reduce_ex__=_mirror_reduce)
    elif value is not None:
        text, show, shape = _value_text(value, fields)
        namespace.update(__slots__=(), __getattr__=_mirror_getattr, __str__=text, __repr__=show, __format__=shape,
                         __reduce_ex__=_mirror_reduce, __copy__=lambda self: _value_copy(value, self),
                         __deepcopy__=lambda self, memo=None: _value_copy(value, self))
        if value is tuple and fields is not None:
            namespace["_fields"] = fields
            for index, field in enumerate(fields):
                if field.isidentifier() and not field.startswith("_"):
                    namespace[field] = _field(index)
    else:
        namespace["__slots__"] = ()
        if setup:
            attrs = info.get("attrs")
            for attr in methods:
                namespace.setdefault(attr, _Forwarded(attr, True))
            for attr in attrs if type(attrs) is list else ():
                if type(attr) is str and not attr.startswith("_"):
                    namespace.setdefault(attr, _Forwarded(attr, False))
        dataclass = info.get("dataclass")
        if type(dataclass) is list and dataclass:
            namespace["__dataclass_fields__"] = _dataclass_fields(dataclass)
            compares = info.get("compares")
            if type(compares) is list and len(compares) == 2 and compares[0] is True:
                namespace.update(_field_comparisons(dataclass, compares[1] is True))
    try:
        cls = MirrorMeta(str(name)[:200], tuple(kept + setup), namespace, mirror=True)
    except TypeError:  # bases that cannot be combined here: keep the first
        cls = MirrorMeta(str(name)[:200], tuple(kept[:1]), namespace, mirror=True)
    if info.get("enum") is True and not exception and value is None:
        IDENTITY.add(cls)
    return cls


def _field_comparisons(specs, order):
    """``==`` (and with ``order``, ``<`` ...) of a completion dataclass whose comparisons
    ``dataclasses`` wrote: made here, as ``dataclasses`` makes them (the tuples of the fields that
    compare, when both are of the same class), from the fields read as they cross. So a field
    that claims to equal everything decides nothing: it equals no plain value here."""
    names = tuple(spec[0] for spec in specs if type(spec) is list and len(spec) == 3 and type(spec[0]) is str
                  and spec[2] is True)

    def values(x):
        return tuple(getattr(x, name) for name in names)

    def compare(op):
        def method(self, other):
            if type(other) is not type(self):
                return NotImplemented
            return op(values(self), values(other))

        return method

    import operator

    found = {"__eq__": compare(operator.eq), "__ne__": compare(operator.ne), "__hash__": RemoteBase.__hash__}
    if order:
        found.update(__lt__=compare(operator.lt), __le__=compare(operator.le), __gt__=compare(operator.gt),
                     __ge__=compare(operator.ge))
    return found




# ---------------------------------------------------------------- the judge

CALLABLE_ATTRIBUTE = object()  # the answer to a "get" of a callable attribute


def flat_kwargs(kwargs):
    return [v for pair in kwargs.items() for v in pair]


def exception_item(exc, encoder):
    """An exception of a built-in or standard-library class (or the nearest built-in base of
    any other class) as ``{"E": [class, args, attributes, text]}``."""
    cls = type(exc)
    if getattr(builtins, cls.__name__, None) is cls:
        spec = cls.__name__
    else:
        named = std_name(cls)
        spec = ["std", *named, builtin_base(cls)] if named is not None else builtin_base(cls)
    attributes = getattr(exc, "__dict__", None)
    attributes = {k: v for k, v in attributes.items() if type(k) is str and not k.startswith("__")} if type(attributes) is dict else {}
    return {"E": [spec, encoder.item(tuple(exc.args)), encoder.item(attributes), clip_text(exc, 4000)]}


def builtin_base(cls):
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
    error = new_exception(cls, args)
    for key, value in attributes.items():
        if type(key) is str and not key.startswith("_"):
            try:
                setattr(error, key, value)
            except BaseException:
                pass
    return error


def new_exception(cls, args):
    base = next((b for b in cls.__mro__ if getattr(builtins, b.__name__, None) is b), BaseException)
    try:
        error = cls(*args) if type(cls) is not MirrorMeta else base.__new__(cls, *args)
        if type(cls) is MirrorMeta:
            base.__init__(error, *args)
    except BaseException:
        error = base.__new__(cls)
        error.args = args
    return error
