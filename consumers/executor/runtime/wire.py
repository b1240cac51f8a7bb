"""The codec's messages on the wire: one message as JSON bytes (:func:`dumps`, :func:`loads`)
and each framed on a pipe by its length (:func:`send_bytes`, :func:`receive`).

A module of the runtime (standard library only; in the sandbox it arrives in the runtime's
bundle, runtime/importer.py; on the host, an ordinary module). What a message holds is
runtime/codec.py's (and runtime/channel.py's).
"""

import json
import os

from rollstream.consumers.executor.runtime.codec import MAX_MESSAGE_BYTES, ProtocolError, TooLarge

_LEN = 4  # frame header: big-endian length


def _not_json(value):
    raise TypeError(f"{type(value).__name__} is not JSON")


# json's C encoder, made once: json.dumps with any non-default argument builds an encoder per
# call, and in a forked child that machinery alone copies dozens of pages.
_JSON = json.encoder.c_make_encoder(None, _not_json, json.encoder.encode_basestring, None, ":", ",",
                                    False, False, True)


def dumps(message):
    """One message as JSON bytes (NaN and infinities as Python's json writes them)."""
    data = "".join(_JSON(message, 0)).encode("utf-8", "surrogatepass")
    if len(data) > MAX_MESSAGE_BYTES:
        raise TooLarge(f"too_large: a message of {len(data)} bytes (at most {MAX_MESSAGE_BYTES})")
    return data


_JSON_DECODE = json.JSONDecoder().decode


def loads(data):
    """A message from JSON bytes; ProtocolError for anything that is not one."""
    try:
        message = _JSON_DECODE(data.decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError, MemoryError) as exc:
        raise ProtocolError(f"an undecodable message: {type(exc).__name__}") from None
    if type(message) is not list or not message:
        raise ProtocolError("a message that is not a list")
    return message


def frame(data):
    return len(data).to_bytes(_LEN, "big") + data


def send_bytes(fd, data):
    view = memoryview(frame(data))
    while view:
        view = view[os.write(fd, view):]


def receive(fd, limit=MAX_MESSAGE_BYTES):
    """One frame's bytes; None at a clean EOF before a frame; ProtocolError on a torn or
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
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            if got:
                raise ProtocolError("the connection closed inside a message")
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
