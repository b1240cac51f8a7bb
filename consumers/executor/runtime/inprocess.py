"""``trust = "in_process"``: a task's tests in the completion's own process.

A module of the runtime (standard library only; in the sandbox it arrives in the runtime's
bundle, runtime/importer.py; on the host, an ordinary module). For a task whose tests need the completion's objects in their own process (or
whose reference does not pass under the judge, with ``trust = "auto"``): setup, code and tests
share one interpreter, as with most graders, so the completion can fake its own verdicts. The
execution record says so and ``rollstream_sandbox_in_process_verdicts_total`` counts it. The
reports travel over a pipe on a random descriptor, each with a per-job key (runtime/jobrun.py,
watch.py ``read_events``), so code that writes made-up reports to every descriptor is not believed.
"""

import builtins
import sys
import time

from rollstream.consumers.executor.runtime.codec import clip_text, run_setup
from rollstream.consumers.executor.runtime.judge import explain
from rollstream.consumers.executor.runtime.ops import run_program_here
from rollstream.consumers.executor.runtime.printing import line_of, print_exception
from rollstream.consumers.executor.runtime.proxies import raises
from rollstream.consumers.executor.runtime.pytests import run_pytest_files


def harness(code, setup, tests, report, program=False, out_cap=1 << 16, pytest_files=False):
    """``trust: "in_process"``: run setup, code and tests in this one process; ``report(dict)``
    writes one event. The completion shares the tests' interpreter, so it can fake its own
    verdicts: the execution record says so.

    ``setup`` and ``tests`` are the task's sources compiled by the runner (a code object, or the
    compile error as text; ``setup`` None when there is none); only the completion's ``code``
    is compiled here. With ``program`` the code is not run as a module: tests call
    ``run_program(stdin)``. With ``pytest_files`` each test is a pytest file (runtime/pytests.py).
    """
    module = type(sys)("solution")  # unittest.main() and pickle find the names here, as in a script
    namespace = module.__dict__
    namespace.update(__builtins__=builtins, raises=raises, __assert_explain__=explain)
    sys.modules["__main__"] = sys.modules["solution"] = module
    sys.argv = ["tests"]
    failed = run_setup(setup, namespace)
    if failed is not None:  # the task's own setup is broken
        report({"e": "setup_error", "type": type(failed).__name__, "msg": clip_text(failed, 500)})
        return 1
    try:
        code = compile(code, "<completion>", "exec")
    except (SyntaxError, ValueError) as exc:  # ValueError: source contains NUL bytes
        print_exception(exc)
        report(
            {
                "e": "syntax",
                "type": type(exc).__name__,
                "line": getattr(exc, "lineno", None),
                "msg": str(getattr(exc, "msg", exc))[:500],
            }
        )
        return 1
    except (MemoryError, RecursionError) as exc:  # a pathological parse tree
        report({"e": "syntax", "type": type(exc).__name__, "line": None, "msg": "too complex to compile"})
        return 1
    report({"e": "compiled"})
    namespace["run_program"] = lambda stdin="": run_program_here(code, stdin, out_cap)[0]
    if not program:
        try:
            exec(code, namespace)
        except BaseException as exc:  # SystemExit and KeyboardInterrupt too: tests never ran
            print_exception(exc)
            report({"e": "code_error", "type": type(exc).__name__, "msg": clip_text(exc, 500), "line": line_of(exc)})
            return 1
    report({"e": "code_ok"})
    if pytest_files:
        run_pytest_files(namespace, tests, report)
        report({"e": "done"})
        return 0
    for index, test in enumerate(tests):
        started = time.perf_counter()
        try:
            if isinstance(test, str):
                raise SyntaxError(f"the task's test does not compile: {test}")
            exec(test, namespace)
        except SystemExit as exc:  # unittest.main(): a success exits with a false code
            event = {"e": "test", "i": index, "ok": not exc.code, "type": "SystemExit", "msg": clip_text(exc, 300)}
        except BaseException as exc:
            event = {"e": "test", "i": index, "ok": False, "type": type(exc).__name__, "msg": clip_text(exc, 300)}
        else:
            event = {"e": "test", "i": index, "ok": True}
        event["d"] = round(time.perf_counter() - started, 6)
        report(event)
    report({"e": "done"})
    return 0
