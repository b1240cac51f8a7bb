"""The judge and the candidate: test verdicts that the code under test cannot forge.

This file runs INSIDE the sandbox, as the first part of the runner's source (see
``consumers/sandbox.py:runner_source``); it uses only the standard library. It is also an
ordinary module on the host, so that its pure parts (the plain-data codec) are unit-tested there.

Per job two parties meet over two pipes:

* the **candidate**, a fresh fork of the runner's zygote, runs the completion: the task's
  ``setup``, then the completion's code, then serves calls. It never sees a test or an expected
  value: the zygote never loaded a job, and the candidate reads only its own part of the job
  (code, setup, the names the tests use).
* the **judge** is the runner (PID 1 of the sandbox) itself: it runs the task's ``setup`` and
  tests, with every name the tests take from the completion bound to a proxy. A call through a
  proxy sends the arguments to the candidate as plain data and receives the result as plain
  data. The judge never executes completion code: results are decoded by a strict decoder into
  exact built-in types (None, bool, int, float, str, bytes, bytearray, list, tuple, dict, set,
  frozenset, nested; size and depth capped), and the test's own ``==`` compares them, so no
  candidate code runs while comparing. The judge is non-dumpable (same-uid code cannot ptrace
  it or read its memory), cannot be signalled from inside the container (a namespace's init)
  and shares nothing writable with the candidate but the two pipes.

What the candidate can do to its own process (replace builtins, walk frames, find reporters
through the garbage collector, return objects whose ``__eq__`` always says yes, exec a forged
responder) changes nothing the judge believes. What only an attack would do is *tamper*: a
message that is not what the honest serving code sends (non-data objects, bad framing, answers
to questions not asked, names it was not asked for). The judge ignores
the candidate's exit status: a candidate that exits, hangs or dies fails every test it has not
answered, and a test during which a call failed (a result that is not plain data, the candidate
gone) fails whatever the test itself did with the error.

Objects that are not plain data (instances of classes the completion defines, functions it
returns, the classes themselves) travel as *handles*: the judge holds an opaque proxy and every
use of it (a method call, an attribute, ``len``, ``str``, iteration, indexing) is a call to the
candidate that answers with plain data, as a function returning plain data could. A proxy
never compares equal (or orders) against plain data, and its hash and identity are the judge's
own, so an "always equal" object cannot pass an equality test.
"""

import builtins
import io
import json
import marshal
import os
import sys

MAX_DEPTH = 100  # nesting of a value (a cyclic value hits this)
MAX_VALUE_BYTES = 4 << 20  # an encoded value; larger results are a failed call
MAX_MESSAGE_BYTES = MAX_VALUE_BYTES + (1 << 20)  # a frame on the pipe; larger is tamper
MAX_OUT_CHARS = 1 << 16  # printed output of one call
MAX_NAME = 200
_LEN = 4  # frame header: big-endian length


class NotPlain(Exception):
    """A value that is not plain data (an honest failure: the call fails)."""


class ProtocolError(Exception):
    """A message from the candidate that honest serving code never sends (tamper)."""


class FailedCall(BaseException):
    """A call that could not be answered with plain data. BaseException, so that a test's
    ``except Exception`` does not swallow it; the test fails whatever it catches."""


class CandidateGone(FailedCall):
    """The candidate exited, died or broke the protocol."""


# ---------------------------------------------------------------- plain-data codec (both sides)

