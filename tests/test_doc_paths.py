"""Docs that match the code: every path of this repository that a doc, a docstring or a comment
names exists, and every relative link of a Markdown file resolves.

A path is checked when its first segment is a top-level entry of the repository
(``consumers/executor/episodes.py``, ``docs/evaluation.md``, ``bench/results/x.json``): paths of
other projects (``trl/trainer/...``), of the machine (``/sys/fs/cgroup/...``) and of what a run
writes (``.rollstream/runs/<run>/...``) are not this repository's. A dotted module path
(``rollstream.consumers.generator.stage``) is checked the same way through the package layout.
Patterns (``*``, ``<run>``, ``{name}``) are not paths.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
# Where the package's subpackages live in the repository (pyproject.toml installs each top-level
# folder under the rollstream namespace: rollstream.consumers is consumers/).
PACKAGE_DIRS = ("streams", "producers", "consumers", "learner", "schemas", "cli", "evaluator")
PATH = re.compile(r"(?<![\w./~$-])((?:[A-Za-z_][\w.-]*/)+[\w.-]*[\w])")
MODULE = re.compile(r"(?<![\w.])rollstream\.((?:[a-z_][a-z0-9_]*\.)*[a-z_][a-z0-9_]*)")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
PATTERN = re.compile(r"[*<>{}$]|\.\.\.|DATE")
OUTPUT = re.compile(r"(--json|--output|--completions|-o|>)[ =]$")  # a file the command writes
# Files that quote other trees or generated listings verbatim.
SKIP = {"tests/test_doc_paths.py"}
# Paths of other projects that share a first segment with ours.
ELSEWHERE = {"docs/advanced_features/sglang_for_rl.md",  # SGLang's documentation
             "docs/caches"}  # the Debian tree's /usr/share/doc and caches, trimmed from the sandbox image


def tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [REPO / p for p in out.decode().split("\0") if p]


def sources() -> list[Path]:
    return [p for p in tracked() if p.suffix in (".py", ".md", ".toml") and p.is_file()
            and str(p.relative_to(REPO)) not in SKIP]


def top_level() -> set[str]:
    return {p.relative_to(REPO).parts[0] for p in tracked()}


def _ignored(rel: str) -> bool:
    """A path git ignores: something a build or a run writes (compose/local/...)."""
    return subprocess.run(["git", "check-ignore", "-q", rel], cwd=REPO).returncode == 0


def _ours(name: str) -> bool:
    """``name`` (a file or folder name, ``.py`` or not) is a module or package of the rollstream package."""
    stem = name.removesuffix(".py")
    return stem in PACKAGE_DIRS or (REPO / "rollstream" / f"{stem}.py").is_file() or (REPO / "rollstream" / stem).is_dir()


def _exists(rel: str) -> bool:
    rel = rel.rstrip(".").rstrip("/")
    if (REPO / rel).exists() or rel in ELSEWHERE or _ignored(rel):
        return True
    head, _, rest = rel.partition("/")
    if head == "rollstream":  # the installed layout (rollstream/consumers/... is consumers/...); else not a path
        first = rest.split("/")[0]  # of ours (a label such as rollstream/verdict/v1)
        return not _ours(first) or (first.removesuffix(".py") in PACKAGE_DIRS and (REPO / rest).exists())
    module, dot, attribute = rel.rpartition(".")  # producers/mixture.epoch_plan: a function of a module
    return bool(dot) and "/" not in attribute and (REPO / f"{module}.py").is_file()


def _module_exists(dotted: str) -> bool:
    """``rollstream.a.b.c``: a module or package, or a name that module defines or imports
    (``...stage.Generator``, ``...stage.Generator.run``: the first name after the module is looked for)."""
    parts = dotted.split(".")
    if not _ours(parts[0]):  # rollstream.toml, rollstream.sandbox (a label), rollstream.rewards (entry points)
        return True
    for n in range(len(parts), 0, -1):
        head = parts[:n]
        base = REPO / head[0] if head[0] in PACKAGE_DIRS else REPO / "rollstream" / head[0]
        path = base.joinpath(*head[1:])
        source = path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__init__.py"
        if source.is_file():
            return n == len(parts) or re.search(rf"\b{re.escape(parts[n])}\b", source.read_text()) is not None
    return False


def broken_references(path: Path, roots: set[str]) -> list[str]:
    text = path.read_text(errors="replace")
    rel = str(path.relative_to(REPO))
    broken = []
    for match in PATH.finditer(text):
        ref = match.group(1)
        if ref.split("/")[0] not in roots or PATTERN.search(text[match.start(): match.end() + 2]) \
                or OUTPUT.search(text[max(0, match.start() - 16): match.start()]):
            continue
        if not _exists(ref):
            broken.append(f"{rel}: {ref}")
    for match in MODULE.finditer(text):
        if not _module_exists(match.group(1)):
            broken.append(f"{rel}: rollstream.{match.group(1)}")
    if path.suffix == ".md":
        for match in LINK.finditer(text):
            target = match.group(1)
            if re.match(r"[a-z]+:", target) or PATTERN.search(target):
                continue
            if not (path.parent / target).exists():
                broken.append(f"{rel}: link ({target})")
    return broken


def test_every_path_the_docs_and_docstrings_name_exists() -> None:
    roots = top_level() | {"rollstream"}
    broken = [b for p in sources() for b in broken_references(p, roots)]
    assert not broken, "names of paths that do not exist (fix the reference):\n" + "\n".join(sorted(set(broken)))


def test_the_check_sees_a_missing_path(tmp_path: Path) -> None:
    doc = REPO / "docs" / "_doc_paths_probe.md"
    doc.write_text("See `consumers/remote.py`, `learner/model.py`, rollstream.cli.nothing_here and [x](nope.md); "
                   "not `trl/trainer/grpo.py` nor `.rollstream/runs/<run>/x.log`.\n")
    try:
        found = broken_references(doc, top_level() | {"rollstream"})
    finally:
        doc.unlink()
    assert found == ["docs/_doc_paths_probe.md: consumers/remote.py", "docs/_doc_paths_probe.md: learner/model.py",
                     "docs/_doc_paths_probe.md: rollstream.cli.nothing_here", "docs/_doc_paths_probe.md: link (nope.md)"]
