"""Scanners: deliver policies, filters, the reorder buffer, whole transactions, tailing, positions."""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import ManagerFactory
from tests.factories import PHYS, begin, body, commit, flat, ins, packs_until, rollback, tick
from tests.waiting import loop_turns, until
from wal import (
    WAL,
    DeliverFilter,
    DeliverPolicy,
    MessageType,
    OutOfRangeError,
    ReadOption,
    WALManager,
)
from wal.resume import resume_after


async def _wal(manager: WALManager, name: str = "p") -> WAL:
    await manager.create_channel(name)
    return await manager.open(name)


def _ts(packs: list) -> list[int]:  # type: ignore[type-arg]
    return [m.timetick for m in flat(packs)]


async def test_messages_are_released_by_ticks_in_timestamp_order(manager: WALManager) -> None:
    wal = await _wal(manager)
    # Appended out of timestamp order, as concurrent producers can land them.
    await wal.append_batch([ins("v", 5), ins("v", 3), ins("v", 9), tick(6), ins("v", 7), tick(10)])
    packs = await packs_until(wal.read(), 10)
    assert [(p.begin_ts, p.end_ts) for p in packs] == [(0, 6), (6, 10)]
    assert [[m.timetick for m in p.messages] for p in packs] == [[3, 5], [7, 9]]


async def test_deliver_policies(manager: WALManager) -> None:
    wal = await _wal(manager)
    await wal.append_batch([ins("v", 1), ins("v", 2), ins("v", 3), tick(4)])

    async def ids(policy: DeliverPolicy) -> list[int]:
        return [m.message_id for m in flat(await packs_until(wal.read(ReadOption(deliver_policy=policy)), 4))]

    assert await ids(DeliverPolicy.all()) == [0, 1, 2]
    assert await ids(DeliverPolicy.start_from(1)) == [1, 2]
    assert await ids(DeliverPolicy.start_after(1)) == [2]
    assert await ids(DeliverPolicy.start_at_time(2)) == [1, 2]
    latest = wal.read(ReadOption(deliver_policy=DeliverPolicy.latest()))
    await wal.append_batch([ins("v", 5), tick(6)])
    assert [m.message_id for m in flat(await packs_until(latest, 6))] == [4]
    with pytest.raises(OutOfRangeError):
        wal.read(ReadOption(deliver_policy=DeliverPolicy.start_from(99)))


async def test_filters_and_vchannels(manager: WALManager) -> None:
    wal = await _wal(manager)
    await wal.append_batch([
        ins("a", 1), ins("b", 2), ins("", 3),
        begin("a", 4, 7), body("a", 5, 7), commit("a", 6, 7),
        ins("a", 8), tick(10),
    ])
    packs = await packs_until(wal.read(ReadOption(vchannel="a")), 10)
    assert _ts(packs) == [1, 3, 4, 5, 6, 8]  # "b" skipped, broadcast kept
    packs = await packs_until(
        wal.read(ReadOption(deliver_filters=(DeliverFilter.timetick_gt(3),))), 10)
    assert _ts(packs) == [4, 5, 6, 8]
    packs = await packs_until(
        wal.read(ReadOption(deliver_filters=(DeliverFilter.timetick_gte(3),))), 10)
    assert _ts(packs) == [3, 4, 5, 6, 8]
    packs = await packs_until(wal.read(ReadOption(
        vchannel="a", deliver_filters=(DeliverFilter.message_type([MessageType.DELETE]),))), 10)
    # Only system messages (the transaction's framing) pass a filter for a type nobody wrote.
    assert [m.message_type for m in flat(packs)] == [MessageType.BEGIN_TXN, MessageType.COMMIT_TXN]


async def test_transaction_is_delivered_whole_at_commit(manager: WALManager) -> None:
    wal = await _wal(manager)
    await wal.append_batch([begin("v", 10, 1), body("v", 11, 1, b"a"), ins("v", 12), tick(13)])
    scanner = wal.read()
    first = await packs_until(scanner, 13)
    assert _ts(first) == [12]  # the open transaction waits
    await wal.append_batch([body("v", 14, 1, b"b"), commit("v", 20, 1), ins("v", 15), tick(21)])
    second = await packs_until(scanner, 21)
    got = flat(second)
    assert [m.timetick for m in got] == [15, 10, 11, 14, 20]  # whole, at the commit's place
    assert [m.payload for m in got if m.message_type is MessageType.INSERT and m.txn] == [b"a", b"b"]


