"""The judge and the candidate on the host (the runtime modules are stdlib-only and run the same
here): whole jobs with both sides forked, as the sandbox's zygotes fork them. What Python means
survives the boundary for honest code; what an attacker sends is refused. The same forms and
attacks through the real sandbox are in test_verdicts.py and test_tamper.py."""

from __future__ import annotations

import json

import pytest

from rollstream.consumers.executor import jobs
from tests.consumers.executor.judged import failures, judged, judged_against, verdicts

pytestmark = pytest.mark.unit


def test_tested_names_and_modules() -> None:
    tests = ("assert f(1) == g(2)", "s = Stack()\nassert len(s) == 0", "with raises(ValueError):\n    h()")
    assert jobs.tested_names(tests, "f") == ("Stack", "f", "g", "h")  # `s` is the tests' own
    assert jobs.tested_names(("try:\n    result = parse('1')\nexcept ValueError:\n    pass\nassert result == 1",),
                                "parse") == ("parse",)
    assert jobs.tested_names(("assert 1 +",), "f") == ("f",)  # a broken test is the judge's to report
    assert "len" in jobs.tested_names(("assert len(1)",), "len")  # the entry point always
    modules = ("assert math.isclose(f(2), 1.4)", "import os\nassert os.sep", "json = 1\nassert json",
               "def re():\n    pass\nre()", "assert collections.Counter(f()) == {}")
    assert jobs.tested_modules(modules) == ("collections", "math")  # read, never bound by the tests


def test_functions_and_values_keep_their_meaning() -> None:
    code = (
        "from collections import namedtuple, Counter, defaultdict, OrderedDict, deque\n"
        "from decimal import Decimal\nfrom fractions import Fraction\nimport datetime, enum\n"
        "P = namedtuple('P', 'x y')\n"
        "class Color(enum.IntEnum):\n    RED = 1\n"
        "def add(a, b):\n    return a + b\n"
        "def squares(n):\n    for i in range(n):\n        yield i * i\n"
        "def power(n):\n    return 2 ** n\n"
        "def values():\n"
        "    d = defaultdict(list)\n    d['a'].append(1)\n"
        "    return [P(1, 2), Counter('aab'), d, OrderedDict(b=1, a=2), deque([1]), Decimal('1.5'),\n"
        "            Fraction(1, 3), 1 + 2j, range(3), datetime.date(2020, 1, 2), Color.RED]\n"
        "def later(day):\n    return day + datetime.timedelta(days=1)\n"
        "def apply(f, xs, key=None):\n    return sorted(map(f, xs), key=key)\n"
    )
    tests = [
        "assert add(1, 2) == 3 and add('a', 'b') == 'ab' and add((1,), (2,)) == (1, 2) and add(0.5, 1.5) == 2",
        "assert list(squares(4)) == [0, 1, 4, 9] and sum(squares(3)) == 5",
        "g = squares(3)\nassert next(g) == 0 and next(g) == 1 and list(g) == [4]",
        "assert power(5000) == 2 ** 5000",
        "from collections import Counter, OrderedDict, deque\nfrom decimal import Decimal\nfrom fractions import Fraction\n"
        "import datetime\n"
        "p, c, d, o, q, dec, fr, z, r, day, red = values()\n"
        "assert p == (1, 2) and p.x == 1 and isinstance(p, tuple) and isinstance(p, P)\n"
        "assert c == {'a': 2, 'b': 1} and c.most_common(1) == [('a', 2)] and type(c) is Counter\n"
        "assert d['a'] == [1] and d['new'] == []\n"
        "assert list(o) == ['b', 'a'] and o != OrderedDict(a=2, b=1)\n"
        "assert q == deque([1]) and dec == Decimal('1.5') and fr == Fraction(1, 3) and z == 1 + 2j\n"
        "assert r == range(3) and day == datetime.date(2020, 1, 2)\n"
        "assert red == 1 and red is Color.RED and str(red) == str(Color.RED)",
        "import datetime\nassert later(datetime.date(2020, 2, 28)) == datetime.date(2020, 2, 29)",
        "assert apply(lambda x: -x, [1, 3, 2]) == [-3, -2, -1]\n"
        "assert apply(str, ['b', 'A'], key=str.lower) == ['A', 'b']\n"
        "seen = []\napply(seen.append, [1])\nassert seen == [1]",
    ]
    events, status = judged_against(code, code, tests, entry_point="add")
    assert status == 0 and verdicts(events) == [True] * len(tests), failures(events)
    assert events[0] == {"e": "compiled"} and events[1] == {"e": "code_ok"} and events[-1] == {"e": "done"}


