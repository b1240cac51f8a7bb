"""Duplicate tasks: exact and near duplicates of prompts and references, as clusters.

* **Exact**: two tasks with the same normalised prompt (lower case, whitespace collapsed), or
  the same normalised reference (its AST with docstrings dropped and every name that is not a
  builtin renamed in order of appearance: ``def f(a): return a + 1`` and
  ``def g(x): return x + 1`` are one).
* **Near**: MinHash LSH (``datasketch``) over token 3-gram shingles, of the prompts with the
  template every task of a source shares removed (:func:`template_ngrams`), and of the
  normalised references; a pair whose estimated Jaccard similarity is at least
  ``intake.near_duplicate_threshold`` (0.7) in either is near.

Pairs are joined into clusters (connected components). ``sources.split_tasks`` keeps every
cluster whole on one side of the held-out split, so no held-out task has a functionally
identical sibling in training.
"""

from __future__ import annotations

import ast
import builtins
import functools
import re
from collections import Counter
from collections.abc import Iterable, Sequence

import msgspec

from rollstream.schemas.tasks import TaskSpec

NEAR_THRESHOLD = 0.7
SHINGLE = 3  # tokens per shingle
NUM_PERM = 128
TEMPLATE_SHARE = 0.3  # an n-gram in at least this share of a source's prompts is template
TEMPLATE_MIN_TEXTS = 10  # ... of a source of at least this many
_TOKEN = re.compile(r"\w+|[^\w\s]")
_BUILTINS = frozenset(dir(builtins))


class Cluster(msgspec.Struct, frozen=True, kw_only=True):
    members: list[str]  # task ids, sorted
    kind: str  # "exact" when some pair in it is an exact duplicate, else "near"
    pairs: list[tuple[str, str, str, float]]  # (task, task, what: prompt|reference, similarity)


def tokens(text: str) -> list[str]:
    """Lower-cased word and punctuation tokens (the unit of shingles and n-grams)."""
    return _TOKEN.findall(text.lower())


def prompt_text(task: TaskSpec) -> str:
    """What the model sees of a task, as one text."""
    return "\n".join(m.content for m in task.chat())


def source_of(task: TaskSpec) -> str:
    """Which source a task came from, for template removal: its family's prefix (HumanEval's
    ``HumanEval/`` ids, the suite's families are one source)."""
    return "humaneval" if task.task_id.startswith("HumanEval/") else "suite" if "/" in task.task_id else task.family


def ngrams(toks: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(toks[i:i + n]) for i in range(len(toks) - n + 1)]


def template_ngrams(texts: Sequence[str], n: int, share: float = TEMPLATE_SHARE,
                    enough: int | None = None) -> frozenset[tuple[str, ...]]:
    """The n-grams that at least ``share`` of ``texts`` contain, or at least ``enough`` of them (none
    when there are fewer than 10 texts): the prompt template a source puts around every task ("Write a Python
    function", "Return the complete function in a ```python code block")."""
    if len(texts) < TEMPLATE_MIN_TEXTS:  # too few to tell a template from tasks that are alike
        return frozenset()
    counts: Counter[tuple[str, ...]] = Counter()
    for text in texts:
        counts.update(set(ngrams(tokens(text), n)))
    floor = max(2, min(share * len(texts), enough or len(texts)))
    return frozenset(g for g, c in counts.items() if c >= floor)


def without_template(toks: list[str], template: frozenset[tuple[str, ...]], n: int) -> list[str]:
    """``toks`` less every token covered by a template n-gram."""
    if not template:
        return toks
    covered = [False] * len(toks)
    for i in range(len(toks) - n + 1):
        if tuple(toks[i:i + n]) in template:
            covered[i:i + n] = [True] * n
    return [t for t, c in zip(toks, covered) if not c]


