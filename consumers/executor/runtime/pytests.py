"""pytest files under the judge: a task whose tests are pytest files (``kind = "python_pytest"``).

A module of the runtime, in the sandbox from its bundle (runtime/importer.py; standard library
only at import: pytest, from the sandbox image, is imported by the pytest zygote before the
container's first pytest file, runtime/zygotes.py; on the host, an ordinary module, tested there
too). The judge's ``judge_main`` is handed :func:`run_pytest_files` by the zygotes: this module
builds on judge.py, which does not import it.

Each file is the tests' own module: the runner compiled it (its asserts explained as in every test
form, jobrun.py ``explained_asserts``: pytest's own rewriting is off, so no ``repr`` of an
object of the completion's writes a message), the judge runs it in a module of its own, holding
the task's setup and the completion's names as bound for every test form (``from solution import
add`` reads the judge's ``solution`` module, judge.py :func:`solution_module`), then hands that
module object to pytest, which collects and runs it: test functions and classes, parametrize,
fixtures (the file's own, ``tmp_path``, ``capsys``/``capfd``, ``monkeypatch``, ``caplog``),
``pytest.raises``/``warns``/``approx``, markers. Each collected test is one test of the verdict,
named by its node id (``test_solution.py::test_add[1-2]``).

What keeps the verdict the tests':

* **Nothing the completion writes is collected or configures pytest.** The file is never read
  from disk: pytest is given the module object (the collector's path is the standard library's
  ``os.py``, read-only, only to satisfy collection), with no conftest (``--noconftest``), no
  plugin autoload, no cache, and a root directory in the read-only image, so no ``pytest.ini``,
  ``conftest.py`` or plugin in ``/work`` counts. Only the file's own functions and classes are
  collected (a completion object bound under a test's name is not a test).
* **The completion cannot skip, xfail, fail or stop a test.** pytest is not importable in its
  process; a ``unittest.SkipTest`` it raises fails the test (crossing.py), a
  ``KeyboardInterrupt`` fails its test and the tests the stop leaves unrun. A skip or xfail the
  tests declare themselves (markers, ``pytest.skip`` in a test) is the tests'.
* **What the tests patch, the completion sees:** ``monkeypatch`` of a module's attribute reaches
  the candidate as the tests' ``mock.patch`` does (:func:`forward_monkeypatch`), until undone.
* **The reference's count holds:** with a reference, each file is held to the number of tests the
  reference's run collected from it (``Rules.collected``; a file parametrized over the
  completion's data collects what the completion chose).
* **Reports are the judge's:** each phase's report is made here from the exception itself (its
  type and ``str``, as every test form reports it), never by pytest's failure formatting (which
  would ``repr`` arguments). A call the judge refused (``type_mismatch``, an object of the tests
  crossing) fails the test even where the test caught its exception, as in every test form.
"""

import os
import sys
import types

from rollstream.consumers.executor.runtime.codec import clip_text
from rollstream.consumers.executor.runtime.guards import JUDGE_CACHE, Guards
from rollstream.consumers.executor.runtime.hooks import package_dirs
from rollstream.consumers.executor.runtime.judge import failure_type
from rollstream.consumers.executor.runtime.proxies import MirrorMeta

PYTEST_MODULE = "test_solution"  # the tests' module name (node ids read test_solution.py::...)
PYTEST_ARGS = ("-p", "no:cacheprovider", "-p", "no:stepwise", "-p", "no:doctest", "-p", "no:junitxml",
               "-p", "no:pastebin", "-p", "no:faulthandler", "-p", "no:terminal", "-p", "no:warnings",
               "-p", "no:debugging", "-p", "no:nose", "--noconftest", "--capture=no", "--assert=plain")
PYTEST_ENV = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_CURRENT_TEST")
# pluggy's hook options, as pytest.hookimpl(tryfirst=True) writes them (pytest is not imported here)
_FIRST = {"hookwrapper": False, "optionalhook": False, "tryfirst": True, "trylast": False, "specname": None}


