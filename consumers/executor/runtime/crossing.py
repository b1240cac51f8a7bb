"""The judge's end of the boundary (:class:`Crossing`): the channel to the candidate, the
objects that crossed and the requests that use them, each answer checked by the one rule
(runtime/valuecheck.py :class:`ValueCheck`, which a Crossing is), the candidate's own requests
served only as the tests' objects allow (runtime/protection.py :class:`Protection`).

A module of the runtime (standard library only; in the sandbox it arrives in the runtime's
bundle, runtime/importer.py; on the host, an ordinary module). The judge process
(runtime/judge.py) holds one Crossing per job.
"""

import sys
import types

from rollstream.consumers.executor.runtime.channel import Channel, LinkDown, items
from rollstream.consumers.executor.runtime.codec import (
    NotTransferable,
    ProtocolError,
    Table,
    TooLarge,
    clip_text,
    resolve_std,
    std_name,
)
from rollstream.consumers.executor.runtime.protection import Protection, mock_api
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
    exception_item,
    exception_value,
    flat_kwargs,
    make_mirror,
    new_exception,
    value_base,
)
from rollstream.consumers.executor.runtime.valuecheck import BINARY, ValueCheck, control_classes, is_object


class Crossing(ValueCheck):
    """One job's end of the boundary in the judge: the channel to the candidate, the objects that
    crossed and where each arrived (the value check's state, :class:`ValueCheck`), what the
    candidate holds of the tests' (:class:`Protection` serves its requests)."""

    def __init__(self, read_fd, write_fd, *, rules=None):
        super().__init__(Table(JUDGE_PARITY), rules)
        self.setup_objects = {}
        self.setup_names = {}  # id(setup function or class) -> its name (they cross by name)
        self.protection = Protection(self)
        self.channel = Channel(read_fd, write_fd, self.table, CANDIDATE_PARITY, self.encode_other,
                               self.decode_other, serve=self.protection.serve, random_ids=True)
        self.channel.on_receive = self.printed
        self.hashes = {}  # ref -> the candidate's hash of a handle (None: unhashable)
        self.texts = {}  # ref -> str() of a candidate exception
        self.methods = {}  # mirror class -> names of its methods (no request until called)
        self.modules = {}  # ref -> the name of a module the candidate holds
        self.std_objects = {}  # ref -> (module, qualname) of a standard-library object the candidate holds
        self.bound = {}  # (record) name -> how the reference bound it
        self.skips = {}  # (record) test index -> unittest tests it skipped (-1: the whole test)
        self.stack = []  # (point, path) of the requests waiting for an answer
        self.decoding = False
        self.gone = None  # why the candidate can no longer answer
        self.tamper = None  # (kind, detail) of the first attack seen
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

    # ------------------------------------------------------------ the tests' uses of the candidate's objects

    def opaque_compare(self, target, op, other):
        """(strict) ``target op other`` where either is an opaque object (:meth:`held_opaque`), or
        None where neither is. Against plain data, or between two opaque objects, it is
        ``type_mismatch`` (the completion would decide whether its answer equals the tests' value:
        ``f(1) == 2``, ``normalize(a) == normalize(b)``); against an object of the completion's
        that the tests built (``Frac(5, 6)``, the expected value), that object's own class decides,
        by its own method (not the reflected one of a subclass the opaque object is)."""
        refs, opaque = self.table.refs, self.opaque
        mine = refs.get(id(target)) in opaque
        theirs = is_object(other, type(other)) and refs.get(id(other)) in opaque
        if not (mine or theirs):
            return None
        if target is other:
            return op in ("eq", "le", "ge")
        if not is_object(other, type(other)) or (mine and theirs):
            self.mismatch(f"type_mismatch: the tests compared a completion object ({self.paths.get(refs.get(id(target)), '?')}) "
                          f"with {'another the tests did not build' if mine and theirs else 'plain data'} (the task has "
                          "no reference: a completion object never decides a comparison with the tests' values)")
        if mine:  # the built one is the other: ask it the mirrored question
            target, other, op = other, target, _MIRRORED[op]
        return self.ask("op", target, [op + "own", other], f"#{op}")

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
        (never opaque), and so is an instance of it that one of its methods is called on (protection.py :meth:`Protection.serve`)."""
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
        mock, _ = mock_api()
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


# what a class of the tests holds that is the class's own, never sent to the candidate's copy (Crossing.subclassed)
_CLASS_OWN = frozenset({"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__slots__", "__classcell__",
                        "__firstlineno__", "__static_attributes__", "__orig_bases__", "__annotations__", "__annotate__",
                        "__type_params__"})

_MIRRORED = {"eq": "eq", "ne": "ne", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}

def _type_name(x):
    try:
        return str(type(x).__name__)[:100]
    except BaseException:
        return "object"
