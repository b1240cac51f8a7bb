"""Tasks without a reference (docs/executor.md, "Tasks without a reference"), through the real
Docker sandbox: honest forms written the way people write Python, each with the tests people
write for it, score full under the judge (``strict``: the task carries no reference); each
hostile twin of the same shape (an object that claims equality, a lying awaitable, a context
manager that swallows the tests' failure, a factory's object that hears the expected value)
scores below full. The forms the strict reading still cannot honour (``lost``: honest Python
that scores below full without a reference) are kept in the table, so a change that honours one
shows; ``rollstream tasks check`` names such tests of a task that has its reference
(``needs_reference``), and ``trust = "auto"`` on a task without one records what it lost.
"""

from __future__ import annotations

import uuid

import pytest

from rollstream.consumers.executor.score import evaluate
from rollstream.schemas.events import RewardSpec

pytestmark = [pytest.mark.sandbox, pytest.mark.containment]  # containment: again under runsc in CI


def form(direction, name, code, tests, *, setup="", entry=""):
    return pytest.param(direction, code, tests, setup, entry, id=f"{direction}-{name}")


ADDER = "def make_adder(n):\n    def add(x):\n        return x + n\n    return add\n"
COUNTER = ("def counter():\n    count = 0\n    def step():\n        nonlocal count\n        count += 1\n"
           "        return count\n    return step\n")
MEMOIZE = ("import functools\ndef memoize(f):\n    cache = {}\n    @functools.wraps(f)\n    def wrapper(*args):\n"
           "        if args not in cache:\n            cache[args] = f(*args)\n        return cache[args]\n"
           "    return wrapper\n")
RETRY = ("def retry(times):\n    def decorate(f):\n        def wrapper(*args, **kwargs):\n"
         "            for attempt in range(times):\n                try:\n                    return f(*args, **kwargs)\n"
         "                except ValueError:\n                    if attempt == times - 1:\n                        raise\n"
         "        return wrapper\n    return decorate\n")
FETCH = "import asyncio\nasync def fetch(x):\n    await asyncio.sleep(0)\n    return x * 2\n"
VERSION = ("from dataclasses import dataclass\n@dataclass(order=True, frozen=True)\nclass Version:\n"
           "    major: int\n    minor: int = 0\n")
TEMPERATURE = ("class Temperature:\n    def __init__(self, celsius):\n        self.celsius = celsius\n"
               "    @classmethod\n    def from_fahrenheit(cls, f):\n        return cls((f - 32) * 5 / 9)\n"
               "    @staticmethod\n    def freezing():\n        return Temperature(0)\n")
TAG = ("from contextlib import contextmanager\n@contextmanager\ndef tag(name, out):\n    out.append(f'<{name}>')\n"
       "    yield name.upper()\n    out.append(f'</{name}>')\n")
IGNORING = ("from contextlib import contextmanager\n@contextmanager\ndef ignoring(*kinds):\n    try:\n        yield\n"
            "    except kinds:\n        pass\n")
COLOR = ("import enum\nclass Color(enum.Enum):\n    RED = 1\n    GREEN = 2\n"
         "def parse(text):\n    return Color[text.upper()]\n")
ANIMAL = ("class Animal:\n    def __init__(self, name):\n        self.name = name\n    def speak(self):\n"
          "        return f'{self.name} says {self.sound()}'\n    def sound(self):\n        return '...'\n")
FRAC = ("from math import gcd\nclass Frac:\n    def __init__(self, n, d=1):\n        g = gcd(n, d)\n"
        "        self.n, self.d = n // g, d // g\n"
        "    def _of(self, o):\n        return o if isinstance(o, Frac) else Frac(o)\n"
        "    def __add__(self, o):\n        o = self._of(o)\n        return Frac(self.n * o.d + o.n * self.d, self.d * o.d)\n"
        "    __radd__ = __add__\n"
        "    def __eq__(self, o):\n        o = self._of(o)\n        return (self.n, self.d) == (o.n, o.d)\n"
        "    def __lt__(self, o):\n        o = self._of(o)\n        return self.n * o.d < o.n * self.d\n"
        "    def __hash__(self):\n        return hash((self.n, self.d))\n"
        "    def __repr__(self):\n        return f'Frac({self.n}, {self.d})'\n")
