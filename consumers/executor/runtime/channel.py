"""The link between a sandbox job's judge and its candidate: requests both ways, replies in order.

A module of the runtime (standard library only; in the sandbox it arrives in the runtime's
bundle, runtime/importer.py; on the host, an ordinary module). Either side may ask the other while it waits for an answer of its own (the judge asks
the candidate to call the completion; the completion calls a key function the tests passed,
which the judge runs), so both run the same loop: send a request, then serve what arrives
until the reply to *that* request does.

A message is ``[kind, id, what, items, defs, sync, env, out, err, extras]`` (consumers/executor/runtime/codec.py for
items, definitions and changes): ``kind`` ``"q"`` (a request: ``what`` is the operation) or
``"a"`` (a reply: ``what`` is ``ok``, ``exc``, ``fail`` or ``m``); ``env`` carries the judge's
overrides for the call (patched builtins, ``sys.stdin``, mock patches); ``out``/``err`` what
the candidate printed since its last message; ``extras`` what a reply carries besides its answer
(warnings the call issued, the random generator's state: consumers/executor/runtime/guards.py). The judge's request ids are random 63-bit
numbers drawn per request, so a reply cannot be written before its question exists; a reply
that answers anything but the question the judge is waiting for is a protocol error.
"""

import _thread
import os

from rollstream.consumers.executor.runtime.codec import NotTransferable, ProtocolError
from rollstream.consumers.executor.runtime.decoder import Decoder
from rollstream.consumers.executor.runtime.encoder import Encoder
from rollstream.consumers.executor.runtime.wire import dumps, loads, receive, send_bytes

MAX_NESTING = 64  # requests served inside requests


