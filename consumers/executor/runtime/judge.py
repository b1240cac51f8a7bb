"""The judge process: one job's tests, run against the candidate's answers.

A module of the runtime (standard library only; in the sandbox it arrives in the runtime's
bundle, runtime/importer.py; on the host, an ordinary module, tested there with forked processes).

The zygote forks a fresh judge per job next to the job's candidate; both die with the job, so
nothing a judge did reaches a later job. The judge runs the task's ``setup`` and tests with the
names the tests read bound as the candidate reported them (consumers/executor/runtime/proxies.py), and reports
events to the runner (PID 1, which only supervises) on a pipe only the judge holds:
``compiled``, ``syntax``, ``setup_error``, ``code_error``, ``code_ok``, ``test`` (i, ok, type,
msg), ``gone`` (i), ``tamper`` (kind, msg), ``paths`` (with ``record``: which calls gave plain
data), ``done``. A judge that does not end with ``done`` and exit status 0 fails the job.

The judge's guards are runtime/guards.py's (:class:`Guards`, one per job) and runtime/hooks.py's
(:func:`install_guards`, once per process).
"""

import builtins
import sys
import time
import types

from rollstream.consumers.executor.runtime.candidate import SOLUTION
from rollstream.consumers.executor.runtime.channel import LinkDown
from rollstream.consumers.executor.runtime.codec import (
    ProtocolError,
    clip_text,
    import_std,
    resolve_std_importing,
    run_setup,
    setup_classes_of,
)
from rollstream.consumers.executor.runtime.crossing import Crossing
from rollstream.consumers.executor.runtime.guards import (
    TEST_MODULE,
    UNBOUND,
    Guards,
    LiveNames,
    builtins_for_tests,
)
from rollstream.consumers.executor.runtime.hooks import install_guards
from rollstream.consumers.executor.runtime.programs import COMPILE_ERROR
from rollstream.consumers.executor.runtime.programs import MESSAGE_CHARS as COMPILE_MESSAGE_CHARS
from rollstream.consumers.executor.runtime.proxies import CrossingState, RemoteBase, raises
from rollstream.consumers.executor.runtime.valuecheck import Refused, Rules


def preimport(modules):
    """The standard-library modules the tests read by name without importing them (``math`` in
    ``assert math.isclose(f(2), 1.41)``), imported by the judge before the completion runs.
    Only these may be bound to a name the completion defines as a module."""
    found = {}
    for name in modules:
        module = import_std(name) if type(name) is str and name.isidentifier() else None
        if module is not None:
            found[name] = module
    return found


def bind(crossing, namespace, report, wanted, entry_point, preimported):
    """Bind the completion's names the tests use: not those the task's setup defined (its own
    helpers stay the judge's; the entry point always comes from the completion), never a builtin
    (but the entry point). With a reference, a name is bound only as the reference binds it
    (:func:`_binding`); a name it does not bind is not bound. Returns the names bound to the
    completion's value as it is (and those it may still define), for :class:`LiveNames`."""
    if type(report) is not list or len(report) % 2:
        raise ProtocolError("a malformed name report")
    rules = crossing.rules
    reported, by_ref, live = {}, {}, {}
    for index in range(0, len(report), 2):
        name, value = report[index], report[index + 1]
        if type(name) is not str or name not in wanted or name in reported:
            raise ProtocolError(f"a name that was not asked for: {str(name)[:200]!r}")
        reported[name] = value
        ref = crossing.table.refs.get(id(value))
        if ref is not None:
            by_ref.setdefault(ref, []).append(name)
    for ref, names in by_ref.items():  # aliases: how the tests reach it is every name it has
        crossing.paths.setdefault(ref, "|".join(sorted(names)))
    for name, value in reported.items():
        if name.startswith("__") or name in ("raises", "run_program") or (hasattr(builtins, name) and name != entry_point):
            continue
        if name in namespace and name != entry_point:
            continue
        ref = crossing.table.refs.get(id(value)) if isinstance(value, RemoteBase) else None
        module, std = crossing.modules.get(ref), crossing.std_objects.get(ref)
        if rules.record:  # the reference itself: what it binds is what the task means
            kind = crossing.bound[name] = _kind_of(crossing, name, value, module, std)
        else:
            kind = rules.names.get(name) if rules.mode == "reference" else None
        bound = _binding(crossing, name, value, kind, module, entry_point, preimported)
        if bound is not UNBOUND:
            namespace[name] = bound
            if bound is value:
                live[name] = value
    if entry_point in namespace and entry_point not in reported:
        del namespace[entry_point]  # the setup's stub (HumanEval prompts) is not the answer
    for name in wanted:  # not defined yet: a later call may define it (`global cache; cache = {}`)
        if name not in reported and name not in namespace and _may_bind(name, entry_point):
            live[name] = UNBOUND
    return live


