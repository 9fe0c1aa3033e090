"""MsgStream merging without a node: how packs of one channel are cut at another channel's tick, and
that the cut positions follow the resume rule.  Also the repack default and the exported surface."""

from __future__ import annotations

import zlib

import pytest

import streamingnode.client as sdk
from streamingnode.client._msgstream import HASH_KEY_PROPERTY, _Channel, _units, default_repack, hash_key
from wal.errors import InvalidArgumentError, OnShutdownError
from wal.message import Message, MessageType, Position, TxnContext
from wal.scanner import MsgPack


def sealed(t: MessageType, ts: int, mid: int, payload: bytes = b"", txn: TxnContext | None = None) -> Message:
    m = Message(t, "v", payload, timetick=ts, txn=txn)
    m._seal(mid)
    return m


def pack(begin: int, end: int, messages: list[Message], start_id: int, end_id: int) -> MsgPack:
    return MsgPack(begin, end, messages, Position("p", start_id, begin), Position("p", end_id, end))


class _NoConsumer:
    pchannel = "p"


def test_units_keep_a_transaction_whole_at_its_commit_timetick() -> None:
    txn = TxnContext(7, 1000)
    messages = [
        sealed(MessageType.DATA, 10, 1, b"a"),
        sealed(MessageType.BEGIN_TXN, 11, 2, txn=txn),
        sealed(MessageType.DATA, 12, 3, b"t", txn=txn),
        sealed(MessageType.COMMIT_TXN, 20, 5, txn=txn),
        sealed(MessageType.DATA, 21, 6, b"b"),
    ]
    units = _units(messages)
    assert [(u.ts, len(u.messages)) for u in units] == [(10, 1), (20, 3), (21, 1)]


def test_take_cuts_a_pack_at_the_tick_and_positions_follow_the_resume_rule() -> None:
    channel = _Channel(_NoConsumer())  # type: ignore[arg-type]
    txn = TxnContext(7, 1000)
    body = [
        sealed(MessageType.DATA, 11, 4, b"a"),
        sealed(MessageType.BEGIN_TXN, 12, 5, txn=txn),
        sealed(MessageType.DATA, 13, 6, b"t", txn=txn),
        sealed(MessageType.COMMIT_TXN, 16, 8, txn=txn),
        sealed(MessageType.DATA, 17, 7, b"b"),
    ]
    channel.pending.append(pack(10, 20, body, start_id=4, end_id=9))
    channel.latest_end = 20

    start, units, end = channel.take(15)
    assert start == Position("p", 4, 10)
    assert [m.payload for u in units for m in u.messages] == [b"a"], "the txn commits at 16, after the cut"
    # Resume rule: start_from(4) + timetick_gt(15) delivers exactly the rest of the pack.
    assert end == Position("p", 4, 15)
    rest = channel.pending[0]
    assert (rest.begin_ts, rest.end_ts, rest.start_position, rest.end_position) == (15, 20, end, Position("p", 9, 20))
    assert all(u.ts > 15 for u in _units(rest.messages))

    start2, units2, end2 = channel.take(20)
    assert start2 == end
    assert [len(u.messages) for u in units2] == [3, 1]
    assert end2 == Position("p", 9, 20) and not channel.pending

    # Nothing new: start and end stay where they were.
    assert channel.take(25) == (end2, [], end2)


def test_default_repack_is_stable_and_uses_the_hash_key_property() -> None:
    keyed = Message(MessageType.DATA, "v1", b"", {HASH_KEY_PROPERTY: "user-42"})
    plain = Message(MessageType.DATA, "v1", b"")
    assert hash_key(keyed) == zlib.crc32(b"user-42")
    assert hash_key(plain) == zlib.crc32(b"v1")
    plan = default_repack([keyed, plain, keyed], 4)
    assert plan[zlib.crc32(b"user-42") % 4].count(keyed) == 2
    assert sum(len(v) for v in plan.values()) == 3


async def test_producer_refuses_bad_limits_and_sends_after_close() -> None:
    with pytest.raises(InvalidArgumentError):
        sdk.Producer(None, "p", max_in_flight=0)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        sdk.Producer(None, "p", producer_id="")  # type: ignore[arg-type]
    producer = sdk.Producer(None, "p")  # type: ignore[arg-type]
    await producer.aclose()
    with pytest.raises(OnShutdownError):
        producer.send_nowait("v", b"x")
    assert producer.batches_written == 0 and producer.closed
