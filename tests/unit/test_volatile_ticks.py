"""Not-persisted TimeTicks release readers behind the head too, not only the one caught up when it is made.

A tick handed out with ``deliver_unpersisted`` follows the ids committed at that moment, and everything
committed later is newer.  A reader that reaches that id afterwards (it was waiting for its turn to
deliver, or is simply slower) releases by it, instead of waking for every commit until the next
persisted tick.
"""

from __future__ import annotations

from tests.factories import ins
from wal import WALManager
from wal.message import Message, new_time_tick
from wal.options import DeliverPolicy, ReadOption
from wal.wal import VOLATILE_TICKS_KEPT


def _volatile(ts: int) -> Message:
    return new_time_tick(ts, persist=False)


def _payloads(messages: list[Message]) -> list[bytes]:
    return [m.payload for m in messages]


async def test_a_reader_behind_releases_by_a_tick_made_before_later_commits(manager: WALManager) -> None:
    await manager.create_channel("p")
    wal = await manager.open("p")
    await wal.append_batch([ins("v", 1, b"a"), ins("v", 2, b"b")])
    wal.deliver_unpersisted(_volatile(5))  # made with ids 0-1 acked: follows id 1
    await wal.append_batch([ins("v", 6, b"c"), ins("v", 7, b"d")])

    async with wal.read(ReadOption(deliver_policy=DeliverPolicy.all())) as scanner:
        pack = scanner.poll()
        assert pack is not None, "the reader met no tick: it would wait for a persisted one"
        assert _payloads(pack.messages) == [b"a", b"b"]
        assert pack.end_ts == 5
        assert pack.end_position.message_id == 2  # resumes at the first message the tick did not release
        assert scanner.poll() is None  # c and d are newer than every tick so far

        wal.deliver_unpersisted(_volatile(9))  # the head's tick, as before
        pack = scanner.poll()
        assert pack is not None and _payloads(pack.messages) == [b"c", b"d"] and pack.end_ts == 9


async def test_a_reader_several_ticks_behind_releases_by_the_newest_in_reach(manager: WALManager) -> None:
    await manager.create_channel("p")
    wal = await manager.open("p")
    ts = 0
    for k in range(5):
        ts += 1
        await wal.append_batch([ins("v", ts, b"%d" % k)])
        ts += 1
        wal.deliver_unpersisted(_volatile(ts))
    await wal.append_batch([ins("v", ts + 1, b"last")])

    async with wal.read(ReadOption(deliver_policy=DeliverPolicy.all())) as scanner:
        packs = []
        while (pack := scanner.poll()) is not None:
            packs.append(pack)
    # One pack, not one per tick (fewer, larger responses for a reader behind), and nothing newer than
    # the tick it ends at.
    assert [_payloads(p.messages) for p in packs] == [[b"%d" % k for k in range(5)]]
    assert packs[0].end_ts == 10


async def test_a_tick_with_no_commit_after_it_supersedes_the_one_before(manager: WALManager) -> None:
    await manager.create_channel("p")
    wal = await manager.open("p")
    await wal.append_batch([ins("v", 1, b"a")])
    wal.deliver_unpersisted(_volatile(2))
    wal.deliver_unpersisted(_volatile(3))
    assert [(at, t.timetick) for at, t in wal._volatile_ticks] == [(1, 3)]


async def test_the_ticks_kept_are_bounded(manager: WALManager) -> None:
    await manager.create_channel("p")
    wal = await manager.open("p")
    ts = 0
    for _ in range(2 * VOLATILE_TICKS_KEPT + 5):
        ts += 1
        await wal.append_batch([ins("v", ts)])
        ts += 1
        wal.deliver_unpersisted(_volatile(ts))
    assert VOLATILE_TICKS_KEPT <= len(wal._volatile_ticks) <= 2 * VOLATILE_TICKS_KEPT
    assert wal._volatile_ticks[-1][1].timetick == ts

    # A reader from the start meets no tick for the oldest ids: it waits (for a persisted tick), and it
    # still releases everything up to the newest tick in reach once it gets there.
    async with wal.read(ReadOption(deliver_policy=DeliverPolicy.all())) as scanner:
        packs = []
        while (pack := scanner.poll()) is not None:
            packs.append(pack)
    released = [m for p in packs for m in p.messages]
    assert released and released[-1].timetick == ts - 1
    assert [m.timetick for m in released] == sorted({m.timetick for m in released})
