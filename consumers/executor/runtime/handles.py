"""The candidate's side of the codec: its state, the tests' objects as :class:`JudgeProxy` s and
the completion's own objects as handles.

A module of the runtime (standard library only; in the sandbox it arrives in the runtime's
bundle, runtime/importer.py; on the host, an ordinary module). :data:`CANDIDATE` is the one
candidate of this process (runtime/candidate.py's ``candidate_main`` fills it in). What the
tests hand over that is no value (their functions, mocks and streams) arrives as a
:class:`JudgeProxy`, which the completion uses like the original: every use is a request the
judge answers. What the completion sends that is no value (its functions, classes, instances,
modules, iterators) leaves as a handle the judge's proxies use (:func:`encode_other`; a class
with what the judge's mirror class needs: :func:`_class_desc`), and what the judge sends back
of them, or of the setup's and the standard library's names, :func:`decode_other` turns into
the objects themselves.
"""

import builtins
import sys

from rollstream.consumers.executor.runtime.channel import items
from rollstream.consumers.executor.runtime.codec import (
    MUTABLE,
    ProtocolError,
    Table,
    clip_text,
    std_name,
)
from rollstream.consumers.executor.runtime.proxies import (
    CANDIDATE_PARITY,
    STD_VALUE_CLASSES,
    VALUE_BASES,
    builtin_base,
    exception_item,
    exception_value,
    flat_kwargs,
    value_base,
)


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
        value = CANDIDATE.hashes.get(CANDIDATE.table.refs.get(id(self)))
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


CANDIDATE = _Candidate()


def _ask(op, target, rest):
    message = CANDIDATE.channel.call(op, [target, items(rest)])
    if message.what == "ok" and len(message.items) == 1:
        return message.items[0]
    if message.what == "exc" and len(message.items) == 1 and isinstance(message.items[0], BaseException):
        raise message.items[0]
    if message.what == "m":
        return _JUDGE_METHOD
    raise RuntimeError(f"the tests' object could not answer: {str(message.items)[:300]}")


def _op(target, name, *args):
    return _ask("op", target, [name, *args])


# ---------------------------------------------------------------- the codec's rules for this side

def encode_other(x, encoder):
    candidate = CANDIDATE
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
    candidate = CANDIDATE
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
