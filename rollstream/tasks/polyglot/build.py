"""Build the polyglot suite: ``python -m rollstream.tasks.polyglot.build`` rewrites ``<language>.jsonl``.

Ten stdin/stdout problems (strings, lists, math, conditionals, parsing, search_sort, bits, sets,
dicts, matrices), each posed in six languages (C, C++, Java, JavaScript, Go, Rust): 60 tasks. A task
is a whole program (``RewardSpec.program``, ``language``): its code is the completion's first block
fenced in that language, built by the executor's compile step and run by the Python tests through
``run_program(stdin)``, which compare the output's whitespace-separated tokens. Every problem's
expected outputs are computed here by a Python solver, over 4-5 inputs that include an edge case
(an empty list, one element, a tie, a value past 32 bits). Each task carries a right program
(``reference_solution``) and a wrong one (``wrong_solutions``: the right one with one edit,
programs.py, an off-by-one bound or a flipped comparison) that fails at least one visible test.
Task ids are ``polyglot/<language>/<problem>`` and families ``<language>/<family>``, so metrics,
the evaluator and the forgetting alert see each language apart. Nothing is random: the files are
byte-identical on every build.

``--check`` verifies that the files on disk equal what would be written.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rollstream.schemas.events import RewardSpec
from rollstream.schemas.tasks import TaskSpec
from rollstream.tasks.polyglot.programs import PROGRAMS
from rollstream.tasks.suite_files import render_grouped, write_or_check

POLYGLOT_SUITE_DIR = Path(__file__).resolve().parent
# language -> (its name in the prompt, the fence tag asked for and used by the solutions)
LANGUAGES: dict[str, tuple[str, str]] = {
    "c": ("C (C17, built with gcc -O2 -lm)", "c"),
    "cpp": ("C++ (C++17, built with g++ -O2)", "cpp"),
    "java": ("Java (Java 17; the class that declares main runs)", "java"),
    "javascript": ("JavaScript (run with Node.js)", "javascript"),
    "go": ("Go (package main, standard library only)", "go"),
    "rust": ("Rust (edition 2021, standard library only)", "rust"),
}
TIMEOUT_S = 10.0  # a JVM's start and a build are slow under gVisor; the compile step has its own bound too
MEMORY_MB = 256  # the job's own limit; a job in another language gets at least runtime/programs.ADDRESS_SPACE_MB


@dataclass(frozen=True)
class Problem:
    name: str
    family: str
    difficulty: int
    statement: str
    input_format: str
    output_format: str
    inputs: tuple[str, ...]  # the tests' stdins; the first is the prompt's example
    solve: Callable[[str], str]  # stdin -> the expected output


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split()]


def _running_sum(text: str) -> str:
    n, *xs = _ints(text)
    out, total = [], 0
    for x in xs[:n]:
        total += x
        out.append(str(total))
    return " ".join(out)


def _gcd_lcm(text: str) -> str:
    a, b = _ints(text)
    return f"{math.gcd(a, b)} {math.lcm(a, b)}"


def _fizzbuzz(text: str) -> str:
    n = int(text)
    return "\n".join("FizzBuzz" if i % 15 == 0 else "Fizz" if i % 3 == 0 else "Buzz" if i % 5 == 0 else str(i)
                     for i in range(1, n + 1))


def _count_bits(text: str) -> str:
    q, *xs = _ints(text)
    return " ".join(str(bin(x).count("1")) for x in xs[:q])


def _count_distinct(text: str) -> str:
    n, *xs = _ints(text)
    return str(len(set(xs[:n])))


def _most_frequent_word(text: str) -> str:
    counts = Counter(text.split())
    word = min(counts, key=lambda w: (-counts[w], w))
    return f"{word} {counts[word]}"


def _transpose(text: str) -> str:
    r, c, *xs = _ints(text)
    return "\n".join(" ".join(str(xs[i * c + j]) for i in range(r)) for j in range(c))


PROBLEMS: tuple[Problem, ...] = (
    Problem("reverse_words", "strings", 1,
            "Print the words of a line in reverse order.",
            "One line of words (1 to 1000 words of letters, separated by one or more spaces).",
            "The words in reverse order, separated by single spaces, on one line.",
            ("hello world\n", "  alpha  beta   gamma \n", "single\n", "one two three four five\n"),
            lambda text: " ".join(reversed(text.split()))),
    Problem("running_sum", "lists", 1,
            "Print the running sums of a list of integers: the i-th number printed is the sum of the first i.",
            "The first line holds n (0 <= n <= 100000); the second holds n integers, each between -10^12 and "
            "10^12.",
            "The n running sums on one line, separated by spaces (an empty line when n is 0).",
            ("4\n1 2 3 4\n", "1\n-5\n", "0\n\n", "5\n3 -3 3 -3 3\n", "2\n1000000000000 1000000000000\n"),
            _running_sum),
    Problem("gcd_lcm", "math", 2,
            "Print the greatest common divisor and the least common multiple of two positive integers.",
            "One line with two integers a and b (1 <= a, b <= 10^9).",
            "gcd(a, b) and lcm(a, b), separated by a space (the lcm may need 64 bits).",
            ("12 18\n", "7 13\n", "5 5\n", "1000000000 999999999\n"),
            _gcd_lcm),
    Problem("fizzbuzz", "conditionals", 1,
            "Print the numbers from 1 to n, one per line, but print Fizz instead of a multiple of 3, Buzz "
            "instead of a multiple of 5 and FizzBuzz instead of a multiple of both.",
            "One integer n (1 <= n <= 1000).",
            "n lines, the i-th being i, Fizz, Buzz or FizzBuzz.",
            ("5\n", "1\n", "15\n", "31\n"),
            _fizzbuzz),
    Problem("sum_csv", "parsing", 1,
            "Print the sum of a line of comma-separated integers.",
            "One line of 1 to 1000 integers separated by commas, without spaces; each is between -10^9 and "
            "10^9 and may carry a minus sign.",
            "Their sum (it may need 64 bits).",
            ("1,2,3\n", "-4,10,-6\n", "42\n", "1000000000,1000000000,1000000000\n", "7,-8\n"),
            lambda text: str(sum(int(f) for f in text.strip().split(",")))),
    Problem("sort_numbers", "search_sort", 2,
            "Sort a list of integers in ascending numeric order.",
            "The first line holds n (1 <= n <= 100000); the second holds n integers, each between -10^9 and "
            "10^9.",
            "The n integers in ascending order on one line, separated by spaces.",
            ("5\n3 1 4 1 5\n", "1\n7\n", "4\n-2 10 -30 0\n", "3\n100 20 3\n"),
            lambda text: " ".join(map(str, sorted(_ints(text)[1:])))),
    Problem("count_bits", "bits", 2,
            "For each of q non-negative integers, print how many 1 bits its binary form has.",
            "The first line holds q (1 <= q <= 1000); the second holds q integers, each between 0 and 10^18.",
            "The q counts on one line, separated by spaces.",
            ("3\n0 1 7\n", "2\n1024 1023\n", "1\n1000000000000000000\n", "2\n4294967295 4294967296\n"),
            _count_bits),
    Problem("count_distinct", "sets", 2,
            "Print how many distinct values a list of integers holds.",
            "The first line holds n (0 <= n <= 100000); the second holds n integers, each between -10^9 and "
            "10^9, in any order.",
            "The number of distinct values.",
            ("5\n1 2 2 3 1\n", "0\n\n", "4\n7 7 7 7\n", "5\n4 4 4 4 9\n", "6\n-1 1 -1 1 0 0\n"),
            _count_distinct),
    Problem("most_frequent_word", "dicts", 3,
            "Find the word that occurs most often in a line; on a tie, the one that comes first in "
            "alphabetical order.",
            "One line of 1 to 1000 words of lowercase letters (each at most 20 letters), separated by spaces.",
            "The word and how many times it occurs, separated by a space.",
            ("b a b c a b\n", "dog cat\n", "x\n", "pear apple pear apple fig\n", "zz zz yy yy yy\n"),
            _most_frequent_word),
    Problem("transpose", "matrices", 2,
            "Print the transpose of a matrix of integers: row j of the output is column j of the input.",
            "The first line holds r and c (1 <= r, c <= 100); then r lines of c integers each.",
            "c lines of r integers each, separated by spaces.",
            ("2 3\n1 2 3\n4 5 6\n", "1 1\n9\n", "3 1\n1\n2\n3\n", "2 2\n1 2\n3 4\n"),
            _transpose),
)


def tests(problem: Problem) -> list[str]:
    """The task's tests: the program's output tokens for each input, as the solver gives them."""
    return [f"assert run_program({stdin!r}).split() == {problem.solve(stdin).split()!r}" for stdin in problem.inputs]


def fenced(language: str, code: str) -> str:
    return f"```{LANGUAGES[language][1]}\n{code.rstrip()}\n```"


def prompt(problem: Problem, language: str) -> str:
    name, fence = LANGUAGES[language]
    example = problem.inputs[0]
    return (f"Write a complete program in {name}. {problem.statement}\n\n"
            f"Input (standard input): {problem.input_format}\n"
            f"Output (standard output): {problem.output_format}\n\n"
            f"Example input:\n{example.rstrip()}\n\nExample output:\n{problem.solve(example)}\n\n"
            f"Read the input from standard input and write only the answer to standard output. "
            f"Return the whole program in a ```{fence} code block.")


def wrong_program(problem: Problem, language: str) -> str:
    code, old, new = PROGRAMS[problem.name][language]
    if code.count(old) != 1:
        raise ValueError(f"{problem.name}/{language}: the wrong program's edit {old!r} occurs {code.count(old)} times")
    return code.replace(old, new)


def make_task(problem: Problem, language: str) -> TaskSpec:
    code = PROGRAMS[problem.name][language][0]
    return TaskSpec(
        task_id=f"polyglot/{language}/{problem.name}",
        family=f"{language}/{problem.family}",
        prompt=prompt(problem, language),
        reward=RewardSpec(kind="python_tests", tests=tests(problem), program=True, language=language,
                          timeout_s=TIMEOUT_S, memory_mb=MEMORY_MB),
        reference_solution=fenced(language, code),
        difficulty=problem.difficulty,
        wrong_solutions=[fenced(language, wrong_program(problem, language))],
    )


def build() -> list[TaskSpec]:
    """Every task of the suite, sorted by task id."""
    if set(PROGRAMS) != {p.name for p in PROBLEMS}:
        raise ValueError(f"programs for {sorted(PROGRAMS)}, problems {sorted(p.name for p in PROBLEMS)}")
    return sorted((make_task(p, lang) for p in PROBLEMS for lang in LANGUAGES), key=lambda t: t.task_id)


def render(tasks: list[TaskSpec] | None = None) -> dict[str, bytes]:
    """File name -> content of every polyglot suite file (one per language)."""
    return render_grouped(tasks if tasks is not None else build(), lambda t: t.reward.language)


def main(argv: list[str] | None = None) -> int:
    return write_or_check(render(), POLYGLOT_SUITE_DIR, "polyglot suite", "languages", __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main())
