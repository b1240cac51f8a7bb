"""The candidate: the completion's process, which answers the judge's requests.

A module of the runtime (standard library only; in the sandbox it arrives in the runtime's
bundle, runtime/importer.py; on the host, an ordinary module). The candidate is a fresh fork of the zygote, which never
loaded a job: it runs the task's ``setup``, then the completion's code, reports what it defines
under the names the tests read, then serves requests until the runner ends it (consumers/
judge.py for the other side). Everything here is honest serving code; the completion can change
any of it in its own process, and the judge believes only what it can decode.

What the tests hand over comes as it is in Python: their lists, dicts and the task's own class
instances as replicas whose changes go back (consumers/executor/runtime/codec.py); their
functions, mocks and streams as ``JudgeProxy`` s (runtime/handles.py), which the completion calls
like the originals (the judge runs them). For the length of a request the judge's overrides
apply here too (runtime/overrides.py): a builtin the tests patched (``input``),
``sys.stdin``/``sys.argv`` they replaced, ``mock.patch`` of a standard-library function.
Programs (``run_program``) get their input on a real descriptor 0, so ``input()``,
``sys.stdin.buffer`` and ``open(0)`` all read it.

This module is the candidate's start-up (:func:`candidate_main`; a program in another language
built first, runtime/programs.py) and its serving loop (:func:`serve`, :func:`serve_requests`).
The rest is in modules of its own: the candidate's state and its side of the codec
(runtime/handles.py), the handlers of the requests (runtime/ops.py ``OPS``), the judge's
overrides (runtime/overrides.py) and what the completion prints (runtime/printing.py).
"""

import builtins
import os
import sys

from rollstream.consumers.executor.runtime.channel import Channel, items
from rollstream.consumers.executor.runtime.codec import ProtocolError, clip_text, run_setup, setup_classes_of
from rollstream.consumers.executor.runtime.handles import CANDIDATE, decode_other, encode_other
from rollstream.consumers.executor.runtime.ops import IS_METHOD, OPS
from rollstream.consumers.executor.runtime.overrides import MISSING, apply_env
from rollstream.consumers.executor.runtime.printing import (
    CAPTURED_ERR,
    CAPTURED_OUT,
    PRINT_CAP,
    line_of,
    print_exception,
)
from rollstream.consumers.executor.runtime.programs import (
    COMPILE_ERROR,
    COMPILER_UNAVAILABLE,
    MESSAGE_CHARS,
    CompileFailed,
    build,
)
from rollstream.consumers.executor.runtime.proxies import JUDGE_PARITY

SOLUTION = "solution"  # the completion's module name


# ---------------------------------------------------------------- serving

def serve(message):
    """Answer one request of the judge's: ``(status, items, extras)``."""
    shared = {}
    restore = apply_env(message.env, shared)
    try:
        values = message.items
        target = values[0] if len(values) == 2 else None
        rest = values[-1]
        result = OPS[message.what](target, *rest)
        status, reply = ("m", []) if result is IS_METHOD else ("ok", [result])
    except BaseException as exc:  # whatever the completion raised, as it is
        status, reply = "exc", [exc]
    finally:
        extras = restore()
    printed = CAPTURED_OUT.size + CAPTURED_ERR.size
    if printed > PRINT_CAP:
        CAPTURED_OUT.drain()
        CAPTURED_ERR.drain()
        return "fail", [f"printed {printed} characters in one call"]
    if CANDIDATE.watched:
        moved = _moved_names()
        if moved:
            extras = moved if extras is None else extras + moved
    return status, reply, extras


def _moved_names():
    """The names the tests read that the completion's module rebound (``global counter; counter +=
    1``) or deleted since the judge last heard, as extras: ``"=name", value`` or ``"-name", None``.
    In Python the tests read the module's current value (``solution.counter``, or the bare name of
    a shared namespace); the judge rebinds its copy (guards.py ``LiveNames``)."""
    namespace, watched, moved = CANDIDATE.namespace, CANDIDATE.watched, None
    for name, before in watched.items():
        now = namespace.get(name, MISSING)
        if now is not before:
            watched[name] = now
            moved = moved or []
            moved += ["-" + name, None] if now is MISSING else ["=" + name, now]
    return moved


# ---------------------------------------------------------------- the candidate's life

