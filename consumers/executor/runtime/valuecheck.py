"""The value check: one rule for what crosses from the candidate into the tests (:class:`ValueCheck`),
what the task's reference says of it (:class:`Rules`) and what a name the completion bound
wrongly is bound to instead (:class:`Refused`).

A module of the runtime (standard library only; in the sandbox it arrives in the runtime's
bundle, runtime/importer.py; on the host, an ordinary module). The judge's end of the boundary,
runtime/crossing.py :class:`Crossing`, is a ValueCheck: it checks every value it decodes.

**The one rule.** Every value the judge decodes from the candidate is checked at the *point* it
arrives: the test it arrived in and how the tests reached it (``3|Stack().pop()``: a call's
result; ``.x``: an attribute; ``#len``: an operator; ``[*]``: an item of an iterator; ``!``: an
exception and its arguments; ``<``: containers written back in place; ``>``: what the
completion passes to the tests' objects). The check is deep (nested containers, dict views, a
``defaultdict``'s factory, instances of the setup's classes and their attributes, exceptions'
arguments and attributes) and runs again whenever the candidate sends a container again. Where
the task's reference produced plain data at a point, the completion must too: one of its
objects there is ``type_mismatch``, fails the test, and is *tainted* (any later use of it fails
too). A completion object reaches the tests only where the reference itself produced one
(``Rules.objects``). Without a reference (``strict``), the completion's objects that the tests did
not build themselves reach them *opaque* (:meth:`ValueCheck.held_opaque`): they may be called, read,
printed, iterated, used in ``with`` and ``await``, never compared with plain data or with another
opaque object, handed the tests' values by an operator, ``in`` or a method a built-in value has,
or used as a number (:meth:`ValueCheck.opaque_use`, crossing.py :meth:`Crossing.opaque_compare`); the task may
declare ``returns_objects`` instead. A binary operator between a completion object and the tests'
plain value never answers with plain data. The
completion's generators and built-in iterators count as plain (their items are checked), as do
instances of its subclasses of value types (they compare, hash and print as their base value).

**Skips and stops belong to the tests.** ``unittest.SkipTest`` (and subclasses) or the framework's
internal stop raised by the completion fail the test instead of skipping it.
"""

import sys
import types

from rollstream.consumers.executor.runtime.codec import SIMPLE, instance_state
from rollstream.consumers.executor.runtime.proxies import (
    CANDIDATE_PARITY,
    JUDGE_PARITY,
    MirrorMeta,
    RemoteBase,
    RemoteIterator,
    TypeMismatch,
    current_crossing,
)

BINARY = frozenset({"add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "pow", "lshift", "rshift", "and",
                    "or", "xor", "divmod"})
BINARY = BINARY | {"r" + name for name in BINARY} | {"i" + name for name in BINARY if name != "divmod"}


class Rules:
    """What the task's reference says, sent with the job (``consumers/executor/reference.py``):

    * ``mode``: ``record`` (this is the reference: record what it produces), ``reference``
      (check against that record) or ``strict`` (no reference: the strictest reading);
    * ``objects``: the points where the reference produced completion objects;
    * ``names``: how the reference bound each name the tests read (``o``: an object of its own,
      ``p``: plain data, ``m``: a module); a name it did not bind is not bound;
    * ``skips``: per test, how many ``unittest`` tests the reference's run skipped (``-1``: the
      whole test); a completion that makes the tests skip more fails those;
    * ``returns_objects``: (strict) the task declares that its entry points return objects;
    * ``delegated``: the points where the reference's run had the candidate evaluate code from
      data (``eval`` of a string that is not a literal, a pickle of the completion's classes);
    * ``suppressed``: the points where the reference's ``__exit__`` swallowed an exception;
    * ``collected``: (pytest files) how many tests the reference's run collected from each file.
    """

    def __init__(self, spec=None):
        spec = spec if type(spec) is dict else {}
        mode = spec.get("mode")
        self.mode = mode if mode in ("record", "reference", "strict") else "strict"
        self.objects = frozenset(p for p in spec.get("objects", ()) if type(p) is str)
        names = spec.get("names")
        self.names = {k: v for k, v in names.items() if type(k) is str} if type(names) is dict else {}
        skips = spec.get("skips")
        self.skips = {k: v for k, v in skips.items() if type(v) is int} if type(skips) is dict else {}
        self.returns_objects = bool(spec.get("returns_objects", False))
        self.delegated = _points(spec.get("delegated"))
        self.suppressed = _points(spec.get("suppressed"))
        collected = spec.get("collected")  # pytest files: the tests the reference's run collected, per file
        self.collected = [n for n in collected if type(n) is int and n > 0] if type(collected) is list else []

    @property
    def record(self):
        return self.mode == "record"

    @property
    def strict(self):
        return self.mode == "strict"


