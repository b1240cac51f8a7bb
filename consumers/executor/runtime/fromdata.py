"""Code and objects from data, in the judge: the judge never runs code the completion chose.

Runs INSIDE the sandbox after ``crossing.py`` (standard library only; on the host, an ordinary
module, unit-tested there). ``judge.py`` installs and uses it.

* **Running code** (:class:`ExecGuard`, an audit hook on ``exec``, installed once in the judge
  zygote): during a job, a code object runs in the judge only when it is the tests' own (the
  setup and tests the runner compiled), when the tests' own ``eval``/``exec``/``compile`` let it
  through (their literals), when the import system runs a module of the standard library, or
  when a standard-library generator makes it from its own template (``namedtuple``,
  ``dataclasses``, ``mock``'s autospec signatures, ``timeit`` of the tests' own statement,
  ``typing`` evaluating the tests' own annotations). Anything else, whatever standard-library
  function reaches it, raises ``PermissionError`` in its test: doctest examples of a completion's
  docstring, annotations of the completion's functions evaluated by ``typing``/``inspect``,
  ``runpy``/``importlib`` on files in ``/work``, ``logging.config``'s ``eval``.
* **Expressions from data** (:func:`plain_eval`): a string the tests ``eval``/``exec`` that is
  only constants, containers and operators on them (``'12*34'``, ``"{'a': [1, 2]}"``,
  ``'x = 5'``) is evaluated here by walking its syntax tree (no code object, no names, calls or
  attributes); only other strings go to the candidate's process (``Guards.delegate``).
* **Pickles and marshal data** (:func:`plain_unpickle`, :func:`plain_unmarshal`): loaded here
  with only plain-data classes (the builtins' containers and values, the standard library's value
  types, the classes the tests define); a pickle naming anything else goes to the candidate, and
  what comes back must then hold an object of the completion's (the class it named), never plain
  data the completion chose for it.
"""

import ast
import io
import operator
import sys
import types

# (module, function) of the standard library's generators that exec code from their own
# templates (names they put in are checked identifiers)
TEMPLATES = frozenset({("collections", "namedtuple"), ("dataclasses", "_create_fn"),
                       ("unittest.mock", "_set_signature")})
IMPORT_SYSTEM = frozenset({"importlib._bootstrap", "importlib._bootstrap_external"})


class ExecGuard:
    """The judge's audit hook: ``current()`` gives the job's guards (None between jobs), which
    answer ``own_code(code)`` and ``trusted(text)``; ``callers`` are the code objects of the
    functions that have already checked what they run (the tests' eval/exec/compile)."""

    def __init__(self, current, callers, stdlib_inside):
        self.current = current
        self.callers = frozenset(callers)
        self.stdlib_inside = stdlib_inside

    def __call__(self, event, args):
        if event != "exec":
            return
        guards = self.current()
        if guards is None or not args:
            return
        code = args[0]
        frame = sys._getframe(1)
        if self.may_run(guards, code, frame):
            return
        where = frame.f_globals.get("__name__", "?")
        raise PermissionError(f"the judge runs no code but the tests' own ({where}.{frame.f_code.co_name} "
                              "ran code from data, which may be the completion's)")

    def may_run(self, guards, code, frame):
        if guards.own_code(code) or frame.f_code in self.callers:
            return True
        module = frame.f_globals.get("__name__")
        function = frame.f_code.co_name
        if module in IMPORT_SYSTEM:  # a module of the standard library (never one in /work)
            filename = getattr(code, "co_filename", "")
            return type(filename) is str and (filename.startswith("<frozen ") or self.stdlib_inside(filename))
        if (module, function) in TEMPLATES:
            return True
        local = frame.f_locals
        if module == "typing" and function == "_evaluate":  # the tests' own annotations only
            return guards.trusted(getattr(local.get("self"), "__forward_arg__", None))
        if module == "timeit" and function == "__init__":  # timeit of the tests' own statement
            return all(callable(local.get(k)) or guards.trusted(local.get(k)) for k in ("stmt", "setup"))
        return False


# ---------------------------------------------------------------- expressions from data

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
           ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.BitAnd: operator.and_,
           ast.BitOr: operator.or_, ast.BitXor: operator.xor}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg, ast.Not: operator.not_, ast.Invert: operator.invert}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
            ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
_NOT_PLAIN = object()
MAX_NODES = 100_000


def plain_eval(source, mode):
    """``(True, value)`` for an ``eval`` of constants and operators on them, ``(True, {name:
    value})`` for an ``exec`` of assignments of such values to names; ``(False, None)`` for
    anything else (names, calls, attributes, comprehensions: the candidate's business)."""
    if isinstance(source, (bytes, bytearray)):
        try:
            source = bytes(source).decode()
        except UnicodeDecodeError:
            return False, None
    if type(source) is not str or len(source) > 10_000_000:
        return False, None
    try:
        tree = ast.parse(source.strip() if mode == "eval" else source, mode=mode)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False, None
    try:
        if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
            return False, None
        if mode == "eval":
            value = _value(tree.body)
            return (False, None) if value is _NOT_PLAIN else (True, value)
        assigned = {}
        for statement in tree.body:
            if type(statement) is ast.Pass:
                continue
            if type(statement) is ast.Expr:
                if _value(statement.value) is _NOT_PLAIN:
                    return False, None
                continue
            if type(statement) is not ast.Assign or not all(type(t) is ast.Name for t in statement.targets):
                return False, None
            value = _value(statement.value)
            if value is _NOT_PLAIN:
                return False, None
            for target in statement.targets:
                assigned[target.id] = value
        return True, assigned
    except RecursionError:
        return False, None


