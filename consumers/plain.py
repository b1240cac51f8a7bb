"""Plain data between the sandbox's judge and its candidate: a strict codec and a framing.

Runs INSIDE the sandbox as the first part of the runner's source (``consumers/sandbox.py:
runner_source`` concatenates ``plain.py``, ``candidate.py``, ``judge.py`` and ``runner.py``);
standard library only. On the host it is an ordinary module, unit-tested there.

Plain data is a whitelist of exact types: None, bool, int, float, str, bytes, bytearray, list,
tuple, dict, set, frozenset, nested (at most ``MAX_DEPTH`` levels, ``MAX_VALUE_BYTES`` encoded,
integers up to 4096 bits). :class:`Encoder` writes it as JSON with one-key tags for what JSON
lacks (``{"t": [...]}`` a tuple, ``{"d": [[k, v], ...]}`` a dict, ``{"s"|"f": [...]}`` a
set/frozenset, ``{"b"|"y": hex}`` bytes/bytearray, ``{"h": id}`` a handle); :func:`decode`
reads it back into exact types and refuses anything the encoder never writes. Never pickle,
marshal or eval what the other side sends. A frame is a 4-byte big-endian length, then UTF-8
JSON.
"""

import json
import os

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


# ---------------------------------------------------------------- the codec (both sides)

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


def _text(exc, limit):
    try:
        return str(exc)[:limit]
    except BaseException:  # a hostile __str__
        return "<unprintable>"