def _points(listed):
    return frozenset(p for p in listed if type(p) is str) if type(listed) is list else frozenset()


class Refused:
    """What a name the tests read is bound to when the completion bound it to an object where
    the reference binds plain data: any use fails the test as ``type_mismatch``."""

    __slots__ = ("_why",)

    def __init__(self, why):
        object.__setattr__(self, "_why", why)

    def _fail(self, *args, **kwargs):
        crossing = current_crossing()
        why = object.__getattribute__(self, "_why")
        crossing.failed = crossing.failed or why
        raise TypeMismatch(why)

    def __getattr__(self, name):
        self._fail()

    def __repr__(self):
        return "<refused: a completion object where the task's reference has plain data>"


for _name in ("call", "eq", "ne", "lt", "le", "gt", "ge", "hash", "bool", "len", "iter", "contains", "getitem",
              "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "radd", "rsub", "rmul", "rtruediv",
              "abs", "neg", "float", "int", "index", "str", "format", "enter", "setattr"):
    setattr(Refused, f"__{_name}__", Refused._fail)


def control_classes():
    """The test framework's skip and stop exceptions (a completion's never skips a test)."""
    case = sys.modules.get("unittest.case")
    if case is None:
        return ()
    return tuple(c for c in (getattr(case, "SkipTest", None), getattr(case, "_ShouldStop", None))
                 if isinstance(c, type))


def is_object(x, t):
    """A completion object itself: a proxy (not a built-in iterator's), a mirror class or an
    instance of one (a mirror exception, or a value subclass: both also hold what is checked)."""
    if t is MirrorMeta:
        return True
    if isinstance(x, RemoteBase):
        return t is not RemoteIterator
    return type(t) is MirrorMeta and isinstance(x, BaseException)


def _children(x, t, setup):
    """What ``x`` holds, each with its step from ``x`` (None: nothing to look into)."""
    if type(t) is MirrorMeta:  # an instance of a mirror that is a value or an exception
        if isinstance(x, BaseException):
            return [*((a, f"!{i}") for i, a in enumerate(x.args)), *((v, f".{k}") for k, v in vars(x).items())]
        if isinstance(x, tuple):
            return [(v, _index(i)) for i, v in enumerate(tuple.__iter__(x))]
        if isinstance(x, frozenset):
            return [(v, "[*]") for v in frozenset.__iter__(x)]
        return None
    if isinstance(x, dict):
        found = []
        if not (SIMPLE.issuperset(map(type, x)) and SIMPLE.issuperset(map(type, x.values()))):
            found = [*((k, "{*key}") for k in x), *((v, _key(k)) for k, v in x.items())]
        factory = getattr(x, "default_factory", None)
        return found + ([(factory, ".default_factory")] if factory is not None else [])
    if isinstance(x, (list, tuple)) or t.__name__ == "deque":
        return [] if SIMPLE.issuperset(map(type, x)) else [(v, _index(i)) for i, v in enumerate(x)]
    if isinstance(x, (set, frozenset)) or t.__name__ in _ITERABLE_VALUES:
        return [] if SIMPLE.issuperset(map(type, x)) else [(v, "[*]") for v in x]
    if isinstance(x, BaseException):
        attributes = getattr(x, "__dict__", None)
        return [*((a, f"!{i}") for i, a in enumerate(x.args)),
                *(((v, f".{k}") for k, v in attributes.items()) if type(attributes) is dict else ())]
    if setup and isinstance(x, setup):
        return [(v, f".{k}") for k, v in instance_state(x).items()]
    if t is slice:
        return [(x.start, ":"), (x.stop, ":"), (x.step, ":")]
    return None


