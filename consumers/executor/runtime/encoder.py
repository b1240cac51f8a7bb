"""The codec's sending end (:class:`Encoder`): the items of one message against its side's
:class:`~codec.Table`, the definitions of the containers it introduces and the changes of those
that changed, and the standard library's value types as tagged items (:func:`value_item`).

A module of the runtime (standard library only; in the sandbox it arrives in the runtime's
bundle, runtime/importer.py; on the host, an ordinary module). The format is runtime/codec.py's;
runtime/decoder.py reads it.
"""

import binascii
import datetime
import decimal
import fractions
import sys

from rollstream.consumers.executor.runtime.codec import (
    BUILTIN_TYPES,
    JSON_INT_BITS,
    KINDS,
    MAX_DEPTH,
    MUTABLE_KINDS,
    SIMPLE,
    NotTransferable,
    TooLarge,
    base_view,
    instance_state,
    plain_instance,
    std_name,
)

INTS = frozenset({int, bool})
BIG = 1 << JSON_INT_BITS
_VIEWS = {type({}.keys()): "K", type({}.values()): "V", type({}.items()): "I"}


class Encoder:
    """Encodes the items of one message against ``table``; ``other(x, encoder)`` encodes what is
    neither a scalar, a container nor a value type (handles, the side's own rules)."""

    __slots__ = ("table", "other", "pending", "defs", "added", "setup_classes", "fast", "depth")

    def __init__(self, table, other, setup_classes=None):
        self.table = table
        self.other = other
        self.fast = True  # lists of scalars as they are (off: item by item)
        self.pending = []  # (ref, kind, obj, depth) defined by this message, payload still to write
        self.depth = 1  # of the container whose payload is being written (its children: one more)
        self.defs = []
        self.added = []  # refs added to the table by this message (undone if it is not sent)
        self.setup_classes = setup_classes or {}  # id(class) -> name: the task's setup classes

    def item(self, x):
        t = type(x)
        if t is str or t is float or t is bool or x is None:
            return x
        if t is int:
            return x if x.bit_length() < JSON_INT_BITS else {"i": hex(x)}
        ref = self.table.refs.get(id(x))
        if ref is not None:
            return {"r": ref}
        kind = KINDS.get(t)
        if kind is None:
            if t is bytes:
                return {"b": binascii.b2a_base64(x, newline=False).decode()}
            value = value_item(x, self)
            if value is not None:
                return value
            kind = self.container_kind(x, t)
            if kind is None:
                return self.other(x, self)
        return self.container(x, kind)

    def container(self, x, kind):
        """Replicate ``x`` as a container of ``kind`` (its contents follow as a definition)."""
        if self.depth >= MAX_DEPTH:
            raise TooLarge(f"too_large: a value nested deeper than {MAX_DEPTH} levels")
        ref = self.table.add(x, kind)
        self.added.append(ref)
        self.pending.append((ref, kind, x, self.depth + 1))
        return {"r": ref}

    def container_kind(self, x, t):
        """Kinds for what is a container by the task's classes or by the standard library's."""
        name = self.setup_classes.get(id(t))
        if name is not None:
            if issubclass(t, tuple) and hasattr(t, "_make"):
                return "N"
            if plain_instance(x, t):
                return "S"
        if t in _VIEWS:
            return _VIEWS[t]
        if issubclass(t, tuple) and hasattr(t, "_fields") and std_name(t) is not None:
            return "N"
        return None

    def payload(self, kind, x):
        if kind in MUTABLE_KINDS and type(x) not in KINDS and kind != "S":
            x = base_view(kind, x)
        item = self.item
        if kind == "l" or kind == "t" or kind == "s" or kind == "f" or kind == "K" or kind == "V":
            if self.fast and _fast(x):
                return list(x)
            return [item(v) for v in x]
        if kind == "d" or kind == "o" or kind == "c":
            return _flat(x, item, self.fast)
        if kind == "y":
            return binascii.b2a_base64(x, newline=False).decode()
        if kind == "q":
            return [x.maxlen, *(item(v) for v in x)]
        if kind == "D":
            return [item(x.default_factory), *_flat(x, item, self.fast)]
        if kind == "I":
            return [v for pair in x for v in (item(pair[0]), item(pair[1]))]
        if kind == "S":
            return [self.setup_classes[id(type(x))], *_flat(instance_state(x), item, self.fast)]
        if kind == "N":
            name = self.setup_classes.get(id(type(x)))
            spec = ["setup", name] if name is not None else ["std", *std_name(type(x))]
            return [spec, *(item(v) for v in tuple.__iter__(x))]
        raise NotTransferable(f"no payload for kind {kind!r}")

    def changes(self):
        """``[ref, payload]`` for every replicated mutable container that changed."""
        table = self.table
        new = set(self.added)
        return [[ref, self.payload(table.kinds[ref], table.objects[ref])] for ref in table.changed() if ref not in new]

    def finish(self):
        """The definitions of the containers this message introduces (their children too)."""
        index = 0
        while index < len(self.pending):
            ref, kind, x, self.depth = self.pending[index]
            index += 1
            self.defs.append([ref, kind, self.payload(kind, x)])
        return self.defs

    def sent(self, synced):
        """The message went out: what the other side now holds is what we hold."""
        table = self.table
        for ref, kind, _, _ in self.pending:
            if kind in MUTABLE_KINDS:
                table.snapshot(ref)
        for ref in synced:
            table.snapshot(ref)

    def abandon(self):
        for ref in self.added:
            self.table.forget(ref)