class Encoder:
    """Plain data -> JSON text with type tags. ``handle`` (or None) turns an object that is not
    plain data into a handle id; otherwise such an object raises NotPlain."""

    __slots__ = ("handle", "budget")

    def __init__(self, handle=None):
        self.handle = handle
        self.budget = MAX_VALUE_BYTES

    def text(self, value):
        self.budget = MAX_VALUE_BYTES
        text = json.dumps(self.wire(value, 0))
        if len(text) > MAX_VALUE_BYTES:
            raise NotPlain(f"value too large ({len(text)} bytes encoded, at most {MAX_VALUE_BYTES})")
        return text

    def wire(self, x, depth):
        t = type(x)
        if t is str:
            self.budget -= len(x)
            if self.budget < 0:
                raise NotPlain("value too large")
            return x
        if t is int:
            if x.bit_length() > 4096:
                raise NotPlain("integer too large")
            return x
        if x is None or t is bool or t is float:
            return x
        if depth >= MAX_DEPTH:
            raise NotPlain(f"nested deeper than {MAX_DEPTH} levels (or cyclic)")
        self.budget -= 2
        if t is list:
            self.budget -= len(x)
            if self.budget < 0:
                raise NotPlain("value too large")
            return [self.wire(v, depth + 1) for v in x]
        if t is tuple:
            return {"t": [self.wire(v, depth + 1) for v in x]}
        if t is dict:
            self.budget -= 2 * len(x)
            if self.budget < 0:
                raise NotPlain("value too large")
            return {"d": [[self.wire(k, depth + 1), self.wire(v, depth + 1)] for k, v in x.items()]}
        if t is set or t is frozenset:
            return {"s" if t is set else "f": [self.wire(v, depth + 1) for v in x]}
        if t is bytes or t is bytearray:
            self.budget -= 2 * len(x)
            if self.budget < 0:
                raise NotPlain("value too large")
            return {"b" if t is bytes else "y": x.hex()}
        return self.other(x, depth)

    def other(self, x, depth):
        """Subclasses of plain types become their plain base (an IntEnum is an int, a Counter a
        dict, a namedtuple a tuple); handles where allowed; anything else is not plain data."""
        if self.handle is not None:
            if isinstance(x, bool):
                return bool(x)
            for base in (int, float, str, bytes, bytearray, list, tuple, dict, set, frozenset):
                if isinstance(x, base):
                    if base is dict:
                        return self.wire(dict(dict.items(x)), depth)
                    return self.wire(base(x) if base is not str else str.__str__(x), depth)
            hid = self.handle(x)
            if hid is not None:
                return {"h": hid}
        raise NotPlain(f"a {_type_name(x)} is not plain data")


def _type_name(x):
    try:
        return str(type(x).__name__)[:100]
    except BaseException:
        return "object"


def decode(text, handle=None):
    """Strictly decode JSON text made by :class:`Encoder` into exact built-in types.

    ``handle(int)`` turns a handle id into the receiver's object (None: handles are refused).
    Raises ProtocolError for anything the honest encoder never writes."""
    def hook(pairs):
        if len(pairs) != 1:
            raise ProtocolError("a tagged value has more than one key")
        tag, v = pairs[0]
        tv = type(v)
        if tv is list:
            if tag == "t":
                return tuple(v)
            if tag == "s":
                return set(v)
            if tag == "f":
                return frozenset(v)
            if tag == "d":
                out = {}
                for item in v:
                    if type(item) is not list or len(item) != 2:
                        raise ProtocolError("a dict item is not a [key, value] pair")
                    out[item[0]] = item[1]
                return out
        elif tv is str:
            if tag == "b":
                return bytes.fromhex(v)
            if tag == "y":
                return bytearray.fromhex(v)
        elif tv is int and tag == "h" and handle is not None:
            return handle(v)
        raise ProtocolError(f"unknown tag {str(tag)[:20]!r}")

    try:
        return json.loads(text, object_pairs_hook=hook)
    except ProtocolError:
        raise
    except (ValueError, TypeError, RecursionError, MemoryError, OverflowError) as exc:
        raise ProtocolError(f"undecodable value: {type(exc).__name__}: {str(exc)[:200]}") from None


# ---------------------------------------------------------------- framing

def send(fd, obj):
    send_bytes(fd, json.dumps(obj).encode())


def send_text(fd, text):
    """One frame whose payload is already JSON text (values encoded once)."""
    send_bytes(fd, text.encode())


def send_bytes(fd, data):
    view = memoryview(frame(data))
    while view:
        view = view[os.write(fd, view):]


def frame(data):
    return len(data).to_bytes(_LEN, "big") + data


def receive(fd, limit=MAX_MESSAGE_BYTES):
    """One frame's bytes; None at a clean EOF before a frame. ProtocolError on a torn or
    oversized frame."""
    head = _read_exact(fd, _LEN)
    if head is None:
        return None
    size = int.from_bytes(head, "big")
    if size > limit:
        raise ProtocolError(f"a message of {size} bytes (at most {limit})")
    body = _read_exact(fd, size)
    if body is None:
        raise ProtocolError("the connection closed inside a message")
    return body