def _index(i):
    return f"[{i}]" if i < 64 else "[*]"


def _key(k):
    return "{" + repr(k)[:40] + "}" if type(k) in (str, int) else "{*}"


def _general(x, children):
    """``[*]`` (``{*}``) when every item (value) of the container ``x`` that is not None is a
    completion object: a list of the completion's nodes, of any length."""
    items = [child for child, label in children if label[:1] in "[{" and label != "{*key}"]
    if not items or not all(c is None or is_object(c, type(c)) for c in items):
        return None
    return "{*}" if isinstance(x, dict) else "[*]"


def _shadows(cls, name):
    """Whether an instance attribute ``name`` hides what ``cls`` defines: a method, a property or
    any other descriptor (a ``cached_property`` filled in by hand), never a slot or a plain value."""
    declared = getattr(cls, name, None)
    if declared is None or type(declared) is types.MemberDescriptorType:
        return False
    return callable(declared) or hasattr(type(declared), "__get__")


# (strict) what the tests may ask of an opaque object of the completion's (ValueCheck.opaque_use)
OPAQUE_OPS = frozenset({"repr", "str", "format", "bool", "len", "iter", "next", "reversed", "dir", "enter", "exit",
                        "await", "aiter", "anext", "getitem", "setitem", "delitem", "copy", "deepcopy"})
# methods a built-in value has: with arguments, asked of an opaque object, they would hand it the tests' values
PLAIN_METHODS = frozenset(name for t in (str, bytes, bytearray, list, tuple, dict, set, frozenset, int, float,
                                         complex, range, memoryview) for name in dir(t))

# dict views, deques and the like: values whose items cross with them
_ITERABLE_VALUES = frozenset({"dict_keys", "dict_values", "dict_items", "deque"})


