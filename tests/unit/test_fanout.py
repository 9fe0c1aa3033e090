"""The fan-out pieces alone: the encoded-pack cache's bound, the per-turn delivery budget, joining
packs that are already in memory, and the scanner's non-waiting poll."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from streamingnode.server import consume
from streamingnode.server.consume import _cut, _merge
from streamingnode.server.fanout import DeliveryTurns, EncodedPacks, PackCheck
from tests.factories import ins, tick
from wal import WAL, WALManager
from wal.message import Message, MessageType, Position
from wal.packs import MESSAGE_OVERHEAD
from wal.scanner import MsgPack


def test_the_cache_keeps_at_most_its_bytes_dropping_the_least_recently_used() -> None:
    cache = EncodedPacks(1000)
    ca, cb = PackCheck(1, 2, Position("p", 1, 2), 1, 0, 0), PackCheck(2, 3, Position("p", 2, 3), 1, 1, 1)
    x = (((b"x" * 200,), 1, 200),)
    cache.put(("a",), ca, x)
    cache.put(("b",), cb, (((b"y" * 200,), 1, 200),))
    assert cache.get(("a",)) == (ca, x)  # now "b" is the least recently used
    cache.put(("a",), cb, (((b"o" * 10,), 1, 10),))  # the first entry stands
    assert cache.get(("a",)) == (ca, x)
    for k in "cdef":
        cache.put((k,), cb, (((b"z" * 100, b"z" * 100), 1, 200),))
    assert cache.bytes <= 1000
    assert cache.get(("b",)) is None
    assert cache.get(("a",)) is not None
    cache.put(("big",), cb, (((b"w" * 501,), 1, 501),))  # over half: not kept, nothing evicted for it
    assert cache.get(("big",)) is None
    assert len(cache) == 5 and cache.bytes == 1000


async def test_deliveries_per_loop_turn_are_bounded() -> None:
    loop = asyncio.get_running_loop()
    turn = 0

    def count_turns() -> None:
        nonlocal turn
        turn += 1
        ticker[0] = loop.call_soon(count_turns)

    ticker = [loop.call_soon(count_turns)]
    turns = DeliveryTurns(per_turn=8)
    passed: list[int] = []

    async def deliver() -> None:
        await turns.take()
        passed.append(turn)

    try:
        await asyncio.wait_for(asyncio.gather(*(deliver() for _ in range(100))), 30)
    finally:
        ticker[0].cancel()
    per_turn = Counter(passed)
    assert sum(per_turn.values()) == 100
    assert max(per_turn.values()) <= 8
    assert len(per_turn) >= 100 // 8


def _message(i: int, size: int = 100) -> Message:
    m = Message(MessageType.DATA, "v", b"x" * size)
    m._timetick = 100 + i
    m._id = i
    return m


def _packs(sizes: list[int]) -> list[MsgPack]:
    """One pack per message, consecutive as a scanner makes them."""
    return [MsgPack(99 + i, 100 + i, [_message(i)] * (size > 0), Position("p", i, 99 + i),
                    Position("p", i + 1, 100 + i)) for i, size in enumerate(sizes)]


class _Polled:
    def __init__(self, packs: list[MsgPack], caught_up: bool = True) -> None:
        self.packs = packs
        self.caught_up = caught_up

    def poll(self) -> MsgPack | None:
        return self.packs.pop(0) if self.packs else None


def test_packs_in_memory_join_the_first_within_the_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(consume, "MERGE_CUT", 1 << 100)  # no cuts: the limits alone
    first, *rest = _packs([1, 1, 0, 1, 1, 1])
    polled = _Polled(list(rest))
    pack, following = _merge(first, polled, 4, 1 << 20)  # type: ignore[arg-type]
    # Four messages (the empty pack between joins too); the pack of the fifth is handed back.
    assert [m.message_id for m in pack.messages] == [0, 1, 3, 4]
    assert (pack.begin_ts, pack.start_position) == (first.begin_ts, first.start_position)
    assert (pack.end_ts, pack.end_position) == (rest[3].end_ts, rest[3].end_position)
    assert following is rest[4]
    assert polled.packs == []

    one = _packs([1])[0]
    size = len(one.messages[0].payload) + MESSAGE_OVERHEAD
    pack, following = _merge(one, _Polled(_packs([1, 1])[1:]), 100, 2 * size - 1)  # type: ignore[arg-type]
    assert len(pack.messages) == 1 and following is not None  # the bytes limit holds too

    # A read that has not caught up yet keeps its packs as they were made...
    first, *rest = _packs([1, 1, 1])
    assert _merge(first, _Polled(list(rest), caught_up=False), 100, 1 << 20) == (first, None)  # type: ignore[arg-type]
    # ...unless it follows another's response from the same start: then exactly as far as that went.
    for caught_up in (False, True):
        polled = _Polled(list(rest), caught_up=caught_up)
        pack, following = _merge(first, polled, 100, 1 << 20, rest[0].end_position)  # type: ignore[arg-type]
        assert [m.message_id for m in pack.messages] == [0, 1] and following is None
        assert pack.end_position == rest[0].end_position and polled.packs == rest[1:]


def test_readers_that_joined_different_packs_end_a_response_at_the_same_tick_again() -> None:
    packs = _packs([1] * 200)
    assert 10 < sum(map(_cut, packs)) < 190

    def responses(start: int, step: int) -> list[Position]:
        """Where each response ends for a reader from pack ``start`` that joins at most ``step``."""
        polled = _Polled(list(packs[start + 1:]))
        pack: MsgPack | None = packs[start]
        ends = []
        while pack is not None:
            pack, following = _merge(pack, polled, step, 1 << 20)  # type: ignore[arg-type]
            ends.append(pack.end_position)
            pack = following or polled.poll()
        return ends

    a, b = responses(0, 100), responses(1, 100)
    shared = set(a) & set(b)
    # From the first cut both reach, every cut ends a response of each: they share from there on.
    assert len(shared) >= 10
    assert min(shared, key=lambda p: p.timetick).timetick < packs[20].end_ts


async def _wal(manager: WALManager) -> WAL:
    await manager.create_channel("p")
    return await manager.open("p")


async def test_poll_hands_out_what_is_in_memory_and_never_waits(manager: WALManager) -> None:
    wal = await _wal(manager)
    scanner = wal.read()
    await wal.append_batch([ins("v", 1), tick(2)])
    first = await anext(scanner)
    assert [x.timetick for x in first.messages] == [1]
    assert scanner.poll() is None  # nothing more: None at once, not a wait
    await wal.append_batch([ins("v", 3), tick(4), ins("v", 5), tick(6)])
    polled = [scanner.poll(), scanner.poll()]
    assert [[x.timetick for x in p.messages] for p in polled if p is not None] == [[3], [5]]
    assert polled[0] is not None and polled[0].start_position == first.end_position
    assert scanner.poll() is None
    await scanner.aclose()
    assert scanner.poll() is None
