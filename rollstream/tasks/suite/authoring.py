"""How the suite's function tasks are written down (the definition modules import :func:`T`).

A task is written as a signature, a one-line description, a reference body, a wrong body
and the *arguments* of its visible and held-out tests; ``build_suite.py`` computes the
expected values by running the reference, so a test can never disagree with it.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class Def:
    family: str
    signature: str  # "reverse_string(s: str) -> str"
    description: str  # completes "Write a Python function `sig` that ..."
    reference: str  # function body (or a full "def ...")
    wrong: str  # a plausible but wrong body: must fail at least one visible test
    tests: tuple[str, ...]  # argument lists (Python source) of the visible tests
    heldout: tuple[str, ...]  # argument lists of the held-out tests
    difficulty: int = 1

    @property
    def name(self) -> str:
        return self.signature.split("(", 1)[0]

    def source(self, body: str) -> str:
        body = textwrap.dedent(body).strip("\n")
        if body.startswith("def "):
            return body + "\n"
        return f"def {self.signature}:\n" + textwrap.indent(body, "    ") + "\n"


def T(family: str, signature: str, description: str, reference: str, wrong: str,
      tests: list[str], heldout: list[str], difficulty: int = 1) -> Def:
    return Def(family, signature, description, reference, wrong, tuple(tests), tuple(heldout), difficulty)