# Packages of the image's pytest: the judge may import from them too (hooks.py ``package_dirs``).
PYTEST_PACKAGES = ("pytest", "_pytest", "pluggy", "iniconfig", "py", "packaging", "attr", "attrs", "exceptiongroup",
                   "more_itertools", "tomli")
WARM_FILE = """
import pytest

@pytest.fixture
def pair():
    return (1, 2)

@pytest.mark.parametrize("x", [1, 2.5])
def test_values(x, pair, capsys):
    print(x)
    assert capsys.readouterr().out.strip() == str(x)
    assert sum(pair) == pytest.approx(3)
    with pytest.raises(ValueError):
        int("x")

class TestKind:
    @pytest.mark.skip(reason="made up")
    def test_skipped(self):
        pass
"""


def warm_pytest():
    """In the pytest zygote, before its guards and its first child (when PID 1 first needs it):
    import the image's pytest, run a made-up file once (pytest's first run builds what every
    later one reuses) and parse its configuration, so each judge of a pytest file forks with it
    warm; no other judge and none of the candidate's processes import it. Nothing if the image
    has no pytest (its pytest jobs are refused on the host: pool.py)."""
    if pytest_available() is None:
        return
    JUDGE_CACHE["trusted_dirs"] = package_dirs(PYTEST_PACKAGES)
    try:
        run_pytest_file(compile(WARM_FILE, "<warm pytest>", "exec"), {"__builtins__": __builtins__}, lambda *a: None)
    finally:
        sys.modules.pop(PYTEST_MODULE, None)
    JUDGE_CACHE["pytest_config"] = _prepared_config()  # parsed once here: each judge forks with its own copy


def _prepared_config():
    """pytest's configuration for the judge's runs (the arguments below, plugins loaded, not yet
    configured): building it is over half of a run's cost, and it holds nothing of any job."""
    from _pytest.config import _prepareconfig

    with _pytest_environment():
        return _prepareconfig(list(_args()), plugins=[])


def _args():
    anchor = os.path.realpath(os.__file__)  # read-only, in the image: only the collector's path
    return (*PYTEST_ARGS, "--rootdir", os.path.dirname(anchor), anchor)


class _pytest_environment:
    """No plugin autoload and none of pytest's environment options while pytest reads its setup."""

    def __enter__(self):
        self.saved = {name: os.environ.pop(name) for name in PYTEST_ENV if name in os.environ}
        os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"

    def __exit__(self, *exc):
        os.environ.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
        os.environ.update(self.saved)


def pytest_available():
    """pytest's version in this interpreter, or None (an image built before pytest files). The
    runner starts without ``site``: the image's site directories (Debian's ``python3-pytest`` is in
    ``/usr/lib/python3/dist-packages``) are added to the path here, after the standard library."""
    try:
        import pytest
    except ImportError:
        import site

        sys.path.extend(p for p in site.getsitepackages() if os.path.isdir(p) and p not in sys.path)
        try:
            import pytest
        except ImportError:
            return None
    return getattr(pytest, "__version__", "?")


MAX_ITEMS = 4096  # tests one file may collect


