"""Values between a sandbox job's judge and its candidate: an identity-keeping codec and framing.

A module of the runtime: in the sandbox it arrives in the runtime's bundle (runtime/importer.py)
and is imported as on the host; standard library only. On the host
it is an ordinary module, unit-tested there.

Python passes references; two processes cannot. Each side keeps a :class:`Table` of every
object that has crossed, under a *ref* (the judge numbers its objects even, the candidate odd):

* **containers** (list, tuple, dict, set, frozenset, bytearray, deque, OrderedDict, Counter,
  defaultdict, instances of the task's own ``setup`` classes) are *replicated*: the receiver
  builds its own copy once and from then on the ref names that copy, so ``f(a) is a``,
  aliasing inside a value, cycles and shared children keep their meaning. A replicated
  mutable container changed by either side is sent again (its new contents, in place) with
  the next message that side sends, whatever it is about: in-place changes, changes made
  before an exception and changes to objects the other side keeps all reach the other side
  before it runs again (the two never run at once);
* **scalars and the standard library's value types** (int of any size, float, complex, str,
  bytes, Decimal, Fraction, datetime/date/time/timedelta/timezone, range, slice, standard
  Enum members and namedtuples, ``pathlib`` paths, ``uuid.UUID``) cross as themselves;
* **anything else** crosses as a *handle*: the receiver holds a proxy whose every use is a
  request to the owner (runtime/proxies.py).

A message is one JSON array: the top-level items are shallow (a container is always ``{"r":
ref}``), new containers travel as a flat list of definitions ``[ref, kind, payload]`` and
changed ones as ``[ref, payload]``, so no value is ever nested in the encoding (deep or cyclic
data costs no recursion). The decoder accepts exactly what the encoder writes: a bare JSON
array or object where an item belongs, an unknown tag, a ref it does not hold, a new ref of the
wrong parity or one it already holds, more than ``MAX_MESSAGE_BYTES``, or a set or dict whose keys flood one hash value is a
:class:`ProtocolError` (tamper, when the candidate sent it). Nothing here evaluates, unpickles
or imports what the other side sent: tags name constructors of the standard library that only
build values; a class named by module and name is looked up only among modules already
imported, through their ``__dict__`` (no module ``__getattr__`` runs).
"""

import binascii
import collections
import datetime
import decimal
import fractions
import json
import os
import sys
from operator import is_not

# The limits are the same for every type, counted in bytes and levels that honest programs do
# not reach (a list of 4 million small ints is ~16 MB; a 1000-deep tuple is ~20 KB). A value
# beyond them fails its test as ``too_large`` (TooLarge), never as an attack.
MAX_MESSAGE_BYTES = 64 << 20  # one framed message
MAX_DEPTH = 10_000  # containers nested in one value (hashing a tuple recurses in C, unguarded)
MAX_OBJECTS = 1 << 22  # containers and handles one job's table may hold
MAX_HASH_DUPLICATES = 64  # keys of one set/dict sharing a hash value beyond this: hash flooding
JSON_INT_BITS = 1024  # larger ints travel as hex (linear to parse; decimal is quadratic and capped)
_LEN = 4  # frame header: big-endian length
SIMPLE = frozenset({int, str, float, bool, type(None)})
INTS = frozenset({int, bool})
BIG = 1 << JSON_INT_BITS


# Modules neither side imports for the other, whoever asks (work on import, or a __main__).
NEVER_IMPORT = frozenset({"antigravity", "this", "__hello__", "__phello__", "idlelib", "turtledemo",
                          "tkinter", "turtle", "ensurepip", "venv", "pydoc", "webbrowser"})


def import_std(name):
    """The standard-library module ``name``, imported when this side has not yet; None when it is
    no such module, one of ``NEVER_IMPORT``, a ``__main__`` (the judge's is the tests' namespace)
    or does not import."""
    top = name.partition(".")[0] if type(name) is str else None
    if top not in sys.stdlib_module_names or top in NEVER_IMPORT or "__main__" in name.split("."):
        return None
    found = sys.modules.get(name)
    if found is None:
        try:
            __import__(name)
        except BaseException:
            return None
        found = sys.modules.get(name)
    return found if type(found) is type(sys) else None


def resolve_std_importing(module, qualname):
    """:func:`resolve_std`, importing the standard-library module first when this side has not
    (the other side's ``HTTPStatus.OK`` when only it imported ``http``): :func:`import_std`."""
    found = resolve_std(module, qualname)
    if found is None and import_std(module) is not None:
        found = resolve_std(module, qualname)
    return found