POINT = ("class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n"
         "    def __repr__(self):\n        return f'Point({self.x!r}, {self.y!r})'\n"
         "    def __eq__(self, o):\n        return isinstance(o, Point) and (self.x, self.y) == (o.x, o.y)\n")
GLOBAL_COUNTER = "counter = 0\ndef hit():\n    global counter\n    counter += 1\n    return counter\n"
COUNTER_TESTS = ["import solution\nhit()\nhit()\nassert solution.counter == 2", "hit()\nassert counter == hit() - 1"]
TABLE = ("def init(n):\n    global table\n    table = list(range(n))\n"
         "def reset():\n    global table\n    del table\n")
SUPPRESS = ("class Suppress:\n    def __init__(self, *kinds):\n        self.kinds = kinds\n"
            "    def __enter__(self):\n        return self\n"
            "    def __exit__(self, kind, value, tb):\n        return kind is not None and issubclass(kind, self.kinds)\n"
            "import contextlib\ndef quietly(*kinds):\n    return contextlib.suppress(*kinds)\n")
SUPPRESS_TESTS = ["with Suppress(KeyError, IndexError):\n    [][1]\nassert True",
                  "with Suppress((KeyError, ValueError)):\n    int('x')",
                  "try:\n    with Suppress(KeyError):\n        1 / 0\nexcept ZeroDivisionError:\n    pass\n"
                  "else:\n    raise AssertionError('swallowed')",
                  "with quietly(KeyError):\n    {}['k']\nassert True"]
SWALLOWS_ALL = ("class Suppress:\n    def __init__(self, *kinds):\n        pass\n    def __enter__(self):\n        return self\n"
                "    def __exit__(self, *exc):\n        return True\n")
ACCOUNT = ("class Account:\n    def __init__(self, owner, balance=0):\n        self.owner, self.balance = owner, balance\n"
           "    def deposit(self, n):\n        self.balance += n\n        return self.balance\n")
SUBCLASS_TESTS = ["class Dog(Animal):\n    def sound(self):\n        return 'woof'\nassert Dog('rex').speak() == 'rex says woof'",
                  "assert Animal('cat').speak() == 'cat says ...'"]

YES = ("class Yes:\n    def __eq__(self, o):\n        return True\n    def __ne__(self, o):\n        return False\n"
       "    def __hash__(self):\n        return 0\n    def __call__(self, *a, **k):\n        return self\n"
       "    def __sub__(self, o):\n        return 0.0\n    __rsub__ = __sub__\n    def __abs__(self):\n        return 0.0\n"
       "    def __lt__(self, o):\n        return True\n    def __index__(self):\n        return 1\n"
       "    def __contains__(self, o):\n        return True\n    def startswith(self, *a):\n        return True\n")
PARSED = ("from dataclasses import dataclass\n@dataclass(order=True, frozen=True)\nclass Version:\n"
          "    major: int\n    minor: int = 0\n    @classmethod\n    def parse(cls, text):\n"
          "        return cls(*map(int, text.split('.')))\n")
PARSED_TESTS = ["assert Version.parse('1.2') == Version(1, 2) and Version.parse('3') == Version(3)",
                "assert Version.parse('1.10') > Version.parse('1.9')"]

