"""Verdicts through the real Docker sandbox, from both sides (docs/executor.md, "The judge").

* Honest code written the way people write Python scores full under the judge, in every test
  form: functions (MBPP-style assert lists, HumanEval-style checks), classes (LeetCode-style
  ``class Solution``), printed output, stdin programs, in-place mutation, expected exceptions,
  and ``unittest.TestCase`` tests. Each task carries its reference (the honest code itself), so
  the reference check and its plain calls are in force, as in a run.
* Wrong code that attacks its verdict scores below full, and nothing it does reaches ``/work`` or
  a later job: a probe job in the same pool finds the sandbox clean after each attack.
* A judge compromised on purpose (a test-only hook) changes nothing of the next job.
* HumanEval: every canonical solution full, ``return None`` never.
"""

from __future__ import annotations

import asyncio
import io
import json
import uuid

import msgspec
import pytest

from rollstream.config import Config, ExecutorConfig
from rollstream.consumers.executor.jobs import Job
from rollstream.consumers.executor.pool import DockerSandboxPool
from rollstream.consumers.executor.reference import ReferenceChecks
from rollstream.consumers.executor.rewards import RewardRegistry
from rollstream.consumers.executor.score import Evaluation, evaluate, score_file
from rollstream.schemas.events import RewardSpec
from rollstream.schemas.tasks import TaskSpec

pytestmark = pytest.mark.sandbox


def honest(name, form, code, tests, *, setup="", program=False, entry=""):
    return pytest.param(form, code, tests, setup, program, entry, id=f"{form}-{name}")


LISTNODE = "class ListNode:\n    def __init__(self, val=0, next=None):\n        self.val = val\n        self.next = next\n"
BUILD = ("def build(xs):\n    head = None\n    for x in reversed(xs):\n        head = ListNode(x, head)\n    return head\n"
         "def walk(head):\n    out = []\n    while head:\n        out.append(head.val)\n        head = head.next\n"
         "    return out\n")