def _read_exact(fd, n):
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, n - got)
        if not chunk:
            if got:
                raise ProtocolError("the connection closed inside a message")
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


# ---------------------------------------------------------------- helpers tests may use

class raises:
    """``with raises(ValueError): f(-1)`` (pytest.raises without pytest; ``match`` is a regex
    searched in ``str(exception)``)."""

    def __init__(self, expected, match=None):
        self.expected, self.match, self.value = expected, match, None

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None:
            raise AssertionError(f"DID NOT RAISE {self.expected}")
        if not issubclass(kind, self.expected) or issubclass(kind, FailedCall):
            return False
        if self.match is not None:
            import re

            if not re.search(self.match, str(value)):
                raise AssertionError(f"{str(value)[:200]!r} does not match {self.match!r}")
        self.value = value
        return True


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


# ---------------------------------------------------------------- the judge

class LinkDown(Exception):
    """The link to the candidate is down: it exited or died, or the job is over (``over``: the
    deadline passed, the output cap was hit or the sandbox was attacked)."""

    def __init__(self, reason, over=False):
        super().__init__(reason)
        self.reason, self.over = reason, over


class PipeLink:
    """A blocking link over two descriptors (the candidate's side, and tests on the host)."""

    def __init__(self, write_fd, read_fd):
        self.write_fd, self.read_fd = write_fd, read_fd

    def send(self, payload):
        try:
            send_bytes(self.write_fd, payload)
        except OSError as exc:
            raise LinkDown(f"the candidate is gone ({type(exc).__name__})") from None

    def receive(self):
        frame = receive(self.read_fd)
        if frame is None:
            raise LinkDown("the candidate exited or died")
        return frame


