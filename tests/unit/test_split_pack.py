"""Splitting a large MsgPack into responses: the bisecting path for packs without transactions cuts
exactly where the message-by-message one does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from streamingnode.server import _split_pack, _split_plain, _split_units
from wal.message import Message, MessageType, Position
from wal.scanner import MsgPack


def _pack(sizes: list[int]) -> MsgPack:
    msgs = []
    for i, size in enumerate(sizes):
        m = Message(MessageType.DATA, "v", b"x" * size)
        m._timetick = 100 + i
        m._id = i
        msgs.append(m)
    return MsgPack(99, 100 + len(sizes), msgs, Position("p", 0, 99), Position("p", len(sizes), 100 + len(sizes)))


def _shape(parts: list[tuple[MsgPack, int]]) -> list[tuple[object, ...]]:
    return [(p.begin_ts, p.end_ts, [m.message_id for m in p.messages], p.start_position, p.end_position, n)
            for p, n in parts]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3000), min_size=1, max_size=60), st.integers(1, 20), st.integers(1, 12000))
def test_plain_packs_are_cut_where_unit_by_unit_cutting_cuts(sizes: list[int], limit: int, max_bytes: int) -> None:
    pack = _pack(sizes)
    lens = [len(m.payload) for m in pack.messages]
    assert _shape(_split_plain(pack, lens, limit, max_bytes)) == _shape(_split_units(pack, limit, max_bytes))
    parts = _split_pack(pack, limit, max_bytes)
    assert [m for p, _ in parts for m in p.messages] == pack.messages
    assert parts[-1][0].end_position == pack.end_position and parts[-1][0].end_ts == pack.end_ts
    assert sum(n for _, n in parts) == sum(sizes)