def test_references_identity_and_in_place_changes_are_pythons() -> None:
    code = (
        "def ident(x):\n    return x\n"
        "def sort_it(a):\n    a.sort()\n"
        "def append_then_fail(a):\n    a.append(1)\n    raise ValueError('after')\n"
        "class Box:\n    def __init__(self):\n        self._items = []\n"
        "    def items(self):\n        return self._items\n"
        "    def size(self):\n        return len(self._items)\n"
        "    def keep(self, x):\n        self._items.append(x)\n"
        "def reverse(head):\n    prev = None\n    while head:\n        head.next, prev, head = prev, head, head.next\n"
        "    return prev\n"
    )
    setup = "class Node:\n    def __init__(self, val, next=None):\n        self.val, self.next = val, next\n"
    tests = [
        "a = [3, 1]\nassert ident(a) is a and ident(a) == [3, 1]",
        "a = [[1], [2]]\nb = ident(a)\nassert not (b is not a)",  # a deep-copy test fails the identity function
        "a = [3, 1, 2]\nsort_it(a)\nassert a == [1, 2, 3]",
        "a = list(range(10000, 0, -1))\nsort_it(a)\nassert a == sorted(a) and len(a) == 10000",
        "a = []\ntry:\n    append_then_fail(a)\nexcept ValueError:\n    pass\nassert a == [1]",
        "b = Box()\nx = b.items()\nx.append(99)\nassert b.size() == 1",  # aliasing an internal list
        "b = Box()\nmine = [1]\nb.keep(mine)\nmine.append(2)\nassert b.items() == [[1, 2]] and b.items()[0] is mine",
        "n = Node(1, Node(2, Node(3)))\nr = reverse(n)\nassert (r.val, r.next.val, r.next.next.val) == (3, 2, 1)\n"
        "assert n.next is None and r.next.next is n",
    ]
    events, _ = judged_against(code, code, tests, setup=setup, entry_point="ident")
    assert verdicts(events) == [True] * len(tests), failures(events)


def test_classes_exceptions_and_iterators_through_mirrors() -> None:
    code = (
        "class InsufficientFunds(ValueError):\n    pass\n"
        "class Account:\n"
        "    def __init__(self, balance):\n        self.balance = balance\n"
        "    def withdraw(self, x):\n"
        "        if x > self.balance:\n            raise InsufficientFunds('no money', x)\n"
        "        self.balance -= x\n        return self.balance\n"
        "class V:\n"
        "    def __init__(self, x, y):\n        self.x, self.y = x, y\n"
        "    def __add__(self, o):\n        return V(self.x + o.x, self.y + o.y)\n"
        "    def __mul__(self, k):\n        return V(self.x * k, self.y * k)\n"
        "    __rmul__ = __mul__\n"
        "    def __eq__(self, o):\n        return isinstance(o, V) and (self.x, self.y) == (o.x, o.y)\n"
        "    def __hash__(self):\n        return hash((self.x, self.y))\n"
        "class Countdown:\n"
        "    def __init__(self, n):\n        self.n = n\n"
        "    def __iter__(self):\n        return self\n"
        "    def __next__(self):\n"
        "        if self.n == 0:\n            raise StopIteration\n"
        "        self.n -= 1\n        return self.n\n"
        "def stop():\n    raise StopIteration\n"
        "def bad(d):\n    return d['a']\n"
        "def decode():\n    return b'\\xff'.decode()\n"
    )
    tests = [
        "a = Account(5)\nwith raises(InsufficientFunds):\n    a.withdraw(9)\nassert a.withdraw(2) == 3",
        "try:\n    Account(1).withdraw(5)\nexcept ValueError as e:\n    assert e.args == ('no money', 5) and isinstance(e, InsufficientFunds)",
        "assert V(1, 2) + V(3, 4) == V(4, 6) and 2 * V(1, 1) == V(2, 2) and len({V(1, 2), V(1, 2), V(0, 0)}) == 2",
        "assert list(Countdown(3)) == [2, 1, 0] and next(Countdown(2)) == 1 and isinstance(Countdown(1), Countdown)",
        "assert all(map(lambda _: stop(), [1]))",  # StopIteration from a call ends no iteration (PEP 479)
        "try:\n    bad({})\nexcept KeyError as e:\n    assert e.args[0] == 'a'",
        "with raises(ValueError):\n    decode()",
    ]
    events, _ = judged_against(code, code, tests, entry_point="Account")
    assert verdicts(events) == [True, True, True, True, False, True, True], failures(events)
    assert failures(events)[0]["type"] == "RuntimeError"


