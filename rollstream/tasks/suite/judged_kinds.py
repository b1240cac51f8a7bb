"""Suite definitions whose tests are more than ``assert f(args) == value``: the kinds the
executor's judge supports beyond plain function calls (docs/executor.md).

* ``class``: a class with methods; the tests hold its instances through handles.
* ``printed``: a function that prints; the tests capture what it printed.
* ``program``: a whole stdin/stdout program; the tests call ``run_program(stdin)``.
* ``mutation``: a function that changes its argument in place; the tests inspect the argument.
* ``exception``: a function that must raise; the tests use ``raises`` (pytest.raises-style)
  or try/except.

Tests are written out with literal expected values; ``tests/rollstream/tasks/test_suite.py`` checks,
through the real sandbox, that every reference passes and every wrong solution fails.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

KINDS = ("class", "printed", "program", "mutation", "exception")
FENCE = "Return the complete {what} in a ```python code block."


@dataclass(frozen=True)
class J:
    family: str
    name: str  # task id within the family, and the entry point (empty for programs)
    kind: str
    prompt: str
    tests: tuple[str, ...]
    heldout: tuple[str, ...]
    reference: str
    wrong: str
    difficulty: int = 1

    @property
    def entry_point(self) -> str:
        return "" if self.kind == "program" else self.name

    def full_prompt(self) -> str:
        what = {"class": "class", "program": "program"}.get(self.kind, "function")
        return textwrap.dedent(self.prompt).strip() + "\n\n" + FENCE.format(what=what)


def _src(text: str) -> str:
    return textwrap.dedent(text).strip("\n") + "\n"


def _printed(call: str, expected: str) -> str:
    """A test of what ``call`` prints."""
    return (
        "import contextlib, io\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        f"    {call}\n"
        f"assert out.getvalue() == {expected!r}, out.getvalue()"
    )


def _mutated(setup: str, call: str, check: str) -> str:
    return f"{setup}\nresult = {call}\nassert {check}"


JUDGED = [
    # ---- classes: instances held by handle, methods called through it
    J("lists", "Stack", "class",
      """Write a Python class `Stack()` with methods `push(x)`, `pop()` (removes and returns the most
      recently pushed item), `peek()` (returns it without removing it), `size()` and `is_empty()`.""",
      ("s = Stack()\ns.push(1)\ns.push(2)\nassert s.pop() == 2 and s.size() == 1",
       "s = Stack()\nassert s.is_empty()\ns.push('a')\nassert s.peek() == 'a' and not s.is_empty() and s.size() == 1",
       "s = Stack()\nfor i in range(5):\n    s.push(i)\nassert [s.pop() for _ in range(5)] == [4, 3, 2, 1, 0]"),
      ("s = Stack()\ns.push(None)\nassert s.size() == 1 and s.pop() is None and s.is_empty()",
       "s = Stack()\ns.push(1)\ns.push(2)\nassert s.peek() == 2 and s.size() == 2"),
      _src("""
      class Stack:
          def __init__(self):
              self.items = []
          def push(self, x):
              self.items.append(x)
          def pop(self):
              return self.items.pop()
          def peek(self):
              return self.items[-1]
          def size(self):
              return len(self.items)
          def is_empty(self):
              return not self.items
      """),
      _src("""
      class Stack:
          def __init__(self):
              self.items = []
          def push(self, x):
              self.items.append(x)
          def pop(self):
              return self.items.pop(0)
          def peek(self):
              return self.items[0]
          def size(self):
              return len(self.items)
          def is_empty(self):
              return not self.items
      """), 1),
    J("dicts", "Tally", "class",
      """Write a Python class `Tally()` that counts things: `add(item)` counts one more of item,
      `count(item)` returns how many were added (0 if none), and `most_common()` returns the item
      added most often (the one added first among ties), or None when nothing was added.""",
      ("t = Tally()\nfor x in 'abcab':\n    t.add(x)\nassert t.count('a') == 2 and t.count('c') == 1 and t.count('z') == 0",
       "t = Tally()\nassert t.most_common() is None\nfor x in 'xyzzy':\n    t.add(x)\nassert t.most_common() == 'y'",
       "t = Tally()\nt.add(3)\nt.add(3)\nt.add(4)\nassert t.most_common() == 3"),
      ("t = Tally()\nt.add('q')\nassert t.most_common() == 'q' and t.count('q') == 1",
       "t = Tally()\nfor x in [1, 2, 2, 1]:\n    t.add(x)\nassert t.most_common() == 1"),
      _src("""
      class Tally:
          def __init__(self):
              self.counts = {}
          def add(self, item):
              self.counts[item] = self.counts.get(item, 0) + 1
          def count(self, item):
              return self.counts.get(item, 0)
          def most_common(self):
              best = None
              for item, n in self.counts.items():
                  if best is None or n > self.counts[best]:
                      best = item
              return best
      """),
      _src("""
      class Tally:
          def __init__(self):
              self.counts = {}
          def add(self, item):
              self.counts[item] = 1
          def count(self, item):
              return self.counts.get(item, 0)
          def most_common(self):
              return next(iter(self.counts), None)
      """), 2),
    J("math", "BankAccount", "class",
      """Write a Python class `BankAccount(balance=0)` with `deposit(amount)`, `withdraw(amount)`
      (raises ValueError when the amount is more than the balance, leaving the balance unchanged)
      and `balance()`, which returns the current balance.""",
      ("a = BankAccount()\na.deposit(10)\na.withdraw(3)\nassert a.balance() == 7",
       "a = BankAccount(5)\nwith raises(ValueError):\n    a.withdraw(6)\nassert a.balance() == 5",
       "a = BankAccount(1)\na.deposit(1)\na.deposit(2)\nassert a.balance() == 4"),
      ("a = BankAccount(100)\na.withdraw(100)\nassert a.balance() == 0",
       "a = BankAccount()\ntry:\n    a.withdraw(1)\nexcept ValueError:\n    pass\nelse:\n    raise AssertionError('no ValueError')\nassert a.balance() == 0"),
      _src("""
      class BankAccount:
          def __init__(self, balance=0):
              self.amount = balance
          def deposit(self, amount):
              self.amount += amount
          def withdraw(self, amount):
              if amount > self.amount:
                  raise ValueError("insufficient funds")
              self.amount -= amount
          def balance(self):
              return self.amount
      """),
      _src("""
      class BankAccount:
          def __init__(self, balance=0):
              self.amount = balance
          def deposit(self, amount):
              self.amount += amount
          def withdraw(self, amount):
              self.amount -= amount
          def balance(self):
              return self.amount
      """), 1),
    J("strings", "TextBuffer", "class",
      """Write a Python class `TextBuffer()` holding text: `append(s)` adds s at the end,
      `undo()` removes what the last append added that was not undone yet (nothing to do if there
      is none), and `text()` returns the current text.""",
      ("b = TextBuffer()\nb.append('ab')\nb.append('cd')\nb.undo()\nassert b.text() == 'ab'",
       "b = TextBuffer()\nb.undo()\nassert b.text() == ''",
       "b = TextBuffer()\nfor w in ['x', 'y', 'z']:\n    b.append(w)\nb.undo()\nb.undo()\nassert b.text() == 'x'"),
      ("b = TextBuffer()\nb.append('hi')\nb.undo()\nb.undo()\nb.append('!')\nassert b.text() == '!'",
       "b = TextBuffer()\nb.append('a b')\nassert b.text() == 'a b'"),
      _src("""
      class TextBuffer:
          def __init__(self):
              self.parts = []
          def append(self, s):
              self.parts.append(s)
          def undo(self):
              if self.parts:
                  self.parts.pop()
          def text(self):
              return ''.join(self.parts)
      """),
      _src("""
      class TextBuffer:
          def __init__(self):
              self.parts = []
          def append(self, s):
              self.parts.append(s)
          def undo(self):
              self.parts = []
          def text(self):
              return ''.join(self.parts)
      """), 2),
    J("search_sort", "SortedBag", "class",
      """Write a Python class `SortedBag()` holding numbers: `add(x)` adds one, `items()` returns all
      of them as a list in ascending order (duplicates kept), and `count(x)` returns how many times
      x was added.""",
      ("b = SortedBag()\nfor x in [3, 1, 2, 1]:\n    b.add(x)\nassert b.items() == [1, 1, 2, 3]",
       "b = SortedBag()\nassert b.items() == [] and b.count(5) == 0",
       "b = SortedBag()\nb.add(7)\nb.add(7)\nassert b.count(7) == 2 and b.items() == [7, 7]"),
      ("b = SortedBag()\nfor x in [-1, 10, 0]:\n    b.add(x)\nassert b.items() == [-1, 0, 10] and b.count(0) == 1",
       "b = SortedBag()\nb.add(2.5)\nb.add(1)\nassert b.items() == [1, 2.5]"),
      _src("""
      class SortedBag:
          def __init__(self):
              self.values = []
          def add(self, x):
              self.values.append(x)
          def items(self):
              return sorted(self.values)
          def count(self, x):
              return self.values.count(x)
      """),
      _src("""
      class SortedBag:
          def __init__(self):
              self.values = set()
          def add(self, x):
              self.values.add(x)
          def items(self):
              return sorted(self.values)
          def count(self, x):
              return 1 if x in self.values else 0
      """), 1),
    # ---- printed output: what the function prints is the answer
    J("strings", "print_triangle", "printed",
      """Write a Python function `print_triangle(n: int) -> None` that prints n lines: line i
      (counting from 1) has i '*' characters. For n = 0 it prints nothing.""",
      (_printed("print_triangle(3)", "*\n**\n***\n"), _printed("print_triangle(0)", ""),
       _printed("print_triangle(1)", "*\n")),
      (_printed("print_triangle(4)", "*\n**\n***\n****\n"), _printed("print_triangle(2)", "*\n**\n")),
      _src("""
      def print_triangle(n: int) -> None:
          for i in range(1, n + 1):
              print('*' * i)
      """),
      _src("""
      def print_triangle(n: int) -> None:
          for i in range(n):
              print('*' * i)
      """), 0),
    J("lists", "print_numbered", "printed",
      """Write a Python function `print_numbered(items: list) -> None` that prints each item on its
      own line as '<index>: <item>', counting from 1.""",
      (_printed("print_numbered(['a', 'b'])", "1: a\n2: b\n"), _printed("print_numbered([])", ""),
       _printed("print_numbered([10])", "1: 10\n")),
      (_printed("print_numbered(['x', 'y', 'z'])", "1: x\n2: y\n3: z\n"), _printed("print_numbered([None])", "1: None\n")),
      _src("""
      def print_numbered(items: list) -> None:
          for i, item in enumerate(items, 1):
              print(f'{i}: {item}')
      """),
      _src("""
      def print_numbered(items: list) -> None:
          for i, item in enumerate(items):
              print(f'{i}: {item}')
      """), 0),
    J("math", "print_multiples", "printed",
      """Write a Python function `print_multiples(n: int, k: int) -> None` that prints the first k
      positive multiples of n on one line, separated by single spaces.""",
      (_printed("print_multiples(3, 4)", "3 6 9 12\n"), _printed("print_multiples(5, 1)", "5\n"),
       _printed("print_multiples(2, 3)", "2 4 6\n")),
      (_printed("print_multiples(7, 2)", "7 14\n"), _printed("print_multiples(1, 5)", "1 2 3 4 5\n")),
      _src("""
      def print_multiples(n: int, k: int) -> None:
          print(' '.join(str(n * i) for i in range(1, k + 1)))
      """),
      _src("""
      def print_multiples(n: int, k: int) -> None:
          print(' '.join(str(n * i) for i in range(k)))
      """), 1),
    J("dicts", "print_sorted_items", "printed",
      """Write a Python function `print_sorted_items(d: dict) -> None` that prints one line
      'key=value' per item of d, in ascending order of the keys.""",
      (_printed("print_sorted_items({'b': 2, 'a': 1})", "a=1\nb=2\n"), _printed("print_sorted_items({})", ""),
       _printed("print_sorted_items({'z': 'end'})", "z=end\n")),
      (_printed("print_sorted_items({3: 'c', 1: 'a', 2: 'b'})", "1=a\n2=b\n3=c\n"),
       _printed("print_sorted_items({'k': None})", "k=None\n")),
      _src("""
      def print_sorted_items(d: dict) -> None:
          for key in sorted(d):
              print(f'{key}={d[key]}')
      """),
      _src("""
      def print_sorted_items(d: dict) -> None:
          for key in d:
              print(f'{key}={d[key]}')
      """), 1),
    J("conditionals", "print_fizzbuzz", "printed",
      """Write a Python function `print_fizzbuzz(n: int) -> None` that prints the numbers 1 to n, one
      per line, but 'Fizz' for multiples of 3, 'Buzz' for multiples of 5 and 'FizzBuzz' for
      multiples of both.""",
      (_printed("print_fizzbuzz(5)", "1\n2\nFizz\n4\nBuzz\n"), _printed("print_fizzbuzz(0)", ""),
       _printed("print_fizzbuzz(15)",
                "1\n2\nFizz\n4\nBuzz\nFizz\n7\n8\nFizz\nBuzz\n11\nFizz\n13\n14\nFizzBuzz\n")),
      (_printed("print_fizzbuzz(3)", "1\n2\nFizz\n"), _printed("print_fizzbuzz(1)", "1\n")),
      _src("""
      def print_fizzbuzz(n: int) -> None:
          for i in range(1, n + 1):
              if i % 15 == 0:
                  print('FizzBuzz')
              elif i % 3 == 0:
                  print('Fizz')
              elif i % 5 == 0:
                  print('Buzz')
              else:
                  print(i)
      """),
      _src("""
      def print_fizzbuzz(n: int) -> None:
          for i in range(1, n + 1):
              if i % 3 == 0:
                  print('Fizz')
              elif i % 5 == 0:
                  print('Buzz')
              else:
                  print(i)
      """), 1),
    # ---- stdin/stdout programs
    J("math", "sum_two_program", "program",
      """Write a Python program that reads two integers separated by a space from one line of
      standard input and prints their sum.""",
      ("assert run_program('2 3\\n') == '5\\n'", "assert run_program('-4 4\\n') == '0\\n'",
       "assert run_program('100 1\\n') == '101\\n'"),
      ("assert run_program('0 0\\n') == '0\\n'", "assert run_program('12 -20\\n') == '-8\\n'"),
      _src("""
      a, b = map(int, input().split())
      print(a + b)
      """),
      _src("""
      a, b = input().split()
      print(a + b)
      """), 0),
    J("strings", "reverse_lines_program", "program",
      """Write a Python program that reads all lines of standard input and prints them in reverse
      order (last line first).""",
      ("assert run_program('a\\nb\\nc\\n') == 'c\\nb\\na\\n'", "assert run_program('') == ''",
       "assert run_program('one\\n') == 'one\\n'"),
      ("assert run_program('x y\\nz\\n') == 'z\\nx y\\n'", "assert run_program('1\\n2\\n') == '2\\n1\\n'"),
      _src("""
      import sys
      lines = sys.stdin.read().splitlines()
      for line in reversed(lines):
          print(line)
      """),
      _src("""
      import sys
      lines = sys.stdin.read().splitlines()
      for line in lines:
          print(line[::-1])
      """), 1),
    J("lists", "max_program", "program",
      """Write a Python program that reads a count N from the first line of standard input and N
      integers separated by spaces from the second line, and prints the largest of them.""",
      ("assert run_program('3\\n1 5 2\\n') == '5\\n'", "assert run_program('1\\n-7\\n') == '-7\\n'",
       "assert run_program('4\\n-1 -5 -3 -2\\n') == '-1\\n'"),
      ("assert run_program('2\\n10 10\\n') == '10\\n'", "assert run_program('5\\n9 8 7 6 5\\n') == '9\\n'"),
      _src("""
      n = int(input())
      numbers = list(map(int, input().split()))[:n]
      print(max(numbers))
      """),
      _src("""
      n = int(input())
      numbers = input().split()[:n]
      print(max(numbers))
      """), 1),
    J("parsing", "word_count_program", "program",
      """Write a Python program that reads all of standard input and prints how many
      whitespace-separated words it contains.""",
      ("assert run_program('hello world\\n') == '2\\n'", "assert run_program('') == '0\\n'",
       "assert run_program('a\\nb c\\n  d  \\n') == '4\\n'"),
      ("assert run_program('one\\n') == '1\\n'", "assert run_program('  \\n\\n') == '0\\n'"),
      _src("""
      import sys
      print(len(sys.stdin.read().split()))
      """),
      _src("""
      import sys
      print(len(sys.stdin.readline().split()))
      """), 1),
    J("conditionals", "grade_program", "program",
      """Write a Python program that reads an integer score (0 to 100) from standard input and
      prints its grade: 'A' for 90 and above, 'B' for 80-89, 'C' for 70-79, 'D' for 60-69 and 'F'
      below 60.""",
      ("assert run_program('95\\n') == 'A\\n'", "assert run_program('80\\n') == 'B\\n'",
       "assert run_program('59\\n') == 'F\\n'", "assert run_program('90\\n') == 'A\\n'",
       "assert run_program('89\\n') == 'B\\n'", "assert run_program('79\\n') == 'C\\n'",
       "assert run_program('70\\n') == 'C\\n'", "assert run_program('69\\n') == 'D\\n'",
       "assert run_program('60\\n') == 'D\\n'"),
      ("assert run_program('100\\n') == 'A\\n'", "assert run_program('75\\n') == 'C\\n'",
       "assert run_program('0\\n') == 'F\\n'"),
      _src("""
      score = int(input())
      if score >= 90:
          print('A')
      elif score >= 80:
          print('B')
      elif score >= 70:
          print('C')
      elif score >= 60:
          print('D')
      else:
          print('F')
      """),
      _src("""
      score = int(input())
      if score > 90:
          print('A')
      elif score > 80:
          print('B')
      elif score > 70:
          print('C')
      elif score > 60:
          print('D')
      else:
          print('F')
      """), 0),
    # ---- in-place mutation: the argument is the answer
    J("lists", "reverse_in_place", "mutation",
      """Write a Python function `reverse_in_place(items: list) -> None` that reverses the list items
      in place (it changes the list it is given and returns None).""",
      (_mutated("a = [1, 2, 3]", "reverse_in_place(a)", "a == [3, 2, 1] and result is None"),
       _mutated("a = []", "reverse_in_place(a)", "a == []"),
       _mutated("a = ['x', 'y']", "reverse_in_place(a)", "a == ['y', 'x']")),
      (_mutated("a = [5]", "reverse_in_place(a)", "a == [5]"),
       _mutated("a = [1, 2, 3, 4]", "reverse_in_place(a)", "a == [4, 3, 2, 1]")),
      _src("""
      def reverse_in_place(items: list) -> None:
          items.reverse()
      """),
      _src("""
      def reverse_in_place(items: list) -> None:
          items = items[::-1]
      """), 0),
    J("lists", "remove_all", "mutation",
      """Write a Python function `remove_all(items: list, x: object) -> None` that removes every
      occurrence of x from the list items, in place.""",
      (_mutated("a = [1, 2, 1, 3, 1]", "remove_all(a, 1)", "a == [2, 3]"),
       _mutated("a = [1, 2]", "remove_all(a, 5)", "a == [1, 2]"),
       _mutated("a = ['a', 'a']", "remove_all(a, 'a')", "a == []")),
      (_mutated("a = []", "remove_all(a, 0)", "a == []"),
       _mutated("a = [0, 1, 0, 1]", "remove_all(a, 0)", "a == [1, 1]")),
      _src("""
      def remove_all(items: list, x: object) -> None:
          items[:] = [item for item in items if item != x]
      """),
      _src("""
      def remove_all(items: list, x: object) -> None:
          if x in items:
              items.remove(x)
      """), 1),
    J("dicts", "increment_all", "mutation",
      """Write a Python function `increment_all(d: dict, k: int) -> None` that adds k to every value
      of the dictionary d, in place.""",
      (_mutated("d = {'a': 1, 'b': 2}", "increment_all(d, 10)", "d == {'a': 11, 'b': 12}"),
       _mutated("d = {}", "increment_all(d, 1)", "d == {}"),
       _mutated("d = {1: -1}", "increment_all(d, 1)", "d == {1: 0}")),
      (_mutated("d = {'x': 0, 'y': 0}", "increment_all(d, -2)", "d == {'x': -2, 'y': -2}"),
       _mutated("d = {'k': 5}", "increment_all(d, 0)", "d == {'k': 5}")),
      _src("""
      def increment_all(d: dict, k: int) -> None:
          for key in d:
              d[key] += k
      """),
      _src("""
      def increment_all(d: dict, k: int) -> None:
          d = {key: value + k for key, value in d.items()}
      """), 1),
    J("matrices", "transpose_in_place", "mutation",
      """Write a Python function `transpose_in_place(m: list[list[int]]) -> None` that transposes
      the square matrix m in place: afterwards m[i][j] holds what m[j][i] held.""",
      (_mutated("m = [[1, 2], [3, 4]]", "transpose_in_place(m)", "m == [[1, 3], [2, 4]]"),
       _mutated("m = [[7]]", "transpose_in_place(m)", "m == [[7]]"),
       _mutated("m = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]", "transpose_in_place(m)", "m == [[1, 4, 7], [2, 5, 8], [3, 6, 9]]")),
      (_mutated("m = []", "transpose_in_place(m)", "m == []"),
       _mutated("m = [[0, 1], [0, 0]]", "transpose_in_place(m)", "m == [[0, 0], [1, 0]]")),
      _src("""
      def transpose_in_place(m: list[list[int]]) -> None:
          n = len(m)
          for i in range(n):
              for j in range(i + 1, n):
                  m[i][j], m[j][i] = m[j][i], m[i][j]
      """),
      _src("""
      def transpose_in_place(m: list[list[int]]) -> None:
          m = [list(row) for row in zip(*m)]
      """), 2),
    J("sets", "discard_evens", "mutation",
      """Write a Python function `discard_evens(s: set) -> None` that removes every even number from
      the set s, in place.""",
      (_mutated("s = {1, 2, 3, 4}", "discard_evens(s)", "s == {1, 3}"),
       _mutated("s = set()", "discard_evens(s)", "s == set()"),
       _mutated("s = {2, 4}", "discard_evens(s)", "s == set()")),
      (_mutated("s = {5, 7}", "discard_evens(s)", "s == {5, 7}"),
       _mutated("s = {0, -1, -2}", "discard_evens(s)", "s == {-1}")),
      _src("""
      def discard_evens(s: set) -> None:
          for x in [x for x in s if x % 2 == 0]:
              s.discard(x)
      """),
      _src("""
      def discard_evens(s: set) -> None:
          s = {x for x in s if x % 2}
      """), 1),
    # ---- expected exceptions
    J("math", "checked_sqrt", "exception",
      """Write a Python function `checked_sqrt(x: float) -> float` that returns the square root of x,
      and raises ValueError when x is negative.""",
      ("assert checked_sqrt(9) == 3.0", "with raises(ValueError):\n    checked_sqrt(-1)",
       "assert checked_sqrt(0) == 0.0"),
      ("with raises(ValueError):\n    checked_sqrt(-0.5)", "assert checked_sqrt(2.25) == 1.5"),
      _src("""
      def checked_sqrt(x: float) -> float:
          if x < 0:
              raise ValueError('negative')
          return x ** 0.5
      """),
      _src("""
      def checked_sqrt(x: float) -> float:
          return abs(x) ** 0.5
      """), 0),
    J("parsing", "parse_port", "exception",
      """Write a Python function `parse_port(s: str) -> int` that returns the integer in s when it is
      a valid port number (1 to 65535), and raises ValueError otherwise (also when s is not a
      number).""",
      ("assert parse_port('8080') == 8080", "with raises(ValueError):\n    parse_port('70000')",
       "try:\n    parse_port('http')\nexcept ValueError:\n    pass\nelse:\n    raise AssertionError('no ValueError')"),
      ("with raises(ValueError):\n    parse_port('0')", "assert parse_port('65535') == 65535"),
      _src("""
      def parse_port(s: str) -> int:
          port = int(s)
          if not 1 <= port <= 65535:
              raise ValueError(f'not a port: {s}')
          return port
      """),
      _src("""
      def parse_port(s: str) -> int:
          return int(s)
      """), 1),
    J("dicts", "require_key", "exception",
      """Write a Python function `require_key(d: dict, key: str)` that returns d[key], and raises
      KeyError when the key is missing or its value is None.""",
      ("assert require_key({'a': 1}, 'a') == 1", "with raises(KeyError):\n    require_key({}, 'a')",
       "with raises(KeyError):\n    require_key({'a': None}, 'a')"),
      ("assert require_key({'x': 0}, 'x') == 0", "with raises(KeyError):\n    require_key({'b': 2}, 'a')"),
      _src("""
      def require_key(d: dict, key: str):
          if d.get(key) is None:
              raise KeyError(key)
          return d[key]
      """),
      _src("""
      def require_key(d: dict, key: str):
          return d.get(key)
      """), 1),
    J("lists", "first_item", "exception",
      """Write a Python function `first_item(items: list)` that returns the first element of items,
      and raises IndexError when items is empty.""",
      ("assert first_item([3, 4]) == 3", "with raises(IndexError):\n    first_item([])",
       "assert first_item(['z']) == 'z'"),
      ("try:\n    first_item([])\nexcept IndexError:\n    pass\nelse:\n    raise AssertionError('no IndexError')",
       "assert first_item([None, 1]) is None"),
      _src("""
      def first_item(items: list):
          return items[0]
      """),
      _src("""
      def first_item(items: list):
          return items[0] if items else None
      """), 0),
    J("strings", "checked_repeat", "exception",
      """Write a Python function `checked_repeat(s: str, n: int) -> str` that returns s repeated n
      times, raising TypeError when n is not an int and ValueError when n is negative.""",
      ("assert checked_repeat('ab', 2) == 'abab'", "with raises(ValueError):\n    checked_repeat('a', -1)",
       "with raises(TypeError):\n    checked_repeat('a', 1.5)", "with raises(TypeError):\n    checked_repeat('a', -1.5)",
       "assert checked_repeat('a', 0) == ''"),
      ("assert checked_repeat('x', 0) == ''", "with raises(TypeError):\n    checked_repeat('a', '2')"),
      _src("""
      def checked_repeat(s: str, n: int) -> str:
          if not isinstance(n, int):
              raise TypeError('n must be an int')
          if n < 0:
              raise ValueError('n must not be negative')
          return s * n
      """),
      _src("""
      def checked_repeat(s: str, n: int) -> str:
          return s * max(int(n), 0)
      """), 1),
]