class LinkDown(Exception):
    """The other side is gone (exited, died), or the job is over."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


class Message:
    __slots__ = ("kind", "id", "what", "items", "env", "out", "err", "changed", "extras")

    def __init__(self, kind, ident, what, items, env, out, err, changed=(), extras=None):
        self.kind, self.id, self.what, self.items = kind, ident, what, items
        self.env, self.out, self.err = env, out, err
        self.changed = changed  # refs of the receiver's containers this message changed in place
        self.extras = extras


class Channel:
    """One side's end. ``serve(message) -> (status, items)`` answers the other side's requests;
    ``encode_other``/``decode_other`` are the side's rules for handles (codec.Encoder/Decoder);
    ``printed() -> (out, err)`` what this side printed since its last message (the candidate)."""

    def __init__(self, read_fd, write_fd, table, peer_parity, encode_other, decode_other, *,
                 serve=None, printed=None, random_ids=False, setup_ids=None, setup_classes=None):
        self.read_fd, self.write_fd = read_fd, write_fd
        self.table = table
        self.peer = peer_parity
        self.encode_other, self.decode_other = encode_other, decode_other
        self.serve = serve
        self.printed = printed
        self.random_ids = random_ids
        self.counter = 0
        self.depth = 0
        self.setup_ids = setup_ids or {}  # id(setup class) -> name
        self.setup_classes = setup_classes or {}  # name -> setup class
        self.on_receive = None  # hook(message), e.g. to write what the candidate printed
        # Either side's threads may all use the other's objects (a thread pool mapping a mock):
        # one exchange at a time, each thread's reply read by that thread.
        self.lock = _thread.RLock()

    def new_id(self):
        if self.random_ids:
            return int.from_bytes(os.urandom(8), "big") >> 1
        self.counter += 1
        return self.counter

    # ------------------------------------------------------------ sending

    def send(self, kind, ident, what, items=(), env=None, extras=None):
        with self.lock:
            data, encoder, synced = self._encode(kind, ident, what, items, env, extras)
            try:
                send_bytes(self.write_fd, data)
            except OSError as exc:
                encoder.abandon()
                raise LinkDown(f"the other side is gone ({type(exc).__name__})") from None
            encoder.sent(synced)

    def _encode(self, kind, ident, what, items, env, extras=None):
        encoder = Encoder(self.table, self.encode_other, self.setup_ids)
        try:
            encoded = [_encode_item(encoder, x) for x in items]
            encoded_env = None if env is None else [_encode_item(encoder, x) for x in env]
            encoded_extras = None if extras is None else [_encode_item(encoder, x) for x in extras]
            changes = encoder.changes()
            defs = encoder.finish()
            out, err = self.printed() if self.printed is not None else ("", "")
            data = dumps([kind, ident, what, encoded, defs, changes, encoded_env, out, err, encoded_extras])
        except BaseException:
            encoder.abandon()
            raise
        return data, encoder, [ref for ref, _ in changes]

    # ------------------------------------------------------------ receiving

    def receive(self):
        """The next message, decoded; None at a clean EOF. ProtocolError, LinkDown."""
        try:
            frame = receive(self.read_fd)
        except OSError as exc:
            raise LinkDown(f"the other side is gone ({type(exc).__name__})") from None
        if frame is None:
            return None
        raw = loads(frame)
        if len(raw) != 10:
            raise ProtocolError("a message of the wrong shape")
        kind, ident, what, items, defs, sync, env, out, err, extras = raw
        if (type(kind) is not str or type(ident) is not int or type(what) is not str or type(items) is not list
                or (env is not None and type(env) is not list) or type(out) is not str or type(err) is not str
                or (extras is not None and type(extras) is not list)):
            raise ProtocolError("a message of the wrong shape")
        decoder = Decoder(self.table, self.peer, self.decode_other, self.setup_classes)
        changed = decoder.message(defs, sync)
        values = [_decode_item(decoder, x) for x in items]
        env_values = None if env is None else [_decode_item(decoder, x) for x in env]
        extra_values = None if extras is None else [_decode_item(decoder, x) for x in extras]
        decoder.settled(changed)
        message = Message(kind, ident, what, values, env_values, out, err, changed, extra_values)
        if self.on_receive is not None:
            self.on_receive(message)
        return message

    # ------------------------------------------------------------ asking

    def call(self, op, items=(), env=None):
        """Ask the other side; serve its requests meanwhile; the reply's Message."""
        with self.lock:
            return self._call(op, items, env)

    def next_request(self):
        """(the candidate's main loop) The other side's next request; None at a clean EOF."""
        with self.lock:
            return self.receive()

    def _call(self, op, items, env):
        ident = self.new_id()
        self.send("q", ident, op, items, env)
        while True:
            message = self.receive()
            if message is None:
                raise LinkDown("the other side exited or died")
            if message.kind == "a":
                if message.id != ident:
                    raise ProtocolError("a reply that answers no question asked")
                return message
            if message.kind != "q" or self.serve is None:
                raise ProtocolError(f"an unexpected {message.kind[:20]!r} message")
            self.answer(message)

    def answer(self, message):
        """Serve one request and send its reply."""
        extras = None
        if self.depth >= MAX_NESTING:
            status, items = "fail", [f"requests nested deeper than {MAX_NESTING}"]
        else:
            self.depth += 1
            try:
                reply = self.serve(message)
            finally:
                self.depth -= 1
            status, items = reply[0], reply[1]
            if len(reply) > 2:
                extras = reply[2]
        try:
            self.send("a", message.id, status, items, None, extras)
        except NotTransferable as exc:  # TooLarge says so ("too_large: ...")
            self.send("a", message.id, "fail", [str(exc)[:500]])


def _encode_item(encoder, x):
    """An item, or a list of items (a request's arguments travel that way, not as a value)."""
    if type(x) is _Items:
        return [_encode_item(encoder, v) for v in x]
    return encoder.item(x)


def _decode_item(decoder, x, depth=0):
    if type(x) is list:
        if depth >= 3:
            raise ProtocolError("a request nested too deep")
        return [_decode_item(decoder, v, depth + 1) for v in x]
    return decoder.item(x)


class _Items(list):
    """A list of items sent as a list of items (not as a replicated list)."""

    __slots__ = ()


def items(values):
    return _Items(values)
