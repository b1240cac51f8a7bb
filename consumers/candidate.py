"""The candidate: the completion's process, which answers the judge's calls with plain data.

Runs INSIDE the sandbox after ``plain.py`` in the runner's source (standard library only; on
the host, an ordinary module). The candidate is a fresh fork of the runner's zygote, which never
loaded a job: it runs the task's ``setup``, then the completion's code, reports which of the
names the tests read it defines, then serves calls until the runner ends it (see
consumers/judge.py for the other side and the guarantees). Everything here is the honest
serving code; the completion can change any of it in its own process, and the judge believes
only what arrives as plain data.
"""

import builtins
import io
import json
import sys

if __name__ != "__main__":  # on the host; in the sandbox these names come from plain.py above
    from rollstream.consumers.plain import (
        Encoder,
        NotPlain,
        ProtocolError,
        _text,
        decode,
        receive,
        send,
        send_text,
    )

def run_program_here(code, stdin):
    """Run a whole program (a code object) in a fresh ``__main__`` namespace of this process with
    ``stdin`` as its standard input; returns (stdout text, exit status)."""
    data = stdin.encode() if isinstance(stdin, str) else bytes(stdin)
    saved = sys.stdin, sys.stdout
    out = io.BytesIO()
    stdout = io.TextIOWrapper(out, encoding="utf-8", write_through=True)
    sys.stdin = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
    sys.stdout = stdout
    status = 0
    try:
        exec(code, {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.stdin, sys.stdout = saved
        try:
            stdout.flush()
            stdout.detach()  # so that collecting the wrapper does not close ``out``
        except BaseException:
            pass
    return out.getvalue().decode("utf-8", "replace"), status


def _exception_name(exc):
    """The nearest built-in exception class of ``exc`` (a ValueError subclass is a ValueError)."""
    for cls in type(exc).__mro__:
        if getattr(builtins, cls.__name__, None) is cls:
            return cls.__name__
    return "Exception"


# ---------------------------------------------------------------- the candidate

class Handles:
    """The candidate's table of objects the judge holds handles to."""

    def __init__(self, namespace_name):
        self.objects = []
        self.ids = {}
        self.module = namespace_name

    def of(self, obj):
        """A handle for callables and instances of classes the completion defined; else None."""
        if not callable(obj) and getattr(type(obj), "__module__", None) != self.module:
            return None
        key = id(obj)
        hid = self.ids.get(key)
        if hid is None:
            hid = self.ids[key] = len(self.objects)
            self.objects.append(obj)
        return hid

    def get(self, hid):
        if type(hid) is not int or not 0 <= hid < len(self.objects):
            raise ProtocolError(f"unknown handle {hid!r}")
        return self.objects[hid]


def candidate_main(code_text, setup, names, program, req_fd, resp_fd, out_cap):
    """Run the completion and serve the judge's calls until the judge hangs up (or the runner
    ends the process); returns an exit status.

    Messages to the judge: ``["compiled"]`` or ``["syntax", type, line, msg]``, then
    ``["ready", "ok", names]`` / ``["ready", "code_error", type, msg, line]`` /
    ``["ready", "setup_error", type, msg]``, then one reply per request (see :func:`_serve`).
    """
    namespace = {"__name__": "solution", "__builtins__": builtins}
    try:
        code = compile(code_text, "<completion>", "exec")
    except (SyntaxError, ValueError) as exc:
        print_exception(exc)
        send(resp_fd, ["syntax", type(exc).__name__, getattr(exc, "lineno", None),
                       str(getattr(exc, "msg", exc))[:500]])
        return 1
    except (MemoryError, RecursionError) as exc:
        send(resp_fd, ["syntax", type(exc).__name__, None, "too complex to compile"])
        return 1
    send(resp_fd, ["compiled"])
    handles = Handles("solution")
    if setup is not None:
        try:
            if isinstance(setup, str):
                raise SyntaxError(setup)
            exec(setup, namespace)
        except BaseException as exc:
            send(resp_fd, ["ready", "setup_error", type(exc).__name__, _text(exc, 500)])
            return 1
    if not program:
        try:
            exec(code, namespace)
        except BaseException as exc:  # SystemExit too: the tests never get an answer
            print_exception(exc)
            send(resp_fd, ["ready", "code_error", type(exc).__name__, _text(exc, 500), _line_of(exc)])
            return 1
    encoder = Encoder(handles.of)
    report = []
    for name in names:
        if name not in namespace:
            continue
        value = namespace[name]
        if type(value).__name__ == "module" and isinstance(getattr(value, "__name__", None), str):
            report.append([name, "m", value.__name__])
            continue
        try:
            report.append([name, "v", json.loads(encoder.text(value))])
        except NotPlain:
            continue
    sys.stdout.flush()
    send(resp_fd, ["ready", "ok", report])
    _serve(code, handles, encoder, req_fd, resp_fd, out_cap)
    return 0


def _serve(code, handles, encoder, req_fd, resp_fd, out_cap):
    """Answer requests ``[op, seq, ...]`` with ``[seq, kind, payload, printed, mutated]``:

    * ``["call", seq, h, args, kwargs]``: call handle ``h`` (args a list, kwargs [[name, v]...]);
    * ``["callm", seq, h, name, args, kwargs]``: call the method ``name`` of handle ``h``;
    * ``["get", seq, h, name]`` / ``["set", seq, h, name, v]``: an attribute;
    * ``["op", seq, h, op, args]``: len, iter, contains, getitem, setitem, delitem, str, repr,
      bool, eq, ne, lt, le, gt, ge (the last six against other handles only);
    * ``["run", seq, stdin]``: the whole program with that standard input.

    ``kind`` is ``ok`` (payload: the value), ``exc`` (payload: [builtin type, message]),
    ``fail`` (payload: why the call has no plain answer) or ``method`` (``get`` of a callable
    attribute); ``mutated`` lists [position or keyword, value] of mutable arguments the call
    changed. Values are the codec's JSON; the reply is built as text so each is encoded once.
    """
    while True:
        frame = receive(req_fd)
        if frame is None:
            return
        request = decode(frame, handles.get)
        seq = request[1]
        printed = io.StringIO()
        saved = sys.stdout
        sys.stdout = printed
        mutated = []
        try:
            kind, payload = _answer(request, code, handles, encoder, mutated)
        except BaseException as exc:  # whatever the completion raised, as plain data
            kind, payload = "exc", json.dumps([_exception_name(exc), _text(exc, 1000)])
        finally:
            sys.stdout = saved
        text = printed.getvalue()
        if len(text) > out_cap:
            kind, payload, text = "fail", json.dumps(f"printed {len(text)} characters in one call"), ""
        send_text(resp_fd, f'[{int(seq)},"{kind}",{payload},{json.dumps(text)},[{",".join(mutated)}]]')


def _answer(request, code, handles, encoder, mutated):
    op = request[0]
    if op == "run":
        out, status = run_program_here(code, request[2])
        return "ok", json.dumps([out, status])
    target = handles.get(request[2])
    if op == "call":
        args, kwargs = request[3], dict(request[4])
        before = _mutables(args, kwargs, encoder)
        result = target(*args, **kwargs)
        for key, old in before:
            value = args[key] if type(key) is int else kwargs[key]
            try:
                new = encoder.text(value)
            except NotPlain:
                continue
            if new != old:
                mutated.append(f"[{json.dumps(key)},{new}]")
    elif op == "callm":
        args, kwargs = request[4], dict(request[5])
        result = getattr(target, request[3])(*args, **kwargs)
    elif op == "get":
        result = getattr(target, request[3])
        if callable(result) and getattr(type(result), "__module__", None) != handles.module:
            return "method", "null"
    elif op == "set":
        setattr(target, request[3], request[4])
        result = None
    elif op == "op":
        result = _operator(target, request[3], request[4])
    else:
        raise ProtocolError(f"unknown request {op!r}")
    try:
        return "ok", encoder.text(result)
    except NotPlain as exc:
        return "fail", json.dumps(str(exc))


def _mutables(args, kwargs, encoder):
    """(key, encoding) of each mutable plain argument, to see afterwards whether it changed."""
    found = []
    for key, value in list(enumerate(args)) + list(kwargs.items()):
        if type(value) in (list, dict, set, bytearray):
            try:
                found.append((key, encoder.text(value)))
            except NotPlain:
                pass
    return found


def _operator(target, op, args):
    if op == "len":
        return len(target)
    if op == "iter":
        items = []
        for item in target:
            items.append(item)
            if len(items) > 100000:
                raise NotPlain("iterates over more than 100000 items")
        return items
    if op == "contains":
        return args[0] in target
    if op == "getitem":
        return target[args[0]]
    if op == "setitem":
        target[args[0]] = args[1]
        return None
    if op == "delitem":
        del target[args[0]]
        return None
    if op == "str":
        return str(target)
    if op == "repr":
        return repr(target)
    if op == "bool":
        return bool(target)
    if op in ("eq", "ne", "lt", "le", "gt", "ge"):
        other = args[0]
        return {"eq": lambda: target == other, "ne": lambda: target != other, "lt": lambda: target < other,
                "le": lambda: target <= other, "gt": lambda: target > other, "ge": lambda: target >= other}[op]()
    raise ProtocolError(f"unknown operator {op!r}")


def _line_of(exc):
    line, tb = None, exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<completion>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def print_exception(exc):
    """Print like the interpreter would (no source lines: the code is not a file), skipping the
    runner's own frames. By hand: the traceback module pulls a dozen modules into the runner,
    which every fork then copies."""
    try:
        if isinstance(exc, SyntaxError):
            lines = [f'  File "{exc.filename}", line {exc.lineno}\n']
            if exc.text:
                lines.append(f"    {exc.text.strip()}\n")
            lines.append(f"{type(exc).__name__}: {exc.msg}\n")
        else:
            frames, tb = [], exc.__traceback__
            while tb is not None:
                code = tb.tb_frame.f_code
                if code.co_filename != print_exception.__code__.co_filename:
                    frames.append(f'  File "{code.co_filename}", line {tb.tb_lineno}, in {code.co_name}\n')
                tb = tb.tb_next
            if len(frames) > 40:
                frames = frames[:20] + [f"  [... {len(frames) - 40} more frames ...]\n"] + frames[-20:]
            text = _text(exc, 2000)
            lines = [
                "Traceback (most recent call last):\n",
                *frames,
                f"{type(exc).__name__}: {text}\n" if text else f"{type(exc).__name__}\n",
            ]
        sys.stderr.write("".join(lines))
        sys.stderr.flush()
    except BaseException:
        pass