def test_printed_output_programs_and_the_tests_overrides() -> None:
    code = (
        "import sys, random\n"
        "def warn(m):\n    print(m, file=sys.stderr)\n    print('out', end='')\n"
        "def ask():\n    return int(input()) + int(input('second? '))\n"
        "def roll():\n    return random.randint(1, 6)\n"
        "def args():\n    return sys.argv[1:]\n"
    )
    tests = [
        "import contextlib, io\ne, o = io.StringIO(), io.StringIO()\n"
        "with contextlib.redirect_stderr(e), contextlib.redirect_stdout(o):\n    warn('hi')\n"
        "assert (e.getvalue(), o.getvalue()) == ('hi\\n', 'out')",
        "from unittest import mock\nwith mock.patch('builtins.input', side_effect=['3', '4']) as fake:\n"
        "    assert ask() == 7\nassert fake.call_count == 2",
        "import sys, io\nsys.stdin = io.StringIO('5\\n6\\n')\nassert ask() == 11",
        "from unittest import mock\nwith mock.patch('random.randint', return_value=4):\n    assert roll() == 4",
        "import sys\nsys.argv = ['prog', '--n', '3']\nassert args() == ['--n', '3']",
    ]
    events, _ = judged_against(code, code, tests, entry_point="warn")
    assert verdicts(events) == [True] * len(tests), failures(events)
    program = ("import sys\nstdin = open(0)\nn = int(stdin.readline())\nrows = [stdin.readline() for _ in range(n)]\n"
               "print(sum(int(x) for row in rows for x in row.split()))\nsys.stdout.buffer.write(b'end\\n')\n")
    tests = ["assert run_program('2\\n1 2\\n3 4\\n') == '10\\nend\\n'", "assert run_program(b'0\\n') == '0\\nend\\n'",
             "assert run_program('1\\n1\\n') == '2\\n'"]
    events, _ = judged(program, tests, program=True)
    assert verdicts(events) == [True, True, False]


def test_the_tasks_own_helpers_and_modules_stay_the_judges() -> None:
    setup = "def encode(s):\n    return s[::-1]\ndef decode(s):\n    '''the stub to complete'''\n"
    tests = ["def check(candidate):\n    assert candidate(encode('abc')) == 'abc'\ncheck(decode)"]
    cheat = "def encode(s):\n    return s\ndef decode(s):\n    return s\n"  # redefines the helper
    assert verdicts(judged(cheat, tests, setup=setup, entry_point="decode")[0]) == [False]
    assert verdicts(judged("def decode(s):\n    return s[::-1]\n", tests, setup=setup, entry_point="decode")[0]) == [True]
    assert verdicts(judged("x = 1\n", tests, setup=setup, entry_point="decode")[0]) == [False]  # the stub is no answer
    code = "import math, json as js\nimport os.path\nimport types\nsys = types.ModuleType('unittest.__main__')\n"
    tests = ["assert math.sqrt(4) == 2", "assert os.path.join('a', 'b') == 'a/b'", "assert js", "assert sys"]
    # math, os and json (as js): the judge's own imports; sys is bound to another module: never bound
    assert verdicts(judged(code, tests)[0]) == [True, True, True, False]