def run_pytest_files(namespace, files, report, crossing=None):
    """A task's pytest files, run by the judge (judge.py ``judge_main``) or, with ``crossing`` None,
    in the completion's own process (inprocess.py): per file a ``collected`` event (``n``
    tests; a file that fails before its tests run counts as one failed test), then a ``test``
    event per test as it ends (``i`` numbered across the files, ``node`` its node id). With a
    reference, a test the reference's run did not skip fails when it skips (a skip the
    completion caused never passes), and each file is held to the count of tests the reference's
    run collected from it (``Rules.collected``: a file that parametrizes over the completion's
    data): a file that collects fewer counts the reference's number, those it did not collect
    failing; one that collects more fails every test (they are not the reference's tests)."""
    rules = crossing.rules if crossing is not None else None
    held = rules.collected if rules is not None and rules.mode == "reference" else []
    held = held if len(held) == len(files) else [None] * len(files)
    base = 0
    state = {"gone": False}

    for code, want in zip(files, held):
        count = [0]
        found = [None]  # what the file collected

        def on_collected(n, want=want, found=found):
            found[0] = n
            report({"e": "collected", "n": n if want is None or n >= want else want})

        def on_start(node, count=count, base=base):
            if crossing is not None:
                crossing.test = str(base + count[0])  # what the judge records a call under: the test's index

        def on_test(node, ok, skip, kind, msg, duration, count=count, base=base, want=want, found=found):
            index = base + count[0]
            count[0] += 1
            if skip and rules is not None and rules.record:
                crossing.skips[str(index)] = -1
            elif skip and rules is not None and rules.mode == "reference" and rules.skips.get(str(index), 0) != -1:
                ok, skip, kind = False, False, "SkipTest"
                msg = "skipped: the test skipped where the task's reference ran it (a skip the completion caused never passes)"
            if want is not None and found[0] is not None and found[0] > want:
                ok, skip, kind = False, False, "CollectedCount"
                msg = (f"the file collected {found[0]} tests where the task's reference collected {want}: "
                       "they are not the reference's tests (its parameters come from the completion)")
            event = {"e": "test", "i": index, "ok": ok, "node": node[:300], "d": round(duration, 6)}
            if not ok:
                event.update(type=kind[:100] or "Error", msg=(msg or "")[:300])
                if skip:
                    event["skip"] = True
            report(event)
            if crossing is not None and crossing.gone is not None and crossing.tamper is None and not state["gone"]:
                state["gone"] = True
                report({"e": "gone", "i": index, "msg": crossing.gone[:300]})

        if isinstance(code, str):  # the runner could not compile it
            outcome = (0, "SyntaxError", f"the task's test file does not compile: {code[:250]}")
        elif crossing is not None and crossing.gone is not None:
            outcome = (0, "FailedCall", crossing.gone[:300])
        else:
            outcome = run_pytest_file(code, namespace, on_test, on_start, crossing, on_collected)
        if type(outcome) is tuple:
            total = max(1, want or 1)
            report({"e": "collected", "n": total})
            report({"e": "test", "i": base, "ok": False, "type": outcome[1][:100], "msg": outcome[2][:300]})
            _not_collected(report, base + 1, base + total, 1, total,
                           "not run: the file failed before its tests ran (the task's reference collected "
                           f"{total} tests from it)")
            base += total
        elif want is not None and outcome < want:
            _not_collected(report, base + outcome, base + want, outcome, want,
                           f"not collected: the file collected {outcome} tests where the task's reference collected "
                           f"{want} (its parameters come from the completion)")
            base += want
        else:
            base += outcome


def _not_collected(report, start, end, first, total, why):
    """Failed tests ``start`` .. ``end - 1``: the ones the reference's run collected and this one did not."""
    for k, index in enumerate(range(start, end)):
        report({"e": "test", "i": index, "ok": False, "node": f"{PYTEST_MODULE}.py::<not collected {first + k + 1} of {total}>",
                "type": "CollectedCount", "msg": why[:300]})


