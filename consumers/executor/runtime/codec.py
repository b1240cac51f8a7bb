"""Values between a sandbox job's judge and its candidate: the codec's model, shared by both ends.

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

The codec is four modules: this one (the limits, the errors, the container kinds and the
:class:`Table`, the standard library's names, a setup instance's state, and the small helpers
both sides share), runtime/encoder.py (:class:`Encoder`: a message's items, definitions and
changes), runtime/decoder.py (:class:`Decoder`: the receiving end, which accepts exactly what
the encoder writes) and runtime/wire.py (a message as JSON bytes, and its framing on a pipe).
Each of the other three imports this one, and none imports another.
"""

import collections
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
SIMPLE = frozenset({int, str, float, bool, type(None)})


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


# ---------------------------------------------------------------- a container's contents

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


def plain_instance(x, t):
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


# ---------------------------------------------------------------- the standard library's names

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


# ---------------------------------------------------------------- what both sides share

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