def test_unittest_forms() -> None:
    code = "def add(a, b):\n    return a + b\n"
    wrong = "def add(a, b):\n    return a - b\n"
    main = ("import unittest\nclass T(unittest.TestCase):\n"
            "    def test_add(self):\n        self.assertEqual(add(1, 2), 3)\n"
            "    def test_zero(self):\n        self.assertEqual(add(0, 0), 0)\nunittest.main()")
    runner = ("import unittest, io\nclass T(unittest.TestCase):\n"
              "    def test_add(self):\n        self.assertEqual(add(2, 2), 4)\n"
              "result = unittest.TextTestRunner(stream=io.StringIO()).run(unittest.defaultTestLoader.loadTestsFromTestCase(T))\n"
              "assert result.wasSuccessful()")
    quiet = main.replace("unittest.main()", "unittest.main(exit=False)")  # a failure must still fail it
    assert verdicts(judged(code, [main, runner, quiet], entry_point="add")[0]) == [True, True, True]
    assert verdicts(judged(wrong, [main, runner, quiet], entry_point="add")[0]) == [False, False, False]


def test_completion_objects_never_answer_for_plain_data() -> None:
    code = (
        "class Yes:\n"
        "    def __eq__(self, other): return True\n"
        "    def __ne__(self, other): return False\n"
        "    def __lt__(self, other): return True\n"
        "    def __contains__(self, other): return True\n"
        "    def startswith(self, *args): return True\n"
        "    __hash__ = object.__hash__\n"
        "def f(x):\n    return Yes()\n"
    )
    tests = ["assert f(1) == 2", "assert 2 == f(1)", "assert f(1) in [2]", "assert f(1) < 3",
             "assert f(1) == f(2)", "assert 3 in f(1)", "assert f(1).startswith('a')"]
    # a task that declares its entry points return objects: its objects answer for themselves only
    events, _ = judged(code, tests, entry_point="f", rules={"returns_objects": True})
    assert verdicts(events) == [False, False, False, False, True, True, True]
    # without a reference, and where the reference gives plain data, a completion object is a type mismatch
    for events, _ in (judged(code, tests, entry_point="f"),
                      judged_against("def f(x):\n    return str(x)\n", code, tests, entry_point="f")):
        assert verdicts(events) == [False] * len(tests)
        assert {e["type"] for e in failures(events)} == {"TypeMismatch"}


def test_what_the_reference_returns_is_recorded() -> None:
    code = ("def f(x):\n    return [x]\ndef g(n):\n    yield from range(n)\n"
            "class S:\n    def pop(self):\n        return 1\n    def me(self):\n        return self\n")
    tests = ["assert f(1) == [1]", "assert list(g(2)) == [0, 1]", "s = S()\nassert s.pop() == 1 and s.me() is s"]
    events, _ = judged(code, tests, entry_point="f", rules={"mode": "record"})
    paths = next(e for e in events if e["e"] == "paths")
    assert paths["objects"] == ["2|S().me()@", "2|S()@"]  # the generator counts as plain: its items are checked
    assert paths["names"] == ["S:o", "f:o", "g:o"] and paths["skips"] == []


def test_code_from_the_completion_runs_in_the_candidate_never_in_the_judge() -> None:
    code = (
        "import pickle\n"
        "class P:\n"
        "    def __repr__(self):\n"
        "        return \"__import__('builtins').__dict__.__setitem__('AssertionError', KeyError) or 5\"\n"
        "class Payload:\n"
        "    def __reduce__(self):\n"
        "        return (exec, ('import builtins; builtins.PWNED = 1',))\n"
        "def f():\n    return P()\n"
        "def data():\n    return pickle.dumps(Payload())\n"
        "def source():\n    return 'import builtins\\nbuiltins.PWNED = 2'\n"
        "class Point:\n"
        "    def __init__(self, x):\n        self.x = x\n"
        "    def __repr__(self):\n        return f'Point({self.x})'\n"
        "    def __eq__(self, other):\n        return isinstance(other, Point) and other.x == self.x\n"
    )
    tests = [
        "assert eval(repr(f())) == 5",
        # the pickle names exec: unpickled by the candidate, whose plain answer is never taken for it
        "import pickle\ntry:\n    pickle.loads(data())\nexcept pickle.UnpicklingError:\n    pass\nelse:\n    assert False",
        "exec(source())",
        "import builtins, pickle, copy\nassert not hasattr(builtins, 'PWNED') and AssertionError is not KeyError",
        "import copy, pickle\np = Point(3)\nassert eval(repr(p)) == p and copy.deepcopy(p) == p and copy.deepcopy(p) is not p\n"
        "assert pickle.loads(pickle.dumps(p)) == p",
        "assert eval('1 + 1') == 2\nexec('y = 3')\nassert y == 3",  # the tests' own literals run here
    ]
    events, _ = judged_against(code, code, tests, entry_point="f")
    assert verdicts(events) == [True] * len(tests), failures(events)