def run_pytest_file(code, namespace, on_test, on_start=None, crossing=None, on_collected=None):
    """Run one pytest file (``code``, compiled by the runner) in a module holding ``namespace``
    (the task's setup and the completion's names); ``on_collected(n)`` once collected,
    ``on_test(node_id, ok, skip, type, msg, duration)`` for each collected test as it ends,
    ``on_start(node_id)`` before each. Returns how many tests were collected, or ``(0, type,
    msg)`` when the file itself failed before its tests ran (or collected none)."""
    if pytest_available() is None:  # the host refuses pytest jobs on such an image: a made-up one
        return 0, "NoPytest", "the sandbox image has no pytest: rebuild it (rollstream sandbox build)"
    import pytest

    module = types.ModuleType(PYTEST_MODULE)
    module.__dict__.update({k: v for k, v in namespace.items() if k not in ("__name__", "__file__", "__spec__")})
    module.__dict__["__name__"] = PYTEST_MODULE
    sys.modules[PYTEST_MODULE] = module
    try:
        exec(code, module.__dict__)
    except BaseException as exc:
        refused = crossing is not None and crossing.failed is not None  # a refused call says so itself
        return (0, *_failure_of(crossing, exc, "" if refused else "the test file did not run: "))
    if crossing is not None:
        forward_monkeypatch(sys.modules.get("_pytest.monkeypatch"))
    plugin = _Plugin(pytest, module, code.co_filename, on_test, on_start, crossing, on_collected)
    config = JUDGE_CACHE.pop("pytest_config", None)  # the zygote's, once per judge; else made here
    if config is None:
        with _pytest_environment():
            pytest.main(list(_args()), plugins=[plugin])
    else:
        config.pluginmanager.register(plugin, "rollstream-judge")
        try:
            config.hook.pytest_cmdline_main(config=config)
        finally:
            config._ensure_unconfigure()
    if plugin.problem is not None:
        return (0, *plugin.problem)
    plugin.flush()
    if not plugin.items:
        return 0, "NoTests", "the test file collects no tests"
    return len(plugin.items)


def forward_monkeypatch(monkeypatch):
    """The tests' ``monkeypatch`` of a module attribute reaches the completion as their
    ``mock.patch`` does (hooks.py ``_wrap_mock``): ``setattr``/``delattr`` of a module's attribute
    (``monkeypatch.setattr(random, "randint", ...)`` or ``"random.randint"``) and
    ``setitem``/``delitem`` of a module's ``__dict__`` are recorded in the job's Guards (``patches``),
    so the candidate sees the attribute as the tests' module now has it (set, or deleted) for the
    length of each request, until the patch is undone (the fixture's teardown, ``undo``,
    ``MonkeyPatch.context``). Installed once per process, before the tests' first patch."""
    if monkeypatch is None or getattr(monkeypatch.MonkeyPatch, "_rollstream_forwarded", False):
        return
    cls = monkeypatch.MonkeyPatch

    def module_of(owner):
        name = getattr(owner, "__name__", None) if type(owner) is types.ModuleType else None
        return name if type(name) is str and sys.modules.get(name) is owner else None

    def by_attribute(entry):
        owner, name, _ = entry
        module = module_of(owner)
        return f"{module}.{name}" if module is not None and type(name) is str else None

    def by_item(entry):
        mapping, key, _ = entry
        if type(mapping) is not dict or type(key) is not str:
            return None
        owner = next((m for m in list(sys.modules.values()) if type(m) is types.ModuleType and m.__dict__ is mapping),
                     None)
        module = module_of(owner)
        return f"{module}.{key}" if module is not None else None

    def recording(method, stack, target_of):
        def patched(self, *args, **kwargs):
            entries = getattr(self, stack)
            before = len(entries)
            try:
                return method(self, *args, **kwargs)
            finally:
                guards = Guards.current
                if guards is not None:
                    for entry in entries[before:]:
                        try:
                            target = target_of(entry)
                        except BaseException:
                            continue
                        if target is not None and not any(p is self and t == target for p, t in guards.patches):
                            guards.patches.append((self, target))

        return patched

    undo = cls.undo

    def undone(self):
        guards = Guards.current
        if guards is not None:
            guards.patches[:] = [(p, t) for p, t in guards.patches if p is not self]
        return undo(self)

    cls.setattr = recording(cls.setattr, "_setattr", by_attribute)
    cls.delattr = recording(cls.delattr, "_setattr", by_attribute)
    cls.setitem = recording(cls.setitem, "_setitem", by_item)
    cls.delitem = recording(cls.delitem, "_setitem", by_item)
    cls.undo = undone
    cls._rollstream_forwarded = True