async def test_rollback_expiry_and_midway_start_deliver_nothing(manager: WALManager) -> None:
    wal = await _wal(manager)
    await wal.append_batch([
        begin("v", 1 * PHYS, 1), body("v", 2 * PHYS, 1), rollback("v", 3 * PHYS, 1),
        begin("v", 4 * PHYS, 2, keepalive_ms=10), body("v", 5 * PHYS, 2, keepalive_ms=10),
        tick(100 * PHYS),  # txn 2 idle for 95 ms > 10 ms keepalive: expired
        commit("v", 101 * PHYS, 2),
        begin("v", 102 * PHYS, 3), body("v", 103 * PHYS, 3),
        ins("v", 104 * PHYS), tick(105 * PHYS),
        body("v", 106 * PHYS, 3), commit("v", 107 * PHYS, 3), tick(108 * PHYS),
    ])
    got = flat(await packs_until(wal.read(), 108 * PHYS))
    assert [(m.timetick // PHYS, m.txn.txn_id if m.txn else None) for m in got] == [
        (104, None), (102, 3), (103, 3), (106, 3), (107, 3)]
    # Starting at txn 3's first body: it never saw the BeginTxn, so the transaction is skipped whole.
    mid = flat(await packs_until(wal.read(ReadOption(deliver_policy=DeliverPolicy.start_from(8))),
                                 108 * PHYS))
    assert [m.timetick // PHYS for m in mid] == [104]


@pytest.mark.parametrize("idle_ms", [10, 11])
async def test_a_reader_expires_a_transaction_exactly_when_the_writer_does(manager: WALManager, idle_ms: int) -> None:
    """At the keepalive's boundary, reader and writer must agree: idle exactly ``keepalive_ms`` is
    still open (the commit is delivered), one millisecond more is expired (it never is)."""
    from wal.clock import txn_expired  # noqa: PLC0415

    wal = await _wal(manager)
    at = (5 + idle_ms) * PHYS
    await wal.append_batch([
        begin("v", 4 * PHYS, 1, keepalive_ms=10), body("v", 5 * PHYS, 1, keepalive_ms=10),
        tick(at), commit("v", at + 1, 1), tick(at + PHYS),
    ])
    got = flat(await packs_until(wal.read(), at + PHYS))
    writer_expired = txn_expired(10, 5 * PHYS, at)
    assert writer_expired is (idle_ms > 10)
    assert [m.timetick for m in got] == ([] if writer_expired else [4 * PHYS, 5 * PHYS, at + 1])


async def test_tailing_is_woken_by_appends(manager: WALManager) -> None:
    wal = await _wal(manager)
    scanner = wal.read(ReadOption(deliver_policy=DeliverPolicy.latest()))
    nxt = asyncio.create_task(scanner.__anext__())
    await until(lambda: scanner.caught_up, "the scanner waiting at the end of the log")
    await loop_turns()
    assert not nxt.done()  # nothing to deliver: it waits (the pack below holds the append, not an empty one)
    await wal.append_batch([ins("v", 1), tick(2)])
    pack = await asyncio.wait_for(nxt, 1)
    assert [m.timetick for m in pack.messages] == [1]
    assert scanner.tailing


async def test_slow_reader_falls_back_to_storage(open_manager: ManagerFactory) -> None:
    manager = await open_manager(tail_buffer_bytes=4096)  # a tiny tail: almost everything is evicted
    wal = await _wal(manager)
    scanner = wal.read()
    await wal.append_batch([ins("v", 1), tick(2)])
    assert _ts(await packs_until(scanner, 2)) == [1]
    for k in range(50):  # the writer races far ahead of the idle reader
        await wal.append_batch([ins("v", 10 * k + 3, b"x" * 500), tick(10 * k + 4)])
    packs = await packs_until(scanner, 494)
    assert _ts(packs) == [10 * k + 3 for k in range(50)]
    assert not scanner.tailing or wal._tail.base > 2


async def test_end_position_resumes_exactly(manager: WALManager) -> None:
    wal = await _wal(manager)
    await wal.append_batch([
        ins("v", 5), begin("v", 6, 1), ins("v", 9), body("v", 7, 1), tick(8),
        commit("v", 12, 1), ins("v", 11), tick(13),
    ])
    packs = await packs_until(wal.read(), 13)
    everything = [m.message_id for m in flat(packs)]
    for i, pack in enumerate(packs):
        pos = pack.end_position
        policy, filters = resume_after(pos.message_id, pos.timetick)
        resumed = wal.read(ReadOption(deliver_policy=policy, deliver_filters=filters))
        rest = flat(await packs_until(resumed, 13)) if i + 1 < len(packs) else []
        delivered = [m.message_id for p in packs[: i + 1] for m in p.messages]
        assert delivered + [m.message_id for m in rest] == everything
    assert packs[0].end_position.message_id == 1  # the open transaction's BeginTxn is not yet delivered


async def test_scanner_close_ends_iteration(manager: WALManager) -> None:
    wal = await _wal(manager)
    async with wal.read() as scanner:
        pass
    with pytest.raises(StopAsyncIteration):
        await scanner.__anext__()


async def test_catch_up_starts_the_next_read_before_this_batch_is_used_up(open_manager: ManagerFactory) -> None:
    manager = await open_manager(tail_buffer_bytes=4096)  # a tiny tail: the scanner reads storage
    wal = await _wal(manager)
    for k in range(4):  # one block per append; each read below returns one block
        await wal.append_batch([ins("v", 10 * k + 1, b"x" * 3000), tick(10 * k + 2)])
    started: list[int] = []
    run_read = manager._run_read

    async def recording(fn, *args):  # type: ignore[no-untyped-def]
        if fn.__name__ == "_read_checked":  # (backend, channel key, from id, max bytes)
            started.append(args[2])
        return await run_read(fn, *args)

    manager._run_read = recording  # type: ignore[method-assign]
    scanner = wal.read(ReadOption(read_batch_bytes=1))
    pack = await scanner.__anext__()
    assert [m.timetick for m in pack.messages] == [1]
    # The read of the following batch is already under way, not merely scheduled.
    assert started == [0, 2]
    assert _ts(await packs_until(scanner, 32)) == [11, 21, 31]
    assert started == [0, 2, 4, 6]
    await scanner.aclose()