def _fast(values):
    """Scalars JSON writes as they are (ints only below ``BIG``), checked at C speed."""
    types = set(map(type, values))
    if not SIMPLE.issuperset(types):
        return False
    if int not in types:
        return True
    return INTS.issuperset(types) and -BIG < min(values) and max(values) < BIG


def _flat(mapping, item, fast):
    if fast and _fast(mapping.keys()) and _fast(mapping.values()):
        return [v for pair in mapping.items() for v in pair]
    return [v for key, value in mapping.items() for v in (item(key), item(value))]


def value_item(x, encoder):
    """The standard library's value types, tagged; None when ``x`` is not one."""
    t = type(x)
    item = encoder.item
    if t is complex:
        return {"x": [x.real, x.imag]}
    if t is decimal.Decimal:
        return {"dec": str(x)}
    if t is fractions.Fraction:
        return {"fr": [item(x.numerator), item(x.denominator)]}
    if t is datetime.datetime:
        return {"dt": [x.year, x.month, x.day, x.hour, x.minute, x.second, x.microsecond,
                       _tz(x.tzinfo, encoder), x.fold]}
    if t is datetime.date:
        return {"da": [x.year, x.month, x.day]}
    if t is datetime.time:
        return {"tm": [x.hour, x.minute, x.second, x.microsecond, _tz(x.tzinfo, encoder), x.fold]}
    if t is datetime.timedelta:
        return {"td": [x.days, x.seconds, x.microseconds]}
    if t is datetime.timezone:
        return {"tz": _tz(x, encoder)}
    if t is range:
        return {"rg": [item(x.start), item(x.stop), item(x.step)]}
    if t is slice:
        return {"sl": [item(x.start), item(x.stop), item(x.step)]}
    if x is Ellipsis:
        return {"el": 0}
    if t is type and x.__name__ in BUILTIN_TYPES and BUILTIN_TYPES[x.__name__] is x:
        return {"ty": x.__name__}
    if _is_enum_member(x) and std_name(t) is not None:
        return {"en": [*std_name(t), x.name]}
    pathlib = sys.modules.get("pathlib")
    if pathlib is not None and (t is pathlib.PosixPath or t is pathlib.PurePosixPath):
        return {"pa": [t is pathlib.PosixPath, str(x)]}
    uuid = sys.modules.get("uuid")
    if uuid is not None and t is uuid.UUID:
        return {"uu": x.hex}
    return None


def _tz(tz, encoder):
    if tz is None:
        return None
    if type(tz) is not datetime.timezone:
        raise NotTransferable(f"a {type(tz).__name__} time zone")
    offset = tz.utcoffset(None)
    name = tz.tzname(None)
    return [offset.days, offset.seconds, offset.microseconds, name if tz != datetime.timezone(offset) else None]


def _is_enum_member(x):
    enum = sys.modules.get("enum")
    return enum is not None and isinstance(x, enum.Enum)
