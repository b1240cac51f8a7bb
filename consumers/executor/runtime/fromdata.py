"""Code and objects from data, in the judge: the judge never runs code the completion chose.

A module of the runtime (standard library only; in the sandbox it arrives in the runtime's
bundle, runtime/importer.py; on the host, an ordinary module, unit-tested there). ``hooks.py`` installs it and ``guards.py`` uses it.

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
  only constants, containers, operators on them and calls of pure functions (``'12*34'``,
  ``"{'a': [1, 2]}"``, ``'max(3, 4) - abs(-2)'``, ``'math.sqrt(2)'``, ``'set([1, 2])'``, ``'x = 5'``)
  is evaluated here by walking its syntax tree (no code object; only the builtins and the modules
  of ``PURE_BUILTINS``/``PURE_MODULES``, never a name of the tests or of the completion); only
  other strings go to the candidate's process (``Guards.delegate``).
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

from rollstream.consumers.executor.runtime.codec import resolve_std_importing

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
        if module in IMPORT_SYSTEM:  # a module of the standard library (never one in /work), by the path
            filename = getattr(code, "co_filename", "")  # as given: a link in /work is no stdlib path
            return type(filename) is str and (filename.startswith("<frozen ") or self.stdlib_inside(filename))
        if (module, function) in TEMPLATES:
            return True
        local = frame.f_locals
        if module == "typing" and function == "_evaluate":  # the tests' own annotations only
            return guards.trusted(getattr(local.get("self"), "__forward_arg__", None))
        if module == "timeit" and function == "__init__":  # timeit of the tests' own statement
            return all(callable(local.get(k)) or local.get(k) == "pass" or guards.trusted(local.get(k))
                       or guards.trusted_text(local.get(k), indent=8) for k in ("stmt", "setup"))
        return False


def guard_logging_config(module, allowed):
    """``logging.config``'s dictionaries name callables by dotted path (``'()'`` factories,
    ``ext://`` values, handler classes) and call or set what they name: from data the completion
    made, that would call anything in the judge. Names are resolved only to what ``allowed(obj)``
    accepts (logging's own classes, the standard streams, the tests' own classes and functions),
    never through a private name."""
    base = module.BaseConfigurator
    if getattr(base.resolve, "_guarded", False):
        return
    resolve = base.resolve

    def guarded(self, name):
        if type(name) is not str or any(part.startswith("_") for part in name.split(".")):
            raise ValueError(f"Cannot resolve {str(name)[:200]!r}: the judge resolves no private names")
        found = resolve(self, name)
        if not allowed(found):
            raise ValueError(f"Cannot resolve {name[:200]!r} here: a logging configuration names logging's own "
                             "classes, the standard streams and the tests' own classes (the judge calls nothing "
                             "else from data)")
        return found

    guarded._guarded = True
    base.resolve = guarded


MAX_TWISTS = 256  # ~160k 32-bit draws: a call draws fewer between the tests' own draws


def random_continues(random, before, after, seeded=None):
    """Whether the generator state ``after`` the candidate sends back is one the tests' shared
    generator reaches by drawing from ``before``, or from ``random.seed(*seeded)`` (the completion
    seeded it itself): never a state the completion made up (an all-zero one makes every later
    draw of the tests the same)."""
    if after == before:
        return True
    starts = [before]
    if type(seeded) is list and len(seeded) == 2 and type(seeded[0]) in (int, str, bytes, float) \
            and seeded[1] in (1, 2):
        probe = random.Random()
        probe.seed(*seeded)
        starts.append(probe.getstate())
    target = after[1][:624] if type(after) is tuple and len(after) == 3 and type(after[1]) is tuple else None
    if target is None:
        return False
    for start in starts:
        probe = random.Random()
        probe.setstate(start)
        for _ in range(MAX_TWISTS):
            state = probe.getstate()[1]
            if state[:624] == target and state[624] <= after[1][624]:
                return True
            probe.getrandbits(32 * max(1, 624 - state[624]) + 32)
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
# What an expression from data may call in the judge: functions of the builtins and of these modules
# that only compute values from their arguments, and the public methods of plain values.
PURE_BUILTINS = frozenset({
    "abs", "min", "max", "sum", "len", "round", "pow", "divmod", "int", "float", "complex", "str", "bool", "bytes",
    "sorted", "list", "tuple", "set", "frozenset", "dict", "all", "any", "chr", "ord", "hex", "oct", "bin", "range",
    "repr", "format", "reversed", "enumerate", "zip", "map", "filter", "slice"})
PURE_MODULES = {  # module -> its names an expression may use (None: every public one)
    "math": None, "cmath": None,
    "statistics": frozenset({"mean", "fmean", "geometric_mean", "harmonic_mean", "median", "median_low",
                             "median_high", "mode", "multimode", "pstdev", "pvariance", "stdev", "variance",
                             "quantiles"}),
    "operator": frozenset({"add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "abs", "eq",
                           "ne", "lt", "le", "gt", "ge", "and_", "or_", "xor", "not_", "invert", "lshift",
                           "rshift", "concat", "contains", "getitem", "itemgetter", "index", "truth"}),
    "fractions": frozenset({"Fraction"}), "decimal": frozenset({"Decimal"}),
    "string": frozenset({"ascii_letters", "ascii_lowercase", "ascii_uppercase", "digits", "hexdigits",
                         "octdigits", "punctuation", "printable", "whitespace", "capwords"}),
    "itertools": frozenset({"accumulate", "chain", "combinations", "combinations_with_replacement", "compress",
                            "count", "cycle", "dropwhile", "groupby", "islice", "pairwise", "permutations",
                            "product", "repeat", "starmap", "takewhile", "zip_longest"}),
    "functools": frozenset({"reduce"}),
}
PLAIN_TYPES = (str, bytes, int, float, complex, bool, tuple, list, dict, set, frozenset, range, type(None))


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
    if kind is ast.Name:
        import builtins

        return getattr(builtins, node.id) if node.id in PURE_BUILTINS else _NOT_PLAIN
    if kind is ast.Attribute:
        return _pure_attribute(node)
    if kind is ast.Call:
        return _pure_call(node)
    return _NOT_PLAIN


def _pure_attribute(node):
    """``math.pi``, ``math.sqrt``, ``'a'.upper``: a public name of a pure module or of a plain value."""
    if node.attr.startswith("_"):
        return _NOT_PLAIN
    owner = node.value
    if type(owner) is ast.Name and owner.id in PURE_MODULES:
        names = PURE_MODULES[owner.id]
        if names is not None and node.attr not in names:
            return _NOT_PLAIN  # (operator.attrgetter, string.Formatter would reach any attribute)
        module = sys.modules.get(owner.id) or __import__(owner.id)
        found = getattr(module, node.attr, _NOT_PLAIN)
        return _NOT_PLAIN if type(found) is types.ModuleType else found
    value = _value(owner)
    if value is _NOT_PLAIN or not isinstance(value, PLAIN_TYPES):
        return _NOT_PLAIN
    return getattr(value, node.attr, _NOT_PLAIN)


def _pure_call(node):
    """A call of a pure function (or a plain value's method) with plain arguments."""
    function = _value(node.func)
    if function is _NOT_PLAIN or not callable(function):
        return _NOT_PLAIN
    if any(type(a) is ast.Starred for a in node.args) or any(k.arg is None for k in node.keywords):
        return _NOT_PLAIN
    args = [_value(a) for a in node.args]
    kwargs = {k.arg: _value(k.value) for k in node.keywords}
    if any(a is _NOT_PLAIN for a in args) or any(v is _NOT_PLAIN for v in kwargs.values()):
        return _NOT_PLAIN
    return function(*args, **kwargs)


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
            found = None if name.startswith("_") else resolve_std_importing(module, name)
            enum = sys.modules.get("enum")
            if enum is not None and isinstance(found, type) and issubclass(found, enum.Enum):
                return found  # a standard-library enum (HTTPStatus): its members are values
            found = vars(tests_module).get(name)
            if module == tests_module.__name__ and isinstance(found, type) and found.__module__ == module:
                return found  # a class the tests define (not one they imported: MagicMock)
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
