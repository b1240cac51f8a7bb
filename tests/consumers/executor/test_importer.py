"""The runtime's bundle and its importer (runtime/importer.py): the modules reach the container
as real modules that import each other as on the host, and once the bundle is sealed nothing in
the container can import them (the completion and the tests included)."""

from __future__ import annotations

import ast
import io
import subprocess
import sys
import uuid
from importlib import resources

import pytest

from rollstream.consumers.executor import hardening
from rollstream.consumers.executor.runtime import importer
from rollstream.consumers.executor.score import evaluate
from rollstream.schemas.events import RewardSpec

PACKAGE = resources.files(importer.PACKAGE)
SOURCES = {p.name: p.read_text() for p in PACKAGE.iterdir() if p.name.endswith(".py")}


def run_bootstrap(preamble: bytes, *args: str) -> subprocess.CompletedProcess:
    """The container's command line, on the host: ``python3 -I -S -c BOOTSTRAP``, the preamble on
    stdin (no site: the host's installed rollstream is not importable, as in the image)."""
    return subprocess.run([sys.executable, "-I", "-S", "-c", hardening.BOOTSTRAP, *args], input=preamble,
                          capture_output=True, timeout=60)


def small_package(**modules: str) -> dict[str, str]:
    return {"importer.py": SOURCES["importer.py"], "__init__.py": "", **{f"{k}.py": v for k, v in modules.items()}}


@pytest.mark.unit
def test_the_bundle_round_trips_and_is_deterministic() -> None:
    preamble = hardening.runner_preamble()
    stream = io.BytesIO(preamble)
    assert stream.read(int(stream.readline())).decode() == SOURCES["importer.py"]  # what the bootstrap runs
    bundle = importer.unpack(stream)
    assert stream.read() == b""
    assert bundle["entry"] == "rollstream.consumers.executor.runtime.supervisor:main"
    names = {f"{importer.PACKAGE}.{name[:-3]}" for name in SOURCES if name != "__init__.py"}
    assert set(bundle["modules"]) == names | {"rollstream", "rollstream.consumers", "rollstream.consumers.executor",
                                              importer.PACKAGE}  # every .py of the package, no order list
    for name, source in SOURCES.items():
        dotted = importer.PACKAGE if name == "__init__.py" else f"{importer.PACKAGE}.{name[:-3]}"
        assert bundle["modules"][dotted] == [source, name == "__init__.py", f"<runner>/{name}"]
    assert bundle["modules"]["rollstream"] == ["", True, None]  # the host's __init__ files are not sent
    # the same sources give the same bytes, whatever order they are listed in: the identity digests them
    shuffled = dict(reversed(list(SOURCES.items())))
    assert importer.pack(shuffled) == preamble
    assert importer.pack({**SOURCES, "codec.py": SOURCES["codec.py"] + "\n"}) != preamble
    digest = hardening.runtime_identity("runc")
    assert digest.startswith("runc+runner:") and digest == hardening.runtime_identity("runc")
    assert hardening.runner_preamble(importer.EGRESS_ENTRY) != preamble  # the proxy's: another entry point


@pytest.mark.unit
def test_a_module_of_the_bundle_imports_another_and_the_seal_closes_the_bundle() -> None:
    sources = small_package(
        b="Y = 41\ndef helper():\n    return Y + 1\n",
        a="import sys\nfrom demo.b import helper\nimport demo.b as b\nfrom demo import b as again\n"
          "def main():\n"
          "    assert b is again and helper() == 42 and b.__name__ == 'demo.b' and not hasattr(b, '__file__')\n"
          "    found = []\n"
          "    for name in ('demo.b', 'demo', 'demo.a', 'demo.importer'):\n"
          "        try:\n"
          "            __import__(name)\n"
          "            found.append(name)\n"
          "        except ImportError:\n"
          "            pass\n"
          "    print(helper(), b.__spec__.origin, sorted(n for n in sys.modules if n.startswith('demo')), found,\n"
          "          type(sys.modules['__main__']).__name__, [type(f).__name__ for f in sys.meta_path if type(f).__name__ == 'BundleFinder'])\n"
          "    return 3\n")
    done = run_bootstrap(importer.pack(sources, "demo.a:main", package="demo"))
    assert done.returncode == 3, done.stderr.decode()  # the entry point's return value is the exit status
    assert done.stdout.decode().split("\n")[0] == "42 <runner>/b.py [] [] module []"


@pytest.mark.unit
def test_a_broken_module_fails_the_boot_and_is_sealed_all_the_same() -> None:
    sources = small_package(a="import demo.missing\ndef main():\n    return 0\n")
    done = run_bootstrap(importer.pack(sources, "demo.a:main", package="demo"))
    assert done.returncode == 1 and b"ModuleNotFoundError: No module named 'demo.missing'" in done.stderr