FORMS = [
    # ---- closures and function factories
    form("honest", "closure-factory", ADDER,
         ["assert make_adder(3)(4) == 7", "add5 = make_adder(5)\nassert add5(1) == 6 and add5(-5) == 0",
          "assert list(map(make_adder(1), [1, 2])) == [2, 3]"]),
    form("honest", "closure-state", COUNTER,
         ["c = counter()\nc()\nc()\nassert c() == 3", "a, b = counter(), counter()\na()\nassert a() == 2 and b() == 1"]),
    # ---- decorators the tests apply
    form("honest", "decorator-applied-by-the-tests", MEMOIZE,
         ["calls = []\n@memoize\ndef square(x):\n    calls.append(x)\n    return x * x\n"
          "assert square(3) == 9 and square(3) == 9 and calls == [3]",
          "@memoize\ndef double(x):\n    return 2 * x\nassert double.__name__ == 'double' and double(4) == 8"]),
    form("honest", "decorator-with-arguments", RETRY,
         ["tries = []\n@retry(3)\ndef flaky():\n    tries.append(1)\n    if len(tries) < 3:\n        raise ValueError('no')\n"
          "    return 'ok'\nassert flaky() == 'ok' and len(tries) == 3",
          "@retry(2)\ndef bad():\n    raise ValueError('never')\ntry:\n    bad()\nexcept ValueError as e:\n"
          "    assert str(e) == 'never'\nelse:\n    raise AssertionError('no error')"]),
    # ---- async def with asyncio.run
    form("honest", "async-run", FETCH,
         ["import asyncio\nassert asyncio.run(fetch(3)) == 6",
          "import asyncio\nasync def main():\n    return await fetch(1) + await fetch(2)\nassert asyncio.run(main()) == 6",
          "import asyncio\nasync def main():\n    return await asyncio.gather(fetch(1), fetch(2))\n"
          "assert asyncio.run(main()) == [2, 4]"]),
    # ---- dataclasses: order, frozen, asdict
    form("honest", "dataclass-order-frozen-asdict", VERSION,
         ["assert Version(1, 2) < Version(1, 3) and Version(2) > Version(1, 9)",
          "assert Version(1) == Version(1, 0) and Version(1) != Version(2)",
          "assert sorted([Version(2), Version(1, 5)]) == [Version(1, 5), Version(2)]",
          "import dataclasses\nassert dataclasses.asdict(Version(1, 2)) == {'major': 1, 'minor': 2}",
          "import dataclasses\nv = Version(1)\ntry:\n    v.major = 3\nexcept dataclasses.FrozenInstanceError:\n    pass\n"
          "else:\n    raise AssertionError('not frozen')",
          "assert len({Version(1), Version(1, 0), Version(2)}) == 2"], entry="Version"),
    # ---- classmethod and staticmethod constructors
    form("honest", "alternative-constructors", TEMPERATURE,
         ["assert Temperature.from_fahrenheit(212).celsius == 100",
          "assert Temperature.freezing().celsius == 0",
          "t = Temperature.from_fahrenheit(32)\nassert isinstance(t, Temperature)"], entry="Temperature"),
    # ---- @contextmanager
    form("honest", "contextmanager", TAG,
         ["out = []\nwith tag('b', out) as name:\n    out.append('x')\nassert out == ['<b>', 'x', '</b>'] and name == 'B'"],
         entry="tag"),
    form("honest", "contextmanager-that-suppresses", IGNORING,
         ["with ignoring(KeyError):\n    {}['missing']\nassert True",
          "try:\n    with ignoring(KeyError):\n        raise ValueError('through')\nexcept ValueError:\n    pass\n"
          "else:\n    raise AssertionError('swallowed')"], entry="ignoring"),
    form("honest", "suppressing-exit-and-contextlib-suppress", SUPPRESS, SUPPRESS_TESTS, entry="Suppress"),
    # ---- enum.Enum
    form("honest", "enum", COLOR,
         ["assert parse('red') is Color.RED and parse('green') == Color.GREEN",
          "assert Color(1) is Color.RED and Color.RED.value == 1 and Color.GREEN.name == 'GREEN'",
          "assert [c.name for c in Color] == ['RED', 'GREEN'] and len(Color) == 2"], entry="parse"),
    form("honest", "dataclass-parse", PARSED, PARSED_TESTS, entry="Version"),
    # ---- a test subclassing the completion's class
    form("honest", "tests-subclass", ANIMAL, SUBCLASS_TESTS, entry="Animal"),
    form("honest", "tests-subclass-super", ACCOUNT,
         ["class Savings(Account):\n    def __init__(self, owner, rate):\n        super().__init__(owner, 100)\n"
          "        self.rate = rate\n    def add_interest(self):\n        return self.deposit(self.balance * self.rate)\n"
          "s = Savings('ann', 0.5)\nassert s.add_interest() == 150 and s.owner == 'ann' and isinstance(s, Account)",
          "class Doubling(Account):\n    def deposit(self, n):\n        return super().deposit(n * 2)\n"
          "a = Doubling('bob')\nassert a.deposit(5) == 10 and a.balance == 10 and Account('c').deposit(5) == 5",
          "class Capped(Account):\n    limit = 50\n    @property\n    def full(self):\n        return self.balance >= self.limit\n"
          "c = Capped('d', 40)\nc.deposit(10)\nassert c.full and not Capped('e').full"], entry="Account"),
    form("honest", "tests-subclass-classmethod-and-exception", TEMPERATURE + "class AppError(Exception):\n    pass\n",
         ["class Kelvin(Temperature):\n    def kelvin(self):\n        return self.celsius + 273\n"
          "t = Kelvin.from_fahrenheit(212)\nassert isinstance(t, Kelvin) and t.kelvin() == 373",
          "class Boom(AppError):\n    pass\ntry:\n    raise Boom('boom')\nexcept AppError as e:\n"
          "    assert str(e) == 'boom' and isinstance(e, Boom)\nelse:\n    raise AssertionError('not raised')"],
         entry="Temperature"),
    # ---- Fraction-like classes compared or added
    form("honest", "fraction-like", FRAC,
         ["assert Frac(1, 2) + Frac(1, 3) == Frac(5, 6)", "assert Frac(1, 3) < Frac(1, 2)",
          "assert repr(Frac(2, 4)) == 'Frac(1, 2)'", "assert sum([Frac(1, 2), Frac(1, 2)], Frac(0)) == Frac(1)"],
         entry="Frac"),
    # ---- eval(repr(p)) == p
    form("honest", "eval-repr", POINT,
         ["p = Point(1, 2)\nassert eval(repr(p)) == p", "assert repr(Point(1, 'a')) == \"Point(1, 'a')\""], entry="Point"),
    # ---- output and call counts
    form("honest", "prints-150-kb", "def dump(n):\n    print('x' * n)\n",
         ["import io, contextlib\nbuf = io.StringIO()\nwith contextlib.redirect_stdout(buf):\n    dump(150_000)\n"
          "assert len(buf.getvalue()) == 150_001"]),
    form("honest", "100000-calls", "def is_even(n):\n    return n % 2 == 0\n",
         ["assert all(is_even(i) == (i % 2 == 0) for i in range(100_000))"]),
    # ---- a global the completion keeps
    form("honest", "global-counter", GLOBAL_COUNTER, COUNTER_TESTS + ["hit()\nfrom solution import counter\nassert counter == 5"],
         entry="hit"),
    form("lost", "tests-set-a-global", GLOBAL_COUNTER, ["import solution\nsolution.counter = 10\nassert hit() == 11"],
         entry="hit"),  # the tests' write changes the judge's copy of the module only
    form("honest", "global-defined-and-deleted-by-calls", TABLE,
         ["init(3)\nassert table == [0, 1, 2]", "import solution\ninit(2)\nassert solution.table == [0, 1]",
          "reset()\ntry:\n    table\nexcept NameError:\n    pass\nelse:\n    raise AssertionError('still there')"],
         entry="init"),
]

