"""Splitting a large MsgPack into responses (``streamingnode.wire.packs``).

Plain packs: the bisecting path cuts exactly where the unit-by-unit one does.  Packs with
transactions: no part cuts a transaction, parts concatenate to the pack, a part is closed as soon as
it reaches a limit (so it exceeds one only by its last unit), and every part's end position resumes
exactly at the next part.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from streamingnode.wire.packs import MESSAGE_OVERHEAD, _split_plain, _split_units, delivery_units, split_pack
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
    assert _shape(_split_plain(pack, lens, limit, max_bytes)) == _shape(_split_units(pack, lens, limit, max_bytes))
    parts = split_pack(pack, limit, max_bytes)
    assert [m for p, _ in parts for m in p.messages] == pack.messages
    assert parts[-1][0].end_position == pack.end_position and parts[-1][0].end_ts == pack.end_ts
    assert sum(n for _, n in parts) == sum(sizes)


# --- packs with transactions ---------------------------------------------------------------------
# A unit as drawn: a plain message's payload size, or (body sizes, committed?) of a transaction.
_UnitSpec = int | tuple[list[int], bool]

_units = st.lists(
    st.one_of(
        st.integers(0, 3000),
        st.tuples(st.lists(st.integers(0, 3000), max_size=8), st.booleans()),
    ),
    min_size=1, max_size=30,
)


@dataclass
class _Drawn:
    pack: MsgPack
    bounds: list[tuple[int, int]]
    """Each unit as (start, stop) indices into the pack's messages, as drawn."""
    delivered_at: list[int]
    """Each unit's timetick: a plain message's own, a transaction's commit (or rollback)."""


def _txn_pack(specs: list[_UnitSpec]) -> _Drawn:
    """A pack as a scanner releases it: units in order of their timetick, each transaction whole at
    its end's timetick.  The BeginTxn and bodies of a transaction carry earlier timeticks than the
    unit before it (it began first and committed later), so a cut inside one would be visible."""
    msgs: list[Message] = []
    bounds: list[tuple[int, int]] = []
    delivered_at: list[int] = []

    def add(t: MessageType, size: int, ts: int) -> None:
        m = Message(t, "v", b"x" * size)
        m._timetick = ts
        m._id = len(msgs)
        msgs.append(m)

    for k, spec in enumerate(specs):
        ts = 1000 + 100 * k
        start = len(msgs)
        if isinstance(spec, int):
            add(MessageType.DATA, spec, ts)
        else:
            bodies, committed = spec
            add(MessageType.BEGIN_TXN, 0, ts - 150)
            for j, size in enumerate(bodies):
                add(MessageType.INSERT, size, ts - 149 + j)
            add(MessageType.COMMIT_TXN if committed else MessageType.ROLLBACK_TXN, 0, ts)
        bounds.append((start, len(msgs)))
        delivered_at.append(ts)
    end_ts = delivered_at[-1] + 50
    pack = MsgPack(900, end_ts, msgs, Position("p", 7, 900), Position("p", 7 + len(msgs), end_ts))
    return _Drawn(pack, bounds, delivered_at)


def test_delivery_units_keep_a_transaction_together() -> None:
    drawn = _txn_pack([5, ([1, 2], True), 3, ([], False), ([4], True)])
    assert list(delivery_units(drawn.pack.messages)) == drawn.bounds == [(0, 1), (1, 5), (5, 6), (6, 8), (8, 11)]
    # A transaction still open at the end of the messages is one last unit.
    assert list(delivery_units(drawn.pack.messages[:3])) == [(0, 1), (1, 3)]
    assert list(delivery_units([])) == []


@settings(max_examples=400, deadline=None)
@given(_units)
def test_delivery_units_are_the_drawn_units(specs: list[_UnitSpec]) -> None:
    drawn = _txn_pack(specs)
    assert list(delivery_units(drawn.pack.messages)) == drawn.bounds


@settings(max_examples=400, deadline=None)
@given(_units, st.integers(1, 20), st.integers(1, 12000))
def test_packs_with_transactions_are_cut_only_between_units(
    specs: list[_UnitSpec], limit: int, max_bytes: int,
) -> None:
    drawn = _txn_pack(specs)
    pack = drawn.pack
    parts = split_pack(pack, limit, max_bytes)

    # Parts concatenate to the pack, and the payload they report is all of it.
    assert [m for p, _ in parts for m in p.messages] == pack.messages
    assert sum(n for _, n in parts) == sum(len(m.payload) for m in pack.messages)
    for part, nbytes in parts:
        assert nbytes == sum(len(m.payload) for m in part.messages)

    # Every cut falls between two drawn units: no transaction is cut.
    unit_of_stop = {stop: k for k, (_, stop) in enumerate(drawn.bounds)}
    cuts: list[int] = []
    offset = 0
    for part, _ in parts:
        offset += len(part.messages)
        assert offset in unit_of_stop, f"a part ends inside a unit, at message {offset}"
        cuts.append(offset)

    # A part is closed as soon as its units reach a limit, and only then: so every unit but its last
    # leaves it under both limits, and a part other than the last has reached one.
    first_unit = 0
    for i in range(len(parts)):
        last_unit = unit_of_stop[cuts[i]]
        units = drawn.bounds[first_unit:last_unit + 1]
        sizes = [sum(len(m.payload) + MESSAGE_OVERHEAD for m in pack.messages[a:b]) for a, b in units]
        counts = [b - a for a, b in units]
        assert sum(sizes[:-1]) < max_bytes and sum(counts[:-1]) < limit
        if i < len(parts) - 1:
            assert sum(sizes) >= max_bytes or sum(counts) >= limit
        first_unit = last_unit + 1

    # Positions: each part starts where the one before ended, and its end resumes exactly after it
    # (pack start id, timetick > the part's last unit), so resuming there delivers the later parts.
    assert parts[0][0].start_position == pack.start_position and parts[0][0].begin_ts == pack.begin_ts
    assert parts[-1][0].end_position == pack.end_position and parts[-1][0].end_ts == pack.end_ts
    for (before, _), (after, _) in itertools.pairwise(parts):
        assert after.start_position == before.end_position and after.begin_ts == before.end_ts
    for i, (part, _) in enumerate(parts[:-1]):
        end = part.end_position
        last_unit = unit_of_stop[cuts[i]]
        assert end.pchannel == "p" and end.message_id == pack.start_position.message_id
        assert end.timetick == part.end_ts == drawn.delivered_at[last_unit]
        resumed = [m for k, (a, b) in enumerate(drawn.bounds) if drawn.delivered_at[k] > end.timetick
                   for m in pack.messages[a:b]]
        assert resumed == [m for p, _ in parts[i + 1:] for m in p.messages]


def test_a_transaction_larger_than_the_limits_goes_out_whole() -> None:
    drawn = _txn_pack([([100] * 6, True), 10, 10])
    parts = split_pack(drawn.pack, 3, 1 << 20)
    assert [len(p.messages) for p, _ in parts] == [8, 2]  # the transaction's 8 messages in one part