def candidate_main(code_text, setup, names, program, req_fd, resp_fd, out_cap):
    """Run the completion and serve the judge until it hangs up (or the runner ends this
    process); returns an exit status.

    First messages: ``compiled`` or ``syntax`` (type, line, msg), then ``ready`` with ``ok``
    (name, value, ... for the names the tests read that it defines), ``code_error`` (type, msg,
    line) or ``setup_error`` (type, msg)."""
    candidate = CANDIDATE
    candidate.__init__()
    candidate.out_cap = out_cap
    module = type(sys)(SOLUTION)  # a real module, so that its classes pickle by name
    namespace = module.__dict__
    namespace["__builtins__"] = builtins
    sys.modules[SOLUTION] = module
    candidate.namespace = namespace
    channel = candidate.channel = Channel(req_fd, resp_fd, candidate.table, JUDGE_PARITY, encode_other,
                                          decode_other, serve=serve, printed=_printed)
    if type(program) is list:  # [language, compile bound]: a program in another language, built here first
        return _built_program(candidate, channel, code_text, *program)
    try:
        code = compile(code_text, "<completion>", "exec")
    except (SyntaxError, ValueError) as exc:
        print_exception(exc)
        channel.send("syntax", 0, "", [type(exc).__name__, getattr(exc, "lineno", None),
                                       str(getattr(exc, "msg", exc))[:500]])
        return 1
    except (MemoryError, RecursionError) as exc:
        channel.send("syntax", 0, "", [type(exc).__name__, None, "too complex to compile"])
        return 1
    candidate.code = code
    channel.send("compiled", 0, "", [])
    failed = run_setup(setup, namespace)
    if failed is not None:
        channel.send("ready", 0, "setup_error", [type(failed).__name__, clip_text(failed, 500)])
        return 1
    candidate.setup = {k: v for k, v in namespace.items() if k != "__builtins__"}
    classes = setup_classes_of(namespace)
    candidate.setup_ids = {id(v): k for k, v in candidate.setup.items()
                           if isinstance(v, type) or type(v).__name__ == "function"}
    channel.setup_ids = {id(v): k for k, v in classes.items()}
    channel.setup_classes = classes
    if not program:
        try:
            exec(code, namespace)
        except BaseException as exc:  # SystemExit too: the tests never get an answer
            print_exception(exc)
            channel.send("ready", 0, "code_error", [type(exc).__name__, clip_text(exc, 500), line_of(exc)])
            return 1
    report = []
    served = namespace.get("__getattr__")  # PEP 562: a name the module does not hold, its __getattr__ serves
    for name in names:
        if name in namespace:
            report += [name, namespace[name]]
        elif served is not None and callable(served) and not name.startswith("__"):
            try:
                report += [name, served(name)]  # what `from solution import name` would get (AttributeError: none)
            except BaseException:
                continue
    sys.stdout.flush()
    sys.stderr.flush()
    sys.stdout, sys.stderr = CAPTURED_OUT, CAPTURED_ERR
    try:
        channel.send("ready", 0, "ok", [items(report)])
    except BaseException as exc:  # a value that cannot cross: the names go unreported
        _complain(f"candidate: cannot report its names: {type(exc).__name__}: {clip_text(exc, 300)}")
        channel.send("ready", 0, "ok", [items([])])
    else:  # from now on the judge hears when the module rebinds one of them (serve)
        candidate.watched = {name: namespace.get(name, MISSING) for name in names}
    return serve_requests(channel)


def serve_requests(channel):
    """Answer the judge's requests until it hangs up; 0."""
    while True:
        message = channel.next_request()  # under the channel's lock; served outside it
        if message is None:
            return 0
        if message.kind != "q":
            raise ProtocolError(f"an unexpected {message.kind!r} message")
        channel.answer(message)


def _built_program(candidate, channel, source, language, compile_timeout_s):
    """A program in another language: built (runtime/programs.py), then served like a Python
    program (``run``), nothing of it run before a test asks. A build that fails is the job's
    ``syntax`` message of type ``CompileError`` with the compiler's first errors; one the machinery
    could not run (no compiler in this image) says so in a type of its own."""
    try:
        candidate.code = build(language, source, float(compile_timeout_s))
    except CompileFailed as exc:
        channel.send("syntax", 0, "", [COMPILE_ERROR, None, str(exc)[:MESSAGE_CHARS]])
        return 1
    except (OSError, KeyError) as exc:
        channel.send("syntax", 0, "", [COMPILER_UNAVAILABLE, None, clip_text(exc, 500)])
        return 1
    channel.send("compiled", 0, "", [])
    sys.stdout.flush()
    sys.stderr.flush()
    sys.stdout, sys.stderr = CAPTURED_OUT, CAPTURED_ERR
    channel.send("ready", 0, "ok", [items([])])
    return serve_requests(channel)


def _printed():
    return CAPTURED_OUT.drain(), CAPTURED_ERR.drain()


def _complain(text):
    try:
        os.write(2, (text + "\n").encode())
    except OSError:
        pass