class NotTransferable(Exception):
    """A value that cannot cross (too large, a cycle through a tuple): the call fails, honestly."""


class TooLarge(NotTransferable):
    """A value over the size or depth limits: its test fails as ``too_large``."""


class ProtocolError(Exception):
    """A message honest code never sends (tamper, when the candidate sent it)."""


# Container kinds. Mutable ones are re-sent when they change.
MUTABLE = {list: "l", dict: "d", set: "s", bytearray: "y", collections.deque: "q",
           collections.OrderedDict: "o", collections.Counter: "c", collections.defaultdict: "D"}
IMMUTABLE = {tuple: "t", frozenset: "f"}
KINDS = {**MUTABLE, **IMMUTABLE}
MUTABLE_KINDS = frozenset("ldsyqocDS")
IMMUTABLE_KINDS = frozenset("tfNKVI")
DICT_KINDS = frozenset("docDS")
_SHELLS = {"l": list, "d": dict, "s": set, "y": bytearray, "o": collections.OrderedDict,
           "c": collections.Counter}
_VIEWS = {type({}.keys()): "K", type({}.values()): "V", type({}.items()): "I"}
# Builtin types that cross by name (a type is a value: ``defaultdict(int)``, ``f() is int``).
BUILTIN_TYPES = {t.__name__: t for t in (int, float, complex, str, bytes, bytearray, bool, list,
                                         tuple, dict, set, frozenset, object, range, slice, type)}
BUILTIN_TYPES["NoneType"] = type(None)


class Table:
    """The objects of one job that have crossed, both ways, under their refs."""

    __slots__ = ("objects", "refs", "kinds", "shadows", "next", "parity", "mutables")

    def __init__(self, parity):
        self.objects = {}  # ref -> object (kept alive: an id is never reused while it is here)
        self.refs = {}  # id(object) -> ref
        self.kinds = {}  # ref -> container kind (replicated containers only)
        self.shadows = {}  # ref -> snapshot of a mutable container as the other side last saw it
        self.mutables = []  # refs of mutable containers, in the order they crossed
        self.next = parity
        self.parity = parity

    def add(self, obj, kind=None, ref=None):
        if ref is None:
            ref = self.next
            self.next += 2
        if len(self.objects) >= MAX_OBJECTS:
            raise TooLarge(f"too_large: more than {MAX_OBJECTS} objects crossed in one job")
        self.objects[ref] = obj
        self.refs[id(obj)] = ref
        if kind is not None:
            self.kinds[ref] = kind
            if kind in MUTABLE_KINDS:
                self.mutables.append(ref)
        return ref

    def forget(self, ref):
        """Undo :meth:`add` (a message that could not be sent)."""
        obj = self.objects.pop(ref, None)
        self.refs.pop(id(obj), None)
        if self.kinds.pop(ref, None) in MUTABLE_KINDS:
            self.mutables.remove(ref)
        self.shadows.pop(ref, None)

    def snapshot(self, ref):
        self.shadows[ref] = _snapshot(self.kinds[ref], self.objects[ref])

    def changed(self):
        """Refs of mutable containers that changed since the other side last saw them."""
        shadows, objects, kinds = self.shadows, self.objects, self.kinds
        return [ref for ref in self.mutables if _differs(kinds[ref], objects[ref], shadows.get(ref))]


def _snapshot(kind, obj):
    """What a mutable container holds, by identity (the elements are kept alive, so their ids
    stay theirs)."""
    if type(obj) not in KINDS and kind != "S":
        obj = base_view(kind, obj)
    if kind == "y":
        return bytes(obj)
    if kind == "l" or kind == "q":
        return list(obj)
    if kind == "s":
        return (list(obj), frozenset(map(id, obj)))
    if kind == "S":
        obj = instance_state(obj)
    keys = list(obj)
    return (keys, list(obj.values()), obj.default_factory if kind == "D" else None)


