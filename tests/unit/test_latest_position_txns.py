"""The latest position with several transactions open: its floor is the BeginTxn of the *oldest* one.

Resuming at the latest position must deliver every transaction open when it was taken, whole: so its id
is held back to the smallest BeginTxn id among the open ones, whichever was begun or committed first,
and moves up as each finishes.  A directed case with two open (committed in the other order), and a
seeded walk of begins, commits, rollbacks and plain appends against a plain model.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

from interceptors.recovery.streaming_wal import ChainConfig, StreamingWAL, open_streaming_wal
from tests.factories import data, flat
from tests.seeds import draw_seed
from wal import DeliverFilter, DeliverPolicy, Message, MessageType, MsgPack, ReadOption, WALManager
from wal.message import Position

FAST = ChainConfig(tick_interval=0.02)
SEED_ENV = "STREAMINGNODE_TEST_SEED"


async def _open(manager: WALManager) -> StreamingWAL:
    await manager.create_channel("p")
    swal = await open_streaming_wal(manager, "p", FAST)
    await swal.ready()
    return swal


def _latest(swal: StreamingWAL) -> Position:
    latest = swal.latest_position()
    assert latest is not None
    return latest


async def test_two_open_transactions_hold_it_back_to_the_older_one_s_begin(manager: WALManager) -> None:
    swal = await _open(manager)
    try:
        await swal.append(data("v", b"before"))
        older, older_begin = await swal.begin_txn("v", keepalive_ms=60_000)
        await swal.append(Message(MessageType.DATA, "v", b"older 1", txn=older))
        newer, newer_begin = await swal.begin_txn("w", keepalive_ms=60_000)
        await swal.append(Message(MessageType.DATA, "w", b"newer 1", txn=newer))
        after = await swal.append(data("x", b"after"))
        assert older_begin.message_id < newer_begin.message_id < after.message_id

        latest = _latest(swal)
        assert latest.message_id <= older_begin.message_id, (
            f"the floor is {latest.message_id}, past the older open transaction's BeginTxn {older_begin.message_id}")
        scanner = swal.read(ReadOption(None, DeliverPolicy.start_from(latest.message_id),
                                       (DeliverFilter.timetick_gt(latest.timetick),)))
        try:
            # The newer one commits first: the older still holds the floor.
            await swal.append(Message(MessageType.DATA, "w", b"newer 2", txn=newer))
            await swal.commit_txn(newer.txn_id)
            assert _latest(swal).message_id == latest.message_id
            # The older one commits: the floor is the log's end again.
            await swal.append(Message(MessageType.DATA, "v", b"older 2", txn=older))
            await swal.commit_txn(older.txn_id)
            assert _latest(swal).message_id == swal.wal.last_id
            marker = await swal.append(data("x", b"marker"))

            got: list[MsgPack] = []
            while not got or got[-1].end_ts < marker.timetick:
                got.append(await asyncio.wait_for(scanner.__anext__(), 10))
            messages = flat(got)
            for ctx, bodies in ((older, [b"older 1", b"older 2"]), (newer, [b"newer 1", b"newer 2"])):
                mine = [m for m in messages if m.txn is not None and m.txn.txn_id == ctx.txn_id]
                assert [m.message_type for m in mine] == [
                    MessageType.BEGIN_TXN, MessageType.DATA, MessageType.DATA, MessageType.COMMIT_TXN], (
                    f"transaction {ctx.txn_id} was not delivered whole from the latest position")
                assert [m.payload for m in mine if m.message_type is MessageType.DATA] == bodies
            plain = [m.payload for m in messages if m.message_type is MessageType.DATA and m.txn is None]
            assert plain == [b"marker"]  # nothing from before the position
        finally:
            await scanner.aclose()
    finally:
        await swal.aclose()


async def test_the_older_one_finishing_moves_the_floor_to_the_newer_one(manager: WALManager) -> None:
    swal = await _open(manager)
    try:
        older, _ = await swal.begin_txn("v", keepalive_ms=60_000)
        newer, newer_begin = await swal.begin_txn("w", keepalive_ms=60_000)
        await swal.append(data("x", b"after"))
        await swal.rollback_txn(older.txn_id)
        assert _latest(swal).message_id == newer_begin.message_id
        await swal.commit_txn(newer.txn_id)
        assert _latest(swal).message_id == swal.wal.last_id
    finally:
        await swal.aclose()


async def test_a_walk_of_transactions_against_a_model(
    manager: WALManager, record_property: Callable[[str, object], None]
) -> None:
    """Random begins, commits, rollbacks and appends; after each, the floor is what the model says:
    the smallest BeginTxn id of the open transactions, or the last id when none is open."""
    rng = random.Random(draw_seed(SEED_ENV, record_property))
    swal = await _open(manager)
    open_: dict[int, int] = {}  # txn id -> its BeginTxn's message id
    try:
        for step in range(120):
            roll = rng.random()
            if roll < 0.3 or not open_:
                ctx, begin = await swal.begin_txn(rng.choice("vwx"), keepalive_ms=60_000)
                open_[ctx.txn_id] = begin.message_id
                what = f"begin {ctx.txn_id}"
            elif roll < 0.5:
                tid = rng.choice(sorted(open_))
                await swal.commit_txn(tid)
                del open_[tid]
                what = f"commit {tid}"
            elif roll < 0.6:
                tid = rng.choice(sorted(open_))
                await swal.rollback_txn(tid)
                del open_[tid]
                what = f"rollback {tid}"
            else:
                await swal.append(data(rng.choice("vwx"), b"plain"))
                what = "plain append"
            latest = _latest(swal)
            last = swal.wal.last_id  # read in the same turn of the loop: no tick lands in between
            assert last is not None
            want = min([last, *open_.values()])
            assert latest.message_id == want, (
                f"step {step} ({what}): floor {latest.message_id}, want {want} (open: {open_})")
    finally:
        await swal.aclose()
