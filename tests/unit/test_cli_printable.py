"""``consume --count``: what it prints of a pack and where a group acks, by the delivery units of
``streamingnode.wire.packs``
(a transaction printed in part is not acked, so the group's next consumer gets it whole)."""

from __future__ import annotations

import pytest

from streamingnode.cli.consume import _printable
from wal.message import Message, MessageType, Position
from wal.scanner import MsgPack

START = Position("p", 40, 100)
END = Position("p", 50, 200)


def _pack() -> MsgPack:
    kinds = [MessageType.DATA, MessageType.TIME_TICK, MessageType.BEGIN_TXN, MessageType.DATA,
             MessageType.COMMIT_TXN, MessageType.DATA]
    msgs = []
    for i, t in enumerate(kinds):
        m = Message(t, "v", b"x")
        m._timetick = 110 + i
        m._id = 40 + i
        msgs.append(m)
    return MsgPack(100, 200, msgs, START, END)


@pytest.mark.parametrize(("limit", "printed", "ack_ts"), [
    (1, [40], 111),  # the tick after the plain message is passed too
    (2, [40, 42], 111),  # BeginTxn printed, the transaction not acked
    (3, [40, 42, 43], 111),
    (4, [40, 42, 43, 44], 114),  # the commit closes the transaction: acked through it
])
def test_a_limit_acks_only_whole_units(limit: int, printed: list[int], ack_ts: int) -> None:
    messages, ack = _printable(_pack(), limit)
    assert [m.message_id for m in messages] == printed
    assert ack == Position("p", START.message_id, ack_ts)


@pytest.mark.parametrize("limit", [None, 5, 9])
def test_a_pack_printed_whole_acks_its_end(limit: int | None) -> None:
    messages, ack = _printable(_pack(), limit)
    assert [m.message_id for m in messages] == [40, 42, 43, 44, 45]
    assert ack == END