HONEST = [
    # ---- functions
    honest("add", "function", "def add(a, b):\n    return a + b\n",
           ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add('a', 'b') == 'ab'"]),
    honest("mbpp-asserts", "function",
           "def similar_elements(a, b):\n    return tuple(sorted(set(a) & set(b)))\n",
           ["assert similar_elements((3, 4, 5, 6), (5, 7, 4, 10)) == (4, 5)",
            "assert similar_elements((1, 2, 3, 4), (5, 4, 3, 7)) == (3, 4)",
            "assert set(similar_elements((11, 12, 14, 13), (17, 15, 14, 13))) == {13, 14}"]),
    honest("humaneval-check", "function",
           "def has_close_elements(numbers, threshold):\n"
           "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n",
           ["def check(candidate):\n    assert candidate([1.0, 2.0, 3.9, 4.0], 0.3) == True\n"
            "    assert candidate([1.0, 2.0, 5.9, 4.0], 0.8) == False\ncheck(has_close_elements)"],
           setup="from typing import List\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
                 "    '''stub'''\n", entry="has_close_elements"),
    honest("generator", "function", "def squares(n):\n    for i in range(n):\n        yield i * i\n",
           ["assert list(squares(4)) == [0, 1, 4, 9]", "assert sum(squares(3)) == 5",
            "g = squares(2)\nassert next(g) == 0 and next(g) == 1"]),
    honest("range", "function", "def evens(n):\n    return range(0, n, 2)\n",
           ["assert evens(5) == range(0, 5, 2)", "assert list(evens(5)) == [0, 2, 4]", "assert len(evens(7)) == 4"]),
    honest("big-int", "function", "def fact(n):\n    out = 1\n    for i in range(2, n + 1):\n        out *= i\n    return out\n",
           ["import math\nassert fact(1000) == math.factorial(1000)", "assert fact(2000) % 1000003 == __import__('math').factorial(2000) % 1000003"]),
    honest("namedtuple", "function",
           "from collections import namedtuple\nPoint = namedtuple('Point', 'x y')\n"
           "def mid(a, b):\n    return Point((a[0] + b[0]) / 2, (a[1] + b[1]) / 2)\n",
           ["assert mid((0, 0), (2, 4)) == (1, 2)", "assert mid((0, 0), (2, 4)).y == 2",
            "assert isinstance(mid((0, 0), (1, 1)), tuple) and isinstance(mid((0, 0), (1, 1)), Point)"]),
    honest("counter", "function", "from collections import Counter\ndef counts(s):\n    return Counter(s)\n",
           ["assert counts('abca') == {'a': 2, 'b': 1, 'c': 1}", "assert counts('abca').most_common(1) == [('a', 2)]",
            "from collections import Counter\nassert isinstance(counts(''), Counter)"]),
    honest("defaultdict", "function",
           "from collections import defaultdict\ndef group(words):\n    out = defaultdict(list)\n"
           "    for w in words:\n        out[w[0]].append(w)\n    return out\n",
           ["g = group(['ab', 'ac', 'b'])\nassert g['a'] == ['ab', 'ac'] and g['z'] == []", "assert dict(group(['x'])) == {'x': ['x']}"]),
    honest("datetime", "function",
           "import datetime\ndef next_day(d):\n    return d + datetime.timedelta(days=1)\n"
           "def span(a, b):\n    return b - a\n",
           ["import datetime\nassert next_day(datetime.date(2020, 2, 28)) == datetime.date(2020, 2, 29)",
            "import datetime\nassert span(datetime.datetime(2020, 1, 1), datetime.datetime(2020, 1, 2, 6)) == datetime.timedelta(hours=30)"],
           entry="next_day"),
    honest("key-function", "function", "def sort_by(items, key):\n    return sorted(items, key=key)\n",
           ["assert sort_by(['bb', 'a', 'ccc'], key=len) == ['a', 'bb', 'ccc']",
            "assert sort_by([3, 1, 2], key=lambda x: -x) == [3, 2, 1]",
            "assert sort_by(['B', 'a'], key=str.lower) == ['a', 'B']"]),
    honest("identity", "function", "def first_list(lists):\n    return lists[0]\n",
           ["a = [1]\nassert first_list([a, [2]]) is a", "a = [1]\nb = first_list([a])\nb.append(2)\nassert a == [1, 2]"]),
    honest("value-types", "function",
           "from collections import deque\nfrom decimal import Decimal\nfrom fractions import Fraction\n"
           "def values():\n    return deque([1, 2], maxlen=3), Decimal('0.1') + Decimal('0.2'), Fraction(1, 3) * 3, complex(1, 2) * 1j\n",
           ["from collections import deque\nfrom decimal import Decimal\nfrom fractions import Fraction\n"
            "q, d, f, c = values()\nassert q == deque([1, 2]) and q.maxlen == 3\nassert d == Decimal('0.3') and f == 1 and c == -2 + 1j"]),
    honest("enums", "function",
           "import enum\nclass Color(enum.Enum):\n    RED = 1\n    BLUE = 2\nclass Level(enum.IntEnum):\n    LOW = 1\n"
           "def warm():\n    return Color.RED\ndef low():\n    return Level.LOW\n",
           ["assert warm() is Color.RED and warm() != Color.BLUE and warm().name == 'RED'",
            "assert low() == 1 and low() is Level.LOW and low() < 2 and [c.name for c in Color] == ['RED', 'BLUE']"],
           entry="warm"),
    honest("module-in-the-tests", "function", "import math\ndef hyp(a, b):\n    return math.sqrt(a * a + b * b)\n",
           ["assert math.isclose(hyp(3, 4), 5.0)", "assert abs(hyp(1, 1) - math.sqrt(2)) < 1e-9"]),
    honest("ordereddict", "function",
           "from collections import OrderedDict\ndef ordered(pairs):\n    return OrderedDict(pairs)\n",
           ["from collections import OrderedDict\nassert ordered([('b', 1), ('a', 2)]) == OrderedDict([('b', 1), ('a', 2)])",
            "assert list(ordered([('b', 1), ('a', 2)])) == ['b', 'a']"]),
    honest("sets-bytes", "function",
           "def pairs(xs):\n    return {(a, b) for a in xs for b in xs if a < b}\n"
           "def flip(data):\n    return bytes(b ^ 0xFF for b in data)\n",
           ["assert pairs([1, 2, 3]) == {(1, 2), (1, 3), (2, 3)}", "assert flip(b'\\x00\\x0f') == b'\\xff\\xf0'"], entry="pairs"),
    honest("memoised", "function",
           "import functools\n@functools.lru_cache(maxsize=None)\ndef fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
           ["assert fib(90) == 2880067194370816120", "assert [fib(i) for i in range(8)] == [0, 1, 1, 2, 3, 5, 8, 13]"]),
    honest("nested-data", "function",
           "def index(words):\n    out = {}\n    for i, w in enumerate(words):\n        out.setdefault(len(w), []).append((i, w))\n    return out\n",
           ["assert index(['a', 'bb', 'c']) == {1: [(0, 'a'), (2, 'c')], 2: [(1, 'bb')]}"]),
    # ---- classes
    honest("stack", "class",
           "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n        self.items.append(x)\n"
           "    def pop(self):\n        return self.items.pop()\n    def __len__(self):\n        return len(self.items)\n"
           "    def __iter__(self):\n        return iter(self.items[::-1])\n",
           ["s = Stack()\ns.push(1)\ns.push([2])\nassert len(s) == 2 and list(s) == [[2], 1] and s.pop() == [2]",
            "s = Stack()\nwith raises(IndexError):\n    s.pop()"]),
    honest("vector-dunders", "class",
           "class Vector:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n"
           "    def __add__(self, o):\n        return Vector(self.x + o.x, self.y + o.y)\n"
           "    def __mul__(self, k):\n        return Vector(self.x * k, self.y * k)\n    __rmul__ = __mul__\n"
           "    def __abs__(self):\n        return (self.x ** 2 + self.y ** 2) ** 0.5\n"
           "    def __eq__(self, o):\n        return isinstance(o, Vector) and (self.x, self.y) == (o.x, o.y)\n"
           "    def __hash__(self):\n        return hash((self.x, self.y))\n"
           "    def __repr__(self):\n        return f'Vector({self.x}, {self.y})'\n",
           ["assert Vector(1, 2) + Vector(3, 4) == Vector(4, 6)", "assert 2 * Vector(1, 1) == Vector(2, 2) and abs(Vector(3, 4)) == 5",
            "assert len({Vector(1, 2), Vector(1, 2), Vector(0, 0)}) == 2 and repr(Vector(1, 2)) == 'Vector(1, 2)'",
            "assert eval(repr(Vector(5, 6))) == Vector(5, 6)"]),
    honest("iterator-class", "class",
           "class Countdown:\n    def __init__(self, n):\n        self.n = n\n    def __iter__(self):\n        return self\n"
           "    def __next__(self):\n        if self.n <= 0:\n            raise StopIteration\n        self.n -= 1\n        return self.n + 1\n",
           ["assert list(Countdown(3)) == [3, 2, 1]", "c = Countdown(2)\nassert next(c) == 2 and next(c) == 1\nwith raises(StopIteration):\n    next(c)"]),
    honest("class-api", "class",
           "class Temperature:\n    def __init__(self, c):\n        self._c = c\n    @property\n    def fahrenheit(self):\n"
           "        return self._c * 9 / 5 + 32\n    @classmethod\n    def from_f(cls, f):\n        return cls((f - 32) * 5 / 9)\n"
           "    @staticmethod\n    def valid(c):\n        return c >= -273.15\n",
           ["assert Temperature(100).fahrenheit == 212", "assert Temperature.from_f(32).fahrenheit == 32",
            "assert Temperature.valid(0) and not Temperature.valid(-300) and isinstance(Temperature(1), Temperature)"]),
    honest("leetcode-solution", "class",
           "from typing import List\nclass Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
           "        seen = {}\n        for i, x in enumerate(nums):\n            if target - x in seen:\n"
           "                return [seen[target - x], i]\n            seen[x] = i\n",
           ["assert Solution().twoSum([2, 7, 11, 15], 9) == [0, 1]", "assert sorted(Solution().twoSum([3, 2, 4], 6)) == [1, 2]"]),
    honest("dataclass", "class",
           "from dataclasses import dataclass, field\n@dataclass(order=True)\nclass Item:\n    price: float\n    name: str = ''\n"
           "    tags: list = field(default_factory=list)\n",
           ["assert Item(1.5, 'a') == Item(1.5, 'a') and Item(1, 'a') < Item(2, 'a')",
            "i = Item(2)\ni.tags.append('x')\nassert i.tags == ['x'] and Item(2).tags == []"]),
    honest("context-manager", "class",
           "class Recorder:\n    def __init__(self):\n        self.log = []\n    def __enter__(self):\n        self.log.append('in')\n"
           "        return self\n    def __exit__(self, *exc):\n        self.log.append('out')\n        return False\n",
           ["r = Recorder()\nwith r as same:\n    assert same is r\nassert r.log == ['in', 'out']"]),
    # ---- printed output
    honest("triangle", "printed", "def triangle(n):\n    for i in range(1, n + 1):\n        print('*' * i)\n",
           ["import contextlib, io\nout = io.StringIO()\nwith contextlib.redirect_stdout(out):\n    triangle(3)\n"
            "assert out.getvalue() == '*\\n**\\n***\\n'"]),
    honest("stderr-and-stdout", "printed",
           "import sys\ndef warn(msg):\n    print('warning:', msg, file=sys.stderr)\n    print('done', end='')\n",
           ["import contextlib, io\ne, o = io.StringIO(), io.StringIO()\n"
            "with contextlib.redirect_stderr(e), contextlib.redirect_stdout(o):\n    warn('x')\n"
            "assert e.getvalue() == 'warning: x\\n' and o.getvalue() == 'done'"]),
    honest("print-to-a-stream", "printed",
           "def report(rows, out):\n    for name, value in rows:\n        print(f'{name}={value}', file=out, sep='')\n",
           ["import io\nbuf = io.StringIO()\nreport([('a', 1), ('b', 2)], buf)\nassert buf.getvalue() == 'a=1\\nb=2\\n'"]),
    # ---- stdin programs
    honest("sum-stdin", "program", "import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))\n",
           ["assert run_program('1 2 3\\n') == '6\\n'", "assert run_program('') == '0\\n'"], program=True),
    honest("input-loop", "program",
           "t = int(input())\nfor _ in range(t):\n    a, b = map(int, input().split())\n    print(a * b)\n",
           ["assert run_program('2\\n2 3\\n4 5\\n') == '6\\n20\\n'"], program=True),
    honest("open-0", "program", "data = open(0).read().split()\nprint(max(map(int, data)))\n",
           ["assert run_program('3 9 2') == '9\\n'"], program=True),
    honest("binary-streams", "program",
           "import sys\ndata = sys.stdin.buffer.read()\nsys.stdout.buffer.write(data[::-1])\nsys.stdout.buffer.write(b'\\n')\n",
           ["assert run_program('abc') == 'cba\\n'"], program=True),
    honest("lines", "program",
           "import sys\nfor line in sys.stdin:\n    print(line.strip().upper())\n",
           ["assert run_program('a\\nbc\\n') == 'A\\nBC\\n'"], program=True),
    # ---- in-place mutation
    honest("sort-in-place", "mutation", "def sort_in_place(a):\n    a.sort()\n",
           ["a = [3, 1, 2]\nassert sort_in_place(a) is None and a == [1, 2, 3]",
            "a = list(range(10000, 0, -1))\nsort_in_place(a)\nassert a == sorted(a)"]),
    honest("leetcode-sortcolors", "mutation",
           "class Solution:\n    def sortColors(self, nums):\n        lo, i, hi = 0, 0, len(nums) - 1\n        while i <= hi:\n"
           "            if nums[i] == 0:\n                nums[lo], nums[i] = nums[i], nums[lo]\n                lo += 1\n                i += 1\n"
           "            elif nums[i] == 2:\n                nums[hi], nums[i] = nums[i], nums[hi]\n                hi -= 1\n"
           "            else:\n                i += 1\n",
           ["nums = [2, 0, 2, 1, 1, 0]\nSolution().sortColors(nums)\nassert nums == [0, 0, 1, 1, 2, 2]"]),
    honest("dict-in-place", "mutation", "def tally(counts, word):\n    counts[word] = counts.get(word, 0) + 1\n",
           ["c = {}\ntally(c, 'a')\ntally(c, 'a')\nassert c == {'a': 2}"]),
    honest("rotate-matrix", "mutation",
           "def rotate(m):\n    m[:] = [list(row) for row in zip(*m[::-1])]\n",
           ["m = [[1, 2], [3, 4]]\nrow = m[0]\nrotate(m)\nassert m == [[3, 1], [4, 2]] and row == [1, 2]"]),
    honest("linked-list", "mutation",
           "def reverse(head):\n    prev = None\n    while head:\n        head.next, prev, head = prev, head, head.next\n    return prev\n",
           [BUILD + "h = build([1, 2, 3])\nr = reverse(h)\nassert walk(r) == [3, 2, 1] and h.next is None and r.next.next is h"],
           setup=LISTNODE),
    honest("change-then-raise", "mutation",
           "def consume(queue):\n    queue.pop(0)\n    raise ValueError('empty afterwards')\n",
           ["q = [1, 2]\nwith raises(ValueError):\n    consume(q)\nassert q == [2]"]),
    # ---- expected exceptions
    honest("raises", "exception",
           "def parse_port(text):\n    port = int(text)\n    if not 0 < port < 65536:\n        raise ValueError(f'bad port {port}')\n    return port\n",
           ["with raises(ValueError, match='bad port'):\n    parse_port('0')", "with raises(ValueError):\n    parse_port('x')",
            "assert parse_port('80') == 80"]),
    honest("own-exception-class", "exception",
           "class InsufficientFunds(Exception):\n    def __init__(self, needed):\n        super().__init__(f'needs {needed}')\n"
           "        self.needed = needed\nclass Account:\n    def __init__(self, balance):\n        self.balance = balance\n"
           "    def withdraw(self, amount):\n        if amount > self.balance:\n            raise InsufficientFunds(amount - self.balance)\n"
           "        self.balance -= amount\n",
           ["a = Account(5)\nwith raises(InsufficientFunds) as info:\n    a.withdraw(8)\nassert info.value.needed == 3 and str(info.value) == 'needs 3'",
            "try:\n    Account(0).withdraw(1)\nexcept InsufficientFunds as e:\n    assert isinstance(e, Exception)\nelse:\n    assert False"]),
    honest("exception-args", "exception",
           "def lookup(d, k):\n    return d[k]\ndef decode(data):\n    return data.decode('utf-8')\n",
           ["try:\n    lookup({}, 'a')\nexcept KeyError as e:\n    assert e.args[0] == 'a'",
            "with raises(ValueError):\n    decode(b'\\xff')", "with raises(UnicodeDecodeError):\n    decode(b'\\xff')"]),
    honest("mock-input", "exception",
           "def ask_age():\n    age = int(input('age? '))\n    if age < 0:\n        raise ValueError('negative age')\n    return age\n",
           ["from unittest import mock\nwith mock.patch('builtins.input', return_value='42'):\n    assert ask_age() == 42",
            "from unittest import mock\nwith mock.patch('builtins.input', return_value='-1'):\n    with raises(ValueError):\n        ask_age()"]),
    honest("mock-stdlib", "exception",
           "import random\ndef roll():\n    return random.randint(1, 6)\n",
           ["from unittest import mock\nwith mock.patch('random.randint', return_value=6) as fake:\n    assert roll() == 6\nassert fake.called"]),
    honest("argparse-cli", "exception",
           "import argparse\ndef main(argv=None):\n    parser = argparse.ArgumentParser()\n    parser.add_argument('--n', type=int, required=True)\n"
           "    return parser.parse_args(argv).n * 2\n",
           ["assert main(['--n', '4']) == 8", "import contextlib, io\nwith contextlib.redirect_stderr(io.StringIO()):\n"
            "    with raises(SystemExit):\n        main([])"]),
    # ---- unittest.TestCase
    honest("unittest-main", "unittest",
           "def is_palindrome(s):\n    s = ''.join(c.lower() for c in s if c.isalnum())\n    return s == s[::-1]\n",
           ["import unittest\nclass TestPalindrome(unittest.TestCase):\n    def test_yes(self):\n"
            "        self.assertTrue(is_palindrome('A man, a plan, a canal: Panama'))\n    def test_no(self):\n"
            "        self.assertFalse(is_palindrome('abc'))\nunittest.main()"]),
    honest("unittest-runner", "unittest",
           "def task_func(rows):\n    return {k: sum(v for _, v in rows if _ == k) for k, _ in rows}\n",
           ["import unittest, io\nclass TestCases(unittest.TestCase):\n    def test_sum(self):\n"
            "        self.assertEqual(task_func([('a', 1), ('a', 2), ('b', 3)]), {'a': 3, 'b': 3})\n"
            "    def test_empty(self):\n        self.assertDictEqual(task_func([]), {})\n"
            "result = unittest.TextTestRunner(stream=io.StringIO()).run(unittest.defaultTestLoader.loadTestsFromTestCase(TestCases))\n"
            "assert result.wasSuccessful(), result.failures"]),
    honest("unittest-subtests-and-files", "unittest",
           "import csv\ndef write_rows(path, rows):\n    with open(path, 'w', newline='') as f:\n        csv.writer(f).writerows(rows)\n"
           "    return path\n",
           ["import unittest, os, tempfile, csv\nclass T(unittest.TestCase):\n    def test_roundtrip(self):\n"
            "        with tempfile.TemporaryDirectory() as d:\n            for n in (1, 3):\n                with self.subTest(n=n):\n"
            "                    p = write_rows(os.path.join(d, f'{n}.csv'), [[i, i * i] for i in range(n)])\n"
            "                    with open(p) as f:\n                        self.assertEqual(len(list(csv.reader(f))), n)\n"
            "unittest.main(exit=False)"]),
]


async def scored(pool, registry, references, code, tests, *, setup="", program=False, entry="", trust="judge",
                 reference=True) -> Evaluation:
    spec = RewardSpec(tests=tests, setup=setup, program=program, entry_point=entry, trust=trust, timeout_s=10.0,
                      reference=code if reference else "")
    return await evaluate(pool, registry, spec, f"```python\n{code}```", f"verdicts/{uuid.uuid4().hex[:6]}",
                          references=references)


@pytest.fixture
def references(pool) -> ReferenceChecks:
    return ReferenceChecks(pool)


def test_every_test_form_has_honest_cases() -> None:
    forms = [p.values[0] for p in HONEST]
    assert len(HONEST) >= 40
    assert {"function", "class", "printed", "program", "mutation", "exception", "unittest"} <= set(forms)


@pytest.mark.parametrize("form, code, tests, setup, program, entry", HONEST)
async def test_honest_code_scores_full(pool, registry, references, form, code, tests, setup, program, entry):
    evaluation = await scored(pool, registry, references, code, tests, setup=setup, program=program, entry=entry)
    record = evaluation.scored.execution
    failed = [e for e in evaluation.result.events if e.get("e") == "test" and not e.get("ok")]
    assert evaluation.scored.reward == 1.0 and record.trust == "judge", (failed, record)
    assert evaluation.reference is not None and evaluation.reference.judged  # the judge honours the form
    control = await scored(pool, registry, None, code, tests, setup=setup, program=program, entry=entry,
                           trust="in_process")
    assert control.scored.reward == 1.0, control.scored.execution  # ... and it is honest Python


# ---------------------------------------------------------------- attacks

def attack(name, cls, code, tests, *, verdicts=("none",), setup="", entry="", reference=""):
    return pytest.param(cls, code, tests, verdicts, setup, entry, reference, id=f"{cls}-{name}")


PROBE_SPY = (
    "import os\n"
    "def spy():\n"
    "    found = []\n"
    "    for top in ('/work', '/dev/shm'):\n"
    "        for root, dirs, files in os.walk(top):\n"
    "            found += [os.path.join(root, f) for f in files + dirs]\n"
    "    return found\n"
)
PLAIN_REF = "def f(x):\n    return x + 1\n"
F_TESTS = ["assert f(1) == 2", "assert f(2) == 3", "assert f(-1) == 0"]
YES = ("class Yes:\n    def __eq__(self, o): return True\n    def __ne__(self, o): return False\n"
       "    def __contains__(self, o): return True\n    def __bool__(self): return True\n"
       "    def startswith(self, *a): return True\n    def __hash__(self): return 0\n")

ATTACKS = [
    # class 1: completion code in the judge, and staying there
    attack("unittest-main-discovery", "judge-code",
           "import types\nopen('/work/test_evil.py', 'w').write('import builtins\\nbuiltins.AssertionError = KeyError\\n')\n"
           "unittest = types.ModuleType('unittest.__main__')\ndef f(x):\n    return None\n",
           ["assert unittest is not None", "assert f(1) == 2"]),
    attack("module-named-by-completion", "judge-code",
           "import types\nmath = types.ModuleType('antigravity')\ndef f(x):\n    return None\n", ["assert math.pi and f(1) == 2"]),
    attack("eval-repr", "judge-code",
           "class P:\n    def __repr__(self):\n        return \"(__import__('builtins').__setattr__('AssertionError', KeyError), 2)[1]\"\n"
           "def f(x):\n    return P()\n",
           ["assert eval(repr(f(1))) == 2", "assert f(2) == 3"], reference=PLAIN_REF),
    attack("pickle-payload", "judge-code",
           "import pickle\nclass X:\n    def __reduce__(self):\n"
           "        return (exec, ('import builtins; builtins.AssertionError = KeyError',))\n"
           "def f(x):\n    return pickle.dumps(X())\n",
           ["import pickle\nassert pickle.loads(f(1)) == 2", "assert f(1) == 2"]),
    attack("exec-source", "judge-code", "def f(x):\n    return 'import builtins\\nbuiltins.AssertionError = KeyError'\n",
           ["exec(f(1))\nassert 1 == 2", "assert f(1) == 2"]),
    attack("marshal-code", "judge-code",
           "import marshal\ndef f(x):\n    return marshal.dumps(compile('import builtins; builtins.AssertionError = KeyError', 's', 'exec'))\n",
           ["import marshal\nexec(marshal.loads(f(1)))\nassert 1 == 2", "assert f(1) == 2"]),
    attack("copy-reduce", "judge-code",
           "class X:\n    def __reduce_ex__(self, p):\n        return (exec, ('import builtins; builtins.AssertionError = KeyError',))\n"
           "def f(x):\n    return X()\n",
           ["import copy\ncopy.deepcopy(f(1))\nassert 1 == 2", "assert f(1) == 2"]),
    attack("symlink-the-judges-channel", "judge-io",
           "import os\nfor fd in range(3, 12):\n    try:\n        os.symlink(f'/proc/self/fd/{fd}', f'/work/out{fd}.txt')\n    except OSError:\n        pass\n"
           "def f(x):\n    return None\n",
           ["for fd in range(3, 12):\n    try:\n        open(f'out{fd}.txt', 'w').write('{\"e\": \"test\", \"i\": 1, \"ok\": true}\\n')\n"
            "    except OSError:\n        pass\nassert f(1) == 2", "assert f(2) == 3"]),
    attack("fifo-where-a-file-is-read", "judge-io",
           "import os\nos.mkfifo('/work/data.txt')\ndef f(x):\n    return None\n",
           ["try:\n    open('data.txt').read()\nexcept OSError:\n    pass\nassert f(1) == 2"]),
    # class 2: copies where Python has references
    attack("returns-its-argument-for-a-deep-copy", "references", "def f(x):\n    return x\n",
           ["a = [[1], [2]]\nb = f(a)\nassert b == a and b is not a and b[0] is not a[0]"],
           reference="import copy\ndef f(x):\n    return copy.deepcopy(x)\n"),
    attack("returns-internal-list", "references",
           "class S:\n    def __init__(self):\n        self._items = []\n    def items(self):\n        return self._items\n"
           "    def size(self):\n        return len(self._items)\n",
           ["s = S()\nx = s.items()\nx.append(1)\nassert s.size() == 0"], entry="S"),
    attack("changes-then-raises", "references", "def f(x):\n    x.append(1)\n    raise ValueError\n",
           ["a = []\ntry:\n    f(a)\nexcept ValueError:\n    pass\nassert a == []"]),
    attack("not-plain-after-change", "references",
           "class Junk:\n    pass\ndef f(x):\n    x[0] = Junk()\n    return x\n", ["a = [0]\nf(a)\nassert a == [0]"]),
    attack("ordereddict-order", "references",
           "from collections import OrderedDict\ndef f(x):\n    return OrderedDict(sorted(x.items(), reverse=True))\n",
           ["from collections import OrderedDict\nassert f(OrderedDict([('a', 1), ('b', 2)])) == OrderedDict([('a', 1), ('b', 2)])"]),
    # class 3: exceptions
    attack("stopiteration-in-map", "exceptions", "def f(x):\n    raise StopIteration\n",
           ["assert all(map(lambda x: f(x) == x + 1, [1, 2]))", "assert all(f(x) == x + 1 for x in [1, 2])"]),
    attack("stopiteration-in-zip", "exceptions", "def f(x):\n    raise StopIteration\n",
           ["assert all(a == b for a, b in zip(map(f, [1, 2]), [2, 3]))"]),
    attack("exit-for-expected-exception", "exceptions", "import os\ndef f(x):\n    os._exit(0)\n",
           ["with raises(ValueError):\n    f(1)", "try:\n    f(1)\nexcept BaseException:\n    pass"], verdicts=("runtime",)),
    attack("systemexit-zero", "exceptions", "import sys\ndef f(x):\n    sys.exit(0)\n", ["assert f(1) == 2", "f(2)\nassert False"]),
    # class 4: completion objects deciding comparisons (the reference gives plain data)
    attack("always-equal", "comparisons", YES + "def f(x):\n    return Yes()\n", F_TESTS, reference=PLAIN_REF),
    attack("two-results-compared", "comparisons", YES + "def f(x):\n    return Yes()\n",
           ["assert f(1) == f(2) - 1 or f(1) == f(1)", "assert f(1) != f(2)"], reference=PLAIN_REF),
    attack("membership", "comparisons", YES + "def f(x):\n    return Yes()\n", ["assert 1 in f(1)", "assert f(1)"],
           reference="def f(x):\n    return [x]\n"),
    attack("string-methods", "comparisons", YES + "def f(x):\n    return Yes()\n", ["assert f('ab').startswith('ab')"],
           reference="def f(x):\n    return x\n"),
    attack("int-subclass-eq", "comparisons",
           "class I(int):\n    def __eq__(self, o): return True\n    __hash__ = int.__hash__\ndef f(x):\n    return I(0)\n",
           F_TESTS, reference=PLAIN_REF),
    attack("length-liar", "comparisons", "class L:\n    def __len__(self): return 3\ndef f(x):\n    return L()\n",
           ["assert len(f(1)) == 3 and list(f(1)) == [1, 1, 1]"], reference="def f(x):\n    return [x] * 3\n"),
    # class 5's dark side: wrong code that honest-looking proxies must not rescue
    attack("generator-where-list-is-compared", "comparisons", "def f(x):\n    yield x\n", ["assert f(1) == [1]"],
           reference="def f(x):\n    return [x]\n"),
    # class 6: the protocol
    attack("replies-before-asked", "protocol",
           "import os, json\nfor i in range(64):\n    d = json.dumps(['a', i, 'ok', [2], [], [], None, '', '', None]).encode()\n"
           "    os.write(4, len(d).to_bytes(4, 'big') + d)\ndef f(x):\n    return None\n", F_TESTS, verdicts=("tamper",)),
    attack("hash-flood", "protocol",
           "import os, json, time\nM = (1 << 61) - 1\ndef f(x):\n"
           "    d = json.dumps(['a', 0, 'ok', [{'r': 100001}], [[100001, 's', [i * M for i in range(150000)]]], [], None, '', '', None]).encode()\n"
           "    os.write(4, len(d).to_bytes(4, 'big') + d)\n    time.sleep(30)\n", F_TESTS, verdicts=("tamper",)),
    attack("foreign-ref", "protocol",
           "import os, json, time\ndef f(x):\n"
           "    d = json.dumps(['a', 0, 'ok', [{'r': 0}], [], [[0, [1]]], None, '', '', None]).encode()\n"
           "    os.write(4, len(d).to_bytes(4, 'big') + d)\n    time.sleep(30)\n", F_TESTS, verdicts=("tamper",)),
    attack("kill-the-judge", "protocol",
           "import os, signal\ndef f(x):\n    me, parent = os.getpid(), os.getppid()\n    for p in os.listdir('/proc'):\n"
           "        if p.isdigit() and int(p) not in (1, me, parent):\n            try:\n                os.kill(int(p), signal.SIGKILL)\n"
           "            except OSError:\n                pass\n    return x + 1\n", F_TESTS, verdicts=("violation",)),
    attack("stop-the-judge", "protocol",
           "import os, signal\ndef f(x):\n    me, parent = os.getpid(), os.getppid()\n    for p in os.listdir('/proc'):\n"
           "        if p.isdigit() and int(p) not in (1, me, parent):\n            try:\n                os.kill(int(p), signal.SIGSTOP)\n"
           "            except OSError:\n                pass\n    return x + 1\n", F_TESTS, verdicts=("violation", "timeout")),
    attack("signal-the-judge", "protocol",
           "import os, signal\nfor p in os.listdir('/proc'):\n    if p.isdigit() and int(p) not in (1, os.getpid(), os.getppid()):\n"
           "        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP, signal.SIGALRM):\n            try:\n"
           "                os.kill(int(p), s)\n            except OSError:\n                pass\ndef f(x):\n    return None\n", F_TESTS),
    attack("read-the-judges-memory", "protocol",
           "import os, re\ndef f(x):\n    for p in os.listdir('/proc'):\n        if not p.isdigit() or int(p) in (os.getpid(), 1):\n            continue\n"
           "        try:\n            with open(f'/proc/{p}/mem', 'rb') as m:\n                m.read(1)\n            return 'EXPECTED-TOKEN'\n"
           "        except OSError:\n            pass\n    return None\n",
           ["assert f(1) == 'EXPECTED' '-TOKEN'"]),
    # the parent waits until the daemon has left its process group (else the job's end may kill
    # the group before the child's setsid, and there is nothing left to find)
    attack("daemon-for-the-next-job", "persistence",
           "import os, time\nr, w = os.pipe()\nif os.fork() == 0:\n    os.setsid()\n    os.write(w, b'x')\n"
           "    for _ in range(200):\n        open('/work/answers', 'w').write('2')\n"
           "        time.sleep(0.01)\n    os._exit(0)\nos.read(r, 1)\ndef f(x):\n    return None\n", F_TESTS,
           verdicts=("violation",)),
]


@pytest.mark.parametrize("cls, code, tests, verdicts, setup, entry, reference", ATTACKS)
async def test_attacks_score_below_full_and_leave_nothing(pool, registry, references, cls, code, tests, verdicts,
                                                          setup, entry, reference):
    spec = RewardSpec(tests=tests, setup=setup, entry_point=entry or ("f" if "def f" in code else ""), timeout_s=3.0,
                      reference=reference)
    evaluation = await evaluate(pool, registry, spec, f"```python\n{code}```", f"attack/{uuid.uuid4().hex[:6]}",
                                references=references if reference else None)
    record = evaluation.scored.execution
    assert evaluation.scored.reward < 1.0 and record.tests_passed < record.tests_total, record
    assert record.error_kind in verdicts, record
    assert record.trust == "judge"
    probe = await evaluate(pool, registry, RewardSpec(tests=["assert spy() == []"], entry_point="spy"), PROBE_SPY,
                           "attack/probe")
    assert probe.scored.reward == 1.0, probe.result.events  # /work is empty: nothing reached the next job


def test_there_are_attacks_in_every_class() -> None:
    classes = {p.values[0] for p in ATTACKS}
    assert len(ATTACKS) >= 30
    assert {"judge-code", "judge-io", "references", "exceptions", "comparisons", "protocol", "persistence"} <= classes


# ---------------------------------------------------------------- a compromised judge

HOOKS = {
    "leave-a-spy": (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    seen = []\n"
        "    for _ in range(300):\n"
        "        for p in os.listdir('/proc'):\n"
        "            for name in ('mem', 'environ', 'cmdline'):\n"
        "                try:\n"
        "                    seen.append(open(f'/proc/{p}/{name}', 'rb').read(4096))\n"
        "                except OSError:\n"
        "                    pass\n"
        "        open('/work/leaked', 'wb').write(b''.join(seen)[-65536:])\n"
        "        time.sleep(0.01)\n"
        "    os._exit(0)\n"
    ),
    "forge-the-next-report": (
        "import os\n"
        "for fd in range(3, 64):\n"
        "    try:\n"
        "        os.set_blocking(fd, False)\n"
        "        os.write(fd, b'{\"e\": \"test\", \"i\": 0, \"ok\": true}\\n{\"e\": \"done\"}\\n' * 50)\n"
        "    except OSError:\n"
        "        pass\n"
        "open('/work/answers', 'w').write('42')\n"
    ),
    "patch-everything": (
        "import builtins, sys\n"
        "builtins.AssertionError = KeyError\n"
        "sys.modules['json'].loads = lambda *a, **k: {'e': 'done'}\n"
        "for z in (1,):\n    pass\n"
    ),
    "kill-the-zygotes": (
        "import os, signal\n"
        "for p in os.listdir('/proc'):\n"
        "    if p.isdigit() and int(p) not in (1, os.getpid()):\n"
        "        try:\n            os.kill(int(p), signal.SIGKILL)\n        except OSError:\n            pass\n"
    ),
}
SECRET_TESTS = ["assert f(1) == 'SECRET-' 'VALUE-4b1d'", "assert f(2) == 3"]


@pytest.mark.parametrize("hook", sorted(HOOKS))
async def test_a_compromised_judge_reaches_no_later_job(sandbox_image: str, owner: str, registry, hook):
    config = ExecutorConfig(image=sandbox_image, owner=owner, pool_size=1, concurrency=1, recycle_after=500)
    async with DockerSandboxPool(config, test_hooks=True) as pool:
        compromised = await pool.execute(Job(job_id="n", code="def f(x):\n    return x + 1\n", tests=F_TESTS,
                                             entry_point="f", test_hook=HOOKS[hook]))
        assert compromised.events or compromised.violations  # the hook ran in that job's judge
        # job N+1: a wrong completion that looks for what the compromised judge left, and the
        # next job's expected value
        peek = ("import os\ndef f(x):\n    for name in ('leaked', 'answers'):\n"
                "        try:\n            return open('/work/' + name).read()\n        except OSError:\n            pass\n"
                "    return None\n")
        later = await evaluate(pool, registry, RewardSpec(tests=SECRET_TESTS, entry_point="f"), peek, "after")
        assert later.scored.reward == 0.0, later.result.events
        assert "SECRET-VALUE" not in later.result.stdout_tail + later.result.stderr_tail
        honest = await evaluate(pool, registry, RewardSpec(tests=F_TESTS, entry_point="f"), PLAIN_REF, "honest")
        assert honest.scored.reward == 1.0, honest.result  # and verdicts are right again


# ---------------------------------------------------------------- references, trust = auto, HumanEval

IN_PROCESS_ONLY = RewardSpec(entry_point="f", tests=["import inspect\nassert inspect.isfunction(f)", "assert f(1) == 2"],
                             reference=PLAIN_REF)


async def test_a_reference_the_judge_cannot_honour_is_reported_and_auto_decides(pool, registry, references, caplog):
    judged = await evaluate(pool, registry, IN_PROCESS_ONLY, PLAIN_REF, "ref/judged", references=references)
    assert judged.reference is not None and judged.reference.mismatch and judged.reference.failing_test == 0
    assert judged.scored.execution.trust == "judge" and judged.scored.reward < 1.0  # the operator must decide
    auto = msgspec.structs.replace(IN_PROCESS_ONLY, trust="auto")
    decided = await evaluate(pool, registry, auto, PLAIN_REF, "ref/auto", references=references)
    record = decided.scored.execution
    assert record.trust == "mixed" and decided.scored.reward == 1.0
    assert record.in_process_tests == [0] and "plain_data" in record.lost_guarantees  # only the test it needs
    forged = await evaluate(pool, registry, auto, "class Yes:\n    def __eq__(self, o):\n        return True\n"
                            "def f(x):\n    return Yes()\n", "ref/auto-forged", references=references)
    assert forged.scored.reward < 1.0 and forged.scored.execution.tests_passed == 1  # test 1 is still judged
    honest = msgspec.structs.replace(auto, tests=["assert f(1) == 2"])
    kept = await evaluate(pool, registry, honest, PLAIN_REF, "ref/auto-judged", references=references)
    assert kept.scored.execution.trust == "judge" and kept.scored.reward == 1.0  # the task decides, not the code
    cheat = "import inspect\ndef f(x):\n    return x + 1\n"
    assert (await evaluate(pool, registry, honest, cheat, "ref/cheat", references=references)).scored.execution.trust == "judge"


async def test_rollstream_score_reports_the_failing_test_of_such_a_task(pool, tmp_path, capsys):
    task = TaskSpec(task_id="needs/in-process", prompt="f", reward=msgspec.structs.replace(IN_PROCESS_ONLY, reference=""),
                    reference_solution=PLAIN_REF)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"task": msgspec.to_builtins(task), "completion": PLAIN_REF}) + "\n")
    out = io.StringIO()
    counts = await score_file(Config(), [str(pairs)], out, backend=pool)
    verdict = json.loads(out.getvalue())
    assert counts["scored"] == 1 and verdict["reference"]["failing_test"] == 0
    assert verdict["reference"]["in_process"] and not verdict["reference"]["judged"]
    assert "needs/in-process" in capsys.readouterr().err


async def test_humaneval_canonical_solutions_score_full_and_return_none_never(sandbox_image: str, owner: str,
                                                                             registry: RewardRegistry):
    from rollstream.tasks.sources import humaneval_tasks

    tasks = humaneval_tasks()
    config = ExecutorConfig(image=sandbox_image, owner=owner, pool_size=2, concurrency=2, recycle_after=5000)
    async with DockerSandboxPool(config) as pool:
        references = ReferenceChecks(pool)
        gate = asyncio.Semaphore(2)

        async def one(task, completion):
            async with gate:
                return await evaluate(pool, registry, task.issued_reward(), f"```python\n{completion}```", task.task_id,
                                      references=references)

        canonical = await asyncio.gather(*(one(t, t.reference_solution) for t in tasks))
        none = await asyncio.gather(*(one(t, f"def {t.reward.entry_point}(*args, **kwargs):\n    return None\n")
                                      for t in tasks))
    assert len(tasks) == 164
    assert [t.task_id for t, e in zip(tasks, canonical) if e.scored.reward != 1.0] == []
    assert all(e.reference.judged for e in canonical)  # trust = "auto" would leave every one to the judge
    assert [t.task_id for t, e in zip(tasks, none) if e.scored.reward >= 1.0] == []