def _may_bind(name, entry_point):
    """Whether the completion may bind ``name`` for the tests at all (a name the setup does not
    define: :func:`bind`)."""
    if name == entry_point:
        return True
    return not (name.startswith("__") or name in ("raises", "run_program") or hasattr(builtins, name)
                or name in sys.stdlib_module_names)



def _kind_of(crossing, name, value, module, std):
    """How the reference binds ``name``: ``m:<module>`` (a standard-library module, under its name
    or an alias), ``s:<module>:<qualname>`` (a standard-library class or function), ``o`` (an
    object of its own), ``p`` (plain data)."""
    if module is not None:
        return f"m:{module}" if import_std(module) is not None else "m"
    if std is not None:
        return f"s:{std[0]}:{std[1]}"
    return "o" if crossing.handles_in(value, name, name) else "p"


def _binding(crossing, name, value, kind, module, entry_point, preimported):
    """What the tests see under ``name``:

    * a standard-library module or object the reference binds there (``import datetime as dt``,
      ``from math import isclose``): the judge's own, whatever the completion bound;
    * a module the completion bound (no reference): the judge's own import of that module, under
      its own name or an alias that is no other module's name; never a completion object under a
      module's name (``math``, ``re`` read by tests that rely on the completion's import), unless
      it is the entry point or the reference binds an object of its own there (``chunk``);
    * with a reference: nothing where it binds nothing, :class:`Refused` for a completion object
      where it binds plain data, or for a standard-library class or function where it binds an
      object of its own (``InsufficientFunds = Exception`` would let ``except`` swallow the tests'
      failures); else the completion's value."""
    if kind is not None and kind.startswith("m:"):
        found = preimported.get(kind[2:]) or import_std(kind[2:])
        return UNBOUND if found is None else found
    if kind is not None and kind.startswith("s:"):
        found = resolve_std_importing(*kind[2:].partition(":")[::2])
        return UNBOUND if found is None else found
    if module is not None:
        if kind is not None or (name in sys.stdlib_module_names and name != module):
            return UNBOUND
        found = preimported.get(module) or import_std(module)
        return UNBOUND if found is None else found
    if name in sys.stdlib_module_names and name != entry_point and kind not in ("o", "p"):
        return UNBOUND
    if crossing.rules.mode == "reference":
        if kind is None:
            return UNBOUND
        objects = crossing.handles_in(value, name, name)
        if kind == "p" and objects:
            return Refused(f"type_mismatch: {name} is a completion object where the task's reference binds plain data")
        if kind == "o" and not objects:
            return Refused(f"type_mismatch: {name} is plain data or a standard-library object where the task's "
                           "reference binds an object of its own")
    return value


# ---------------------------------------------------------------- the test loop

