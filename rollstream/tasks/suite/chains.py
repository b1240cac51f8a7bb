# ruff: noqa: ISC004 (the chains are data: long strings split over lines)
"""The built-in subtask chains: ``python -m rollstream.tasks.suite.chains`` rewrites ``chains.jsonl``.

Each chain builds a small module one step at a time (consumers/executor/episodes.py): a step is an
instruction, its tests and a reference solution; the code of the steps passed is kept and runs
before the next step's, so later steps may call what earlier ones defined. A chain's top-level
``reward.tests`` are all its steps' tests (a one-shot answer that writes the whole module
passes them) and its ``reference_solution`` is the steps' references in order. It gets
``max_turns`` = steps + 2: a turn per step and two to fix mistakes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rollstream.schemas.events import RewardSpec, Subtask
from rollstream.schemas.tasks import TaskSpec, encode_task

FAMILY = "chains"
FILE = Path(__file__).resolve().parent / "chains.jsonl"

# (name, what the module is, [(instruction, reference, [tests])])
CHAINS: list[tuple[str, str, list[tuple[str, str, list[str]]]]] = [
    ("stack", "a stack kept in a Python list", [
        ("Write `make_stack()` returning a new empty stack (a list).",
         "def make_stack():\n    return []\n", ["assert make_stack() == []", "assert make_stack() is not make_stack()"]),
        ("Write `push(stack, x)` adding x on top and returning the new size.",
         "def push(stack, x):\n    stack.append(x)\n    return len(stack)\n",
         ["s = make_stack()\nassert push(s, 1) == 1 and push(s, 2) == 2 and s == [1, 2]"]),
        ("Write `pop(stack)` removing and returning the top item, or None when the stack is empty.",
         "def pop(stack):\n    return stack.pop() if stack else None\n",
         ["s = make_stack()\npush(s, 1)\npush(s, 2)\nassert pop(s) == 2 and pop(s) == 1 and pop(s) is None"]),
    ]),
    ("wordcount", "word statistics of a text", [
        ("Write `words(text)` returning the lower-cased words of text (split on whitespace).",
         "def words(text):\n    return text.lower().split()\n", ["assert words('The cat  the') == ['the', 'cat', 'the']"]),
        ("Write `word_counts(text)` returning a dict word -> count, using `words`.",
         "def word_counts(text):\n    counts = {}\n    for w in words(text):\n        counts[w] = counts.get(w, 0) + 1\n"
         "    return counts\n", ["assert word_counts('a b A') == {'a': 2, 'b': 1}", "assert word_counts('') == {}"]),
        ("Write `top_word(text)` returning the most frequent word (the alphabetically first on a tie), or None for no words.",
         "def top_word(text):\n    counts = word_counts(text)\n    if not counts:\n        return None\n"
         "    return min(counts, key=lambda w: (-counts[w], w))\n",
         ["assert top_word('b a b a c') == 'a'", "assert top_word('x y y') == 'y'", "assert top_word('') is None"]),
    ]),
    ("matrix", "small matrices as lists of rows", [
        ("Write `zeros(n, m)` returning an n x m matrix of zeros (independent rows).",
         "def zeros(n, m):\n    return [[0] * m for _ in range(n)]\n",
         ["assert zeros(2, 3) == [[0, 0, 0], [0, 0, 0]]", "z = zeros(2, 2)\nz[0][0] = 1\nassert z[1][0] == 0"]),
        ("Write `identity(n)` returning the n x n identity matrix.",
         "def identity(n):\n    m = zeros(n, n)\n    for i in range(n):\n        m[i][i] = 1\n    return m\n",
         ["assert identity(2) == [[1, 0], [0, 1]]", "assert identity(0) == []"]),
        ("Write `transpose(m)` returning the transpose of matrix m.",
         "def transpose(m):\n    return [list(row) for row in zip(*m)]\n",
         ["assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]", "assert transpose(identity(3)) == identity(3)"]),
    ]),
    ("temperature", "temperature conversions", [
        ("Write `c_to_f(c)` converting Celsius to Fahrenheit.",
         "def c_to_f(c):\n    return c * 9 / 5 + 32\n", ["assert c_to_f(100) == 212", "assert c_to_f(-40) == -40"]),
        ("Write `f_to_c(f)` converting Fahrenheit to Celsius.",
         "def f_to_c(f):\n    return (f - 32) * 5 / 9\n", ["assert f_to_c(212) == 100", "assert f_to_c(32) == 0"]),
        ("Write `convert_all(values, to)` converting a list with `c_to_f` when to == 'F' and `f_to_c` when to == 'C'.",
         "def convert_all(values, to):\n    f = c_to_f if to == 'F' else f_to_c\n    return [f(v) for v in values]\n",
         ["assert convert_all([0, 100], 'F') == [32, 212]", "assert convert_all([32], 'C') == [0]"]),
    ]),
    ("palindromes", "palindrome helpers", [
        ("Write `reverse(s)` returning s reversed.",
         "def reverse(s):\n    return s[::-1]\n", ["assert reverse('abc') == 'cba'", "assert reverse('') == ''"]),
        ("Write `is_palindrome(s)` (ignoring case), using `reverse`.",
         "def is_palindrome(s):\n    return s.lower() == reverse(s.lower())\n",
         ["assert is_palindrome('Level')", "assert not is_palindrome('ab')"]),
        ("Write `longest_palindrome(words)` returning the longest palindromic word (the first on a tie), or '' if none.",
         "def longest_palindrome(words):\n    best = ''\n    for w in words:\n        if is_palindrome(w) and len(w) > len(best):\n"
         "            best = w\n    return best\n",
         ["assert longest_palindrome(['ab', 'aba', 'racecar', 'noon']) == 'racecar'", "assert longest_palindrome(['ab']) == ''"]),
    ]),
    ("primes", "prime numbers", [
        ("Write `is_prime(n)` for integers n (False below 2).",
         "def is_prime(n):\n    if n < 2:\n        return False\n    i = 2\n    while i * i <= n:\n        if n % i == 0:\n"
         "            return False\n        i += 1\n    return True\n",
         ["assert [n for n in range(12) if is_prime(n)] == [2, 3, 5, 7, 11]"]),
        ("Write `primes_below(n)` returning the primes less than n, using `is_prime`.",
         "def primes_below(n):\n    return [k for k in range(n) if is_prime(k)]\n",
         ["assert primes_below(20) == [2, 3, 5, 7, 11, 13, 17, 19]", "assert primes_below(2) == []"]),
        ("Write `nth_prime(k)` returning the k-th prime (nth_prime(1) == 2).",
         "def nth_prime(k):\n    n, found = 1, 0\n    while found < k:\n        n += 1\n        if is_prime(n):\n"
         "            found += 1\n    return n\n", ["assert nth_prime(1) == 2 and nth_prime(5) == 11 and nth_prime(10) == 29"]),
    ]),
    ("vectors", "vectors as lists of numbers", [
        ("Write `add(u, v)` returning the element-wise sum.",
         "def add(u, v):\n    return [a + b for a, b in zip(u, v)]\n", ["assert add([1, 2], [3, 4]) == [4, 6]"]),
        ("Write `scale(v, k)` multiplying every element by k.",
         "def scale(v, k):\n    return [a * k for a in v]\n", ["assert scale([1, -2], 3) == [3, -6]"]),
        ("Write `dot(u, v)` returning the dot product, and `norm2(v)` returning dot(v, v).",
         "def dot(u, v):\n    return sum(a * b for a, b in zip(u, v))\n\n\ndef norm2(v):\n    return dot(v, v)\n",
         ["assert dot([1, 2, 3], [4, 5, 6]) == 32", "assert norm2(add([1, 0], scale([0, 1], 2))) == 5"]),
    ]),
    ("bank", "bank accounts as dicts", [
        ("Write `open_account(owner)` returning {'owner': owner, 'balance': 0}.",
         "def open_account(owner):\n    return {'owner': owner, 'balance': 0}\n",
         ["assert open_account('ann') == {'owner': 'ann', 'balance': 0}"]),
        ("Write `deposit(account, amount)` adding a positive amount and returning the new balance; raise ValueError otherwise.",
         "def deposit(account, amount):\n    if amount <= 0:\n        raise ValueError('amount must be positive')\n"
         "    account['balance'] += amount\n    return account['balance']\n",
         ["a = open_account('x')\nassert deposit(a, 5) == 5 and deposit(a, 2) == 7",
          "a = open_account('x')\ntry:\n    deposit(a, 0)\n    raise AssertionError('no error')\nexcept ValueError:\n    pass"]),
        ("Write `withdraw(account, amount)` taking the amount out and returning the new balance; raise ValueError when the balance is too low.",
         "def withdraw(account, amount):\n    if amount <= 0 or amount > account['balance']:\n"
         "        raise ValueError('cannot withdraw')\n    account['balance'] -= amount\n    return account['balance']\n",
         ["a = open_account('x')\ndeposit(a, 10)\nassert withdraw(a, 4) == 6",
          "a = open_account('x')\ntry:\n    withdraw(a, 1)\n    raise AssertionError('no error')\nexcept ValueError:\n    pass"]),
    ]),
    ("inventory", "an inventory dict name -> quantity", [
        ("Write `add_item(inv, name, qty)` adding qty of name (starting at 0) and returning the new quantity.",
         "def add_item(inv, name, qty):\n    inv[name] = inv.get(name, 0) + qty\n    return inv[name]\n",
         ["inv = {}\nassert add_item(inv, 'a', 2) == 2 and add_item(inv, 'a', 3) == 5"]),
        ("Write `remove_item(inv, name, qty)` taking qty away (never below 0; the name goes when it reaches 0); return what is left.",
         "def remove_item(inv, name, qty):\n    left = max(0, inv.get(name, 0) - qty)\n    if left:\n        inv[name] = left\n"
         "    else:\n        inv.pop(name, None)\n    return left\n",
         ["inv = {'a': 5}\nassert remove_item(inv, 'a', 2) == 3 and remove_item(inv, 'a', 9) == 0 and inv == {}"]),
        ("Write `total_items(inv)` returning the sum of all quantities.",
         "def total_items(inv):\n    return sum(inv.values())\n",
         ["inv = {}\nadd_item(inv, 'a', 2)\nadd_item(inv, 'b', 3)\nassert total_items(inv) == 5", "assert total_items({}) == 0"]),
    ]),
    ("grades", "grade reports", [
        ("Write `average(scores)` returning the mean of a non-empty list.",
         "def average(scores):\n    return sum(scores) / len(scores)\n", ["assert average([80, 90, 100]) == 90"]),
        ("Write `letter(avg)` returning 'A' (>= 90), 'B' (>= 80), 'C' (>= 70) or 'F'.",
         "def letter(avg):\n    for bound, grade in ((90, 'A'), (80, 'B'), (70, 'C')):\n        if avg >= bound:\n"
         "            return grade\n    return 'F'\n", ["assert [letter(x) for x in (95, 80, 75, 10)] == ['A', 'B', 'C', 'F']"]),
        ("Write `report(students)` mapping each name of a dict name -> scores to its letter grade.",
         "def report(students):\n    return {name: letter(average(s)) for name, s in students.items()}\n",
         ["assert report({'a': [90, 100], 'b': [70, 60]}) == {'a': 'A', 'b': 'F'}"]),
    ]),
    ("fibonacci", "Fibonacci numbers", [
        ("Write `fib(n)` with fib(0) == 0, fib(1) == 1.",
         "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
         ["assert [fib(i) for i in range(8)] == [0, 1, 1, 2, 3, 5, 8, 13]"]),
        ("Write `fib_list(n)` returning the first n Fibonacci numbers.",
         "def fib_list(n):\n    return [fib(i) for i in range(n)]\n", ["assert fib_list(5) == [0, 1, 1, 2, 3]", "assert fib_list(0) == []"]),
        ("Write `sum_even_fib(limit)` summing the even Fibonacci numbers not above limit.",
         "def sum_even_fib(limit):\n    total, i = 0, 0\n    while fib(i) <= limit:\n        if fib(i) % 2 == 0:\n"
         "            total += fib(i)\n        i += 1\n    return total\n", ["assert sum_even_fib(10) == 10", "assert sum_even_fib(100) == 44"]),
    ]),
    ("letters", "letter statistics", [
        ("Write `count_vowels(s)` counting the letters aeiou (any case).",
         "def count_vowels(s):\n    return sum(c in 'aeiou' for c in s.lower())\n", ["assert count_vowels('Hello World') == 3"]),
        ("Write `count_consonants(s)` counting the other letters.",
         "def count_consonants(s):\n    return sum(c.isalpha() and c not in 'aeiou' for c in s.lower())\n",
         ["assert count_consonants('Hello World!') == 7"]),
        ("Write `vowel_ratio(s)` returning vowels / letters (0.0 for no letters).",
         "def vowel_ratio(s):\n    letters = count_vowels(s) + count_consonants(s)\n    return count_vowels(s) / letters if letters else 0.0\n",
         ["assert vowel_ratio('abab') == 0.5", "assert vowel_ratio('123') == 0.0"]),
    ]),
    ("queue", "a FIFO queue kept in a list", [
        ("Write `enqueue(q, x)` appending x to the list q.",
         "def enqueue(q, x):\n    q.append(x)\n", ["q = []\nenqueue(q, 1)\nenqueue(q, 2)\nassert q == [1, 2]"]),
        ("Write `dequeue(q)` removing and returning the oldest item, or None when empty.",
         "def dequeue(q):\n    return q.pop(0) if q else None\n",
         ["q = []\nenqueue(q, 1)\nenqueue(q, 2)\nassert dequeue(q) == 1 and dequeue(q) == 2 and dequeue(q) is None"]),
        ("Write `drain(q)` dequeuing everything, returning the items in order.",
         "def drain(q):\n    out = []\n    while q:\n        out.append(dequeue(q))\n    return out\n",
         ["q = [3, 1, 2]\nassert drain(q) == [3, 1, 2] and q == []"]),
    ]),
    ("shapes", "areas of shapes", [
        ("Write `rect_area(w, h)`.", "def rect_area(w, h):\n    return w * h\n", ["assert rect_area(2, 3) == 6"]),
        ("Write `triangle_area(b, h)` (half base times height).",
         "def triangle_area(b, h):\n    return b * h / 2\n", ["assert triangle_area(4, 3) == 6"]),
        ("Write `total_area(shapes)` for a list of ('rect', w, h) and ('triangle', b, h) tuples.",
         "def total_area(shapes):\n    total = 0\n    for kind, a, b in shapes:\n"
         "        total += rect_area(a, b) if kind == 'rect' else triangle_area(a, b)\n    return total\n",
         ["assert total_area([('rect', 2, 3), ('triangle', 4, 3)]) == 12", "assert total_area([]) == 0"]),
    ]),
    ("calendar", "calendar arithmetic", [
        ("Write `is_leap(year)` for the Gregorian calendar.",
         "def is_leap(year):\n    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)\n",
         ["assert is_leap(2000) and is_leap(2024) and not is_leap(1900) and not is_leap(2023)"]),
        ("Write `days_in_month(year, month)`.",
         "def days_in_month(year, month):\n    if month == 2:\n        return 29 if is_leap(year) else 28\n"
         "    return 30 if month in (4, 6, 9, 11) else 31\n",
         ["assert days_in_month(2024, 2) == 29 and days_in_month(2023, 2) == 28 and days_in_month(2023, 4) == 30"]),
        ("Write `day_of_year(year, month, day)` (January 1st is 1).",
         "def day_of_year(year, month, day):\n    return sum(days_in_month(year, m) for m in range(1, month)) + day\n",
         ["assert day_of_year(2023, 1, 1) == 1 and day_of_year(2023, 3, 1) == 60 and day_of_year(2024, 12, 31) == 366"]),
    ]),
    ("caesar", "a Caesar cipher", [
        ("Write `shift_char(c, k)` shifting a lower-case letter k places around the alphabet (other characters unchanged).",
         "def shift_char(c, k):\n    if 'a' <= c <= 'z':\n        return chr((ord(c) - 97 + k) % 26 + 97)\n    return c\n",
         ["assert shift_char('a', 1) == 'b' and shift_char('z', 2) == 'b' and shift_char('!', 3) == '!'"]),
        ("Write `encrypt(s, k)` shifting every character of s.",
         "def encrypt(s, k):\n    return ''.join(shift_char(c, k) for c in s)\n", ["assert encrypt('abc xyz', 3) == 'def abc'"]),
        ("Write `decrypt(s, k)` undoing `encrypt`.",
         "def decrypt(s, k):\n    return encrypt(s, -k)\n", ["assert decrypt(encrypt('hello, world', 7), 7) == 'hello, world'"]),
    ]),
    ("chunks", "list chunking", [
        ("Write `chunk(lst, n)` splitting a list into consecutive pieces of n (the last may be shorter).",
         "def chunk(lst, n):\n    return [lst[i:i + n] for i in range(0, len(lst), n)]\n",
         ["assert chunk([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]", "assert chunk([], 3) == []"]),
        ("Write `flatten(lists)` joining a list of lists.",
         "def flatten(lists):\n    return [x for part in lists for x in part]\n", ["assert flatten([[1], [2, 3], []]) == [1, 2, 3]"]),
        ("Write `chunk_sums(lst, n)` returning the sum of each chunk.",
         "def chunk_sums(lst, n):\n    return [sum(part) for part in chunk(lst, n)]\n",
         ["assert chunk_sums([1, 2, 3, 4, 5], 2) == [3, 7, 5]", "assert flatten(chunk([1, 2, 3], 2)) == [1, 2, 3]"]),
    ]),
    ("roman", "Roman numerals", [
        ("Write `to_roman(n)` for 1 <= n <= 3999.",
         "def to_roman(n):\n    parts = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'), (50, 'L'),\n"
         "             (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')]\n    out = ''\n"
         "    for value, text in parts:\n        while n >= value:\n            out += text\n            n -= value\n    return out\n",
         ["assert to_roman(1994) == 'MCMXCIV' and to_roman(4) == 'IV' and to_roman(3999) == 'MMMCMXCIX'"]),
        ("Write `from_roman(s)` converting back.",
         "def from_roman(s):\n    values = {'I': 1, 'V': 5, 'X': 10, 'L': 50, 'C': 100, 'D': 500, 'M': 1000}\n    total = 0\n"
         "    for i, c in enumerate(s):\n        v = values[c]\n        if i + 1 < len(s) and values[s[i + 1]] > v:\n"
         "            total -= v\n        else:\n            total += v\n    return total\n",
         ["assert from_roman('MCMXCIV') == 1994 and from_roman('IX') == 9"]),
        ("Write `roman_add(a, b)` adding two numerals and returning a numeral.",
         "def roman_add(a, b):\n    return to_roman(from_roman(a) + from_roman(b))\n",
         ["assert roman_add('XIV', 'XXVI') == 'XL'", "assert all(from_roman(to_roman(n)) == n for n in range(1, 200))"]),
    ]),
    ("histogram", "frequency counts", [
        ("Write `freq(items)` returning a dict item -> count.",
         "def freq(items):\n    out = {}\n    for x in items:\n        out[x] = out.get(x, 0) + 1\n    return out\n",
         ["assert freq('abca') == {'a': 2, 'b': 1, 'c': 1}"]),
        ("Write `mode(items)` returning the most frequent item (the smallest on a tie).",
         "def mode(items):\n    counts = freq(items)\n    return min(counts, key=lambda x: (-counts[x], x))\n",
         ["assert mode([3, 1, 3, 1, 2]) == 1", "assert mode('banana') == 'a'"]),
        ("Write `bars(items)` returning lines 'item: ***' (one star per occurrence) in sorted item order, joined by newlines.",
         "def bars(items):\n    counts = freq(items)\n    return '\\n'.join(f'{x}: ' + '*' * counts[x] for x in sorted(counts))\n",
         ["assert bars('aba') == 'a: **\\nb: *'", "assert bars([]) == ''"]),
    ]),
    ("sorted", "sorted lists", [
        ("Write `bsearch(lst, x)` returning the index of x in the sorted list lst, or -1.",
         "def bsearch(lst, x):\n    lo, hi = 0, len(lst) - 1\n    while lo <= hi:\n        mid = (lo + hi) // 2\n"
         "        if lst[mid] == x:\n            return mid\n        if lst[mid] < x:\n            lo = mid + 1\n"
         "        else:\n            hi = mid - 1\n    return -1\n",
         ["assert bsearch([1, 3, 5, 7], 5) == 2 and bsearch([1, 3, 5], 4) == -1 and bsearch([], 1) == -1"]),
        ("Write `insert_sorted(lst, x)` returning a new sorted list with x inserted.",
         "def insert_sorted(lst, x):\n    i = 0\n    while i < len(lst) and lst[i] < x:\n        i += 1\n    return lst[:i] + [x] + lst[i:]\n",
         ["assert insert_sorted([1, 3, 5], 4) == [1, 3, 4, 5] and insert_sorted([], 1) == [1]"]),
        ("Write `merge_sorted(a, b)` merging two sorted lists.",
         "def merge_sorted(a, b):\n    out = list(a)\n    for x in b:\n        out = insert_sorted(out, x)\n    return out\n",
         ["assert merge_sorted([1, 4], [2, 3, 5]) == [1, 2, 3, 4, 5]", "assert bsearch(merge_sorted([1], [2]), 2) == 1"]),
    ]),
]


def build(name: str, topic: str, steps: list[tuple[str, str, list[str]]]) -> TaskSpec:
    subtasks = [Subtask(instruction=text, tests=tests, reference=reference) for text, reference, tests in steps]
    prompt = (f"Build {topic} in Python, one step at a time: each step adds to what you wrote before, which is "
              f"kept.\n\nStep 1 of {len(steps)}: {steps[0][0]}\n\nAnswer with the code of this step in one "
              f"```python block.")
    return TaskSpec(task_id=f"{FAMILY}/{name}", family=FAMILY, prompt=prompt,
                    reward=RewardSpec(tests=[t for _, _, tests in steps for t in tests], subtasks=subtasks),
                    reference_solution="\n\n".join(reference for _, reference, _ in steps),
                    max_turns=len(steps) + 2, difficulty=1)


def check(task: TaskSpec) -> None:
    """Run each step's reference after the steps before it and its tests, in-process (a suite
    bug, not a sandbox check: tests/rollstream/tasks/test_suite.py does that through the sandbox)."""
    namespace: dict[str, object] = {"__name__": "solution"}
    for subtask in task.reward.subtasks:
        exec(subtask.reference or "", namespace)  # noqa: S102 - the suite's own references
        for test in subtask.tests:
            exec(test, dict(namespace))  # noqa: S102


def render() -> bytes:
    tasks = [build(*chain) for chain in CHAINS]
    for task in tasks:
        check(task)
    return b"".join(encode_task(t) + b"\n" for t in tasks)


def main() -> int:
    FILE.write_bytes(render())
    print(f"wrote {len(CHAINS)} chains to {FILE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
