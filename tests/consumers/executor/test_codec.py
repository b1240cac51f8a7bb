"""The codec between judge and candidate (consumers/executor/runtime/codec.py, encoder.py,
decoder.py, wire.py): values keep their types, identity, aliasing and cycles across the boundary;
changes travel back in place; the strict decoder refuses what the encoder never writes, and
floods of equal hashes."""

from __future__ import annotations

import collections
import datetime
import decimal
import enum
import fractions
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollstream.consumers.executor.runtime import codec, wire
from rollstream.consumers.executor.runtime.decoder import Decoder
from rollstream.consumers.executor.runtime.encoder import Encoder

pytestmark = pytest.mark.unit


class Side:
    """One end of a link: a table, and the rules for handles (none here: plain values only)."""

    def __init__(self, parity: int) -> None:
        self.table = codec.Table(parity)

    def send(self, *values):
        encoder = Encoder(self.table, _no_handles)
        items = [encoder.item(v) for v in values]
        changes = encoder.changes()
        defs = encoder.finish()
        data = wire.dumps(["m", 0, "", items, defs, changes, None, "", ""])
        encoder.sent([ref for ref, _ in changes])
        return data

    def receive(self, data, peer: int):
        message = wire.loads(data)
        decoder = Decoder(self.table, peer, _no_tags)
        changed = decoder.message(message[4], message[5])
        values = [decoder.item(v) for v in message[3]]
        decoder.settled(changed)
        return values


def _no_handles(x, encoder):
    raise codec.NotTransferable(f"a {type(x).__name__}")


def _no_tags(tag, x, decoder):
    raise codec.ProtocolError(f"unknown tag {tag!r}")


def link():
    return Side(0), Side(1)


def cross(value):
    judge, candidate = link()
    return candidate.receive(judge.send(value), 0)[0]