def judge_main(part, read_fd, write_fd, report, guarded=True, run_files=None):
    """Run one job's setup and tests against the candidate at the other end of the pipes;
    ``report(dict)`` records events. ``part`` is what the runner sent (trusted). ``guarded``:
    install the guards if this process has not (off only for the runner's warm-up).
    ``run_files`` runs a job's pytest files (runtime/pytests.py ``run_pytest_files``, which the
    zygotes pass: pytests.py builds on this module, so this one does not import it)."""
    setup, tests, names, entry_point, modules, rules, pytest_files = part  # pytest_files: runtime/pytests.py
    preimported = preimport(modules)
    namespace_module = types.ModuleType(TEST_MODULE)
    namespace = namespace_module.__dict__
    crossing = Crossing(read_fd, write_fd, rules=Rules(rules))
    CrossingState.crossing = crossing
    if guarded:
        install_guards()
    guards = Guards(crossing, [setup, *tests])
    Guards.current = guards
    crossing.env = guards.env
    crossing.extras = guards.extras
    namespace.update(__builtins__=builtins_for_tests(), raises=raises,
                     run_program=lambda stdin="": _run_program(crossing, stdin), __assert_explain__=explain)
    sys.modules[TEST_MODULE] = namespace_module
    sys.argv = ["tests"]
    guards.argv = list(sys.argv)
    failed = run_setup(setup, namespace)
    if failed is not None:
        report({"e": "setup_error", "type": type(failed).__name__, "msg": clip_text(failed, 500)})
        return finish(crossing, report)
    setup_objects = {k: v for k, v in namespace.items()
                     if k not in ("__builtins__", "raises", "run_program", "__assert_explain__")}
    crossing.set_setup(setup_objects, setup_classes_of(namespace))
    status, detail = first_messages(crossing)
    if status == "syntax":
        kind, line, msg = (detail + [None, None, None])[:3]
        report({"e": "syntax", "type": _short(kind), "line": line if type(line) is int else None,
                "msg": _short(msg, COMPILE_MESSAGE_CHARS if kind == COMPILE_ERROR else 500)})
        return finish(crossing, report)
    if status in ("gone", "tamper"):
        if detail == "compiled":
            report({"e": "compiled"})
        return finish(crossing, report, tests, 0)
    report({"e": "compiled"})
    if status == "setup_error":
        report({"e": "setup_error", "type": _short(_at(detail, 0)), "msg": _short(_at(detail, 1), 500)})
        return finish(crossing, report)
    if status == "code_error":
        line = _at(detail, 2)
        report({"e": "code_error", "type": _short(_at(detail, 0)), "msg": _short(_at(detail, 1), 500),
                "line": line if type(line) is int else None})
        return finish(crossing, report)
    try:
        if status != "ok" or len(detail) != 1:
            raise ProtocolError("an unknown ready status")
        live = bind(crossing, namespace, detail[0], set(names), entry_point, preimported)
        sys.modules[SOLUTION] = module = solution_module(namespace, names)
        guards.live = LiveNames(crossing, (namespace, module.__dict__), live, names)
    except ProtocolError as exc:
        crossing.set_tamper("protocol", exc)
        return finish(crossing, report, tests, 0)
    report({"e": "code_ok"})
    if pytest_files:
        if run_files is None:
            raise RuntimeError("a job of pytest files, and no runner of them given")
        run_files(namespace, tests, report, crossing)
        return finish(crossing, report)
    for index, test in enumerate(tests):
        if crossing.gone is not None:  # nothing more will be answered: the rest fail unrun
            return finish(crossing, report, tests, index, gone_reported=True)
        started = time.perf_counter()
        event = run_test(crossing, guards, namespace, index, test)
        event["d"] = round(time.perf_counter() - started, 6)
        report(event)
        if crossing.gone is not None and crossing.tamper is None:
            report({"e": "gone", "i": index, "msg": crossing.gone[:300]})
    return finish(crossing, report)


