"""The judge: test verdicts that the code under test cannot forge.

Runs INSIDE the sandbox after ``plain.py`` and ``candidate.py`` in the runner's source
(standard library only; on the host, an ordinary module, tested there with a forked candidate).

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
import sys

if __name__ != "__main__":  # on the host; in the sandbox these names come from the files above
    from rollstream.consumers.plain import (
        MAX_NAME,
        Encoder,
        NotPlain,
        ProtocolError,
        _text,
        decode,
        receive,
        send_bytes,
    )

class FailedCall(BaseException):
    """A call that could not be answered with plain data. BaseException, so that a test's
    ``except Exception`` does not swallow it; the test fails whatever it catches."""


class CandidateGone(FailedCall):
    """The candidate exited, died or broke the protocol."""


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


# ---------------------------------------------------------------- the channel and the proxies

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