def exact(a: object, b: object) -> bool:
    """Equal with the same types all the way down (== alone says 1 == 1.0 == True)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(exact(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(exact(a[k], b[k]) for k in a)
    if isinstance(a, float) and a != a:
        return b != b
    return a == b


scalars = (st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary()
           | st.integers(min_value=-(1 << 20000), max_value=1 << 20000))
hashable_scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary()
                    | st.integers(min_value=-(1 << 20000), max_value=1 << 20000))  # NaN != NaN in a set
hashables = st.recursive(hashable_scalars, lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3),
                         max_leaves=8)
values = st.recursive(
    scalars,
    lambda inner: (st.lists(inner, max_size=4) | st.tuples(inner, inner)
                   | st.dictionaries(hashables, inner, max_size=4) | st.sets(hashables, max_size=4)
                   | st.frozensets(hashables, max_size=4) | st.binary().map(bytearray)),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(values)
def test_values_round_trip_with_exact_types(value: object) -> None:
    assert exact(cross(value), value)


def test_standard_library_values_cross_as_themselves() -> None:
    class Color(enum.Enum):  # not the standard library's: refused below
        RED = 1

    stdlib = [
        collections.OrderedDict(b=1, a=2), collections.Counter("abca"), collections.deque([1, 2], maxlen=3),
        decimal.Decimal("1.10"), fractions.Fraction(1, 3), complex(1, -2), range(1, 10, 3), slice(1, None, 2),
        datetime.datetime(2020, 1, 2, 3, 4, 5, 6, tzinfo=datetime.timezone(datetime.timedelta(hours=2), "X")),
        datetime.date(2020, 1, 2), datetime.time(1, 2, fold=1), datetime.timedelta(days=-1, seconds=5),
        int, type(None), Ellipsis, {1: 2}.keys(), {1: 2}.items(), re.RegexFlag.IGNORECASE, 2 ** 70000,
    ]
    back = cross(stdlib)
    for original, copy in zip(stdlib, back):
        assert type(copy) is type(original) and copy == original, (original, copy)
    assert back[-2] is re.RegexFlag.IGNORECASE
    assert list(back[0]) == ["b", "a"] and back[2].maxlen == 3
    dd = collections.defaultdict(list, a=[1])
    copy = cross(dd)
    assert copy.default_factory is list and copy["zz"] == [] and copy["a"] == [1]
    with pytest.raises(codec.NotTransferable):
        cross(Color.RED)


def test_identity_aliasing_and_cycles_survive() -> None:
    shared = [1]
    cyclic: list = []
    cyclic.append(cyclic)
    deep: list = []
    node = deep
    for _ in range(5000):  # deeper than any recursion limit: the encoding is flat
        node.append([])
        node = node[0]
    value = [shared, shared, (shared,), cyclic, deep]
    back = cross(value)
    assert back[0] is back[1] is back[2][0]
    assert back[3][0] is back[3]
    depth, node = 0, back[4]
    while node:
        node, depth = node[0], depth + 1
    assert depth == 5000


def test_a_value_sent_again_is_the_same_object_and_changes_go_back_in_place() -> None:
    judge, candidate = link()
    argument = [3, 1, 2]
    received = candidate.receive(judge.send(argument), 0)[0]
    assert candidate.receive(judge.send(argument), 0)[0] is received  # the same replica
    received.sort()
    received.append(received)
    kept = {"a": received}
    back = judge.receive(candidate.send(None, kept), 1)
    assert argument[:3] == [1, 2, 3] and argument[3] is argument  # changed in place, a cycle back to itself
    assert back[1]["a"] is argument  # the candidate's dict holds the judge's own list
    argument.clear()  # the judge changes an object the candidate keeps
    candidate.receive(judge.send(None), 0)
    assert kept["a"] == []
    assert candidate.send(None) == candidate.send(None)  # nothing changed: nothing re-sent


@pytest.mark.parametrize(
    "message, why",
    [
        (["m", 0, "", [[1, 2]], [], [], None, "", ""], "bare JSON"),
        (["m", 0, "", [{"r": 99}], [], [], None, "", ""], "does not hold"),
        (["m", 0, "", [{"r": 2}], [[2, "l", []]], [], None, "", ""], "not the sender's"),
        (["m", 0, "", [{"r": 1}], [[1, "l", []], [1, "l", []]], [], None, "", ""], "not the sender's"),
        (["m", 0, "", [{"r": 1}], [[1, "zz", []]], [], None, "", ""], "unknown kind"),
        (["m", 0, "", [{"q": 1}], [], [], None, "", ""], "unknown tag"),
        (["m", 0, "", [{"r": 1}], [[1, "t", [{"r": 1}]]], [], None, "", ""], "cycle through an immutable"),
        (["m", 0, "", [None], [], [[7, []]], None, "", ""], "not a known mutable"),
        (["m", 0, "", [{"i": "zz"}], [], [], None, "", ""], "malformed"),
        (["m", 0, "", [{"r": 1}], [[1, "d", [1]]], [], None, "", ""], "key and no value"),
        (["m", 0, "", [{"r": 1}], [[1, "s", [[1]]]], [], None, "", ""], "bare JSON"),
    ],
)
def test_the_decoder_refuses_what_the_encoder_never_writes(message, why) -> None:
    _, judge = link()
    with pytest.raises(codec.ProtocolError, match=why):
        judge.receive(json.dumps(message).encode(), 1)


def test_hash_flooding_is_refused_before_the_set_is_built() -> None:
    modulus = (1 << 61) - 1  # ints that differ by it hash alike
    flood = [i * modulus for i in range(20000)]
    message = ["m", 0, "", [{"r": 1}], [[1, "s", flood]], [], None, "", ""]
    _, judge = link()
    with pytest.raises(codec.ProtocolError, match="hash flooding"):
        judge.receive(json.dumps(message).encode(), 1)
    assert len(cross(set(range(20000)))) == 20000  # many keys with distinct hashes are fine


def test_messages_are_bounded() -> None:
    with pytest.raises(codec.NotTransferable):
        wire.dumps(["x" * (codec.MAX_MESSAGE_BYTES + 1)])
    read, write = __import__("os").pipe()
    try:
        __import__("os").write(write, (codec.MAX_MESSAGE_BYTES + 1).to_bytes(4, "big"))
        with pytest.raises(codec.ProtocolError, match="at most"):
            wire.receive(read)
    finally:
        __import__("os").close(read)
        __import__("os").close(write)