def _value(node):
    """The value of a constant expression (``_NOT_PLAIN`` for anything else); errors of the
    operations themselves (``1/0``) raise, as ``eval`` would."""
    kind = type(node)
    if kind is ast.Constant:
        return node.value
    if kind in (ast.Tuple, ast.List, ast.Set):
        items = [_value(e) for e in node.elts]
        if any(v is _NOT_PLAIN for v in items) or any(type(e) is ast.Starred for e in node.elts):
            return _NOT_PLAIN
        return tuple(items) if kind is ast.Tuple else list(items) if kind is ast.List else set(items)
    if kind is ast.Dict:
        if any(k is None for k in node.keys):
            return _NOT_PLAIN
        keys, values = [_value(k) for k in node.keys], [_value(v) for v in node.values]
        if any(v is _NOT_PLAIN for v in keys) or any(v is _NOT_PLAIN for v in values):
            return _NOT_PLAIN
        return dict(zip(keys, values))
    if kind is ast.BinOp and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        return _NOT_PLAIN if left is _NOT_PLAIN or right is _NOT_PLAIN else _BINARY[type(node.op)](left, right)
    if kind is ast.UnaryOp and type(node.op) in _UNARY:
        operand = _value(node.operand)
        return _NOT_PLAIN if operand is _NOT_PLAIN else _UNARY[type(node.op)](operand)
    if kind is ast.BoolOp:
        values = [_value(v) for v in node.values]
        if any(v is _NOT_PLAIN for v in values):
            return _NOT_PLAIN
        result = values[0]
        for value in values[1:]:
            if (type(node.op) is ast.And and not result) or (type(node.op) is ast.Or and result):
                break
            result = value
        return result
    if kind is ast.Compare and all(type(op) in _COMPARE for op in node.ops):
        left = _value(node.left)
        rights = [_value(c) for c in node.comparators]
        if left is _NOT_PLAIN or any(v is _NOT_PLAIN for v in rights):
            return _NOT_PLAIN
        for op, right in zip(node.ops, rights):
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if kind is ast.IfExp:
        test = _value(node.test)
        if test is _NOT_PLAIN:
            return _NOT_PLAIN
        return _value(node.body if test else node.orelse)
    if kind is ast.Subscript:
        container, index = _value(node.value), _value(node.slice)
        return _NOT_PLAIN if container is _NOT_PLAIN or index is _NOT_PLAIN else container[index]
    if kind is ast.Slice:
        parts = [None if p is None else _value(p) for p in (node.lower, node.upper, node.step)]
        return _NOT_PLAIN if any(p is _NOT_PLAIN for p in parts) else slice(*parts)
    return _NOT_PLAIN


# ---------------------------------------------------------------- pickles and marshal data

# Plain-data classes a pickle may name (their constructors only build values).
PLAIN_CLASSES = frozenset({
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "bytearray"), ("builtins", "complex"),
    ("builtins", "slice"), ("builtins", "range"), ("builtins", "list"), ("builtins", "dict"),
    ("builtins", "tuple"), ("builtins", "str"), ("builtins", "bytes"), ("builtins", "int"), ("builtins", "float"),
    ("builtins", "bool"), ("builtins", "object"), ("copyreg", "_reconstructor"), ("_codecs", "encode"),
    ("collections", "OrderedDict"), ("collections", "deque"), ("collections", "Counter"),
    ("collections", "defaultdict"), ("datetime", "datetime"), ("datetime", "date"), ("datetime", "time"),
    ("datetime", "timedelta"), ("datetime", "timezone"), ("decimal", "Decimal"), ("fractions", "Fraction"),
    ("uuid", "UUID"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
})


class NotPlain(Exception):
    """A pickle that names a class that is not plain data (the candidate's business)."""


def plain_unpickle(data, tests_module, real_unpickler, kwargs):
    """Unpickle ``data`` here, naming only plain-data classes and the classes the tests define
    (in ``tests_module``); NotPlain when it names anything else."""
    import _compat_pickle

    class Plain(real_unpickler):
        def find_class(self, module, name):
            if (module, name) in _compat_pickle.NAME_MAPPING:  # protocols 0-2 name Python 2's modules
                module, name = _compat_pickle.NAME_MAPPING[(module, name)]
            module = _compat_pickle.IMPORT_MAPPING.get(module, module)
            if (module, name) in PLAIN_CLASSES:
                return super().find_class(module, name)
            if module == tests_module.__name__ and isinstance(vars(tests_module).get(name), type):
                return vars(tests_module)[name]
            raise NotPlain(f"{module}.{name}")

    return Plain(io.BytesIO(bytes(data)), **kwargs).load()


def plain_unmarshal(data, real_loads):
    """marshal data loaded here: values only (a code object in it is refused: it would be code
    from data)."""
    value = real_loads(bytes(data))
    stack = [value]
    while stack:
        x = stack.pop()
        kind = type(x)
        if kind is types.CodeType:
            raise ValueError("marshal data holding code: the judge runs no code from data")
        if kind in (list, tuple, set, frozenset):
            stack.extend(x)
        elif kind is dict:
            stack.extend(x)
            stack.extend(x.values())
    return value
