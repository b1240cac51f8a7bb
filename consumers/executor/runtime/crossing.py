"""The judge's end of the boundary: one rule for what crosses from the candidate into the tests,
and what the candidate may do to the tests' own objects.

A module of the runtime (standard library only; in the sandbox it arrives in the runtime's
bundle, runtime/importer.py; on the host, an ordinary module). The judge process holds one :class:`Judge`.

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
not build themselves reach them *opaque* (:meth:`Judge.held_opaque`): they may be called, read,
printed, iterated, used in ``with`` and ``await``, never compared with plain data or with another
opaque object, handed the tests' values by an operator, ``in`` or a method a built-in value has,
or used as a number (:meth:`Judge.opaque_use`, :meth:`Judge.opaque_compare`); the task may
declare ``returns_objects`` instead. A binary operator between a completion object and the tests'
plain value never answers with plain data. The
completion's generators and built-in iterators count as plain (their items are checked), as do
instances of its subclasses of value types (they compare, hash and print as their base value).

**The tests' objects are the tests'.** The candidate may call what the tests hand over (a mock
records the call) and read its data; it may not set attributes on it (but plain data attributes
of the setup's own instances), use a mock's own API (``assert_*``, ``reset_mock``,
``configure_mock``, ``return_value``, ``call_count``, ...), or touch the test framework's objects
(``TestCase``, results, runners, suites). A refused operation fails the test and is ``tamper``.

**Skips and stops belong to the tests.** ``unittest.SkipTest`` (and subclasses) or the framework's
internal stop raised by the completion fail the test instead of skipping it.
"""

import sys
import types