class _Plugin:
    """The judge's pytest plugin for one file (see the module docstring)."""

    def __init__(self, pytest, module, filename, on_test, on_start, crossing, on_collected):
        self.pytest, self.module, self.filename = pytest, module, filename
        self.on_test, self.on_start, self.crossing, self.on_collected = on_test, on_start, crossing, on_collected
        self.items = []  # node ids, in run order
        self.results = {}  # node id -> [ok, skip, type, msg, seconds of its phases]
        self.reported = set()
        self.problem = None  # (type, msg): the file itself failed to collect
        self.session = None
        self.interrupted = None  # (type, msg) of a KeyboardInterrupt that stopped the run

        plugin = self

        class TestModule(pytest.Module):
            """The tests' module as the judge ran it: collected, never imported from disk."""

            def _getobj(self):
                return plugin.module

            def collect(self):
                return [node for node in super().collect() if plugin.own(getattr(node, "obj", None))]

        self.module_class = TestModule

    def own(self, obj):
        """Whether ``obj`` is the test file's own function or class (never the completion's)."""
        if isinstance(obj, type):
            return not isinstance(obj, MirrorMeta) and obj.__module__ == PYTEST_MODULE
        code = getattr(obj, "__code__", None)
        return type(obj) is types.FunctionType and code is not None and code.co_filename == self.filename

    def pytest_pycollect_makemodule(self, module_path, parent):
        return self.module_class.from_parent(parent, path=module_path, name=f"{PYTEST_MODULE}.py",
                                             nodeid=f"{PYTEST_MODULE}.py")
    pytest_pycollect_makemodule.pytest_impl = _FIRST

    def pytest_collection_modifyitems(self, items):
        if len(items) > MAX_ITEMS:
            self.problem = self.problem or ("TooLarge", f"the test file collects {len(items)} tests (at most {MAX_ITEMS})")
        if self.problem is not None:
            items[:] = []  # nothing runs
        self.items = [item.nodeid for item in items]

    def pytest_collection_finish(self, session):
        if self.problem is None and self.items and self.on_collected is not None:
            self.on_collected(len(self.items))

    def pytest_configure(self, config):
        """pytest's unittest support (a ``unittest.TestCase`` in the file) reads the options of its
        debugging plugin, which the judge never loads (``-p no:debugging``: no pdb, no ``--trace``,
        ``pdb.set_trace`` left as it is): here they exist, and are off."""
        for name in ("usepdb", "trace"):
            if not hasattr(config.option, name):
                setattr(config.option, name, False)
    pytest_configure.pytest_impl = _FIRST

    def pytest_make_collect_report(self, collector):
        """A collector's report, its failure written from the exception (never pytest's formatting)."""
        from _pytest.reports import CollectReport
        from _pytest.runner import CallInfo

        call = CallInfo.from_call(lambda: list(collector.collect()), "collect")
        if call.excinfo is None:
            return CollectReport(collector.nodeid, "passed", None, call.result)
        exc = call.excinfo.value
        if isinstance(exc, self.pytest.skip.Exception) and self.judge_clean():
            return CollectReport(collector.nodeid, "skipped", (self.filename, 0, clip_text(exc, 280)), [])
        self.problem = self.problem or _failure_of(self.crossing, exc, f"collecting {collector.nodeid or 'the file'}: ")
        return CollectReport(collector.nodeid, "failed", self.problem[1], [])
    pytest_make_collect_report.pytest_impl = _FIRST

    def pytest_runtest_setup(self, item):
        if self.crossing is not None:
            self.crossing.failed = None
        if self.on_start is not None:
            self.on_start(item.nodeid)
    pytest_runtest_setup.pytest_impl = _FIRST

    def pytest_runtest_makereport(self, item, call):
        """The phase's report from the exception itself: type and ``str``, as every test form."""
        from _pytest.reports import TestReport

        outcome, longrepr, failure = "passed", None, None
        caught = getattr(item, "_excinfo", None)  # a TestCase's outcome, which unittest gave its result (the item)
        if type(caught) is list and caught:  # as pytest's unittest support takes it (its hook would run after this one)
            call.excinfo = caught.pop(0)
        if call.excinfo is not None:
            exc = call.excinfo.value
            if isinstance(exc, self.pytest.skip.Exception) and self.judge_clean():
                outcome, longrepr = "skipped", (self.filename, item.reportinfo()[1] or 0, clip_text(exc, 280))
            else:
                outcome, failure = "failed", _failure_of(self.crossing, exc)
                longrepr = f"{failure[0]}: {failure[1]}"
        report = TestReport(item.nodeid, item.location, {k: 1 for k in item.keywords}, outcome, longrepr, call.when,
                            [], call.duration, user_properties=item.user_properties)
        report.rollstream_failure = failure  # (type, message): pytest's xfail handling may change the outcome
        return report
    pytest_runtest_makereport.pytest_impl = _FIRST

    def pytest_runtest_logreport(self, report):
        """One phase's outcome folded into its test's: the first failure stands."""
        result = self.results.setdefault(report.nodeid, [True, False, "", "", 0.0])
        result[4] += report.duration
        if not self.judge_clean() and result[0]:  # a call the judge refused fails the test whatever it caught
            result[:4] = [False, False, *_failure_of(self.crossing, None)]
        elif report.failed and result[0]:
            failure = getattr(report, "rollstream_failure", None) or ("Failed", str(report.longrepr)[:300])
            result[:4] = [False, False, *failure]
        elif report.skipped and result[0] and not result[1]:
            xfail = getattr(report, "wasxfail", None)
            result[1:4] = [True, "Skipped", report.longrepr[2] if isinstance(report.longrepr, tuple) else ""] \
                if xfail is None else [True, "XFail", f"expected to fail: {xfail}" if xfail else "expected to fail"]
        if report.when == "teardown":
            self.emit(report.nodeid)
            if self.crossing is not None and self.crossing.gone is not None and self.session is not None:
                self.session.shouldstop = "the candidate is gone"

    def pytest_sessionstart(self, session):
        self.session = session

    def emit(self, nodeid):
        if nodeid in self.reported:
            return
        self.reported.add(nodeid)
        ok, skip, kind, msg, duration = self.results.get(nodeid, [False, False, "FailedCall", "not run", 0.0])
        self.on_test(nodeid, ok and not skip, skip and ok, kind, msg, duration)

    def pytest_keyboard_interrupt(self, excinfo):
        self.interrupted = (type(excinfo.value).__name__, clip_text(excinfo.value, 280))

    def flush(self):
        """The collected tests that did not run to their end fail: the one a stop interrupted (a
        ``KeyboardInterrupt`` the completion raised) with the stop, the rest unrun."""
        why = (self.crossing.gone if self.crossing is not None and self.crossing.gone else "not run: the run stopped")[:300]
        for nodeid in self.items:
            if nodeid in self.reported:
                continue
            if nodeid in self.results and self.interrupted is not None:
                self.results[nodeid] = [False, False, *self.interrupted, 0.0]
            else:
                self.results[nodeid] = [False, False, "FailedCall", why, 0.0]
            self.emit(nodeid)

    def judge_clean(self):
        return self.crossing is None or self.crossing.failed is None


def _failure_of(crossing, exc, prefix=""):
    """(type, message) of a failure: the call the judge refused, if one was, else ``exc``."""
    if crossing is not None and crossing.failed is not None:
        return failure_type(crossing.failed), prefix + crossing.failed[:300]
    return type(exc).__name__, prefix + clip_text(exc, 300)