def _differs(kind, obj, shadow):
    if shadow is None:
        return True
    if type(obj) not in KINDS and kind != "S":
        obj = base_view(kind, obj)
    if kind == "y":
        return obj != shadow
    if kind == "l" or kind == "q":
        return len(obj) != len(shadow) or any(map(is_not, obj, shadow))
    if kind == "s":
        return len(obj) != len(shadow[1]) or frozenset(map(id, obj)) != shadow[1]
    if kind == "S":
        obj_dict = instance_state(obj)
        keys, values, _ = shadow
        return (len(obj_dict) != len(keys) or any(map(is_not, obj_dict, keys))
                or any(map(is_not, obj_dict.values(), values)))
    keys, values, factory = shadow
    return (len(obj) != len(keys) or any(map(is_not, obj, keys)) or any(map(is_not, obj.values(), values))
            or (kind == "D" and obj.default_factory is not factory))


# ---------------------------------------------------------------- encoding

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
            if _plain_instance(x, t):
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


def base_view(kind, x):
    """What a subclass of a container holds, read with the container's own methods (never the
    subclass's ``__iter__``, ``items`` or ``keys``): it crosses as that container."""
    if kind == "l":
        return list.copy(x)
    if kind == "d":
        return dict.copy(x)
    if kind == "s":
        return set.copy(x)
    if kind == "y":
        return bytearray(memoryview(x))
    if kind == "q":
        return collections.deque(collections.deque.__iter__(x), collections.deque.maxlen.__get__(x))
    if kind == "o":
        return collections.OrderedDict(collections.OrderedDict.items(x))
    if kind == "c":
        return collections.Counter(dict.copy(x))
    if kind == "D":
        return collections.defaultdict(collections.defaultdict.default_factory.__get__(x), dict.copy(x))
    return x


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


def _plain_instance(x, t):
    """An instance of a task class whose whole state is its ``__dict__`` and its slots (replicable)."""
    if t.__new__ is not object.__new__:
        return False
    slots = _slots(t)
    return slots is not None and (type(getattr(x, "__dict__", None)) is dict or (bool(slots) and not hasattr(x, "__dict__")))


_SLOTS = {}


def _slots(cls):
    """The slot descriptors of ``cls``'s classes, by name (None: slots that are not plain names)."""
    found = _SLOTS.get(cls)
    if found is None and cls not in _SLOTS:
        found = {}
        for klass in cls.__mro__:
            names = klass.__dict__.get("__slots__", ())
            for name in ([names] if type(names) is str else names):
                if type(name) is not str:
                    found = None
                    break
                if name in ("__dict__", "__weakref__"):
                    continue
                descriptor = klass.__dict__.get(name)
                if type(descriptor).__name__ != "member_descriptor":
                    found = None
                    break
                found.setdefault(name, descriptor)
            if found is None:
                break
        _SLOTS[cls] = found
    return found


def instance_state(x):
    """A setup instance's attributes: its ``__dict__`` itself, or (with slots) a dict of them."""
    slots = _slots(type(x))
    attributes = getattr(x, "__dict__", None)
    if not slots and type(attributes) is dict:
        return attributes
    state = dict(attributes) if type(attributes) is dict else {}
    for name, descriptor in (slots or {}).items():
        try:
            state[name] = descriptor.__get__(x, type(x))
        except AttributeError:
            continue
    return state


def set_instance_state(x, pairs, clear=False):
    slots = _slots(type(x)) or {}
    attributes = getattr(x, "__dict__", None)
    if clear:
        if type(attributes) is dict:
            attributes.clear()
        for descriptor in slots.values():
            try:
                descriptor.__delete__(x)
            except AttributeError:
                continue
    for name, value in pairs.items():
        descriptor = slots.get(name)
        if descriptor is not None:
            descriptor.__set__(x, value)
        elif type(attributes) is dict:
            attributes[name] = value
        else:
            raise ProtocolError("an attribute the instance has no place for")


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


def std_name(cls):
    """(module, qualname) of a standard-library class or function that resolves back to ``cls``
    among modules already imported, else None."""
    module = getattr(cls, "__module__", None)
    qualname = getattr(cls, "__qualname__", None)
    if type(module) is not str or type(qualname) is not str or "<" in qualname:
        return None
    top = module.partition(".")[0]
    if top not in sys.stdlib_module_names:
        return None
    return (module, qualname) if resolve_std(module, qualname) is cls else None


def resolve_std(module, qualname):
    """The object ``module.qualname`` among modules already imported (never imports, never runs a
    module's ``__getattr__``); None when there is none."""
    if type(module) is not str or type(qualname) is not str:
        return None
    if module.partition(".")[0] not in sys.stdlib_module_names:
        return None
    found = sys.modules.get(module)
    if found is None:
        return None
    for part in qualname.split("."):
        namespace = getattr(found, "__dict__", None)
        if type(namespace) is not dict and type(namespace).__name__ != "mappingproxy":
            return None
        found = namespace.get(part)
        if found is None:
            return None
    return found