class Channel:
    """The judge's end of the link to the candidate: one request, one reply, in order."""

    def __init__(self, link):
        self.link = link
        self.seq = 0
        self.proxies = {}
        self.methods = set()  # (handle, name) pairs known to be methods
        self.encoder = Encoder(_proxy_id)
        self.gone = None  # why the candidate can no longer answer
        self.over = False  # the job is over (deadline, output cap, attack on the sandbox)
        self.tamper = None  # (kind, detail) of the first attack seen
        self.failed = None  # why a call of the current test failed

    def proxy(self, hid):
        if type(hid) is not int or hid < 0:
            raise ProtocolError(f"bad handle {hid!r}")
        found = self.proxies.get(hid)
        if found is None:
            found = self.proxies[hid] = Proxy(self, hid)
        return found

    def _next(self):
        """The next message, decoded (LinkDown, ProtocolError)."""
        return decode(self.link.receive(), self.proxy)

    def first(self):
        """The candidate's first messages: (status, detail)."""
        try:
            message = self._next()
            if message == ["compiled"]:
                try:
                    message = self._next()
                except LinkDown as exc:
                    self.down(exc)
                    return "gone", "compiled"
                if type(message) is not list or len(message) < 2 or message[0] != "ready":
                    raise ProtocolError("expected the ready message")
                return message[1], message[2:]
            if type(message) is list and message and message[0] == "syntax" and len(message) == 4:
                return "syntax", message[1:]
            raise ProtocolError("expected the compile status")
        except ProtocolError as exc:
            self.set_tamper("protocol", str(exc))
            return "tamper", None
        except LinkDown as exc:
            self.down(exc)
            return "gone", None

    def down(self, exc):
        self.gone = self.gone or exc.reason
        self.over = self.over or exc.over

    def set_tamper(self, kind, detail):
        if self.tamper is None:
            self.tamper = (kind, str(detail)[:500])
        self.gone = self.gone or f"tamper: {kind}"

    def request(self, parts):
        """Send one request, return (kind, payload, mutated); raise FailedCall when the
        candidate cannot answer."""
        if self.gone is not None:
            self.fail(self.gone)
        self.seq += 1
        try:
            text = self.encoder.text([parts[0], self.seq] + list(parts[1:]))
        except NotPlain as exc:
            raise TypeError(f"cannot pass this to the completion: {exc}") from None
        try:
            self.link.send(text.encode())
            reply = decode(self.link.receive(), self.proxy)
            if type(reply) is not list or len(reply) != 5 or reply[0] != self.seq:
                raise ProtocolError("a reply that answers no question asked")
            _, kind, payload, printed, mutated = reply
            if kind not in ("ok", "exc", "fail", "method") or type(printed) is not str or type(mutated) is not list:
                raise ProtocolError("a malformed reply")
            if kind == "exc" and (type(payload) is not list or len(payload) != 2
                                  or type(payload[0]) is not str or type(payload[1]) is not str):
                raise ProtocolError("a malformed exception")
        except ProtocolError as exc:
            self.set_tamper("protocol", exc)
            self.fail(self.gone)
        except LinkDown as exc:
            self.down(exc)
            self.fail(self.gone)
        if printed:
            sys.stdout.write(printed)
        return kind, payload, mutated

    def fail(self, why):
        self.failed = self.failed or why
        raise CandidateGone(why) if self.gone else FailedCall(why)

    def value(self, parts, args=None, kwargs=None):
        """The plain answer of one request (a candidate exception is raised here as its
        built-in type; mutable arguments the call changed are updated in place)."""
        kind, payload, mutated = self.request(parts)
        if mutated:
            self.sync(mutated, args or [], kwargs or {})
        if kind == "ok":
            return payload
        if kind == "exc":
            cls = getattr(builtins, payload[0], None)
            if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, FailedCall):
                try:
                    error = cls(payload[1])
                except BaseException:
                    error = Exception(f"{payload[0]}: {payload[1]}")
                raise error
            self.fail(f"the call raised {payload[0][:100]}: {payload[1][:300]}")
        if kind == "fail":
            self.fail(f"the call failed: {str(payload)[:300]}")
        return _METHOD

    def sync(self, mutated, args, kwargs):
        """Mirror the candidate's in-place changes onto the judge's own argument objects."""
        for item in mutated:
            if type(item) is not list or len(item) != 2:
                self.set_tamper("protocol", "a malformed mutation")
                self.fail(self.gone)
            key, new = item
            if type(key) is int and 0 <= key < len(args):
                old = args[key]
            elif type(key) is str and key in kwargs:
                old = kwargs[key]
            else:
                self.set_tamper("protocol", "a mutation of an argument that was not passed")
                self.fail(self.gone)
            if type(new) is not type(old):
                self.set_tamper("protocol", "a mutation that changes an argument's type")
                self.fail(self.gone)
            if type(old) in (list, bytearray):
                old[:] = new
            elif type(old) in (dict, set):
                old.clear()
                old.update(new)

    def run_program(self, stdin=""):
        """The program's standard output for this standard input (tests call it by name)."""
        if not isinstance(stdin, (str, bytes)):
            raise TypeError("run_program takes the standard input as str or bytes")
        result = self.value(["run", stdin])
        if type(result) is not list or len(result) != 2 or type(result[0]) is not str:
            self.set_tamper("protocol", "a malformed program result")
            self.fail(self.gone)
        return result[0]


_METHOD = object()  # the answer to a "get" of a callable attribute


def _proxy_id(obj):
    """The handle id of a judge-side proxy (when passing it back to the candidate)."""
    if type(obj) is Proxy:
        return object.__getattribute__(obj, "_hid")
    return None