class _Canonical(ast.NodeTransformer):
    """Names not builtins become v0, v1, ... in order of appearance; docstrings go."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def _name(self, name: str) -> str:
        if name in _BUILTINS:
            return name
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.copy_location(ast.Name(id=self._name(node.id), ctx=node.ctx), node)

    def visit_arg(self, node: ast.arg) -> ast.AST:
        return ast.arg(arg=self._name(node.arg), annotation=None)

    def _body(self, node: ast.AST) -> ast.AST:
        body = node.body  # type: ignore[attr-defined]
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
        return self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.name = self._name(node.name)
        node.returns = None
        return self._body(node)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        node.name = self._name(node.name)
        return self._body(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        value = node.value if node.value is not None else ast.Constant(None)
        return self.visit(ast.copy_location(ast.Assign(targets=[node.target], value=value, lineno=node.lineno), node))


@functools.lru_cache(maxsize=8192)
def normalised_code(source: str) -> str:
    """The code with names canonical and docstrings and annotations dropped (the source itself,
    stripped, when it does not parse)."""
    try:
        tree = _Canonical().visit(ast.parse(source))
    except (SyntaxError, ValueError, RecursionError):
        return source.strip()
    return ast.unparse(ast.fix_missing_locations(tree))


def _normalised_prompt(task: TaskSpec) -> str:
    return " ".join(prompt_text(task).lower().split())


def _minhash(shingles: Iterable[tuple[str, ...]]):
    from datasketch import MinHash

    encoded = [" ".join(s).encode() for s in set(shingles)]
    m = MinHash(num_perm=NUM_PERM, seed=1)
    if encoded:
        m.update_batch(encoded)
    return m


def _near_pairs(keys: dict[str, list[tuple[str, ...]]], threshold: float) -> list[tuple[str, str, float]]:
    """Pairs of ids whose shingle sets are near (MinHash LSH candidates, confirmed by their
    estimated Jaccard similarity)."""
    from datasketch import MinHashLSH

    lsh = MinHashLSH(threshold=threshold, num_perm=NUM_PERM)
    hashes = {}
    for task_id, shingles in keys.items():
        if len(set(shingles)) < 2:
            continue  # too short to say anything
        hashes[task_id] = _minhash(shingles)
        lsh.insert(task_id, hashes[task_id])
    pairs = []
    for task_id, m in hashes.items():
        for other in lsh.query(m):
            if other > task_id:
                similarity = m.jaccard(hashes[other])
                if similarity >= threshold:
                    pairs.append((task_id, other, round(similarity, 3)))
    return sorted(pairs)


def duplicate_clusters(tasks: Sequence[TaskSpec], threshold: float = NEAR_THRESHOLD) -> list[Cluster]:
    """The clusters (two tasks or more) of exact and near duplicates among ``tasks``, sorted."""
    pairs: list[tuple[str, str, str, float]] = []
    exact: list[tuple[str, str]] = []
    for what, key in (("prompt", _normalised_prompt),
                      ("reference", lambda t: normalised_code(t.reference_solution) if t.reference_solution else "")):
        first: dict[str, str] = {}
        for task in tasks:
            value = key(task)
            if not value:
                continue
            if value in first:
                exact.append((first[value], task.task_id))
                pairs.append((first[value], task.task_id, what, 1.0))
            else:
                first[value] = task.task_id
    by_source: dict[str, list[TaskSpec]] = {}
    for task in tasks:
        by_source.setdefault(source_of(task), []).append(task)
    prompt_shingles: dict[str, list[tuple[str, ...]]] = {}
    for members in by_source.values():
        template = template_ngrams([prompt_text(t) for t in members], SHINGLE)
        for task in members:
            prompt_shingles[task.task_id] = ngrams(without_template(tokens(prompt_text(task)), template, SHINGLE), SHINGLE)
    code_shingles = {t.task_id: ngrams(tokens(normalised_code(t.reference_solution)), SHINGLE)
                     for t in tasks if t.reference_solution}
    for what, keys in (("prompt", prompt_shingles), ("reference", code_shingles)):
        pairs += [(a, b, what, s) for a, b, s in _near_pairs(keys, threshold)]
    return _components(pairs, set(map(frozenset, exact)))


def _components(pairs: list[tuple[str, str, str, float]], exact: set[frozenset[str]]) -> list[Cluster]:
    parent: dict[str, str] = {}

    def root(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b, _, _ in pairs:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    groups: dict[str, list[str]] = {}
    for x in list(parent):
        groups.setdefault(root(x), []).append(x)
    clusters = []
    for members in groups.values():
        inside = set(members)
        own = sorted({p for p in pairs if p[0] in inside})
        kind = "exact" if any(frozenset(p[:2]) in exact for p in own) else "near"
        clusters.append(Cluster(members=sorted(members), kind=kind, pairs=own))
    return sorted(clusters, key=lambda c: c.members)
