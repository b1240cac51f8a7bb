"""Build the math suite: ``python -m rollstream.tasks.mathsuite.build`` rewrites ``<family>.jsonl``.

Six families of generated problems with exact answers (arithmetic word problems, fractions and
ratios, linear equations, combinatorics counts, number theory, sequences), 30 tasks each, at
difficulty 1 (one step: "What is 17 + 25?"), 2 (two steps) and 3 (three or more, or a formula).
Every task is drawn from a template with a random.Random seeded by (SEED, family, template), so
the files are byte-identical on every build; its answer is computed exactly (an integer, or a
fraction a/b in lowest terms), and it carries a short worked solution ending in ``\\boxed{gold}``
(``reference_solution``) and the same solution with an off-by-one answer (``wrong_solutions``).
The reward is ``math_answer`` with ``answer_format = "boxed"``.

``--check`` verifies that the files on disk equal what would be written.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

from rollstream.schemas.events import RewardSpec
from rollstream.schemas.tasks import TaskSpec
from rollstream.tasks.suite_files import render_grouped, write_or_check

MATH_SUITE_DIR = Path(__file__).resolve().parent
SEED = 55
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
NAMES = ("Ana", "Ben", "Chloe", "Dev", "Ella", "Finn", "Grace", "Hugo", "Ivy", "Jack", "Kira", "Leo", "Maya",
         "Nico", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tara", "Uma", "Victor", "Wen", "Yusuf", "Zoe")
ITEMS = ("apples", "marbles", "stickers", "pencils", "cards", "shells", "stamps", "coins", "books", "cookies",
         "crayons", "buttons", "beads", "balloons", "rocks")
Number = int | Fraction
# A template draws (problem text, worked steps, exact answer) from its generator.
Template = Callable[[random.Random], tuple[str, str, Number]]


def show(value: Number) -> str:
    """An exact answer as the gold text: an integer, or a/b in lowest terms (the sign on a)."""
    value = Fraction(value)
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def off_by_one(value: Number) -> str:
    """A wrong answer one away: n + 1, or a/b with the numerator one larger (never equal to the gold)."""
    value = Fraction(value)
    if value.denominator == 1:
        return str(value.numerator + 1)
    return f"{value.numerator + 1}/{value.denominator}"


def _two(rng: random.Random, pool: tuple[str, ...]) -> tuple[str, str]:
    a, b = rng.sample(pool, 2)
    return a, b


# --- arithmetic word problems -------------------------------------------------------------

def add(rng):
    a, b = rng.randint(11, 69), rng.randint(11, 59)
    return f"What is {a} + {b}?", f"{a} + {b} = {a + b}.", a + b


def sub(rng):
    a = rng.randint(30, 99)
    b = rng.randint(11, a - 5)
    return f"What is {a} - {b}?", f"{a} - {b} = {a - b}.", a - b


def mul(rng):
    a, b = rng.randint(3, 12), rng.randint(3, 12)
    return f"What is {a} times {b}?", f"{a} × {b} = {a * b}.", a * b


def buy_more(rng):
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(5, 40), rng.randint(3, 30)
    return (f"{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} have now?",
            f"{name} has {a} and gets {b} more: {a} + {b} = {a + b}.", a + b)


def left(rng):
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a = rng.randint(15, 60)
    b = rng.randint(2, a - 3)
    return (f"{name} had {a} {item} and gave {b} of them to a friend. How many {item} are left?",
            f"{a} - {b} = {a - b} are left.", a - b)


def groups(rng):
    item = rng.choice(ITEMS)
    a, b = rng.randint(3, 9), rng.randint(4, 12)
    return (f"There are {a} bags with {b} {item} in each bag. How many {item} are there in total?",
            f"{a} bags of {b}: {a} × {b} = {a * b}.", a * b)


def share(rng):
    item = rng.choice(ITEMS)
    d, q = rng.randint(3, 8), rng.randint(3, 12)
    return (f"{d * q} {item} are shared equally among {d} friends. How many {item} does each friend get?",
            f"{d * q} ÷ {d} = {q}.", q)


def packs(rng):
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    p, q = rng.randint(2, 6), rng.randint(5, 12)
    r = rng.randint(2, p * q - 2)
    return (f"{name} buys {p} packs of {item} with {q} in each pack, then gives away {r} of them. "
            f"How many {item} does {name} keep?",
            f"{name} buys {p} × {q} = {p * q}, then keeps {p * q} - {r} = {p * q - r}.", p * q - r)


def change(rng):
    name = rng.choice(NAMES)
    p, n = rng.randint(2, 9), rng.randint(2, 5)
    bill = 20 if p * n < 20 else 50
    return (f"A notebook costs {p} dollars. {name} buys {n} notebooks and pays with a {bill}-dollar bill. "
            "How many dollars of change does " + name + " get?",
            f"The notebooks cost {n} × {p} = {n * p} dollars; the change is {bill} - {n * p} = {bill - n * p}.",
            bill - n * p)


def order_of_operations(rng):
    a, b, c = rng.randint(2, 20), rng.randint(2, 9), rng.randint(2, 9)
    return (f"What is {a} + {b} * {c}?", f"Multiply first: {b} * {c} = {b * c}, then {a} + {b * c} = {a + b * c}.",
            a + b * c)


def speed(rng):
    s1, s2 = rng.choice((40, 50, 60, 70, 80)), rng.choice((45, 55, 65, 75, 90))
    h1, h2 = rng.randint(2, 4), rng.randint(1, 3)
    total = s1 * h1 + s2 * h2
    return (f"A train travels at {s1} km per hour for {h1} hours, then at {s2} km per hour for {h2} hours. "
            "How many kilometres does it travel in total?",
            f"{s1} × {h1} = {s1 * h1} km and {s2} × {h2} = {s2 * h2} km; together {s1 * h1} + {s2 * h2} = {total}.",
            total)


def percent(rng):
    p = rng.choice((10, 20, 25, 30, 40, 60, 75))
    n = rng.choice((40, 80, 120, 160, 200, 240, 360))
    value = p * n // 100
    return f"What is {p}% of {n}?", f"{p}% of {n} is {p}/100 × {n} = {value}.", value


def savings(rng):
    name = rng.choice(NAMES)
    s, a, w = rng.randint(5, 30), rng.randint(4, 15), rng.randint(3, 10)
    goal = s + a * w
    return (f"{name} has {s} dollars and saves {a} dollars every week. After how many weeks will {name} have "
            f"{goal} dollars?",
            f"{name} needs {goal} - {s} = {goal - s} more dollars, which takes {goal - s} ÷ {a} = {w} weeks.", w)


def average(rng):
    name = rng.choice(NAMES)
    while True:
        xs = [rng.randint(55, 99) for _ in range(4)]
        if sum(xs) % 4 == 0:
            break
    listed = ", ".join(map(str, xs[:3])) + f" and {xs[3]}"
    return (f"{name} scored {listed} on four tests. What is the average score?",
            f"The total is {' + '.join(map(str, xs))} = {sum(xs)}, and {sum(xs)} ÷ 4 = {sum(xs) // 4}.",
            sum(xs) // 4)


# --- fractions and ratios -----------------------------------------------------------------

def same_denominator(rng):
    d = rng.randint(5, 12)
    a, b = rng.randint(1, d - 2), 0
    b = rng.randint(1, d - a - 1)
    v = Fraction(a + b, d)
    return (f"What is {a}/{d} + {b}/{d}?", f"Add the numerators: ({a} + {b})/{d} = {a + b}/{d} = {show(v)}.", v)


def half(rng):
    n = 2 * rng.randint(6, 49)
    return f"What is half of {n}?", f"{n} ÷ 2 = {n // 2}.", n // 2


def lowest_terms(rng):
    while True:
        p, q = rng.randint(1, 9), rng.randint(2, 11)
        if p < q and math.gcd(p, q) == 1:
            break
    k = rng.randint(2, 9)
    return (f"Write {k * p}/{k * q} in lowest terms.",
            f"Divide the top and bottom by {k}: {k * p}/{k * q} = {p}/{q}.", Fraction(p, q))


def fraction_of_group(rng):
    item = rng.choice(("marbles", "beads", "balloons", "buttons"))
    n = rng.choice((12, 15, 18, 20, 24, 30, 36))
    k = rng.randint(2, n - 2)
    v = Fraction(k, n)
    return (f"A bag holds {n} {item} and {k} of them are red. What fraction of the {item} are red? "
            "Give the fraction in lowest terms.", f"{k} out of {n} is {k}/{n} = {show(v)}.", v)


def add_unlike(rng):
    b, d = rng.sample((2, 3, 4, 5, 6, 7, 8), 2)
    a, c = rng.randint(1, b - 1), rng.randint(1, d - 1)
    v = Fraction(a, b) + Fraction(c, d)
    m = b * d // math.gcd(b, d)
    return (f"What is {a}/{b} + {c}/{d}?",
            f"Over {m}: {a * m // b}/{m} + {c * m // d}/{m} = {a * m // b + c * m // d}/{m} = {show(v)}.", v)


def sub_unlike(rng):
    b, d = rng.sample((2, 3, 4, 5, 6, 8, 9), 2)
    a, c = rng.randint(1, b - 1), rng.randint(1, d - 1)
    v = Fraction(a, b) - Fraction(c, d)
    m = b * d // math.gcd(b, d)
    return (f"What is {a}/{b} - {c}/{d}?",
            f"Over {m}: {a * m // b}/{m} - {c * m // d}/{m} = {a * m // b - c * m // d}/{m} = {show(v)}.", v)


def multiply(rng):
    b, d = rng.randint(2, 9), rng.randint(2, 9)
    a, c = rng.randint(1, b), rng.randint(1, d - 1)
    v = Fraction(a, b) * Fraction(c, d)
    return (f"What is {a}/{b} times {c}/{d}?",
            f"Multiply tops and bottoms: ({a} × {c})/({b} × {d}) = {a * c}/{b * d} = {show(v)}.", v)


def ratio_part(rng):
    p, q = rng.randint(1, 5), rng.randint(2, 6)
    k = rng.randint(3, 8)
    n = (p + q) * k
    return (f"The ratio of boys to girls in a class is {p}:{q}. There are {n} students. How many girls are there?",
            f"There are {p} + {q} = {p + q} parts, each {n} ÷ {p + q} = {k} students; girls: {q} × {k} = {q * k}.",
            q * k)


def fraction_of_number(rng):
    b = rng.randint(3, 9)
    a = rng.randint(1, b - 1)
    n = b * rng.randint(3, 15)
    return (f"What is {a}/{b} of {n}?", f"{n} ÷ {b} = {n // b}, and {a} × {n // b} = {a * n // b}.", a * n // b)


def divide(rng):
    b, d = rng.randint(2, 9), rng.randint(2, 9)
    a, c = rng.randint(1, b - 1), rng.randint(1, d - 1)
    v = Fraction(a, b) / Fraction(c, d)
    return (f"What is {a}/{b} divided by {c}/{d}?",
            f"Multiply by the reciprocal: {a}/{b} × {d}/{c} = {a * d}/{b * c} = {show(v)}.", v)


def mixed(rng):
    a, b = rng.randint(1, 4), rng.randint(2, 6)
    c, d, e, f = rng.randint(1, 5), rng.randint(2, 7), rng.randint(1, 5), rng.randint(2, 7)
    product = Fraction(c, d) * Fraction(e, f)
    v = Fraction(a, b) + product
    return (f"What is {a}/{b} + {c}/{d} × {e}/{f}?",
            f"Multiply first: {c}/{d} × {e}/{f} = {show(product)}; then {a}/{b} + {show(product)} = {show(v)}.", v)


def ratio_three(rng):
    x, y, z = rng.sample(NAMES, 3)
    p, q, r = rng.randint(1, 4), rng.randint(2, 5), rng.randint(1, 6)
    k = rng.randint(4, 12)
    total = (p + q + r) * k
    return (f"{x}, {y} and {z} share {total} dollars in the ratio {p}:{q}:{r}. How many dollars does {z} get?",
            f"{p} + {q} + {r} = {p + q + r} parts of {total} ÷ {p + q + r} = {k} dollars; {z} gets {r} × {k} = "
            f"{r * k}.", r * k)


def remaining(rng):
    name = rng.choice(NAMES)
    a, b = rng.randint(1, 3), rng.randint(4, 6)
    c, d = rng.randint(1, 2), rng.randint(3, 5)
    after = 1 - Fraction(a, b)
    v = after * (1 - Fraction(c, d))
    return (f"{name} spends {a}/{b} of a sum of money on a book and then {c}/{d} of what is left on lunch. "
            "What fraction of the money is left?",
            f"After the book {show(after)} is left; lunch leaves {show(1 - Fraction(c, d))} of that: "
            f"{show(after)} × {show(1 - Fraction(c, d))} = {show(v)}.", v)


# --- linear equations ---------------------------------------------------------------------

def x_plus(rng):
    a, x = rng.randint(2, 40), rng.randint(-10, 50)
    return f"Solve for x: x + {a} = {x + a}.", f"x = {x + a} - {a} = {x}.", x


def x_minus(rng):
    a, x = rng.randint(2, 40), rng.randint(1, 60)
    return f"Solve for x: x - {a} = {x - a}.", f"x = {x - a} + {a} = {x}.", x


def x_times(rng):
    a, x = rng.randint(2, 12), rng.randint(2, 15)
    return f"Solve for x: {a}x = {a * x}.", f"x = {a * x} ÷ {a} = {x}.", x


def two_step(rng):
    a, b, x = rng.randint(2, 9), rng.randint(1, 30), rng.randint(-8, 15)
    c = a * x + b
    return (f"Solve for x: {a}x + {b} = {c}.", f"{a}x = {c} - {b} = {c - b}, so x = {c - b} ÷ {a} = {x}.", x)


def two_step_minus(rng):
    a, b, x = rng.randint(2, 9), rng.randint(1, 30), rng.randint(1, 15)
    c = a * x - b
    return (f"Solve for x: {a}x - {b} = {c}.", f"{a}x = {c} + {b} = {c + b}, so x = {c + b} ÷ {a} = {x}.", x)


def x_over(rng):
    a, b, q = rng.randint(2, 6), rng.randint(1, 20), rng.randint(1, 12)
    x = a * q
    return (f"Solve for x: x/{a} + {b} = {q + b}.", f"x/{a} = {q + b} - {b} = {q}, so x = {q} × {a} = {x}.", x)


def think_of(rng):
    a, b, x = rng.randint(2, 7), rng.randint(3, 25), rng.randint(2, 20)
    c = a * x + b
    return (f"I think of a number, multiply it by {a} and add {b}. The result is {c}. What is the number?",
            f"{a}n + {b} = {c}, so {a}n = {c - b} and n = {x}.", x)


def both_sides(rng):
    while True:
        a, c = rng.randint(3, 12), rng.randint(1, 10)
        if a != c:
            break
    b, d = rng.randint(-15, 20), rng.randint(-15, 30)
    x = Fraction(d - b, a - c)
    return (f"Solve for x: {a}x + {b} = {c}x + {d}.".replace("+ -", "- "),
            f"({a} - {c})x = {d} - ({b}), so {a - c}x = {d - b} and x = {show(x)}.", x)


def brackets(rng):
    a, b, c = rng.randint(2, 8), rng.randint(1, 9), rng.randint(-20, 60)
    x = Fraction(c, a) - b
    return (f"Solve for x: {a}(x + {b}) = {c}.", f"x + {b} = {c}/{a}, so x = {show(Fraction(c, a))} - {b} = {show(x)}.",
            x)


def fraction_answer(rng):
    while True:
        a, b, c = rng.randint(2, 9), rng.randint(1, 20), rng.randint(1, 50)
        if (c - b) % a:
            break
    x = Fraction(c - b, a)
    reduced = "" if x.denominator == a else f" = {show(x)}"
    return (f"Solve for x: {a}x + {b} = {c}.", f"{a}x = {c} - {b} = {c - b}, so x = {c - b}/{a}{reduced}.", x)


# --- combinatorics counts -----------------------------------------------------------------

def outfits(rng):
    name = rng.choice(NAMES)
    a, b = rng.randint(2, 9), rng.randint(2, 7)
    return (f"{name} has {a} shirts and {b} pairs of trousers. How many different outfits of one shirt and one "
            f"pair of trousers can {name} make?", f"{a} × {b} = {a * b}.", a * b)


def line_up(rng):
    n = rng.choice((3, 4))
    return (f"In how many different orders can {n} people stand in a line?",
            f"{n}! = {' × '.join(map(str, range(n, 0, -1)))} = {math.factorial(n)}.", math.factorial(n))


def menu(rng):
    a, b = rng.randint(2, 6), rng.randint(3, 8)
    return (f"A lunch menu has {a} soups and {b} salads. In how many ways can you choose one soup and one salad?",
            f"{a} × {b} = {a * b}.", a * b)


def pick_one(rng):
    a, b = rng.randint(3, 15), rng.randint(3, 15)
    return (f"A bag has {a} red balls and {b} blue balls, all different. In how many ways can you pick one ball?",
            f"{a} + {b} = {a + b}.", a + b)


def shelf(rng):
    n = rng.randint(5, 7)
    return (f"In how many ways can {n} different books be arranged on a shelf?",
            f"{n}! = {math.factorial(n)}.", math.factorial(n))


def handshakes(rng):
    n = rng.randint(5, 25)
    return (f"At a party, each of {n} guests shakes hands with every other guest exactly once. How many handshakes "
            "are there?", f"C({n}, 2) = {n} × {n - 1} / 2 = {math.comb(n, 2)}.", math.comb(n, 2))


def medals(rng):
    n = rng.randint(5, 12)
    return (f"In how many ways can a gold, a silver and a bronze medal be awarded among {n} runners?",
            f"{n} × {n - 1} × {n - 2} = {math.perm(n, 3)}.", math.perm(n, 3))


def team(rng):
    n = rng.randint(6, 12)
    k = rng.randint(2, 4)
    return (f"In how many ways can a team of {k} be chosen from {n} players?",
            f"C({n}, {k}) = {math.comb(n, k)}.", math.comb(n, k))


def committee(rng):
    m, w = rng.randint(4, 8), rng.randint(4, 8)
    k1, k2 = rng.randint(1, 3), rng.randint(1, 3)
    v = math.comb(m, k1) * math.comb(w, k2)
    men, women = "man" if k1 == 1 else "men", "woman" if k2 == 1 else "women"
    return (f"A committee of {k1} {men} and {k2} {women} is chosen from {m} men and {w} women. How many different "
            "committees are possible?", f"C({m}, {k1}) × C({w}, {k2}) = {math.comb(m, k1)} × {math.comb(w, k2)} = {v}.",
            v)


def arrangements(rng):
    word = rng.choice(("BANANA", "LEVEL", "COFFEE", "PEPPER", "LETTER", "ALGEBRA", "STATS", "PUZZLE", "MISSISSIPPI"))
    counts = sorted({c: word.count(c) for c in word}.items())
    v = math.factorial(len(word))
    for _, k in counts:
        v //= math.factorial(k)
    repeats = " × ".join(f"{k}!" for _, k in counts if k > 1)
    return (f"How many different arrangements are there of the letters of the word {word}?",
            f"{len(word)}! / ({repeats}) = {v}.", v)


def grid(rng):
    a, b = rng.randint(2, 6), rng.randint(2, 5)
    v = math.comb(a + b, a)
    return (f"How many shortest paths are there from one corner of a {a} by {b} grid to the opposite corner, "
            "moving one unit right or up at a time?", f"Choose which {a} of the {a + b} moves go right: "
            f"C({a + b}, {a}) = {v}.", v)


def digits(rng):
    n, k = rng.randint(5, 9), rng.randint(2, 4)
    return (f"How many {k}-digit numbers can be made from the digits 1 to {n} if no digit is used twice?",
            f"{' × '.join(str(n - i) for i in range(k))} = {math.perm(n, k)}.", math.perm(n, k))


# --- number theory ------------------------------------------------------------------------

def remainder(rng):
    b = rng.randint(3, 12)
    a = rng.randint(2 * b, 120)
    return (f"What is the remainder when {a} is divided by {b}?",
            f"{a} = {b} × {a // b} + {a % b}, so the remainder is {a % b}.", a % b)


def gcd(rng):
    g = rng.randint(2, 12)
    while True:
        p, q = rng.randint(2, 9), rng.randint(2, 9)
        if p != q and math.gcd(p, q) == 1:
            break
    a, b = g * p, g * q
    return (f"What is the greatest common divisor of {a} and {b}?",
            f"{a} = {g} × {p} and {b} = {g} × {q} with {p} and {q} sharing no factor, so it is {g}.", g)


def evens(rng):
    n = rng.randint(11, 99)
    return (f"How many even numbers are there from 1 to {n}?", f"2, 4, ..., {n - n % 2}: {n} ÷ 2 rounded down = {n // 2}.",
            n // 2)


def next_multiple(rng):
    a, b = rng.randint(3, 12), rng.randint(20, 100)
    v = (b // a + 1) * a
    return (f"What is the smallest multiple of {a} that is greater than {b}?",
            f"{b} ÷ {a} = {b // a} remainder {b % a}, so the next multiple is {b // a + 1} × {a} = {v}.", v)


def lcm(rng):
    a, b = rng.sample((4, 6, 8, 9, 10, 12, 14, 15, 16, 18, 20), 2)
    v = a * b // math.gcd(a, b)
    return (f"What is the least common multiple of {a} and {b}?",
            f"lcm = {a} × {b} / gcd({a}, {b}) = {a * b} / {math.gcd(a, b)} = {v}.", v)


def _factor(n: int) -> dict[int, int]:
    out: dict[int, int] = {}
    p = 2
    while p * p <= n:
        while n % p == 0:
            out[p] = out.get(p, 0) + 1
            n //= p
        p += 1
    if n > 1:
        out[n] = out.get(n, 0) + 1
    return out


def _factored(n: int) -> str:
    return " × ".join(f"{p}^{k}" if k > 1 else str(p) for p, k in sorted(_factor(n).items()))


def divisors(rng):
    n = rng.choice((24, 36, 40, 48, 60, 72, 84, 90, 96, 100, 120, 144))
    v = math.prod(k + 1 for k in _factor(n).values())
    counts = " × ".join(f"({k} + 1)" for _, k in sorted(_factor(n).items()))
    return (f"How many positive divisors does {n} have?", f"{n} = {_factored(n)}, so {counts} = {v}.", v)


def prime_factor_sum(rng):
    n = rng.choice((30, 42, 66, 70, 78, 84, 105, 110, 130, 154, 165, 182))
    ps = sorted(_factor(n))
    return (f"What is the sum of the distinct prime factors of {n}?",
            f"{n} = {_factored(n)}; {' + '.join(map(str, ps))} = {sum(ps)}.", sum(ps))


def next_prime(rng):
    n = rng.randint(20, 150)
    v = n + 1
    while len(_factor(v)) != 1 or list(_factor(v).values()) != [1]:
        v += 1
    return (f"What is the smallest prime number greater than {n}?",
            f"Checking {n + 1}, {n + 2}, ...: the first with no divisor but 1 and itself is {v}.", v)


def power_mod(rng):
    a, k, m = rng.randint(2, 9), rng.randint(5, 20), rng.choice((5, 7, 9, 11, 13))
    return (f"What is the remainder when {a}^{k} is divided by {m}?",
            f"Reducing the powers of {a} modulo {m} step by step, {a}^{k} leaves remainder {pow(a, k, m)}.",
            pow(a, k, m))


def last_digit(rng):
    a, k = rng.choice((2, 3, 7, 8, 13, 17)), rng.randint(10, 40)
    cycle = [pow(a, i, 10) for i in range(1, 5)]
    return (f"What is the last digit of {a}^{k}?",
            f"The last digits of {a}^1, {a}^2, {a}^3, {a}^4 are {', '.join(map(str, cycle))} and repeat every 4; "
            f"{k} leaves {k % 4 or 4} in that cycle, so it is {pow(a, k, 10)}.", pow(a, k, 10))


def inclusion_exclusion(rng):
    a, b = rng.sample((2, 3, 4, 5, 6, 7), 2)
    n = rng.randint(50, 200)
    m = a * b // math.gcd(a, b)
    v = n // a + n // b - n // m
    return (f"How many integers from 1 to {n} are divisible by {a} or by {b}?",
            f"{n // a} are divisible by {a}, {n // b} by {b} and {n // m} by both (by {m}): "
            f"{n // a} + {n // b} - {n // m} = {v}.", v)


def digit_sum(rng):
    k = rng.randint(10, 20)
    v = sum(map(int, str(2 ** k)))
    return (f"What is the sum of the digits of 2^{k}?",
            f"2^{k} = {2 ** k}; {' + '.join(str(2 ** k))} = {v}.", v)


# --- sequences ----------------------------------------------------------------------------

def _terms(values: list[int]) -> str:
    return ", ".join(map(str, values))


def next_arithmetic(rng):
    a, d = rng.randint(1, 30), rng.randint(2, 9)
    t = [a + i * d for i in range(4)]
    return (f"What is the next number in the sequence {_terms(t)}, ...?",
            f"Each term is {d} more than the one before: {t[-1]} + {d} = {t[-1] + d}.", t[-1] + d)


def next_geometric(rng):
    a, r = rng.randint(1, 5), rng.randint(2, 3)
    t = [a * r ** i for i in range(4)]
    return (f"What is the next number in the sequence {_terms(t)}, ...?",
            f"Each term is {r} times the one before: {t[-1]} × {r} = {t[-1] * r}.", t[-1] * r)


def next_down(rng):
    d = rng.randint(2, 8)
    a = rng.randint(5 * d, 90)
    t = [a - i * d for i in range(4)]
    return (f"What is the next number in the sequence {_terms(t)}, ...?",
            f"Each term is {d} less than the one before: {t[-1]} - {d} = {t[-1] - d}.", t[-1] - d)


def missing(rng):
    a, d = rng.randint(2, 20), rng.randint(3, 11)
    t = [a + i * d for i in range(5)]
    shown = f"{t[0]}, {t[1]}, __, {t[3]}, {t[4]}"
    return (f"What number is missing from the sequence {shown}?",
            f"The terms go up by {d}: {t[1]} + {d} = {t[2]}.", t[2])


def nth_arithmetic(rng):
    a, d, n = rng.randint(1, 20), rng.randint(2, 9), rng.randint(10, 40)
    v = a + (n - 1) * d
    return (f"The first term of an arithmetic sequence is {a}, and each term is {d} more than the one before. "
            f"What is term number {n}?", f"{a} + ({n} - 1) × {d} = {a} + {(n - 1) * d} = {v}.", v)


def sum_arithmetic(rng):
    a, d, n = rng.randint(1, 10), rng.randint(1, 6), rng.randint(6, 20)
    last = a + (n - 1) * d
    v = n * (a + last) // 2
    return (f"What is the sum of the first {n} terms of the sequence {a}, {a + d}, {a + 2 * d}, ...?",
            f"Term {n} is {a} + {n - 1} × {d} = {last}; the sum is {n} × ({a} + {last}) / 2 = {v}.", v)


def fibonacci_like(rng):
    a, b, n = rng.randint(1, 6), rng.randint(1, 9), rng.randint(6, 8)
    t = [a, b]
    while len(t) < n:
        t.append(t[-1] + t[-2])
    return (f"Each term of a sequence is the sum of the two terms before it. The first two terms are {a} and {b}. "
            f"What is term number {n}?", f"The terms are {_terms(t)}, so term {n} is {t[-1]}.", t[-1])


def next_square(rng):
    k = rng.randint(2, 12)
    t = [(k + i) ** 2 for i in range(4)]
    return (f"What is the next number in the sequence {_terms(t)}, ...?",
            f"These are {k}², {k + 1}², {k + 2}², {k + 3}², so next is {k + 4}² = {(k + 4) ** 2}.", (k + 4) ** 2)


def sum_to_n(rng):
    n = rng.randint(30, 200)
    return (f"What is 1 + 2 + 3 + ... + {n}?", f"{n} × {n + 1} / 2 = {n * (n + 1) // 2}.", n * (n + 1) // 2)


def geometric_sum(rng):
    a, r, n = rng.randint(1, 5), rng.randint(2, 3), rng.randint(4, 8)
    v = a * (r ** n - 1) // (r - 1)
    return (f"What is the sum of the first {n} terms of the geometric sequence {a}, {a * r}, {a * r * r}, ...?",
            f"{a} × ({r}^{n} - 1) / ({r} - 1) = {a} × {r ** n - 1} / {r - 1} = {v}.", v)


def recurrence(rng):
    a, p, q, k = rng.randint(1, 5), rng.randint(2, 3), rng.randint(-3, 5), rng.randint(4, 6)
    t = [a]
    while len(t) < k:
        t.append(p * t[-1] + q)
    rule = f"{p} times the term before it, plus {q}" if q >= 0 else f"{p} times the term before it, minus {-q}"
    return (f"The first term of a sequence is {a}, and each later term is {rule}. What is term number {k}?",
            f"The terms are {_terms(t)}, so term {k} is {t[-1]}.", t[-1])


def sum_odd(rng):
    n = rng.randint(12, 60)
    return (f"What is the sum of the first {n} odd numbers?",
            f"1 + 3 + ... + {2 * n - 1} = {n}² = {n * n}.", n * n)


# family -> [(template, difficulty, how many)]
FAMILIES: dict[str, list[tuple[Template, int, int]]] = {
    "arithmetic": [(add, 1, 4), (sub, 1, 3), (mul, 1, 2), (buy_more, 1, 2), (left, 1, 2), (groups, 1, 1),
                   (share, 1, 1), (packs, 2, 3), (change, 2, 3), (order_of_operations, 2, 2), (speed, 3, 2),
                   (percent, 3, 2), (savings, 3, 2), (average, 3, 1)],
    "fractions": [(same_denominator, 1, 3), (half, 1, 2), (lowest_terms, 1, 3), (fraction_of_group, 1, 2),
                  (add_unlike, 2, 3), (sub_unlike, 2, 2), (multiply, 2, 2), (ratio_part, 2, 3),
                  (fraction_of_number, 2, 2), (divide, 3, 2), (mixed, 3, 2), (ratio_three, 3, 2), (remaining, 3, 2)],
    "linear_equations": [(x_plus, 1, 4), (x_minus, 1, 3), (x_times, 1, 3), (two_step, 2, 4), (two_step_minus, 2, 2),
                         (x_over, 2, 2), (think_of, 2, 2), (both_sides, 3, 4), (brackets, 3, 3),
                         (fraction_answer, 3, 3)],
    "combinatorics": [(outfits, 1, 3), (line_up, 1, 2), (menu, 1, 2), (pick_one, 1, 2), (shelf, 2, 3),
                      (handshakes, 2, 3), (medals, 2, 2), (team, 2, 3), (committee, 3, 3), (arrangements, 3, 3),
                      (grid, 3, 2), (digits, 3, 2)],
    "number_theory": [(remainder, 1, 4), (gcd, 1, 3), (evens, 1, 2), (next_multiple, 1, 2), (lcm, 2, 3),
                      (divisors, 2, 3), (prime_factor_sum, 2, 2), (next_prime, 2, 2), (power_mod, 3, 3),
                      (last_digit, 3, 2), (inclusion_exclusion, 3, 3), (digit_sum, 3, 1)],
    "sequences": [(next_arithmetic, 1, 4), (next_geometric, 1, 3), (next_down, 1, 2), (missing, 1, 2),
                  (nth_arithmetic, 2, 3), (sum_arithmetic, 2, 3), (fibonacci_like, 2, 2), (next_square, 2, 2),
                  (sum_to_n, 3, 2), (geometric_sum, 3, 3), (recurrence, 3, 3), (sum_odd, 3, 1)],
}


def solution(steps: str, answer: str) -> str:
    return f"{steps}\n\nThe answer is $\\boxed{{{answer}}}$."


def make_task(family: str, template: Template, difficulty: int, index: int, text: str, steps: str,
              answer: Number) -> TaskSpec:
    gold = show(answer)
    return TaskSpec(
        task_id=f"{family}/{template.__name__}_{index}",
        family=family,
        prompt=f"{text}\n\n{INSTRUCTION}",
        reward=RewardSpec(kind="math_answer", answer=gold, answer_format="boxed"),
        reference_solution=solution(steps, gold),
        difficulty=difficulty,
        wrong_solutions=[f"The answer is $\\boxed{{{off_by_one(answer)}}}$."],
    )


def build() -> list[TaskSpec]:
    """Every task of the suite, sorted by task id."""
    tasks = []
    for family, templates in FAMILIES.items():
        for template, difficulty, count in templates:
            rng = random.Random(f"{SEED}/{family}/{template.__name__}")
            seen: set[str] = set()
            while len(seen) < count:
                text, steps, answer = template(rng)
                if text in seen:
                    continue
                seen.add(text)
                tasks.append(make_task(family, template, difficulty, len(seen), text, steps, answer))
    return sorted(tasks, key=lambda t: t.task_id)


def render(tasks: list[TaskSpec] | None = None) -> dict[str, bytes]:
    """File name -> content of every math suite file."""
    return render_grouped(tasks if tasks is not None else build(), lambda t: t.family)


def main(argv: list[str] | None = None) -> int:
    return write_or_check(render(), MATH_SUITE_DIR, "math suite", "families", __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main())
