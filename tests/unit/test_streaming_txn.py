"""Transactions through the whole chain: whole at commit, or never."""

from __future__ import annotations

import asyncio

import pytest

from interceptors.recovery.streaming_wal import ChainConfig, StreamingWAL, open_streaming_wal
from tests import waiting
from tests.conftest import ManagerFactory
from tests.factories import data, flat
from tests.waiting import persisted_tick, ticks_pass
from wal import (
    DeliverPolicy,
    InvalidTxnStateError,
    Message,
    MessageType,
    MsgPack,
    ReadOption,
    Scanner,
    TxnExpiredError,
    WALManager,
)

FAST = ChainConfig(tick_interval=0.02)


async def _open(manager: WALManager, name: str = "p") -> StreamingWAL:
    if name not in await manager.list_channels():
        await manager.create_channel(name)
    swal = await open_streaming_wal(manager, name, FAST)
    await swal.ready()
    return swal


def body(vchannel: str, ctx: object, payload: bytes) -> Message:
    return Message(MessageType.DATA, vchannel, payload, txn=ctx)  # type: ignore[arg-type]


async def until(scanner: Scanner, ts: int) -> list[MsgPack]:
    out: list[MsgPack] = []
    while not out or out[-1].end_ts < ts:
        out.append(await asyncio.wait_for(scanner.__anext__(), 5))
    return out


async def test_commit_delivers_all_bodies_together_at_the_commit_timestamp(manager: WALManager) -> None:
    swal = await _open(manager)
    scanner = swal.read(ReadOption(vchannel="v", deliver_policy=DeliverPolicy.latest()))
    ctx, _ = await swal.begin_txn("v", keepalive_ms=10_000)
    await swal.append_batch([body("v", ctx, b"a"), body("v", ctx, b"b")])
    plain = await swal.append(data("v", b"plain"))
    await ticks_pass(swal, 3)  # the open transaction must not leak out with them
    await swal.append(body("v", ctx, b"c"))
    commit = await swal.commit_txn(ctx.txn_id)
    packs = await until(scanner, commit.timetick)
    got = flat(packs)
    assert [m.payload for m in got if m.message_type is MessageType.DATA] == [b"plain", b"a", b"b", b"c"]
    txn_pack = next(p for p in packs if any(m.txn for m in p.messages))
    assert [m.message_type for m in txn_pack.messages if m.txn] == [
        MessageType.BEGIN_TXN, MessageType.DATA, MessageType.DATA, MessageType.DATA, MessageType.COMMIT_TXN]
    assert txn_pack.end_ts >= commit.timetick > plain.timetick
    await swal.aclose()


async def test_rollback_and_expiry_deliver_nothing(manager: WALManager) -> None:
    swal = await _open(manager)
    scanner = swal.read(ReadOption(deliver_policy=DeliverPolicy.latest()))
    rolled, _ = await swal.begin_txn("v", keepalive_ms=10_000)
    await swal.append(body("v", rolled, b"rolled"))
    await swal.rollback_txn(rolled.txn_id)
    expiring, _ = await swal.begin_txn("v", keepalive_ms=30)
    await swal.append(body("v", expiring, b"expired"))
    await waiting.until(lambda: swal.txns.min_open_begin_id() is None, "ticks to move past its keepalive")
    with pytest.raises(TxnExpiredError):
        await swal.commit_txn(expiring.txn_id)
    marker = await swal.append(data("v", b"marker"))
    got = flat(await until(scanner, marker.timetick))
    assert [m.payload for m in got if m.message_type is MessageType.DATA] == [b"marker"]
    await swal.aclose()


async def test_exclusive_ddl_fails_the_open_transactions_of_its_vchannel(manager: WALManager) -> None:
    swal = await _open(manager)
    on_v, _ = await swal.begin_txn("v", keepalive_ms=10_000)
    on_w, _ = await swal.begin_txn("w", keepalive_ms=10_000)
    await swal.append(Message(MessageType.MANUAL_FLUSH, "v"))
    with pytest.raises(InvalidTxnStateError):
        await swal.append(body("v", on_v, b"late"))
    with pytest.raises(InvalidTxnStateError):
        await swal.commit_txn(on_v.txn_id)
    await swal.append(body("w", on_w, b"fine"))
    await swal.commit_txn(on_w.txn_id)  # another vchannel is untouched
    await swal.aclose()


async def test_scanner_started_mid_transaction_sees_it_whole(manager: WALManager) -> None:
    swal = await _open(manager)
    ctx, begin = await swal.begin_txn("v", keepalive_ms=10_000)
    await swal.append(body("v", ctx, b"first"))
    await persisted_tick(swal)  # in the time index, after the BeginTxn
    # A reader that starts at a time after the BeginTxn: the time index points it back to the
    # transaction's start (last confirmed), so it still sees the transaction whole.
    scanner = swal.read(ReadOption(deliver_policy=DeliverPolicy.start_at_time(swal.timetick.last_tick)))
    await swal.append(body("v", ctx, b"second"))
    commit = await swal.commit_txn(ctx.txn_id)
    got = [m for m in flat(await until(scanner, commit.timetick)) if m.txn]
    assert [m.message_type for m in got] == [
        MessageType.BEGIN_TXN, MessageType.DATA, MessageType.DATA, MessageType.COMMIT_TXN]
    assert got[0].message_id == begin.message_id
    await swal.aclose()


async def test_reopen_rolls_back_what_the_previous_owner_left_open(open_manager: ManagerFactory) -> None:
    m = await open_manager()
    swal = await _open(m)
    ctx, _ = await swal.begin_txn("v", keepalive_ms=0)  # no expiry: only the rollback can end it
    await swal.append(body("v", ctx, b"orphan"))
    await swal.aclose()
    await m.aclose()
    m2 = await open_manager()
    swal2 = await _open(m2)
    with pytest.raises(TxnExpiredError):
        await swal2.append(body("v", ctx, b"too late"))
    marker = await swal2.append(data("v", b"marker"))
    stored = await swal2.wal.read_stored(0)
    assert any(x.message_type is MessageType.ROLLBACK_TXN and x.txn and x.txn.txn_id == ctx.txn_id for x in stored)
    got = flat(await until(swal2.read(), marker.timetick))
    assert [x.payload for x in got if x.message_type is MessageType.DATA] == [b"marker"]
    await swal2.aclose()