class Proxy:
    """An object of the candidate's, held by handle. Every use is a call to the candidate that
    answers with plain data; equality, hashing and truth are the judge's own unless both sides
    of a comparison are the candidate's objects."""

    __slots__ = ("_channel", "_hid")

    def __init__(self, channel, hid):
        object.__setattr__(self, "_channel", channel)
        object.__setattr__(self, "_hid", hid)

    def _ask(self, parts, args=None, kwargs=None):
        return object.__getattribute__(self, "_channel").value(parts, args, kwargs)

    def __call__(self, *args, **kwargs):
        hid = object.__getattribute__(self, "_hid")
        return self._ask(["call", hid, list(args), [[k, v] for k, v in kwargs.items()]], args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        channel = object.__getattribute__(self, "_channel")
        hid = object.__getattribute__(self, "_hid")
        if (hid, name) in channel.methods:  # known to be a method: no round trip until called
            return _Method(self, name)
        value = channel.value(["get", hid, name])
        if value is _METHOD:
            channel.methods.add((hid, name))
            return _Method(self, name)
        return value

    def __setattr__(self, name, value):
        self._ask(["set", object.__getattribute__(self, "_hid"), name, value])

    def _op(self, op, *args):
        return self._ask(["op", object.__getattribute__(self, "_hid"), op, list(args)])

    def __len__(self):
        n = self._op("len")
        if type(n) is not int or n < 0:
            raise TypeError("len() of a candidate object gave no non-negative int")
        return n

    def __iter__(self):
        items = self._op("iter")
        if type(items) is not list:
            raise TypeError("iterating a candidate object gave no list")
        return iter(items)

    def __contains__(self, item):
        return self._op("contains", item) is True

    def __getitem__(self, key):
        return self._op("getitem", key)

    def __setitem__(self, key, value):
        self._op("setitem", key, value)

    def __delitem__(self, key):
        self._op("delitem", key)

    def __str__(self):
        text = self._op("str")
        return text if type(text) is str else "<candidate object>"

    def __repr__(self):
        text = self._op("repr")
        return text if type(text) is str else "<candidate object>"

    def __bool__(self):
        return self._op("bool") is True

    def __eq__(self, other):
        if type(other) is Proxy:
            return self._op("eq", other) is True
        return self is other

    def __ne__(self, other):
        if type(other) is Proxy:
            return self._op("ne", other) is True
        return self is not other

    def _compare(self, op, other):
        if type(other) is Proxy:
            return self._op(op, other) is True
        return NotImplemented

    def __lt__(self, other):
        return self._compare("lt", other)

    def __le__(self, other):
        return self._compare("le", other)

    def __gt__(self, other):
        return self._compare("gt", other)

    def __ge__(self, other):
        return self._compare("ge", other)

    def __hash__(self):
        return id(self)


class _Method:
    """A bound method of a candidate object (``obj.push``): calling it calls the candidate."""

    __slots__ = ("owner", "name")

    def __init__(self, owner, name):
        self.owner, self.name = owner, name

    def __call__(self, *args, **kwargs):
        owner = self.owner
        hid = object.__getattribute__(owner, "_hid")
        return owner._ask(["callm", hid, self.name, list(args), [[k, v] for k, v in kwargs.items()]], args, kwargs)


def judge_main(setup, tests, names, entry_point, channel, report):
    """Run the task's setup and tests against the candidate at the other end of ``channel``;
    ``report(dict)`` records events.

    ``setup`` and ``tests`` are code objects compiled by the runner (or compile errors as text);
    ``names`` the names the tests use that the completion may define. Events: compiled, syntax,
    setup_error, code_error, code_ok, test (i, ok, type, msg), gone (i), tamper (kind, msg),
    done. Once the job is over (``channel.over``) no further test runs."""
    namespace = {"__name__": "tests", "__builtins__": builtins, "raises": raises,
                 "run_program": channel.run_program}
    status, detail = channel.first()
    if status == "syntax":
        kind, line, msg = detail
        report({"e": "syntax", "type": _short(kind), "line": line if type(line) is int else None,
                "msg": _short(msg, 500)})
        return _finish(channel, report)
    if status in ("gone", "tamper"):
        if detail == "compiled":
            report({"e": "compiled"})
        return _finish(channel, report, tests, 0)
    report({"e": "compiled"})
    if setup is not None:
        try:
            if isinstance(setup, str):
                raise SyntaxError(setup)
            exec(setup, namespace)
        except BaseException as exc:
            report({"e": "setup_error", "type": type(exc).__name__, "msg": _text(exc, 500)})
            return _finish(channel, report)
    if status == "setup_error":
        report({"e": "setup_error", "type": _short(detail[0] if detail else ""),
                "msg": _short(detail[1] if len(detail) > 1 else "", 500)})
        return _finish(channel, report)
    if status == "code_error":
        line = detail[2] if len(detail) > 2 and type(detail[2]) is int else None
        report({"e": "code_error", "type": _short(detail[0] if detail else ""),
                "msg": _short(detail[1] if len(detail) > 1 else "", 500), "line": line})
        return _finish(channel, report)
    if status != "ok" or len(detail) != 1 or type(detail[0]) is not list:
        channel.set_tamper("protocol", "an unknown ready status")
        return _finish(channel, report, tests, 0)
    try:
        _bind(channel, namespace, detail[0], set(names), entry_point)
    except ProtocolError as exc:
        channel.set_tamper("protocol", str(exc))
        return _finish(channel, report, tests, 0)
    report({"e": "code_ok"})
    for index, test in enumerate(tests):
        if channel.gone is not None:  # nothing more will be answered: the rest fail unrun
            return _finish(channel, report, tests, index, gone_reported=True)
        channel.failed = None
        try:
            if isinstance(test, str):
                raise SyntaxError(f"the task's test does not compile: {test}")
            exec(test, namespace)
        except BaseException as exc:
            event = {"e": "test", "i": index, "ok": False, "type": type(exc).__name__, "msg": _text(exc, 300)}
        else:
            event = {"e": "test", "i": index, "ok": True}
        if channel.failed is not None:
            event = {"e": "test", "i": index, "ok": False, "type": "FailedCall", "msg": channel.failed[:300]}
        if channel.gone is not None and channel.tamper is None:
            report({"e": "gone", "i": index, "msg": channel.gone[:300]})
        report(event)
    return _finish(channel, report)


def _bind(channel, namespace, report, wanted, entry_point):
    """Bind the completion's names the tests use: those the task's setup did not define (the
    task's own helpers stay the judge's), never a builtin, always the entry point."""
    for item in report:
        if type(item) is not list or len(item) != 3 or type(item[0]) is not str or item[1] not in ("v", "m"):
            raise ProtocolError("a malformed name report")
        name, kind, value = item
        if name not in wanted:
            raise ProtocolError(f"a name that was not asked for: {name[:MAX_NAME]!r}")
        if name.startswith("__") or hasattr(builtins, name) or name in ("raises", "run_program"):
            continue  # the tests' builtins and helpers are always the judge's own
        if name in namespace and name != entry_point:
            continue  # the task defines it: its own definition is the one the tests trust
        if kind == "m":
            module = _stdlib_module(name, value)
            if module is None:
                continue
            value = module
        namespace[name] = value
    if entry_point in namespace and not any(item[0] == entry_point for item in report):
        del namespace[entry_point]  # the setup's stub (HumanEval prompts) is not the answer


def _stdlib_module(name, module_name):
    """The judge's own copy of a standard-library module that the completion imported under the
    name the tests use (``import math``, ``import os.path``): only a module of that name, so
    the candidate cannot make the judge import anything the tests do not name."""
    if type(module_name) is not str or module_name.partition(".")[0] != name:
        return None
    if name not in getattr(sys, "stdlib_module_names", ()) or name in ("antigravity", "this", "__hello__"):
        return None
    try:
        __import__(module_name)
        return sys.modules[module_name]
    except BaseException:
        return None


def _finish(channel, report, tests=(), start=None, gone_reported=False):
    """Report what is left: the tests from ``start`` on fail unrun (the candidate is gone or
    tampered), any tamper, then done."""
    if start is not None:
        why = (channel.gone or "the candidate exited or died")[:300]
        if channel.tamper is None and not gone_reported:
            report({"e": "gone", "i": start, "msg": why})
        for index in range(start, len(tests)):
            report({"e": "test", "i": index, "ok": False, "type": "FailedCall", "msg": why})
    if channel.tamper is not None:
        report({"e": "tamper", "kind": channel.tamper[0], "msg": channel.tamper[1]})
    report({"e": "done"})
    return 0


def _short(value, limit=100):
    return value[:limit] if type(value) is str else ""


def _text(exc, limit):
    try:
        return str(exc)[:limit]
    except BaseException:  # a hostile __str__
        return "<unprintable>"


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


def load_part(fd):
    """A child's part of the job: the runner's marshal of trusted data (never the candidate's)."""
    return marshal.loads(os.pread(fd, os.fstat(fd).st_size, 0))
