"""The codec's receiving end (:class:`Decoder`): a message's definitions, changes and items,
built into the receiving side's :class:`~codec.Table`, accepting exactly what runtime/encoder.py
writes (anything else is a :class:`~codec.ProtocolError`).

A module of the runtime (standard library only; in the sandbox it arrives in the runtime's
bundle, runtime/importer.py; on the host, an ordinary module). Nothing here evaluates, unpickles
or imports what the other side sent (runtime/codec.py).
"""

import binascii
import collections
import datetime
import decimal
import fractions
import sys

from rollstream.consumers.executor.runtime.codec import (
    BUILTIN_TYPES,
    IMMUTABLE_KINDS,
    MAX_DEPTH,
    MAX_HASH_DUPLICATES,
    MUTABLE_KINDS,
    SIMPLE,
    ProtocolError,
    TooLarge,
    resolve_std,
    resolve_std_importing,
    set_instance_state,
)

_SHELLS = {"l": list, "d": dict, "s": set, "y": bytearray, "o": collections.OrderedDict,
           "c": collections.Counter}


class Decoder:
    """Decodes the items of one message from the side whose refs have ``sender_parity`` into
    ``table``; ``other(tag, value, decoder)`` decodes the tags of the receiving side (handles)."""

    __slots__ = ("table", "sender", "other", "defs", "building", "new", "setup_classes")

    def __init__(self, table, sender_parity, other, setup_classes=None):
        self.table = table
        self.sender = sender_parity
        self.other = other
        self.defs = {}  # ref -> (kind, payload) of immutables not built yet
        self.building = set()
        self.new = []  # (ref, kind) of containers this message introduced
        self.setup_classes = setup_classes or {}  # name -> the receiver's own setup class

    def message(self, defs, sync):
        """Take in the definitions and changes of a message (before its items are decoded)."""
        if type(defs) is not list or type(sync) is not list:
            raise ProtocolError("a malformed message")
        table = self.table
        shells = []
        for entry in defs:
            if type(entry) is not list or len(entry) != 3:
                raise ProtocolError("a malformed definition")
            ref, kind, payload = entry
            if type(ref) is not int or ref < 0 or ref % 2 != self.sender or ref in table.objects or ref in self.defs:
                raise ProtocolError("a definition under a ref that is not the sender's to make")
            if kind in MUTABLE_KINDS:
                shells.append((self.shell(kind, payload, ref), kind, payload, ref))
            elif kind in IMMUTABLE_KINDS:
                self.defs[ref] = (kind, payload)
            else:
                raise ProtocolError(f"an unknown kind {str(kind)[:20]!r}")
        for ref in list(self.defs):
            self.ref(ref)
        for obj, kind, payload, _ in shells:
            self.fill(obj, kind, payload)
        changed = []
        new = {ref for ref, _ in self.new}
        for entry in sync:
            if type(entry) is not list or len(entry) != 2 or type(entry[0]) is not int:
                raise ProtocolError("a malformed change")
            ref, payload = entry
            kind = table.kinds.get(ref)
            if kind not in MUTABLE_KINDS or ref in new or ref in changed:
                raise ProtocolError("a change to something that is not a known mutable container")
            self.refill(table.objects[ref], kind, payload)
            changed.append(ref)
        return changed

    def settled(self, changed):
        """Every item of the message is decoded: what we hold is what the sender holds."""
        table = self.table
        for ref, kind in self.new:
            if kind in MUTABLE_KINDS:
                table.snapshot(ref)
        for ref in changed:
            table.snapshot(ref)

    def shell(self, kind, payload, ref):
        if kind == "q":
            if type(payload) is not list or not payload or (payload[0] is not None and type(payload[0]) is not int):
                raise ProtocolError("a malformed deque")
            obj = collections.deque(maxlen=payload[0])
        elif kind == "D":
            obj = collections.defaultdict()
        elif kind == "S":
            if type(payload) is not list or not payload or type(payload[0]) is not str:
                raise ProtocolError("a malformed instance")
            cls = self.setup_classes.get(payload[0])
            if cls is None or cls.__new__ is not object.__new__:
                raise ProtocolError("an instance of a class the task does not define")
            obj = object.__new__(cls)
        else:
            obj = _SHELLS[kind]()
        self.table.add(obj, kind, ref)
        self.new.append((ref, kind))
        return obj

    def fill(self, obj, kind, payload):
        if kind == "y":
            if type(payload) is not str:
                raise ProtocolError("a malformed bytearray")
            obj[:] = _b64(payload)
            return
        if type(payload) is not list:
            raise ProtocolError("a malformed container")
        if kind == "l":
            obj.extend(self.items(payload))
        elif kind == "s":
            values = self.items(payload)
            check_hashes(values)
            obj.update(values)
        elif kind == "q":
            obj.extend(self.items(payload[1:]))
        elif kind == "D":
            if not payload:
                raise ProtocolError("a malformed defaultdict")
            factory = self.item(payload[0])
            if factory is not None and not callable(factory):
                raise ProtocolError("a defaultdict factory that cannot be called")
            obj.default_factory = factory
            obj.update(self.pairs(payload[1:]))
        elif kind == "S":
            pairs = self.pairs(payload[1:])
            if any(type(k) is not str for k in pairs):
                raise ProtocolError("an attribute name that is not a str")
            set_instance_state(obj, pairs)
        else:
            obj.update(self.pairs(payload))

    def refill(self, obj, kind, payload):
        if kind == "l":
            if type(payload) is not list:
                raise ProtocolError("a malformed container")
            obj[:] = self.items(payload)
        elif kind == "y":
            obj[:] = b""
            self.fill(obj, kind, payload)
        elif kind == "q":
            if type(payload) is not list or not payload or payload[0] != obj.maxlen:
                raise ProtocolError("a deque that changed its maxlen")
            obj.clear()
            self.fill(obj, kind, payload)
        elif kind == "S":
            if type(payload) is not list or not payload or self.setup_classes.get(payload[0]) is not type(obj):
                raise ProtocolError("an instance that changed its class")
            set_instance_state(obj, {}, clear=True)
            self.fill(obj, kind, payload)
        else:
            obj.clear()
            self.fill(obj, kind, payload)

    def pairs(self, payload):
        if len(payload) % 2:
            raise ProtocolError("a mapping with a key and no value")
        values = self.items(payload)
        keys = values[0::2]
        check_hashes(keys)
        result = dict(zip(keys, values[1::2]))
        if len(result) != len(keys):
            raise ProtocolError("a mapping with a repeated key")
        return result

    def items(self, payload):
        if SIMPLE.issuperset(map(type, payload)):
            return payload
        item = self.item
        return [item(v) for v in payload]

    def item(self, v):
        t = type(v)
        if t is str or t is int or t is float or t is bool or v is None:
            return v
        if t is not dict or len(v) != 1:
            raise ProtocolError("a bare JSON value where an item belongs")
        ((tag, x),) = v.items()
        if tag == "r":
            return self.ref(x)
        value = self.value(tag, x)
        if value is _NOT_A_VALUE:
            return self.other(tag, x, self)
        return value

    def ref(self, ref):
        if type(ref) is not int:
            raise ProtocolError("a malformed ref")
        objects = self.table.objects
        if ref in objects:
            return objects[ref]
        if ref not in self.defs:
            raise ProtocolError("a ref this side does not hold")
        self.construct(ref)
        return objects[ref]

    def construct(self, root):
        """Build the immutable ``root`` and the immutables it holds, children first, without
        recursion (so a 1000-deep tuple costs no stack): each is built once all it holds is."""
        objects, defs, building = self.table.objects, self.defs, self.building
        stack = [root]
        building.add(root)
        while stack:
            ref = stack[-1]
            kind, payload = defs[ref]
            waiting = None
            if type(payload) is list and not SIMPLE.issuperset(map(type, payload)):
                for value in payload:
                    if type(value) is dict and len(value) == 1 and "r" in value:
                        child = value["r"]
                        if type(child) is int and child not in objects and child in defs:
                            if child in building:
                                raise ProtocolError("a cycle through an immutable value")
                            waiting = child
                            break
            if waiting is not None:
                if len(stack) >= MAX_DEPTH:
                    raise TooLarge(f"too_large: a value nested deeper than {MAX_DEPTH} levels")
                building.add(waiting)
                stack.append(waiting)
                continue
            stack.pop()
            building.discard(ref)
            obj = self.build(kind, payload)
            del defs[ref]
            self.table.add(obj, kind, ref)
            self.new.append((ref, kind))

    def build(self, kind, payload):
        if type(payload) is not list:
            raise ProtocolError("a malformed container")
        if kind == "t":
            return tuple(self.items(payload))
        if kind == "f":
            values = self.items(payload)
            check_hashes(values)
            return frozenset(values)
        if kind == "K":
            values = self.items(payload)
            check_hashes(values)
            return dict.fromkeys(values).keys()
        if kind == "V":
            return dict(enumerate(self.items(payload))).values()
        if kind == "I":
            return self.pairs(payload).items()
        if not payload or type(payload[0]) is not list:  # "N"
            raise ProtocolError("a malformed namedtuple")
        spec = payload[0]
        if len(spec) == 2 and spec[0] == "setup":
            cls = self.setup_classes.get(spec[1])
        elif len(spec) == 3 and spec[0] == "std":
            cls = resolve_std(spec[1], spec[2])
        else:
            cls = None
        if not (isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_make")):
            raise ProtocolError("a namedtuple of a class this side does not know")
        values = self.items(payload[1:])
        if len(values) != len(getattr(cls, "_fields", ())):
            raise ProtocolError("a namedtuple with the wrong number of fields")
        return tuple.__new__(cls, values)

    def value(self, tag, x):
        """The standard library's value types (and big ints, bytes)."""
        try:
            if tag == "i" and type(x) is str:
                return int(x, 16)
            if tag == "b" and type(x) is str:
                return _b64(x)
            if tag == "x" and _floats(x, 2):
                return complex(x[0], x[1])
            if tag == "dec" and type(x) is str and len(x) < 100000:
                return decimal.Decimal(x)
            if tag == "fr" and type(x) is list and len(x) == 2:
                n, d = self.item(x[0]), self.item(x[1])
                if type(n) is not int or type(d) is not int or d == 0:
                    raise ProtocolError("a malformed Fraction")
                return fractions.Fraction(n, d)
            if tag == "dt" and _ints(x[:7] if type(x) is list else None, 7) and len(x) == 9 and x[8] in (0, 1):
                return datetime.datetime(*x[:7], tzinfo=self.tz(x[7]), fold=x[8])
            if tag == "da" and _ints(x, 3):
                return datetime.date(*x)
            if tag == "tm" and _ints(x[:4] if type(x) is list else None, 4) and len(x) == 6 and x[5] in (0, 1):
                return datetime.time(*x[:4], tzinfo=self.tz(x[4]), fold=x[5])
            if tag == "td" and _ints(x, 3):
                return datetime.timedelta(days=x[0], seconds=x[1], microseconds=x[2])
            if tag == "tz":
                zone = self.tz(x)
                if zone is None:
                    raise ProtocolError("a malformed time zone")
                return zone
            if tag == "rg" and type(x) is list and len(x) == 3:
                start, stop, step = (self.item(v) for v in x)
                if type(start) is not int or type(stop) is not int or type(step) is not int or step == 0:
                    raise ProtocolError("a malformed range")
                return range(start, stop, step)
            if tag == "sl" and type(x) is list and len(x) == 3:
                return slice(*(self.item(v) for v in x))
            if tag == "el":
                return Ellipsis
            if tag == "pa" and type(x) is list and len(x) == 2 and type(x[0]) is bool and type(x[1]) is str:
                import pathlib

                return (pathlib.PosixPath if x[0] else pathlib.PurePosixPath)(x[1])
            if tag == "uu" and type(x) is str and len(x) == 32:
                import uuid

                return uuid.UUID(hex=x)
            if tag == "ty" and type(x) is str and x in BUILTIN_TYPES:
                return BUILTIN_TYPES[x]
            if tag == "en" and type(x) is list and len(x) == 3:
                cls = resolve_std_importing(x[0], x[1])
                enum = sys.modules.get("enum")
                if enum is None or not (isinstance(cls, type) and issubclass(cls, enum.Enum)) or type(x[2]) is not str:
                    raise ProtocolError("a member of an enum this side does not know")
                member = cls.__members__.get(x[2])
                if member is None:
                    raise ProtocolError("an enum member that does not exist")
                return member
        except (ValueError, TypeError, OverflowError, ArithmeticError) as exc:
            raise ProtocolError(f"a malformed {tag!r} value: {type(exc).__name__}") from None
        if tag in ("i", "b", "x", "dec", "fr", "dt", "da", "tm", "td", "rg", "sl", "ty", "en", "pa", "uu"):
            raise ProtocolError(f"a malformed {tag!r} value")
        return _NOT_A_VALUE

    def tz(self, x):
        if x is None:
            return None
        if type(x) is not list or len(x) != 4 or not _ints(x[:3], 3) or (x[3] is not None and type(x[3]) is not str):
            raise ProtocolError("a malformed time zone")
        offset = datetime.timedelta(days=x[0], seconds=x[1], microseconds=x[2])
        return datetime.timezone(offset) if x[3] is None else datetime.timezone(offset, x[3])


_NOT_A_VALUE = object()


def _ints(x, n):
    return type(x) is list and len(x) == n and all(type(v) is int for v in x)


def _floats(x, n):
    return type(x) is list and len(x) == n and all(type(v) in (int, float) for v in x)


def _b64(text):
    try:
        return binascii.a2b_base64(text.encode("ascii"), strict_mode=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise ProtocolError("malformed base64") from None


def check_hashes(keys):
    """Refuse a set or dict whose keys flood one hash value (building it would take quadratic
    time). Counting distinct hash values is linear: hash values are ints, which hash to
    themselves, so the set of them cannot be flooded."""
    if len(keys) > MAX_HASH_DUPLICATES:
        try:
            distinct = len(set(map(hash, keys)))
        except TypeError:
            raise ProtocolError("an unhashable key") from None
        if len(keys) - distinct > MAX_HASH_DUPLICATES:
            raise ProtocolError(f"hash flooding: {len(keys) - distinct} keys share hash values")