def solution_module(namespace, names):
    """The completion's module as the tests import it (``from solution import add``, ``import
    solution``): the names the tests read, each as :func:`bind` bound it (the task's setup's
    own where it defines one); a name the completion does not define is not there (an
    ``ImportError``, as in Python)."""
    module = types.ModuleType(SOLUTION)
    module.__dict__.update({name: namespace[name] for name in names
                            if name in namespace and name not in ("raises", "run_program", "__assert_explain__")})
    return module


def run_test(crossing, guards, namespace, index, test):
    """One test: passed only if it ran to its end. A skip the tests declare themselves
    (``@unittest.skip``, ``skipTest``, ``raise unittest.SkipTest`` in the test's code) reports the
    test as skipped: neither passed nor failed. With a reference, skipping more of a test than
    the reference's run did is the completion's doing: the test fails."""
    crossing.failed = None
    crossing.test = str(index)
    guards.unittest_failed = False
    guards.unittest_run = guards.unittest_skipped = 0
    skipped = None
    try:
        if isinstance(test, str):
            raise SyntaxError(f"the task's test does not compile: {test}")
        exec(test, namespace)
    except SystemExit as exc:  # unittest.main(): a success exits with a false code
        ok = id(exc) not in crossing.candidate_errors and not exc.code
        event = {"e": "test", "i": index, "ok": ok} if ok else _failure(index, exc)
    except BaseException as exc:
        control = _skip_class()
        if control is not None and isinstance(exc, control) and crossing.failed is None:
            skipped = clip_text(exc, 300)  # the test's own skip (a completion's never arrives as one)
        event = _failure(index, exc)
    else:
        event = {"e": "test", "i": index, "ok": True}
    if event["ok"] and guards.unittest_failed:
        event = {"e": "test", "i": index, "ok": False, "type": "AssertionError", "msg": "a unittest test failed"}
    whole = skipped is not None or (event["ok"] and guards.unittest_run and guards.unittest_skipped == guards.unittest_run)
    count = -1 if whole else guards.unittest_skipped
    if crossing.rules.record:
        if count:
            crossing.skips[str(index)] = count
    elif count and crossing.rules.mode == "reference":
        allowed = crossing.rules.skips.get(str(index), 0)
        if allowed != -1 and (count == -1 or count > allowed):
            crossing.failed = crossing.failed or ("skipped: the test skipped where the task's reference ran it (a skip "
                                            "the completion caused never passes)")
            whole = False
    if whole and crossing.failed is None:
        return {"e": "test", "i": index, "ok": False, "skip": True, "type": "SkipTest",
                "msg": skipped or f"all {guards.unittest_run} unittest tests skipped"}
    if crossing.failed is not None:
        event = {"e": "test", "i": index, "ok": False, "type": failure_type(crossing.failed), "msg": crossing.failed[:300]}
    return event


_SCALARS = (bool, float, complex, type(None))


def plain_repr(value, budget=120, depth=0):
    """``value`` as text when it is plain data (the exact built-in types, containers of them, within
    ``budget`` characters and 3 levels), else its type's name: nothing of the completion runs (a
    proxy's type is the judge's own class; no ``__repr__`` but the built-ins' is called)."""
    kind = type(value)
    if kind in _SCALARS:
        return repr(value)
    if kind is int:
        return repr(value) if value.bit_length() <= 256 else f"<int of {value.bit_length()} bits>"
    if kind in (str, bytes):
        return repr(value[:budget]) + (f"... ({len(value)} long)" if len(value) > budget else "")
    if kind in (list, tuple, set, frozenset, dict) and depth < 3:
        items = list(value.items()) if kind is dict else list(value) if kind in (list, tuple) else None
        if items is None:  # a set: its items' order is the set's own; only plain ones are shown
            items = list(value)
        shown, used = [], 0
        for item in items:
            text = (f"{plain_repr(item[0], budget, depth + 1)}: {plain_repr(item[1], budget, depth + 1)}"
                    if kind is dict else plain_repr(item, budget, depth + 1))
            used += len(text) + 2
            if used > budget and shown:
                shown.append(f"... {len(items) - len(shown)} more")
                break
            shown.append(text)
        body = ", ".join(shown)
        if kind is list:
            return f"[{body}]"
        if kind is tuple:
            return f"({body}{',' if len(items) == 1 else ''})"
        if kind is dict:
            return "{" + body + "}"
        return f"{kind.__name__}({{{body}}})" if items else f"{kind.__name__}()"
    return f"<{kind.__name__}>" if kind.__module__ == "builtins" else "<an object>"