from rollstream.consumers.executor.runtime.channel import Channel, LinkDown, items
from rollstream.consumers.executor.runtime.codec import (
    SIMPLE,
    NotTransferable,
    ProtocolError,
    Table,
    TooLarge,
    clip_text,
    instance_state,
    resolve_std,
    std_name,
)
from rollstream.consumers.executor.runtime.proxies import (
    CALLABLE_ATTRIBUTE,
    CANDIDATE_PARITY,
    JUDGE_PARITY,
    STD_VALUE_CLASSES,
    CandidateGone,
    FailedCall,
    Inherited,
    Method,
    MirrorMeta,
    Remote,
    RemoteBase,
    RemoteIterator,
    TypeMismatch,
    current_judge,
    exception_item,
    exception_value,
    flat_kwargs,
    make_mirror,
    new_exception,
    raises,
    value_base,
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
        judge = current_judge()
        why = object.__getattribute__(self, "_why")
        judge.failed = judge.failed or why
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


def _framework_classes():
    """The test framework's own objects: never the completion's to use."""
    found = [raises]
    for module, names in (("unittest.case", ("TestCase", "_Outcome", "_AssertRaisesBaseContext")),
                          ("unittest.result", ("TestResult",)), ("unittest.suite", ("BaseTestSuite",)),
                          ("unittest.runner", ("TextTestRunner",)), ("unittest.loader", ("TestLoader",)),
                          ("unittest.main", ("TestProgram",))):
        found += [c for c in (getattr(sys.modules.get(module), n, None) for n in names) if isinstance(c, type)]
    return tuple(found)


_MOCK_API = {}


def _mock_api():
    """(mock classes, the public names of their own API) when ``unittest.mock`` is loaded."""
    mock = sys.modules.get("unittest.mock")
    if mock is None:
        return None, frozenset()
    found = _MOCK_API.get(id(mock))
    if found is None:
        classes = tuple(c for c in (getattr(mock, n, None) for n in ("NonCallableMock", "CallableMixin",
                                                                          "NonCallableMagicMock", "MagicMixin",
                                                                          "AsyncMockMixin", "AsyncMagicMixin"))
                        if isinstance(c, type))
        names = frozenset(n for c in classes for n in vars(c) if not n.startswith("_"))
        found = _MOCK_API[id(mock)] = (getattr(mock, "NonCallableMock", None), names)
    return found


def _is_object(x, t):
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
    if not items or not all(c is None or _is_object(c, type(c)) for c in items):
        return None
    return "{*}" if isinstance(x, dict) else "[*]"


def _shadows(cls, name):
    """Whether an instance attribute ``name`` hides what ``cls`` defines: a method, a property or
    any other descriptor (a ``cached_property`` filled in by hand), never a slot or a plain value."""
    declared = getattr(cls, name, None)
    if declared is None or type(declared) is types.MemberDescriptorType:
        return False
    return callable(declared) or hasattr(type(declared), "__get__")


def _autospec(target, mock):
    """A function ``mock.create_autospec`` made (``patch(..., autospec=True)``): a real function
    that carries its mock's API (``reset_mock``, ``assert_*``, ``mock_calls``) as attributes."""
    attributes = getattr(target, "__dict__", None) if isinstance(target, types.FunctionType) else None
    return type(attributes) is dict and isinstance(attributes.get("mock"), mock)


class Judge:
    """One job's judge: the channel to the candidate, the objects that crossed, where each
    arrived, and what the task's reference says (:class:`Rules`)."""

    def __init__(self, read_fd, write_fd, *, rules=None):
        self.table = Table(JUDGE_PARITY)
        self.setup_objects = {}
        self.setup_names = {}  # id(setup function or class) -> its name (they cross by name)
        self.setup_classes = ()
        self.channel = Channel(read_fd, write_fd, self.table, CANDIDATE_PARITY, self.encode_other,
                               self.decode_other, serve=self.serve, random_ids=True)
        self.channel.on_receive = self.printed
        self.rules = rules if isinstance(rules, Rules) else Rules(rules)
        self.hashes = {}  # ref -> the candidate's hash of a handle (None: unhashable)
        self.texts = {}  # ref -> str() of a candidate exception
        self.paths = {}  # ref -> how the tests reached the object ("f()", "Stack().pop()")
        self.points = {}  # ref -> the point a container of the candidate's arrived at
        self.arrivals = {}  # ref -> every (point, path) a container of the candidate's arrived at itself
        self.methods = {}  # mirror class -> names of its methods (no request until called)
        self.modules = {}  # ref -> the name of a module the candidate holds
        self.std_objects = {}  # ref -> (module, qualname) of a standard-library object the candidate holds
        self.recorded_steps = set()  # (record) "point@step": where in a value its objects arrived (handles_in)
        self.bound = {}  # (record) name -> how the reference bound it
        self.skips = {}  # (record) test index -> unittest tests it skipped (-1: the whole test)
        self.delegated = set()  # (record) points where the tests' code from data ran in the candidate
        self.suppressed = set()  # (record) points where the completion's __exit__ swallowed an exception
        self.tainted = set()  # refs of completion objects that arrived where they may not
        self.opaque = set()  # (strict) refs of completion objects the tests may not take for plain data
        self.test = "-"  # the current test's index, as points name it
        self.stack = []  # (point, path) of the requests waiting for an answer
        self.decoding = False
        self.gone = None  # why the candidate can no longer answer
        self.tamper = None  # (kind, detail) of the first attack seen
        self.failed = None  # why a call of the current test failed
        self.candidate_errors = set()  # ids of exceptions raised on the candidate's behalf
        self.kept_errors = []  # ... kept alive for the job, so that no other object takes their ids
        self.named = {}  # (strict) ref of a completion object -> the exception classes the tests' call that made it named
        self.tests_classes = set()  # the tests' classes derived from the completion's (subclassed)
        self.forwarded = set()  # ids of the functions of those classes, which the candidate's copies call
        self.made = None  # (during subclassed) the mirror classes the candidate's answer made
        self.env = None  # the overrides for the candidate (Guards)
        self.extras = None  # what the candidate's replies carry besides the answer (Guards)

    def set_setup(self, objects, classes):
        """What the task's setup bound: the instances of the classes it defined (``classes``) are
        replicated, its functions and classes cross by name (the candidate ran the same setup)."""
        self.setup_objects = objects
        self.setup_names = {id(v): k for k, v in objects.items() if isinstance(v, (type, types.FunctionType))}
        self.setup_classes = tuple(classes.values())
        self.channel.setup_ids = {id(v): k for k, v in classes.items()}
        self.channel.setup_classes = classes

    # ------------------------------------------------------------ requests to the candidate

    def ask(self, op, target, rest=(), suffix="", env=True, iterating=False, constructing=False):
        with self.channel.lock:  # the tests' threads may all use the completion's objects: one request at a time
            return self._ask(op, target, rest, suffix, env, iterating, constructing)

    def _ask(self, op, target, rest, suffix, env, iterating, constructing):
        if self.gone is not None:
            self.fail(self.gone)
        if target is not None:
            ref = self.table.refs.get(id(target))
            if ref in self.tainted:
                self.mismatch("type_mismatch: the test used a completion object that arrived where the task's "
                              "reference has plain data")
            path = self.paths.get(ref, "?") + suffix
        else:
            path = f"<{op}>"
        point = f"{self.test}|{path}"
        self.decoding = True
        self.stack.append((point, path))
        try:
            message = self.channel.call(op, [target, items(rest)] if target is not None else [items(rest)],
                                        self.env() if env and self.env is not None else None)
        except TooLarge as exc:
            why = str(exc)
            self.failed = self.failed or (why if why.startswith("too_large") else f"too_large: {why}")[:300]
            raise FailedCall(self.failed) from None
        except NotTransferable as exc:
            raise TypeError(f"cannot pass this to the completion: {exc}") from None
        except ProtocolError as exc:
            self.set_tamper("protocol", exc)
            self.fail(self.gone)
        except (LinkDown, OSError) as exc:
            self.gone = self.gone or getattr(exc, "reason", "the candidate is gone")
            self.fail(self.gone)
        finally:
            self.stack.pop()
            self.decoding = False
        value = self.answer(message, point, path, iterating, target if constructing else None, target)
        if op == "eval" and rest and rest[0] == "eval" and self.rules.strict and not self.rules.returns_objects \
                and not self.handles_in(value, point, path):
            self.mismatch("type_mismatch: code the completion made, evaluated in its process, gave plain data (the "
                          "task has no reference: such code may only give the completion's objects, as "
                          "eval(repr(obj)) does; plain data is the judge's to compute)")
        return value

    def answer(self, message, point, path, iterating, constructed, receiver=None):
        status, values = message.what, message.items
        self.check_changes(message.changed, point + "<", path + "<")
        if message.extras is not None and self.extras is not None:
            try:
                self.extras(message.extras)
            except ProtocolError as exc:
                self.set_tamper("protocol", exc)
                self.fail(self.gone)
        if status == "ok" and len(values) == 1:
            value = values[0]
            refused = self.check(value, point, path, constructed=constructed, receiver=receiver, lazy=True)
            return value if refused is None else refused
        if status == "m":
            return CALLABLE_ATTRIBUTE
        if status == "exc" and len(values) == 1 and isinstance(values[0], BaseException):
            error = values[0]
            if isinstance(error, FailedCall):
                self.set_tamper("protocol", "a FailedCall from the candidate")
                self.fail(self.gone)
            control = control_classes()
            if control and isinstance(error, control):
                self.failed = self.failed or (f"the completion raised {type(error).__name__}: a test the completion "
                                              "skipped or stopped never passes")
                raise FailedCall(self.failed)
            self.check(error, point + "!", path + "!", exception=True)
            if isinstance(error, (StopIteration, StopAsyncIteration)) and not iterating:
                wrapped = RuntimeError(f"the completion raised {type(error).__name__}")  # PEP 479
                wrapped.__cause__ = error
                error = wrapped
            self.candidate_errors.add(id(error))
            self.kept_errors.append(error)  # the id stays this error's for the whole job
            raise error
        if status == "fail" and len(values) == 1 and type(values[0]) is str:
            if values[0].startswith("too_large"):
                self.failed = self.failed or values[0][:300]
                raise FailedCall(self.failed)
            self.fail(f"the call failed: {values[0][:300]}")
        self.set_tamper("protocol", "a malformed reply")
        self.fail(self.gone)

    # ------------------------------------------------------------ the one rule

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
                if _is_object(other, type(other)):
                    return
        else:
            return
        what = f".{name}(...)" if op == "callm" else name
        self.mismatch(f"type_mismatch: {self.paths.get(self.table.refs.get(id(target)), '?')} gave a completion "
                      f"object that the tests then used as plain data ({what}; the task has no reference: its "
                      "objects never hear the tests' values nor stand in for numbers)")

    def opaque_compare(self, target, op, other):
        """(strict) ``target op other`` where either is an opaque object (:meth:`held_opaque`), or
        None where neither is. Against plain data, or between two opaque objects, it is
        ``type_mismatch`` (the completion would decide whether its answer equals the tests' value:
        ``f(1) == 2``, ``normalize(a) == normalize(b)``); against an object of the completion's
        that the tests built (``Frac(5, 6)``, the expected value), that object's own class decides,
        by its own method (not the reflected one of a subclass the opaque object is)."""
        refs, opaque = self.table.refs, self.opaque
        mine = refs.get(id(target)) in opaque
        theirs = _is_object(other, type(other)) and refs.get(id(other)) in opaque
        if not (mine or theirs):
            return None
        if target is other:
            return op in ("eq", "le", "ge")
        if not _is_object(other, type(other)) or (mine and theirs):
            self.mismatch(f"type_mismatch: the tests compared a completion object ({self.paths.get(refs.get(id(target)), '?')}) "
                          f"with {'another the tests did not build' if mine and theirs else 'plain data'} (the task has "
                          "no reference: a completion object never decides a comparison with the tests' values)")
        if mine:  # the built one is the other: ask it the mirrored question
            target, other, op = other, target, _MIRRORED[op]
        return self.ask("op", target, [op + "own", other], f"#{op}")

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
            if _is_object(x, t):
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
            elif control and isinstance(x, BaseException) and isinstance(x, control) and not _is_object(x, t):
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

    # ------------------------------------------------------------ the tests' uses of the candidate's objects

    def call(self, target, args, kwargs):
        result = self.ask("call", target, [items(args), items(flat_kwargs(kwargs))], "()",
                          constructing=type(target) is MirrorMeta)
        if self.rules.strict and (args or kwargs) and isinstance(result, RemoteBase):
            self.note_named(result, args, kwargs)
        return result

    def call_method(self, owner, name, args, kwargs):
        if self.opaque and self.table.refs.get(id(owner)) in self.opaque:
            self.opaque_use(owner, "callm", name, args or kwargs)
        result = self.ask("callm", owner, [name, items(args), items(flat_kwargs(kwargs))], f".{name}()")
        if self.rules.strict and (args or kwargs) and isinstance(result, RemoteBase):
            self.note_named(result, args, kwargs)
        return result

    def call_super(self, owner, cls, name, args, kwargs):
        """``cls``'s own ``name`` (a completion class's) called on ``owner``, an instance of a class
        of the tests derived from it (proxies.Inherited: ``super().__init__(...)``, an inherited
        method): in the candidate, from ``cls`` down its own MRO."""
        if self.opaque and self.table.refs.get(id(owner)) in self.opaque:
            self.opaque_use(owner, "callm", name, args or kwargs)
        return self.ask("callsuper", owner, [cls, name, items(args), items(flat_kwargs(kwargs))], f".{name}()")

    def note_named(self, result, args, kwargs):
        """(strict) The exception classes the tests named in the call that gave ``result``
        (``ignoring(KeyError)``, ``Suppressing((KeyError, IndexError))``, ``errors=ValueError``): the
        exceptions of the tests' own code that its ``__exit__`` may swallow (:meth:`may_suppress`)."""
        named = tuple(x for arg in (*args, *kwargs.values()) for x in (arg if type(arg) in (tuple, list) else (arg,))
                      if isinstance(x, type) and issubclass(x, BaseException))
        if named:
            self.named[self.table.refs.get(id(result))] = named

    def subclassed(self, cls):
        """The tests derived ``cls`` from the completion's classes (``class Dog(Animal): ...``;
        proxies.MirrorMeta). The candidate makes the same class from the completion's own, with the
        tests' attributes: their functions (methods, static and class methods, properties' parts)
        are called here, on the instance as it crossed, and their other values cross as values.
        ``cls`` then stands for the candidate's class (its ref): constructing it makes an instance
        in the candidate, as the completion's classes do; what ``cls`` inherits is the completion
        classes' own, asked by name (proxies.Inherited). A class the tests build is the tests'
        (never opaque), and so is an instance of it that one of its methods is called on (:meth:`serve`)."""
        refs = self.table.refs
        if not all(type(base) is MirrorMeta and refs.get(id(base)) is not None for base in cls.__bases__):
            raise TypeError("a class of the tests may derive from the completion's classes, not from them and others")
        attributes = []
        for name, value in vars(cls).items():
            if name in _CLASS_OWN or isinstance(value, types.MemberDescriptorType):
                continue
            if isinstance(value, types.FunctionType):
                entry = [name, "m", value]
            elif isinstance(value, (staticmethod, classmethod)):
                entry = [name, "s" if isinstance(value, staticmethod) else "c", value.__func__]
            elif isinstance(value, property):
                entry = [name, "p", value.fget, value.fset, value.fdel]
            elif not name.startswith("__") or value is None:  # `__hash__ = None` (the tests' __eq__)
                entry = [name, "v", value]
            else:
                continue
            self.forwarded.update(id(f) for f in entry[2:] if isinstance(f, types.FunctionType))
            attributes.append(entry)
        self.made = []
        try:
            made = self.ask("subclass", None, [cls.__name__, cls.__qualname__, list(cls.__bases__), attributes])
            fresh = self.made
        finally:
            self.made = None
        ref = refs.get(id(made))
        if type(made) is not MirrorMeta or not any(m is made for m in fresh) or ref is None:
            self.set_tamper("protocol", "a subclass answered by something that is not a new class")
            self.fail(self.gone)
        refs.pop(id(made), None)
        self.table.objects[ref] = cls  # the tests' class stands for the candidate's from now on
        refs[id(cls)] = ref
        self.kept_errors.append(made)  # kept alive: its id is never another object's
        self.methods[cls] = self.methods.pop(made, set())
        self.opaque.discard(ref)
        self.tainted.discard(ref)
        self.paths[ref] = str(cls.__qualname__)[:100]
        self.tests_classes.add(cls)
        for base in cls.__mro__[1:]:  # what it inherits, and super(), from the completion's classes by name
            if type(base) is MirrorMeta and base not in self.tests_classes:
                for name in sorted({*self.methods.get(base, ()), "__init__"}):
                    # public names only (a candidate's class may list any): never one Python looks up on the
                    # type itself (__eq__, __getattribute__, __class__), which would hand it the tests' objects
                    if (name == "__init__" or (name.isidentifier() and not name.startswith("_"))) \
                            and name not in vars(base):
                        setattr(base, name, Inherited(base, name))

    def op(self, target, name, *args):
        if self.opaque and self.table.refs.get(id(target)) in self.opaque:
            self.opaque_use(target, "op", name, args)
        if name == "next" or name == "anext":
            return self.ask("op", target, [name, *args], "[*]", iterating=True)
        result = self.ask("op", target, [name, *args], f"#{name}")
        if name == "exit" and result and len(args) > 1 and args[1] is not None:
            where = f"{self.test}|{self.paths.get(self.table.refs.get(id(target)), '?')}#exit"
            if not self.may_suppress(args[1], where, self.named.get(self.table.refs.get(id(target)), ())):
                return False
        if self.rules.strict and name in BINARY and not self.rules.record:
            other = args[0] if args else None
            if not self.handles_in(other, "", "") and not self.handles_in(result, "", ""):
                self.mismatch(f"type_mismatch: the completion's {name} with the tests' value gave plain data (the "
                              "task has no reference: a completion object never decides a comparison with the "
                              "tests' values)")
        return result

    def may_suppress(self, error, point, named=()):
        """Whether a completion's ``__exit__`` may swallow ``error`` at ``point``: never the tests'
        assertion or a skip or stop of the test framework (a test that did not run to its end never
        passes); otherwise where the task's reference swallowed one too, or (no reference) an
        exception the completion raised itself, or one of the tests' own code of a class the tests
        named in the call that made the context manager (``named``: ``with ignoring(KeyError):
        {}['x']``, what ``contextlib.suppress`` does); never the judge's own failures."""
        control = control_classes()
        own = id(error) in self.candidate_errors
        if (isinstance(error, AssertionError) and not own) or (control and isinstance(error, control)):
            allowed = False
        elif self.rules.record:
            self.suppressed.add(point)
            allowed = True
        elif self.rules.mode == "reference":
            allowed = point in self.rules.suppressed
        else:
            allowed = own or (bool(named) and isinstance(error, named) and not isinstance(error, FailedCall))
        if not allowed:
            self.failed = self.failed or (f"the completion's __exit__ swallowed {type(error).__name__} where the "
                                          "task's reference lets it through: a test that did not run to its end "
                                          "never passes")
        return allowed

    def attribute(self, target, name):
        cls = target if type(target) is MirrorMeta else type(target)
        if name in self.methods.get(cls, ()):
            return Method(target, name)
        value = self.ask("get", target, [name], f".{name}")
        if value is CALLABLE_ATTRIBUTE:
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
            self.tamper = (kind, clip_text(detail, 500))
        self.gone = self.gone or f"tamper: {kind}"

    def printed(self, message):
        """What the candidate printed during a call goes where the tests' own prints go."""
        if message.out:
            sys.stdout.write(message.out)
        if message.err:
            sys.stderr.write(message.err)

    # ------------------------------------------------------------ requests from the candidate

    def serve(self, message):
        """A request of the candidate's: only on objects the judge handed it, only public names,
        only what the object's meaning allows (:meth:`refused`)."""
        try:
            op, values = message.what, message.items
            if not values or type(values[-1]) is not list:
                raise ProtocolError("a malformed request")
            target = values[0] if len(values) == 2 else None
            rest = values[-1]
            if target is None or self.table.refs.get(id(target)) is None or isinstance(target, RemoteBase):
                raise ProtocolError("a request about something the judge never handed over")
            point, path = self.stack[-1] if self.stack else (f"{self.test}|?", "?")
            if (op in ("get", "set", "callm") and (not rest or type(rest[0]) is not str)) or (op == "set" and len(rest) != 2):
                raise ProtocolError("a malformed request")
            why = self.refused(op, target, rest)  # before its values are looked at: rewiring is the attack
            receiver = self.receiver(op, target, rest)
            if why is not None:
                self.failed = self.failed or f"test_object: {why}"
                self.set_tamper("test_object", why)
                return "fail", [f"refused: {why}"]
            try:
                self.check_changes(message.changed, point + ">", path + ">")
                self.check(rest, point + ">", path + ">")
                if receiver is not None:  # the tests' own instance, its own method called on it (subclassed)
                    self.opaque.discard(receiver)
            except TypeMismatch as exc:
                return "exc", [TypeError(str(exc))]
            if op in ("get", "callm") and rest[0].startswith("_") and not (op == "get" and rest[0] in METADATA
                                                                           and isinstance(target, NAMED_KINDS)):
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

    def receiver(self, op, target, rest):
        """The ref of the instance (or class) of a class of the tests (:meth:`subclassed`) that a
        call of one of that class's own functions is on, where it is not opaque already: it stays
        the tests' own there."""
        if op != "call" or id(target) not in self.forwarded or not rest or type(rest[0]) is not list or not rest[0]:
            return None
        first = rest[0][0]
        if type(first) not in self.tests_classes and first not in self.tests_classes:
            return None
        ref = self.table.refs.get(id(first))
        return ref if ref not in self.opaque else None

    def refused(self, op, target, rest):
        """Why the candidate may not do ``op`` to the tests' object ``target`` (None: it may)."""
        owner = getattr(target, "__self__", None) if isinstance(target, types.MethodType) else None
        framework = _framework_classes()
        if isinstance(target, framework) or (owner is not None and isinstance(owner, framework)):
            if op == "call" and owner is not None and not target.__func__.__name__.startswith("_"):
                return None  # a method the tests handed over as a callable (self.assertEqual as a check)
            return f"the test framework's {type(owner if owner is not None else target).__name__} is not the " \
                   "completion's to use"
        if op == "set":
            name, value = rest[0], rest[1]
            if self.setup_classes and isinstance(target, self.setup_classes) and not name.startswith("_"):
                declared = getattr(type(target), name, None)
                if (declared is None or isinstance(declared, types.MemberDescriptorType)) \
                        and not self.handles_in(value, "", ""):
                    return None  # a plain data attribute (or slot) of the setup's own instance
            return f"sets {name!r} on an object of the tests"
        mock, api = _mock_api()
        if mock is None:
            return None
        if owner is not None and isinstance(owner, mock) and target.__func__.__name__ in api:
            return f"calls the mock's own {target.__func__.__name__}"
        function = target.__func__ if isinstance(target, types.MethodType) else target
        if (isinstance(target, mock) or _autospec(function, mock)) and op in ("get", "callm") and rest[0] in api:
            return f"uses the mock's own {rest[0]!r}"
        return None

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
        mock, _ = _mock_api()
        try:  # a mock records hash(mock) as a call of its own: its default hash, unasked
            value = object.__hash__(x) if mock is not None and isinstance(x, mock) else hash(x)
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
        if kind == "c" and len(desc) == 7:
            _, name, qualname, module, bases, methods, info = desc
            base_values = [decoder.item(b) for b in bases] if type(bases) is list else None
            info = decoder.item(info)
            if base_values is None or type(methods) is not list or not all(type(m) is str for m in methods) \
                    or type(info) is not dict:
                raise ProtocolError("a malformed class")
            obj = make_mirror(name, qualname, module, base_values, methods, info, self.setup_classes)
            self.methods[obj] = set(methods)
            if self.made is not None:
                self.made.append(obj)
        elif kind == "i" and len(desc) == 3:
            cls = decoder.item(desc[1])
            if type(cls) is not MirrorMeta:
                raise ProtocolError("an instance of something that is not a class")
            base = value_base(cls)
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
            obj = new_exception(cls, args)
            self.texts[ref] = clip_text(text, 4000) if type(text) is str else None
        elif kind == "g" and len(desc) == 2:
            obj = object.__new__(RemoteIterator)
        elif kind == "m" and len(desc) == 2 and type(desc[1]) is str:
            obj = object.__new__(Remote)
            self.modules[ref] = desc[1]
        elif kind == "f" and len(desc) == 2:
            obj = object.__new__(Remote)
        elif kind == "s" and len(desc) == 3 and type(desc[1]) is str and type(desc[2]) is str:
            obj = object.__new__(Remote)  # the candidate's standard-library class or function, by its name
            self.std_objects[ref] = (desc[1][:200], desc[2][:200])
        else:
            raise ProtocolError("a malformed handle")
        table.add(obj, None, ref)
        self.hashes[ref] = value
        return obj


# what a class of the tests holds that is the class's own, never sent to the candidate's copy (Judge.subclassed)
_CLASS_OWN = frozenset({"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__slots__", "__classcell__",
                        "__firstlineno__", "__static_attributes__", "__orig_bases__", "__annotations__", "__annotate__",
                        "__type_params__"})

# what the candidate may read of the tests' functions and classes besides public names: their names and docstring
# (functools.wraps in a decorator the tests apply), strings the judge reads with the objects' own descriptors
METADATA = frozenset({"__name__", "__qualname__", "__doc__", "__module__"})
NAMED_KINDS = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type)

_MIRRORED = {"eq": "eq", "ne": "ne", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}

# (strict) what the tests may ask of an opaque object of the completion's (Judge.opaque_use)
OPAQUE_OPS = frozenset({"repr", "str", "format", "bool", "len", "iter", "next", "reversed", "dir", "enter", "exit",
                        "await", "aiter", "anext", "getitem", "setitem", "delitem", "copy", "deepcopy"})
# methods a built-in value has: with arguments, asked of an opaque object, they would hand it the tests' values
PLAIN_METHODS = frozenset(name for t in (str, bytes, bytearray, list, tuple, dict, set, frozenset, int, float,
                                         complex, range, memoryview) for name in dir(t))

# dict views, deques and the like: values whose items cross with them
_ITERABLE_VALUES = frozenset({"dict_keys", "dict_values", "dict_items", "deque"})


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
