"""A pack larger than one response: cut into continued parts that each fit, joined back whole."""

from __future__ import annotations

import itertools
import random

import pytest

from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.wire import codec
from streamingnode.wire.packs import continued_runs, wire_bound
from wal.message import Message, MessageType, Position, TxnContext
from wal.scanner import MsgPack


def _message(rng: random.Random, i: int) -> Message:
    props = {f"k{j}\u00e9": "v\U0001f600" * rng.randrange(0, 20) for j in range(rng.randrange(0, 6))}
    m = Message(MessageType.DATA, "v\u00e9" * rng.randrange(1, 60), bytes(rng.randrange(0, 3000)), props)
    m._timetick = 2**64 - 1 - i
    m._term = 2**63 - 1
    m._id = 2**63 + i if rng.random() < 0.9 else None
    m._last_confirmed = 2**63
    if rng.random() < 0.5:
        m._txn = TxnContext(2**63 - 1, 2**32 - 1)
    return m


def _pack(messages: list[Message]) -> MsgPack:
    return MsgPack(10, 2**64 - 1, messages, Position("p" * 128, 5, 10), Position("p" * 128, 5, 2**64 - 1))


@pytest.mark.parametrize("encode", [codec.consume_pack_response, codec.consume_columns_response])
def test_wire_bound_bounds_each_message(encode: object) -> None:
    rng = random.Random(7)
    for i in range(300):
        m = _message(rng, i)
        empty = len(encode(_pack([]), "v"))  # type: ignore[operator]
        assert len(encode(_pack([m]), "v")) - empty <= wire_bound(m)  # type: ignore[operator]


def test_continued_runs_fit_the_budget_and_cover_in_order() -> None:
    rng = random.Random(3)
    messages = [_message(rng, i) for i in range(500)]
    big = Message(MessageType.DATA, "v", bytes(50_000))  # larger than the budget: a run of its own
    messages.insert(250, big)
    runs = continued_runs(messages, 20_000)
    assert runs[0][0] == 0 and runs[-1][1] == len(messages)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(runs)), "consecutive, no gap, no overlap"
    for start, stop in runs:
        assert stop > start
        assert stop - start == 1 or sum(wire_bound(m) for m in messages[start:stop]) <= 20_000
    assert (250, 251) in runs


@pytest.mark.parametrize("encode", [codec.consume_pack_response, codec.consume_columns_response])
def test_continued_parts_fit_and_join_to_the_pack(encode: object) -> None:
    rng = random.Random(11)
    pack = _pack([_message(rng, i) for i in range(400)])
    budget = 16_384
    runs = continued_runs(pack.messages, budget - codec.pack_head_bytes(pack, "v"))
    assert len(runs) > 5
    decoded = []
    for k, (start, stop) in enumerate(runs):
        last = k == len(runs) - 1
        data = encode(codec.continued_part(pack, start, stop, last), "v", not last)  # type: ignore[operator]
        assert len(data) <= budget or stop - start == 1
        resp = spb.ConsumeResponse.FromString(data)
        assert resp.pack.continued is not last
        part = codec.msgpack_from_pb(resp.pack)
        # A part that is not the last ends where the pack starts: acking it re-reads the whole pack.
        assert part.end_position == (pack.end_position if last else pack.start_position)
        decoded.append(part)
    whole = codec.join_continued(decoded[:-1], decoded[-1])
    assert whole.start_position == pack.start_position and whole.end_position == pack.end_position
    assert (whole.begin_ts, whole.end_ts) == (pack.begin_ts, pack.end_ts)
    assert [(m.payload, m.properties, m.vchannel, m.timetick, m.txn) for m in whole.messages] == [
        (m.payload, m.properties, m.vchannel, m.timetick, m.txn) for m in pack.messages]