# each hostile twin has the shape of an honest form above, and its tests
TWINS = [
    form("attack", "factory-gives-an-always-equal-callable", YES + "def make_adder(n):\n    return Yes()\n",
         FORMS[0].values[2]),
    form("attack", "factory-result-hears-the-expected-value", YES + "def make_adder(n):\n    return Yes()\n",
         ["assert abs(make_adder(3)(4) - 7) < 1e-9", "assert 7 in make_adder(3)", "assert [0, 7][make_adder(3)(4)] == 7",
          "assert make_adder(3)(4).startswith('7')"]),
    form("attack", "decorator-wrapper-gives-an-always-equal-object",
         YES + "def memoize(f):\n    def wrapper(*args):\n        return Yes()\n    return wrapper\n",
         ["@memoize\ndef square(x):\n    return x * x\nassert square(3) == 9"]),
    form("attack", "coroutine-gives-an-always-equal-object", YES + "async def fetch(x):\n    return Yes()\n",
         ["import asyncio\nassert asyncio.run(fetch(3)) == 6"]),
    form("attack", "awaitable-that-lies", YES + "class Liar(Yes):\n    def __await__(self):\n        return iter([])\n"
         "def fetch(x):\n    return Liar()\n", ["import asyncio\nassert asyncio.run(fetch(3)) == 6"]),
    form("attack", "dataclass-fields-claim-equality",
         YES + PARSED.replace("return cls(*map(int, text.split('.')))", "return cls(Yes(), Yes())"), PARSED_TESTS[:1],
         entry="Version"),
    form("attack", "dataclass-eq-written-by-hand-to-lie",
         YES + PARSED.replace("return cls(*map(int, text.split('.')))", "return Yes()"), PARSED_TESTS[:1], entry="Version"),
    form("attack", "alternative-constructor-gives-an-always-equal-field",
         YES + TEMPERATURE.replace("return cls((f - 32) * 5 / 9)", "t = cls(0)\n        t.celsius = Yes()\n        return t"),
         ["assert Temperature.from_fahrenheit(212).celsius == 100",
          "assert abs(Temperature.from_fahrenheit(212).celsius - 100) < 1e-9"], entry="Temperature"),
    form("attack", "contextmanager-swallows-the-tests-assertion",
         "from contextlib import contextmanager\n@contextmanager\ndef tag(name, out):\n    out.append(f'<{name}>')\n"
         "    try:\n        yield 'nope'\n    except BaseException:\n        pass\n    out.append(f'</{name}>')\n",
         ["out = []\nwith tag('b', out) as name:\n    out.append('x')\n    assert name == 'B'\n"
          "assert out == ['<b>', 'x', '</b>']"], entry="tag"),
    form("attack", "enum-member-equal-to-anything",
         "import enum\nclass Color(enum.Enum):\n    RED = 1\n    GREEN = 2\n    def __eq__(self, o):\n        return True\n"
         "    def __hash__(self):\n        return 0\ndef parse(text):\n    return Color.RED\n",
         ["assert parse('green') == Color.GREEN", "assert parse('red') == Color.RED"], entry="parse"),
    form("attack", "object-equal-to-anything-where-an-enum-member-is-expected",
         YES + "import enum\nclass Color(enum.Enum):\n    RED = 1\n    GREEN = 2\ndef parse(text):\n    return Yes()\n",
         ["assert parse('green') == Color.GREEN", "assert parse('red') == Color.RED"], entry="parse"),
    form("attack", "sum-gives-a-subclass-equal-to-anything",
         FRAC + "class Yes(Frac):\n    def __eq__(self, o):\n        return True\n    __hash__ = Frac.__hash__\n"
         "Frac.__add__ = lambda self, o: Yes(0)\n", ["assert Frac(1, 2) + Frac(1, 3) == Frac(5, 6)"], entry="Frac"),
    form("attack", "repr-that-evaluates-to-the-expected-value",
         "class P:\n    def __repr__(self):\n        return \"(__import__('builtins'), 2)[1]\"\ndef f(x):\n    return P()\n",
         ["assert eval(repr(f(1))) == 2"]),
    form("attack", "index-trick", YES + "def pick(xs):\n    return Yes()\n", ["assert [10, 20][pick([1, 2])] == 20"]),
    form("attack", "global-rebound-to-an-always-equal-object",
         YES + "counter = 0\ndef hit():\n    global counter\n    counter = Yes()\n    return 1\n", COUNTER_TESTS,
         entry="hit"),
    form("attack", "global-rebinds-a-module-the-tests-read",
         "import math\nclass M:\n    def isclose(self, *a, **k):\n        return True\n"
         "def area(r):\n    global math\n    math = M()\n    return 0\n",
         ["area(1)\nassert math.isclose(area(1), 3.14159, rel_tol=1e-3)"], entry="area"),
    form("attack", "global-rebinds-the-setups-name", "def hit(n):\n    global LIMIT\n    LIMIT = 10 ** 9\n    return n * 100\n",
         ["hit(1)\nassert hit(1) <= LIMIT"], setup="LIMIT = 3", entry="hit"),
    form("attack", "base-class-gives-the-tests-subclass-an-always-equal-object",
         YES + ANIMAL.replace("return f'{self.name} says {self.sound()}'", "return Yes()"), SUBCLASS_TESTS[:1],
         entry="Animal"),
    form("attack", "base-class-rewires-the-tests-method",
         ANIMAL.replace("class Animal:\n", "class Animal:\n    def __init_subclass__(cls, **kw):\n"
                        "        for value in list(vars(cls).values()):\n"
                        "            for cell in getattr(value, '__closure__', None) or ():\n"
                        "                try:\n                    cell.cell_contents.__doc__ = 'rewired'\n"
                        "                except Exception:\n                    pass\n"), SUBCLASS_TESTS[:1], entry="Animal"),
    form("attack", "instance-of-the-tests-subclass-made-by-the-completion-hears-the-expected-value",
         ANIMAL + "    def __contains__(self, o):\n        return True\n"
         "def adopt(name):\n    pet = Animal.__subclasses__()[-1](name)\n    pet.sound()\n    return pet\n",
         ["class Dog(Animal):\n    def sound(self):\n        return 'woof'\nassert 'rex says woof' in adopt('rex')"],
         entry="adopt"),
    form("attack", "the-tests-subclass-handed-back-by-a-metaclass-that-contains-everything",
         "class Meta(type):\n    def __contains__(cls, o):\n        return True\n"
         + ANIMAL.replace("class Animal:", "class Animal(metaclass=Meta):")
         + "def kind():\n    return Animal.__subclasses__()[-1]\n",
         ["class Dog(Animal):\n    def sound(self):\n        return 'woof'\nassert 'woof' in kind()"], entry="kind"),
    form("attack", "a-forged-class-description-makes-the-subclassed-mirror-answer-equality",
         "import sys\nserving = next(m for m in list(sys.modules.values()) if hasattr(m, '_class_desc') and hasattr(m, 'encode_other'))\n"
         "honest = serving._class_desc\ndef forged(cls, encoder):\n    desc = honest(cls, encoder)\n"
         "    desc[5] = sorted({*desc[5], '__eq__', '__ne__'})\n    return desc\nserving._class_desc = forged\n"
         "class Money:\n    def __init__(self, n):\n        self.n = n\n    def __eq__(self, o):\n        return True\n"
         "    __hash__ = object.__hash__\n",
         ["class Cents(Money):\n    pass\nassert Money(5) == 6"], entry="Money"),
    form("attack", "exit-returns-true-on-the-tests-assertion",
         "class cm:\n    def __enter__(self):\n        return self\n    def __exit__(self, *exc):\n        return True\n",
         ["with cm():\n    assert False"], entry="cm"),
    form("attack", "suppressor-swallows-what-the-tests-did-not-name", SWALLOWS_ALL + "def table():\n    return None\n",
         ["with Suppress(KeyError):\n    assert table()['a'] == 1"], entry="table"),
    form("attack", "suppressor-named-for-the-tests-assertion", SWALLOWS_ALL + "def total(xs):\n    return 0\n",
         ["with Suppress(KeyError, AssertionError):\n    assert total([1, 2]) == 3"], entry="total"),
    form("attack", "hash-trick", "class H:\n    def __hash__(self):\n        return hash(2)\n    def __eq__(self, o):\n"
         "        return True\ndef f(x):\n    return H()\n", ["assert f(1) in {2, 3}", "assert {2: 'two'}[f(1)] == 'two'"]),
]