def test_a_candidate_that_leaves_fails_every_test_it_did_not_answer() -> None:
    code = "import os\ndef f(x):\n    if x == 2:\n        os._exit(0)\n    return x\n"
    tests = ["assert f(1) == 1", "try:\n    f(2)\nexcept BaseException:\n    pass", "assert f(3) == 3"]
    events, status = judged(code, tests, entry_point="f")
    assert status == 0 and verdicts(events) == [True, False, False]
    assert [e["i"] for e in events if e["e"] == "gone"] == [1]


def frame(message: list) -> bytes:
    data = json.dumps(message).encode()
    return len(data).to_bytes(4, "big") + data


@pytest.mark.parametrize(
    "payload, reason",
    [
        # replies written before they are asked (request ids are random: none can match)
        ("".join(f"os.write(4, {frame(['a', i, 'ok', [True], [], [], None, '', '', None])!r})\n" for i in range(8)),
         "expected the ready message"),
        # a set of 150k ints that all hash alike, as the answer to the first call
        ("M = (1 << 61) - 1\n"
         "def f(x):\n"
         "    import json\n    d = json.dumps(['a', 0, 'ok', [{'r': 100001}], [[100001, 's', [i * M for i in range(150000)]]],"
         " [], None, '', '', None]).encode()\n"
         "    os.write(4, len(d).to_bytes(4, 'big') + d)\n    import time\n    time.sleep(60)\n", "hash flooding"),
        ("os.write(4, b'\\xff\\xff\\xff\\xff')\n", "at most"),
    ],
    ids=["replies-before-asked", "hash-flood", "oversized-frame"],
)
def test_messages_honest_code_never_sends_are_tamper(payload: str, reason: str) -> None:
    code = "import os\n" + payload + ("def f(x):\n    return None\n" if "def f" not in payload else "")
    events, _ = judged(code, ["assert f(1) is True", "assert f(2) is True"], entry_point="f", timeout_s=20)
    assert verdicts(events) == [False, False]
    tamper = [e for e in events if e["e"] == "tamper"]
    assert len(tamper) == 1 and reason in tamper[0]["msg"], tamper


COUNTER = "counter = 0\ndef hit():\n    global counter\n    counter += 1\n    return counter\n"
YES = "class Yes:\n    def __eq__(self, o):\n        return True\n    __hash__ = object.__hash__\n"


def test_the_completions_globals_are_read_live() -> None:
    """A global the completion rebinds during a call reaches the tests (judge.LiveNames), checked
    where it arrives; never a name the setup defines or a module's."""
    tests = ["import solution\nhit()\nhit()\nassert solution.counter == 2", "hit()\nassert counter == hit() - 1",
             "hit()\nfrom solution import counter\nassert counter == 5"]
    assert verdicts(judged(COUNTER, tests, entry_point="hit")[0]) == [True, True, True]
    assert verdicts(judged_against(COUNTER, COUNTER, tests, entry_point="hit")[0]) == [True, True, True]
    lying = YES + COUNTER.replace("counter += 1", "counter = Yes()")
    assert verdicts(judged(lying, tests[:2], entry_point="hit")[0]) == [False, False]
    assert verdicts(judged_against(COUNTER, lying, tests[:2], entry_point="hit")[0]) == [False, False]
    log = "log = []\ndef hit(x):\n    global log\n    log = log + [x]\n    return len(log)\n"
    nested = YES + log.replace("log + [x]", "[Yes()]")  # refused inside: the call fails, and so does every later read
    assert verdicts(judged_against(log, nested, ["hit(1)\nassert log == [1]", "assert log == [1]"], entry_point="hit")[0]) \
        == [False, False]
    defined = "def init(n):\n    global table\n    table = list(range(n))\ndef reset():\n    global table\n    del table\n"
    assert verdicts(judged(defined, ["init(2)\nassert table == [0, 1]",
                                     "reset()\ntry:\n    table\nexcept NameError:\n    pass\nelse:\n    assert False"],
                           entry_point="init")[0]) == [True, True]
    rebinds = "import math\ndef hit(n):\n    global LIMIT, math\n    LIMIT, math = 10 ** 9, None\n    return n * 100\n"
    events, _ = judged(rebinds, ["hit(1)\nassert hit(1) <= LIMIT", "hit(1)\nassert math.sqrt(4) == 2"], setup="LIMIT = 3",
                       entry_point="hit")
    assert verdicts(events) == [False, True]  # the setup's LIMIT and the judge's math stay


