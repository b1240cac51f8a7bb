"""The tests' objects are the tests': what the candidate may do with what the tests handed it
(:class:`Protection`, which serves the candidate's requests for the judge's end of the boundary,
runtime/crossing.py :class:`Crossing`).

A module of the runtime (standard library only; in the sandbox it arrives in the runtime's
bundle, runtime/importer.py; on the host, an ordinary module).

**The tests' objects are the tests'.** The candidate may call what the tests hand over (a mock
records the call) and read its data; it may not set attributes on it (but plain data attributes
of the setup's own instances), use a mock's own API (``assert_*``, ``reset_mock``,
``configure_mock``, ``return_value``, ``call_count``, ...), or touch the test framework's objects
(``TestCase``, results, runners, suites). A refused operation fails the test and is ``tamper``.
"""

import sys
import types

from rollstream.consumers.executor.runtime.codec import ProtocolError
from rollstream.consumers.executor.runtime.proxies import FailedCall, RemoteBase, TypeMismatch, raises


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


def mock_api():
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


def _autospec(target, mock):
    """A function ``mock.create_autospec`` made (``patch(..., autospec=True)``): a real function
    that carries its mock's API (``reset_mock``, ``assert_*``, ``mock_calls``) as attributes."""
    attributes = getattr(target, "__dict__", None) if isinstance(target, types.FunctionType) else None
    return type(attributes) is dict and isinstance(attributes.get("mock"), mock)


class Protection:
    """What the candidate may do to the tests' objects, for one job's :class:`Crossing` (whose
    channel hands it the candidate's requests: :meth:`serve`)."""

    def __init__(self, crossing):
        self.crossing = crossing

    def serve(self, message):
        """A request of the candidate's: only on objects the judge handed it, only public names,
        only what the object's meaning allows (:meth:`refused`)."""
        crossing = self.crossing
        try:
            op, values = message.what, message.items
            if not values or type(values[-1]) is not list:
                raise ProtocolError("a malformed request")
            target = values[0] if len(values) == 2 else None
            rest = values[-1]
            if target is None or crossing.table.refs.get(id(target)) is None or isinstance(target, RemoteBase):
                raise ProtocolError("a request about something the judge never handed over")
            point, path = crossing.stack[-1] if crossing.stack else (f"{crossing.test}|?", "?")
            if (op in ("get", "set", "callm") and (not rest or type(rest[0]) is not str)) or (op == "set" and len(rest) != 2):
                raise ProtocolError("a malformed request")
            why = self.refused(op, target, rest)  # before its values are looked at: rewiring is the attack
            receiver = self.receiver(op, target, rest)
            if why is not None:
                crossing.failed = crossing.failed or f"test_object: {why}"
                crossing.set_tamper("test_object", why)
                return "fail", [f"refused: {why}"]
            try:
                crossing.check_changes(message.changed, point + ">", path + ">")
                crossing.check(rest, point + ">", path + ">")
                if receiver is not None:  # the tests' own instance, its own method called on it (subclassed)
                    crossing.opaque.discard(receiver)
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
            crossing.set_tamper("protocol", exc)
            return "fail", ["protocol error"]
        except FailedCall:
            raise
        except BaseException as exc:
            return "exc", [exc]

    def receiver(self, op, target, rest):
        """The ref of the instance (or class) of a class of the tests (:meth:`Crossing.subclassed`) that a
        call of one of that class's own functions is on, where it is not opaque already: it stays
        the tests' own there."""
        crossing = self.crossing
        if op != "call" or id(target) not in crossing.forwarded or not rest or type(rest[0]) is not list or not rest[0]:
            return None
        first = rest[0][0]
        if type(first) not in crossing.tests_classes and first not in crossing.tests_classes:
            return None
        ref = crossing.table.refs.get(id(first))
        return ref if ref not in crossing.opaque else None

    def refused(self, op, target, rest):
        """Why the candidate may not do ``op`` to the tests' object ``target`` (None: it may)."""
        crossing = self.crossing
        owner = getattr(target, "__self__", None) if isinstance(target, types.MethodType) else None
        framework = _framework_classes()
        if isinstance(target, framework) or (owner is not None and isinstance(owner, framework)):
            if op == "call" and owner is not None and not target.__func__.__name__.startswith("_"):
                return None  # a method the tests handed over as a callable (self.assertEqual as a check)
            return f"the test framework's {type(owner if owner is not None else target).__name__} is not the " \
                   "completion's to use"
        if op == "set":
            name, value = rest[0], rest[1]
            if crossing.setup_classes and isinstance(target, crossing.setup_classes) and not name.startswith("_"):
                declared = getattr(type(target), name, None)
                if (declared is None or isinstance(declared, types.MemberDescriptorType)) \
                        and not crossing.handles_in(value, "", ""):
                    return None  # a plain data attribute (or slot) of the setup's own instance
            return f"sets {name!r} on an object of the tests"
        mock, api = mock_api()
        if mock is None:
            return None
        if owner is not None and isinstance(owner, mock) and target.__func__.__name__ in api:
            return f"calls the mock's own {target.__func__.__name__}"
        function = target.__func__ if isinstance(target, types.MethodType) else target
        if (isinstance(target, mock) or _autospec(function, mock)) and op in ("get", "callm") and rest[0] in api:
            return f"uses the mock's own {rest[0]!r}"
        return None


# what the candidate may read of the tests' functions and classes besides public names: their names and docstring
# (functools.wraps in a decorator the tests apply), strings the judge reads with the objects' own descriptors
METADATA = frozenset({"__name__", "__qualname__", "__doc__", "__module__"})
NAMED_KINDS = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type)

def _kwargs(flat):
    if type(flat) is not list or len(flat) % 2 or not all(type(k) is str for k in flat[0::2]):
        raise ProtocolError("malformed keyword arguments")
    return dict(zip(flat[0::2], flat[1::2]))


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
