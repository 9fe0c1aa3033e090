"""Builders for hand-made messages and a helper that drains a scanner up to a time tick."""

from __future__ import annotations

import asyncio

from wal import Message, MessageType, MsgPack, Scanner, TxnContext, new_time_tick

PHYS = 1 << 18  # one millisecond in hybrid timestamp units


def ins(vchannel: str, ts: int, payload: bytes = b"row", **props: str) -> Message:
    return Message(MessageType.INSERT, vchannel, payload, dict(props), timetick=ts)


def data(vchannel: str, payload: bytes = b"row", **props: str) -> Message:
    """A plain log record (no schema): what the chain accepts without a collection."""
    return Message(MessageType.DATA, vchannel, payload, dict(props))


def tick(ts: int) -> Message:
    return new_time_tick(ts)


def txn_msg(kind: MessageType, vchannel: str, ts: int, txn_id: int, keepalive_ms: int = 0,
            payload: bytes = b"") -> Message:
    return Message(kind, vchannel, payload, timetick=ts, txn=TxnContext(txn_id, keepalive_ms))


def begin(vchannel: str, ts: int, txn_id: int, keepalive_ms: int = 0) -> Message:
    return txn_msg(MessageType.BEGIN_TXN, vchannel, ts, txn_id, keepalive_ms)


def body(vchannel: str, ts: int, txn_id: int, payload: bytes = b"b", keepalive_ms: int = 0) -> Message:
    return txn_msg(MessageType.INSERT, vchannel, ts, txn_id, keepalive_ms, payload)


def commit(vchannel: str, ts: int, txn_id: int) -> Message:
    return txn_msg(MessageType.COMMIT_TXN, vchannel, ts, txn_id)


def rollback(vchannel: str, ts: int, txn_id: int) -> Message:
    return txn_msg(MessageType.ROLLBACK_TXN, vchannel, ts, txn_id)


async def packs_until(scanner: Scanner, end_ts: int, timeout: float = 5.0) -> list[MsgPack]:
    """Read packs until one ends at or after ``end_ts``."""
    out: list[MsgPack] = []

    async def run() -> None:
        async for pack in scanner:
            out.append(pack)
            if pack.end_ts >= end_ts:
                return

    await asyncio.wait_for(run(), timeout)
    return out


def flat(packs: list[MsgPack]) -> list[Message]:
    return [m for p in packs for m in p.messages]
