"""The judge's requests, answered in the candidate: :data:`OPS`, one handler a request.

A module of the runtime (standard library only; in the sandbox it arrives in the runtime's
bundle, runtime/importer.py; on the host, an ordinary module). runtime/candidate.py's ``serve``
applies the judge's overrides for the request and calls the handler of its name with the
request's target and arguments: a call, a method call or an attribute of one of the completion's
objects, an operator (:data:`CANDIDATE_OPERATORS`: the object's own, as the tests' expression
would use it), ``eval``/``exec``, ``compile`` or ``pickle`` of something the tests did not write
themselves, a class of the tests' derived from the completion's and ``super()`` in it; and
``run``, the whole program on one input: a Python one in a fork of this process
(:func:`run_program_here`), one in another language as runtime/programs.py built it. A
handler's result or exception is the reply; :data:`IS_METHOD` says that an attribute is a method
of its object, which the judge then calls by name.
"""

import builtins
import os
import sys

from rollstream.consumers.executor.runtime.handles import CANDIDATE
from rollstream.consumers.executor.runtime.printing import print_exception
from rollstream.consumers.executor.runtime.programs import Built, run_built, run_forked

IS_METHOD = object()  # what _get answers for a method of its target: the judge then calls it by name


def _kwargs_of(flat):
    return dict(zip(flat[0::2], flat[1::2]))


def _get(target, name):
    value = getattr(target, name)
    if callable(value) and getattr(value, "__self__", None) is target and not isinstance(value, type):
        return IS_METHOD
    return value


def _set(target, name, value):
    setattr(target, name, value)


def _del(target, name):
    delattr(target, name)


def _call(target, args, kwargs):
    return target(*args, **_kwargs_of(kwargs))


def _callm(target, name, args, kwargs):
    return getattr(target, name)(*args, **_kwargs_of(kwargs))


def _run(_, stdin):
    if isinstance(CANDIDATE.code, Built):
        return list(run_built(CANDIDATE.code, stdin, CANDIDATE.out_cap))
    return list(run_program_here(CANDIDATE.code, stdin, CANDIDATE.out_cap))


def _eval(_, mode, source, globals_, locals_, modules):
    """``eval``/``exec`` of something the tests did not write themselves: here, never in the
    judge. Without namespaces of its own it sees the completion's names and the tests' modules."""
    namespace = dict(CANDIDATE.namespace) if globals_ is None else dict(globals_)
    if globals_ is None and type(modules) is dict:
        namespace.update(modules)
    namespace.setdefault("__builtins__", builtins)
    run = builtins.eval if mode == "eval" else builtins.exec
    result = run(source, namespace, locals_ if locals_ is not None else namespace)
    if globals_ is not None:  # what the code defined goes back into the tests' own dict
        for key, value in namespace.items():
            if key != "__builtins__" and (key not in globals_ or globals_[key] is not value):
                globals_[key] = value
    return result


def _subclass(_, name, qualname, bases, attributes):
    """The tests' class derived from the completion's ``bases`` (judge side: crossing.Crossing.subclassed),
    made here from them: the tests' methods, static and class methods and properties' parts call the
    tests' functions (the judge runs them, on the instance as it crossed: ``self.sound()`` in the
    completion's ``speak`` reaches the tests' ``sound``), their other attributes are values."""
    namespace = {"__module__": "__main__", "__qualname__": str(qualname)}
    for entry in attributes:
        key, kind, *parts = entry
        if kind == "m":
            namespace[key] = _tests_function(parts[0], key)
        elif kind in ("s", "c"):
            namespace[key] = (staticmethod if kind == "s" else classmethod)(_tests_function(parts[0], key))
        elif kind == "p":
            namespace[key] = property(*(None if part is None else _tests_function(part, key) for part in parts))
        else:
            namespace[key] = parts[0]
    return type(str(name), tuple(bases), namespace)


def _tests_function(proxy, name):
    def forwarded(*args, **kwargs):
        return proxy(*args, **kwargs)

    forwarded.__name__ = forwarded.__qualname__ = str(name)
    return forwarded


def _callsuper(target, cls, name, args, kwargs):
    """``cls``'s own ``name`` (found down ``cls``'s MRO, never from ``target``'s class, which holds
    the tests' override) bound to ``target`` and called: ``super().__init__(...)`` or an inherited
    method of the tests' class."""
    for klass in cls.__mro__:
        if name in vars(klass):
            found = vars(klass)[name]
            bind = getattr(type(found), "__get__", None)
            method = found if bind is None else bind(found, target, type(target))
            return method(*args, **_kwargs_of(kwargs))
    raise AttributeError(f"{cls.__name__!r} object has no attribute {name!r}")


