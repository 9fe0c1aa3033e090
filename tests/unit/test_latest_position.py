"""The latest position of a streaming WAL: resuming there delivers what comes next, including the
transactions open at the time it was taken (their BeginTxn lies behind the log's end)."""

from __future__ import annotations

import asyncio

from interceptors.recovery.streaming_wal import ChainConfig, StreamingWAL, open_streaming_wal
from tests.factories import data, flat
from wal import DeliverFilter, DeliverPolicy, Message, MessageType, MsgPack, ReadOption, Scanner, WALManager
from wal.message import Position, TxnContext

FAST = ChainConfig(tick_interval=0.02)


async def _open(manager: WALManager) -> StreamingWAL:
    await manager.create_channel("p")
    swal = await open_streaming_wal(manager, "p", FAST)
    await swal.ready()
    return swal


def _body(ctx: TxnContext, payload: bytes) -> Message:
    return Message(MessageType.DATA, "v", payload, txn=ctx)


def _resume(swal: StreamingWAL, pos: Position) -> Scanner:
    """A reader that resumes after ``pos`` by the rule of Position."""
    return swal.read(ReadOption(None, DeliverPolicy.start_from(pos.message_id),
                                (DeliverFilter.timetick_gt(pos.timetick),)))


async def _until(scanner: Scanner, ts: int) -> list[MsgPack]:
    out: list[MsgPack] = []
    while not out or out[-1].end_ts < ts:
        out.append(await asyncio.wait_for(scanner.__anext__(), 10))
    return out


async def test_without_open_transactions_it_is_the_end_of_the_log(manager: WALManager) -> None:
    swal = await _open(manager)
    try:
        await swal.append(data("v", b"old"))
        latest = swal.latest_position()
        assert latest is not None
        assert latest == Position("p", swal.wal.last_id, swal.wal.last_timetick)
        scanner = _resume(swal, latest)
        new = await swal.append(data("v", b"new"))
        got = flat(await _until(scanner, new.timetick))
        assert [m.payload for m in got if m.message_type is MessageType.DATA] == [b"new"]
        await scanner.aclose()
    finally:
        await swal.aclose()


async def test_an_open_transaction_holds_it_back_to_its_begin(manager: WALManager) -> None:
    swal = await _open(manager)
    try:
        await swal.append(data("v", b"before"))
        ctx, begin = await swal.begin_txn("v", keepalive_ms=60_000)
        await swal.append(_body(ctx, b"in the transaction"))
        after = await swal.append(data("w", b"after"))  # the log's end now lies past the BeginTxn

        latest = swal.latest_position()
        assert latest is not None
        assert latest.message_id <= begin.message_id < after.message_id
        assert latest.timetick >= after.timetick  # what was committed before is behind it, by time

        scanner = _resume(swal, latest)
        commit = await swal.commit_txn(ctx.txn_id)
        marker = await swal.append(data("v", b"marker"))
        got = flat(await _until(scanner, marker.timetick))
        # The transaction, whole and at its commit; nothing from before the position.
        assert [m.payload for m in got if m.message_type is MessageType.DATA] == [b"in the transaction", b"marker"]
        assert [m.message_type for m in got if m.txn is not None] == [
            MessageType.BEGIN_TXN, MessageType.DATA, MessageType.COMMIT_TXN]
        await scanner.aclose()

        # Committed: nothing holds it back any more.
        latest = swal.latest_position()
        assert latest is not None and latest.message_id == swal.wal.last_id > commit.message_id
    finally:
        await swal.aclose()