ANIMAL = ("class Animal:\n    def __init__(self, name):\n        self.name = name\n    def speak(self):\n"
          "        return f'{self.name} says {self.sound()}'\n    def sound(self):\n        return '...'\n")


def test_the_tests_subclass_the_completions_class() -> None:
    """The tests' class derived from the completion's (crossing.Crossing.subclassed): their methods run
    here, called by the completion's; super() reaches the completion's own; what the completion
    makes of it is opaque; rewiring the tests' methods is tamper."""
    tests = ["class Dog(Animal):\n    def __init__(self, name):\n        super().__init__(name.upper())\n"
             "    def sound(self):\n        return 'woof'\n    def speak(self):\n        return super().speak() + '!'\n"
             "d = Dog('rex')\nassert d.speak() == 'REX says woof!' and isinstance(d, Animal) and d.name == 'REX'",
             "assert Animal('cat').speak() == 'cat says ...'"]
    assert verdicts(judged(ANIMAL, tests, entry_point="Animal")[0]) == [True, True]
    assert verdicts(judged_against(ANIMAL, ANIMAL, tests, entry_point="Animal")[0]) == [True, True]
    lying = YES + ANIMAL.replace("return f'{self.name} says {self.sound()}'", "return Yes()")
    assert verdicts(judged(lying, tests[:1], entry_point="Animal")[0]) == [False]
    made = ANIMAL + "    def __contains__(self, o):\n        return True\n" \
                    "def adopt(name):\n    pet = Animal.__subclasses__()[-1](name)\n    pet.sound()\n    return pet\n"
    events, _ = judged(made, ["class Dog(Animal):\n    def sound(self):\n        return 'woof'\n"
                              "assert 'rex' in adopt('rex')"], entry_point="adopt")
    assert verdicts(events) == [False] and "type_mismatch" in failures(events)[0]["msg"]
    rewires = ANIMAL.replace("class Animal:\n", "class Animal:\n    def __init_subclass__(cls, **kw):\n"
                             "        vars(cls)['sound'].__closure__[0].cell_contents.__doc__ = 'x'\n")
    events, _ = judged(rewires, tests[:1], entry_point="Animal")
    assert verdicts(events) == [False] and [e["kind"] for e in events if e["e"] == "tamper"] == ["test_object"]


def test_a_suppressing_context_manager_swallows_what_the_tests_named() -> None:
    """The completion's __exit__ may swallow an exception of the tests' own code of a class the tests
    named making it (crossing.Crossing.may_suppress); never their assertion, nor what they did not name."""
    code = ("class Suppress:\n    def __init__(self, *kinds):\n        self.kinds = kinds\n    def __enter__(self):\n"
            "        return self\n    def __exit__(self, kind, value, tb):\n"
            "        return kind is not None and issubclass(kind, self.kinds)\n")
    tests = ["with Suppress(KeyError):\n    {}['k']", "with Suppress((IndexError, ValueError)):\n    int('x')",
             "try:\n    with Suppress(KeyError):\n        1 / 0\nexcept ZeroDivisionError:\n    pass\nelse:\n    assert False"]
    assert verdicts(judged(code, tests, entry_point="Suppress")[0]) == [True, True, True]
    everything = code.replace("return kind is not None and issubclass(kind, self.kinds)", "return True")
    attacks = ["with Suppress(KeyError):\n    assert {}.get('k')['a'] == 1", "with Suppress(KeyError, AssertionError):\n    assert 1 == 2",
               "with Suppress():\n    assert False"]
    assert verdicts(judged(everything, attacks, entry_point="Suppress")[0]) == [False, False, False]