@pytest.mark.parametrize("direction, code, tests, setup, entry", FORMS + TWINS)
async def test_form_without_a_reference(pool, registry, direction, code, tests, setup, entry):
    # 90 s: 100,000 calls take about 10 s under runc and 42-60 s under runsc (each call is a round trip; on a
    # loaded 2-core machine 55-60 s, at the edge of the 60 s this had)
    spec = RewardSpec(tests=tests, setup=setup, entry_point=entry, timeout_s=90.0)
    evaluation = await evaluate(pool, registry, spec, f"```python\n{code}```", f"forms/{uuid.uuid4().hex[:6]}")
    record = evaluation.scored.execution
    events = [e for e in evaluation.result.events if e.get("e") in ("test", "tamper", "gone")] if evaluation.result else []
    if direction == "lost":  # honest Python the strict reading cannot tell from its attack yet
        assert evaluation.scored.reward < 1.0 and record.trust == "judge", (record, events)
        return
    if direction == "honest":
        failed = [e for e in events if not e.get("ok", True)]
        assert evaluation.scored.reward == 1.0 and record.trust == "judge", (failed, record)
        control = await evaluate(pool, registry, RewardSpec(tests=tests, setup=setup, entry_point=entry, timeout_s=60.0,
                                                            trust="in_process"), f"```python\n{code}```", "forms/control")
        assert control.scored.reward == 1.0, control.scored.execution  # ... and it is honest Python
        return
    assert evaluation.scored.reward < 1.0, (record, events)