@pytest.mark.unit
def test_after_the_seal_no_runtime_module_can_be_imported() -> None:
    """The whole runtime, booted up to its zygotes' imports: then neither a plain import, nor the
    judge's import machinery, nor a name the other side could send reaches it."""
    probe = ("import sys\nfrom rollstream.consumers.executor.runtime import zygotes, codec\n"
             "def main():\n"
             "    found = []\n"
             "    for name in ('rollstream', 'rollstream.consumers.executor.runtime.judge', "
             "'rollstream.consumers.executor.runtime.importer'):\n"
             "        try:\n"
             "            __import__(name)\n"
             "            found.append(name)\n"
             "        except ImportError:\n"
             "            pass\n"
             "    left = [n for n in sys.modules if n.startswith('rollstream')]\n"
             "    print(found, left, codec.import_std('rollstream'), codec.resolve_std('rollstream', 'x'),\n"
             "          zygotes.judge_main.__module__, zygotes.judge_main.__code__.co_filename)\n"
             "    return 0\n")
    done = run_bootstrap(importer.pack({**SOURCES, "probe.py": probe}, importer.PACKAGE + ".probe:main"))
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().split("\n")[0] == (
        "[] [] None None rollstream.consumers.executor.runtime.judge <runner>/judge.py")


IMAGE_PACKAGES = {"pytest", "_pytest"}  # the image's pytest, imported by pytests.py in the judges of pytest files


def _imports(tree: ast.Module):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield node, [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            yield node, [(node.module or "", a.name) for a in node.names]


@pytest.mark.unit
def test_the_runtime_imports_the_standard_library_and_itself_only_at_the_top_and_no_private_names() -> None:
    """What the bundle needs of its sources: every import of another runtime module at the top
    level (after the seal nothing can import one), only public names of another file, and no
    module but the standard library's and the runtime's own."""
    problems = []
    for name, source in sorted(SOURCES.items()):
        tree = ast.parse(source)
        top = set(map(id, tree.body))
        for node, names in _imports(tree):
            for module, imported in names:
                if module.startswith("rollstream"):
                    if not module.startswith(importer.PACKAGE):
                        problems.append(f"{name}: imports {module}")
                    if id(node) not in top:
                        problems.append(f"{name}:{node.lineno}: imports {module} inside a function or block")
                    if imported is not None and imported.startswith("_"):
                        problems.append(f"{name}:{node.lineno}: imports the private {imported} of {module}")
                elif module.partition(".")[0] not in sys.stdlib_module_names | IMAGE_PACKAGES:
                    problems.append(f"{name}:{node.lineno}: imports {module}, not of the standard library")
        if "__name__ != \"__main__\"" in source or "__name__ == \"__main__\"" in source:
            problems.append(f"{name}: a __name__ == '__main__' condition")
    assert problems == []


async def score(pool, registry, code: str, tests: list[str], **spec):
    evaluation = await evaluate(pool, registry, RewardSpec(tests=tests, timeout_s=10.0, **spec),
                                f"```python\n{code}```", f"importer/{uuid.uuid4().hex[:6]}")
    return evaluation.scored


PROBE = ("import sys\n"
         "def runtime_reached():\n"
         "    found = [n for n in sys.modules if n.startswith('rollstream')]\n"
         "    for name in ('rollstream', 'rollstream.consumers.executor.runtime.judge'):\n"
         "        try:\n"
         "            __import__(name)\n"
         "            found.append(name)\n"
         "        except ImportError:\n"
         "            pass\n"
         "    return found\n"
         "def main_module():\n"
         "    import __main__\n"
         "    return __main__.__name__\n")
PROBE_TESTS = [
    "assert runtime_reached() == []",
    "import sys\nassert [n for n in sys.modules if n.startswith('rollstream')] == []",
    "try:\n    import rollstream.consumers.executor.runtime.judge\nexcept ImportError:\n    pass\n"
    "else:\n    raise AssertionError('the tests imported the runtime')",
]


@pytest.mark.sandbox
@pytest.mark.containment
async def test_neither_the_completion_nor_the_tests_can_import_the_runtime(pool, registry) -> None:
    scored = await score(pool, registry, PROBE, PROBE_TESTS + [
        "assert main_module() == 'rollstream.consumers.executor.runtime.channel'"], entry_point="runtime_reached")
    assert scored.reward == 1.0, scored.execution.test_results
    in_process = await score(pool, registry, PROBE, PROBE_TESTS, entry_point="runtime_reached", trust="in_process")
    assert in_process.reward == 1.0, in_process.execution.test_results