# ---------------------------------------------------------------- decoding

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


# ---------------------------------------------------------------- messages and framing

def _not_json(value):
    raise TypeError(f"{type(value).__name__} is not JSON")


# json's C encoder, made once: json.dumps with any non-default argument builds an encoder per
# call, and in a forked child that machinery alone copies dozens of pages.
_JSON = json.encoder.c_make_encoder(None, _not_json, json.encoder.encode_basestring, None, ":", ",",
                                    False, False, True)


def dumps(message):
    """One message as JSON bytes (NaN and infinities as Python's json writes them)."""
    data = "".join(_JSON(message, 0)).encode("utf-8", "surrogatepass")
    if len(data) > MAX_MESSAGE_BYTES:
        raise TooLarge(f"too_large: a message of {len(data)} bytes (at most {MAX_MESSAGE_BYTES})")
    return data


_JSON_DECODE = json.JSONDecoder().decode


def loads(data):
    """A message from JSON bytes; ProtocolError for anything that is not one."""
    try:
        message = _JSON_DECODE(data.decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError, MemoryError) as exc:
        raise ProtocolError(f"an undecodable message: {type(exc).__name__}") from None
    if type(message) is not list or not message:
        raise ProtocolError("a message that is not a list")
    return message


def frame(data):
    return len(data).to_bytes(_LEN, "big") + data


def send_bytes(fd, data):
    view = memoryview(frame(data))
    while view:
        view = view[os.write(fd, view):]


def receive(fd, limit=MAX_MESSAGE_BYTES):
    """One frame's bytes; None at a clean EOF before a frame; ProtocolError on a torn or
    oversized frame."""
    head = _read_exact(fd, _LEN)
    if head is None:
        return None
    size = int.from_bytes(head, "big")
    if size > limit:
        raise ProtocolError(f"a message of {size} bytes (at most {limit})")
    body = _read_exact(fd, size)
    if body is None:
        raise ProtocolError("the connection closed inside a message")
    return body


def _read_exact(fd, n):
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            if got:
                raise ProtocolError("the connection closed inside a message")
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def environ_text(data=None):
    """The process's environment (or ``data``, a copy of ``os.environ._data``) as one string
    (``key NUL value NUL ...``; NUL is in no key or value); None when ``os.environ`` is not the
    real mapping (a test's ``mock.patch`` of it crosses as a patch)."""
    environ = os.environ
    if type(environ) is not os._Environ:
        return None
    if data is None:
        return "\0".join(f"{k}\0{v}" for k, v in environ.items())
    decode = environ.decodevalue
    return "\0".join(f"{decode(k)}\0{decode(v)}" for k, v in data.items())


def environ_apply(before, after):
    """Make ``os.environ`` differ from ``before`` as ``after`` does (both :func:`environ_text`s):
    only the keys the other side changed move, so the process's own changes stay."""
    if type(os.environ) is not os._Environ:
        return
    old, new = _environ_pairs(before), _environ_pairs(after)
    for key in old.keys() | new.keys():
        value = new.get(key)
        if value == old.get(key):
            continue
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _environ_pairs(text):
    parts = text.split("\0") if text else []
    return dict(zip(parts[::2], parts[1::2]))


def setup_classes_of(namespace):
    """The classes the task's setup itself defined in ``namespace`` (name -> class): those it only
    imported (``from typing import *`` binds ``Any``, ``Text = str``; ``from collections import
    deque``) keep their own meaning. Both sides compute it the same way from the same setup."""
    module = namespace.get("__name__")
    return {k: v for k, v in namespace.items()
            if isinstance(v, type) and type(k) is str and not k.startswith("__") and v.__module__ == module}


def run_setup(setup, namespace):
    """Run the task's ``setup`` (a code object, or its compile error as text, or None) in
    ``namespace``: None, or the exception it raised."""
    if setup is None:
        return None
    try:
        if isinstance(setup, str):
            raise SyntaxError(setup)
        exec(setup, namespace)
    except BaseException as exc:
        return exc
    return None


def clip_text(exc, limit):
    try:
        return str(exc)[:limit]
    except BaseException:  # a hostile __str__
        return "<unprintable>"