def explain(left, op, right):
    """The message of a failing ``assert left <op> right`` (runtime/jobrun.py ``explained_asserts``)."""
    return f"{plain_repr(left)} {op} {plain_repr(right)}"


def failure_type(why):
    for prefix, kind in (("type_mismatch", "TypeMismatch"), ("too_large", "TooLarge"), ("skipped", "SkipTest"),
                         ("test_object", "TestObject")):
        if why.startswith(prefix):
            return kind
    return "FailedCall"


def _skip_class():
    case = sys.modules.get("unittest.case")
    return getattr(case, "SkipTest", None) if case is not None else None


def _failure(index, exc):
    return {"e": "test", "i": index, "ok": False, "type": type(exc).__name__, "msg": clip_text(exc, 300)}


def first_messages(crossing):
    """The candidate's first messages: (status, detail)."""
    channel = crossing.channel
    crossing.decoding = True
    try:
        message = channel.receive()
        if message is None:
            raise LinkDown("the candidate exited or died")
        if message.kind == "syntax":
            return "syntax", message.items
        if message.kind != "compiled":
            raise ProtocolError("expected the compile status")
        try:
            message = channel.receive()
            if message is None:
                raise LinkDown("the candidate exited or died")
        except LinkDown as exc:
            crossing.gone = crossing.gone or exc.reason
            return "gone", "compiled"
        if message.kind != "ready":
            raise ProtocolError("expected the ready message")
        return message.what, message.items
    except ProtocolError as exc:
        crossing.set_tamper("protocol", exc)
        return "tamper", None
    except LinkDown as exc:
        crossing.gone = crossing.gone or exc.reason
        return "gone", None
    finally:
        crossing.decoding = False


def _run_program(crossing, stdin):
    """The program's standard output for this standard input (tests call it by name)."""
    if not isinstance(stdin, (str, bytes)):
        raise TypeError("run_program takes the standard input as str or bytes")
    result = crossing.ask("run", None, [stdin])
    if type(result) is not list or len(result) != 2 or type(result[0]) is not str:
        crossing.set_tamper("protocol", "a malformed program result")
        crossing.fail(crossing.gone)
    return result[0]


def finish(crossing, report, tests=(), start=None, gone_reported=False):
    """Report what is left: the tests from ``start`` on fail unrun, any tamper, the record of
    plain calls, then done."""
    if start is not None:
        why = (crossing.gone or "the candidate exited or died")[:300]
        if crossing.tamper is None and not gone_reported:
            report({"e": "gone", "i": start, "msg": why})
        for index in range(start, len(tests)):
            report({"e": "test", "i": index, "ok": False, "type": "FailedCall", "msg": why})
    if crossing.tamper is not None:
        report({"e": "tamper", "kind": crossing.tamper[0], "msg": crossing.tamper[1]})
    if crossing.rules.record:  # what the reference produced: the rules for the task's other jobs
        report({"e": "paths", "objects": sorted(crossing.recorded_steps)[:4096],
                "names": sorted(f"{name}:{kind}" for name, kind in crossing.bound.items()),
                "skips": sorted(f"{index}:{count}" for index, count in crossing.skips.items()),
                "delegated": sorted(crossing.delegated)[:4096], "suppressed": sorted(crossing.suppressed)[:4096]})
    report({"e": "done"})
    return 0


def _at(detail, index):
    return detail[index] if type(detail) is list and len(detail) > index else None


def _short(value, limit=100):
    return value[:limit] if type(value) is str else ""