class ValueCheck:
    """One job's value check: where each of the completion's objects arrived, which may not be used
    (tainted) or may be used only opaquely, and what the task's reference says (:class:`Rules`);
    with a reference's own run, what it produced there (the record)."""

    def __init__(self, table, rules):
        self.table = table
        self.rules = rules if isinstance(rules, Rules) else Rules(rules)
        self.setup_classes = ()
        self.paths = {}  # ref -> how the tests reached the object ("f()", "Stack().pop()")
        self.points = {}  # ref -> the point a container of the candidate's arrived at
        self.arrivals = {}  # ref -> every (point, path) a container of the candidate's arrived at itself
        self.recorded_steps = set()  # (record) "point@step": where in a value its objects arrived (handles_in)
        self.delegated = set()  # (record) points where the tests' code from data ran in the candidate
        self.suppressed = set()  # (record) points where the completion's __exit__ swallowed an exception
        self.tainted = set()  # refs of completion objects that arrived where they may not
        self.opaque = set()  # (strict) refs of completion objects the tests may not take for plain data
        self.test = "-"  # the current test's index, as points name it
        self.failed = None  # why a call of the current test failed

    def check(self, value, point, path, *, exception=False, constructed=None, receiver=None, lazy=False):
        """``value`` arrived at ``point``: completion objects in it only where the rules let them.
        ``lazy``: a value that is itself the one object refused is answered as :class:`Refused`,
        which fails the test when the test uses it (a fluent ``return self`` the test ignores is no
        failure); returned, for the caller to hand over instead."""
        t = type(value)
        if t in SIMPLE or t is bytes:
            return None
        steps, general = [], set()
        found = self.handles_in(value, point, path, exception=exception, steps=steps, general=general)
        if self.rules.strict and found and found[0] is value and (
                (constructed is not None and isinstance(value, constructed)) or value is receiver):
            found, steps = found[1:], steps[1:]  # (strict) a class's instance; a method's own receiver
        if self.rules.record:
            self.recorded_steps.update(f"{point}@{step}" for step in [*steps, *general])
            return
        if found and self.rules.strict and not self.rules.returns_objects:
            found = self.held_opaque(found)  # (strict) the completion's objects themselves pass, opaque
        if found and not self.allowed(point, steps):
            if self.rules.strict:
                why = (f"type_mismatch: {path} gave a completion object (the task has no reference: its calls "
                       "must give plain data unless it declares returns_objects)")
            else:
                why = f"type_mismatch: {path} gave a completion object where the task's reference gives plain data"
            if lazy and len(found) == 1 and found[0] is value:
                return Refused(why)  # (not tainted: where the tests hold it otherwise, it came there rightly)
            self.refuse(found, why)
        return None

    def held_opaque(self, found):
        """(strict) What ``found`` holds that may not reach the tests at all (a skip or stop class,
        a setup instance whose attribute shadows a method); the completion's objects themselves
        are let through as *opaque* (:meth:`opaque_use`): without a reference the judge cannot
        know whether the tests take them for plain data, so they may answer only what they could
        tell without hearing the tests' values."""
        refs, rest = self.table.refs, []
        for obj in found:
            ref = refs.get(id(obj))
            if ref is not None and ref % 2 == CANDIDATE_PARITY and (type(obj) is MirrorMeta or isinstance(obj, RemoteBase)
                                                                    or type(type(obj)) is MirrorMeta):
                self.opaque.add(ref)
            else:
                rest.append(obj)
        return rest

    def opaque_use(self, target, op, name, args):
        """(strict) Whether the tests may ``op`` (``name``, with ``args``) an opaque object of the
        completion's (:meth:`held_opaque`): calling it, reading and writing its attributes and
        items, its text, identity, hash, truth, length, iteration, ``with`` and ``await``, its
        methods (with arguments only where no built-in value type has a method of that name), and
        operators and comparisons with another of the completion's objects. Never what would hand
        it the tests' values to answer as plain data would (``x - expected``, ``expected in x``,
        ``x.startswith(expected)``) or make it stand in for a number (``int``, ``abs``,
        ``__index__``): that is ``type_mismatch``."""
        if op == "callm":
            if not args or name not in PLAIN_METHODS:
                return
        elif op == "op":
            if name in OPAQUE_OPS:
                return
            if name in BINARY or name in ("eq", "ne", "lt", "le", "gt", "ge"):
                other = args[0] if args else None
                if is_object(other, type(other)):
                    return
        else:
            return
        what = f".{name}(...)" if op == "callm" else name
        self.mismatch(f"type_mismatch: {self.paths.get(self.table.refs.get(id(target)), '?')} gave a completion "
                      f"object that the tests then used as plain data ({what}; the task has no reference: its "
                      "objects never hear the tests' values nor stand in for numbers)")

    def check_changes(self, changed, point, path):
        """Containers the candidate sent again (written back in place): checked again, at the
        point they first arrived at (the tests' own containers: at this request's)."""
        if not changed:
            return
        objects = self.table.objects
        for ref in changed:
            container = objects.get(ref)
            if ref % 2 == JUDGE_PARITY:  # the tests' own container: what was written into it arrived now
                self.check(container, point, path)
                continue
            # a container of the candidate's: at every point it arrived at (the tests may hold it from each)
            for where, how in sorted(self.arrivals.get(ref, ())) or [(self.points.get(ref, point),
                                                                          self.paths.get(ref, path))]:
                self.check(container, where, how)

    def delegating(self, what):
        """The tests are about to have the candidate run code from data (``what``: eval, exec,
        loads): recorded for the reference, refused where the reference did not."""
        point = f"{self.test}|<{what}>"
        if self.rules.record:
            self.delegated.add(point)
        elif self.rules.mode == "reference" and point not in self.rules.delegated:
            self.mismatch(f"type_mismatch: the tests would {what} code the completion made where the task's "
                          "reference gives plain data")

    def allowed(self, point, steps):
        """Whether completion objects may arrive at ``point`` where ``steps`` say: where the
        reference's own arrived (position by position: ``[1]`` of a tuple, ``{'key'}``, or any item
        of a container whose every item was one of the reference's objects)."""
        rules = self.rules
        if rules.mode == "reference":
            objects = rules.objects
            return all(f"{point}@{step}" in objects
                       or (step[:1] == "[" and f"{point}@[*]" in objects)
                       or (step[:1] == "{" and step != "{*key}" and f"{point}@{{*}}" in objects)
                       for step in steps)
        return rules.returns_objects

    def refuse(self, found, why):
        for obj in found:
            ref = self.table.refs.get(id(obj))
            if ref is not None:
                self.tainted.add(ref)
        self.mismatch(why)

    def mismatch(self, why):
        self.failed = self.failed or why[:300]
        raise TypeMismatch(why[:300])

    def handles_in(self, value, point, path, exception=False, steps=None, general=None):
        """The completion's objects in ``value``, deeply (each given its path and point if it
        has none: the value's own, or ``[]`` after it for what it holds). ``steps`` (a list) gets,
        for each, where in ``value`` it lies: ``""`` (the value itself) or the first step into it
        (``[1]``, ``{'key'}``, ``.attribute``, ``!0`` for an exception's argument); ``general`` (a
        set) gets ``[*]`` / ``{*}`` when every item of the value that is not None is a completion
        object."""
        found, steps = [], [] if steps is None else steps  # steps[i]: where found[i] lies
        refs, paths, points = self.table.refs, self.paths, self.points
        control = control_classes()
        setup = self.setup_classes
        nested = path + "[]"
        stack, seen = [(value, "")], set()
        while stack:
            x, step = stack.pop()
            t = type(x)
            if t in SIMPLE or t is bytes:
                continue
            key = id(x)
            if key in seen:
                continue
            seen.add(key)
            root = x is value
            ref = refs.get(key)
            if ref is not None:
                paths.setdefault(ref, path if root else nested)
                points.setdefault(ref, point)
                if root and ref % 2 != JUDGE_PARITY and point:
                    self.arrivals.setdefault(ref, set()).add((point, path))
            if is_object(x, t):
                found.append(x)
                steps.append(step)
                if t is MirrorMeta or isinstance(x, RemoteBase):
                    continue
            children = _children(x, t, setup)
            if children is None:
                if isinstance(x, type) and control and issubclass(x, control):
                    found.append(x)
                    steps.append(step)
                continue
            if t is not MirrorMeta and type(t) is MirrorMeta and isinstance(x, BaseException) and exception and root \
                    and not (control and isinstance(x, control)):
                found.pop()  # the exception raised is the point's own (checked as an exception)
                steps.pop()
            elif control and isinstance(x, BaseException) and isinstance(x, control) and not is_object(x, t):
                found.append(x)
                steps.append(step)
            if setup and isinstance(x, setup) and any(_shadows(t, name) for name in instance_state(x) if type(name) is str):
                found.append(x)  # an instance attribute shadowing one of the class's methods or properties
                steps.append(step)
            widest = _general(x, children) if root and general is not None else None
            if widest:
                general.add(widest)
            stack.extend((child, label if root else step) for child, label in children)
        return found