def _compile(_, *args):
    return builtins.compile(*args)


def _loads(_, kind, data):
    if kind == "marshal":
        import marshal

        return marshal.loads(data)
    import pickle

    return pickle.loads(data)


def _dumps(_, obj, protocol):
    import pickle

    return pickle.dumps(obj, protocol)


def _operator(target, op, *args):
    return CANDIDATE_OPERATORS[op](target, *args)


def _await(awaitable):
    """Run the completion's awaitable to its end on this process's own event loop (kept for the
    job: an asynchronous generator stays bound to it between its items)."""
    import asyncio

    loop = CANDIDATE.loop
    if loop is None:
        loop = CANDIDATE.loop = asyncio.new_event_loop()

    async def run():
        return await awaitable

    return loop.run_until_complete(run())


def _own(target, other, name):
    """``target == other`` asked of ``target``'s own class only (not ``other``'s reflected method)."""
    result = getattr(type(target), name)(target, other)
    if result is NotImplemented:
        if name in ("__eq__", "__ne__"):
            return (target is other) == (name == "__eq__")
        raise TypeError(f"{name} is not supported between these objects")
    return result


def _candidate_operators():
    import copy
    import math
    import operator as o

    table = {
        "len": len, "iter": iter, "next": next, "reversed": reversed, "str": str, "repr": repr, "bool": bool,
        "int": int, "float": float, "index": o.index, "complex": complex, "abs": abs, "neg": o.neg, "pos": o.pos,
        "invert": o.invert, "trunc": math.trunc, "floor": math.floor, "ceil": math.ceil, "hash": hash, "dir": dir,
        "round": round, "format": format, "copy": copy.copy, "deepcopy": copy.deepcopy,
        "contains": lambda t, item: item in t, "getitem": o.getitem, "setitem": o.setitem, "delitem": o.delitem,
        "eq": o.eq, "ne": o.ne, "lt": o.lt, "le": o.le, "gt": o.gt, "ge": o.ge,
        **{f"{name}own": (lambda n: lambda t, other: _own(t, other, f"__{n}__"))(name)
           for name in ("eq", "ne", "lt", "le", "gt", "ge")},
        "enter": lambda t: type(t).__enter__(t), "exit": lambda t, *exc: type(t).__exit__(t, *exc),
        "divmod": divmod, "rdivmod": lambda t, other: divmod(other, t),
        "await": _await, "aiter": lambda t: t.__aiter__(), "anext": lambda t: _await(t.__anext__()),
    }
    for name in ("add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "pow", "lshift", "rshift",
                 "and", "or", "xor"):
        function = getattr(o, name + "_" if name in ("and", "or") else name)
        table[name] = function
        table["r" + name] = (lambda f: lambda t, other: f(other, t))(function)
        table["i" + name] = getattr(o, "i" + (name + "_" if name in ("and", "or") else name).rstrip("_"))
    return table


CANDIDATE_OPERATORS = _candidate_operators()
OPS = {"call": _call, "callm": _callm, "get": _get, "set": _set, "del": _del, "op": _operator, "run": _run,
       "eval": _eval, "compile": _compile, "loads": _loads, "dumps": _dumps, "subclass": _subclass,
       "callsuper": _callsuper}


def run_program_here(code, stdin, out_cap):
    """Run a whole program (a code object) as ``__main__`` of a process of its own, forked from
    this one, with ``stdin`` on a real descriptor 0 and its descriptor 1 captured; returns
    (stdout text, exit status), as a program run by a shell would: ``os._exit`` after a flush
    keeps what was flushed, an uncaught exception prints its traceback and exits 1."""
    return run_forked(lambda source, sink: _program_child(code, source, sink), stdin, out_cap)


def _program_child(code, source, sink):
    status = 1
    try:
        os.dup2(source, 0)
        os.dup2(sink, 1)
        sys.stdin = open(0, closefd=False, encoding="utf-8", errors="surrogateescape")
        sys.stdout = open(1, "w", closefd=False, encoding="utf-8")
        sys.stdout.reconfigure(write_through=True)  # print() and sys.stdout.buffer.write() keep their order
        sys.stderr = open(2, "w", closefd=False, encoding="utf-8", errors="backslashreplace")
        sys.argv = ["solution"]
        try:
            exec(code, {"__name__": "__main__", "__builtins__": builtins})
            status = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                status = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
        except BaseException as exc:
            print_exception(exc)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
    finally:
        os._exit(status & 0xFF if status >= 0 else 1)