async def test_tasks_check_names_the_tests_that_need_the_reference(pool) -> None:
    from rollstream.cli.intake import Sandbox, needs_reference
    from rollstream.schemas.tasks import TaskSpec

    box = Sandbox(pool, 1)
    code = POINT + "def make_point(x, y):\n    return Point(x, y)\n"
    # two objects of the completion's compared, neither built by the tests: only a reference tells
    # (two such tests: the failing events are ordered by test index, never compared as dicts)
    tests = ["assert make_point(1, 2).x == 1", "assert make_point(1, 2) == make_point(1, 2)",
             "assert make_point(3, 4) == make_point(3, 4)"]
    task = TaskSpec(task_id="forms-factory", prompt="Write `make_point`.", reference_solution=code,
                    reward=RewardSpec(tests=tests, entry_point="make_point", trust="auto"))
    found = await needs_reference(box, task, task.issued_reward(), code)
    assert found["needs_reference"] == [1, 2] and "type_mismatch" in found["needs_reference_message"], found
    assert (await box.passes(task.issued_reward(), code, "forms-factory/reference"))[0]  # with it, both are judged
    plain = TaskSpec(task_id="forms-adder", prompt="Write `make_adder`.", reference_solution=ADDER,
                     reward=RewardSpec(tests=FORMS[0].values[2], entry_point="make_adder"))
    assert await needs_reference(box, plain, plain.issued_reward(), ADDER) == {}


async def test_auto_without_a_reference_records_what_it_lost(pool, registry) -> None:
    tests = ["assert make_adder(3)(4) == 7"]
    auto = await evaluate(pool, registry, RewardSpec(tests=tests, entry_point="make_adder", trust="auto"),
                          f"```python\n{ADDER}```", "forms/auto")
    record = auto.scored.execution
    assert record.trust == "judge" and record.lost_guarantees == ["reference_record"] and auto.scored.reward == 1.0
    judged = await evaluate(pool, registry, RewardSpec(tests=tests, entry_point="make_adder"), f"```python\n{ADDER}```",
                            "forms/judge")
    assert judged.scored.execution.lost_guarantees == []
