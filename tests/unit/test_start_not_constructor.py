"""Owners start their tasks in ``start()``, never in a constructor: building one runs nothing."""

from __future__ import annotations

import asyncio

import pytest

from interceptors.chain import build_chain
from interceptors.recovery.streaming_wal import ChainConfig, StreamingWAL, default_interceptors
from streamingnode.client import Consumer
from wal import Message, MessageType, OnShutdownError, WALManager


def _tasks() -> set[asyncio.Task[object]]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


async def test_streaming_wal_recovers_only_once_started(manager: WALManager) -> None:
    await manager.create_channel("p")
    wal = await manager.open("p")
    config = ChainConfig()
    steps, timetick, txns, shard = default_interceptors(wal, config)
    chain = build_chain(steps, wal.append_batch)
    before = _tasks()
    stream = StreamingWAL(wal, chain, timetick=timetick, txns=txns, shard=shard, config=config)
    try:
        assert _tasks() == before  # the constructor started nothing
        with pytest.raises(OnShutdownError, match="not started"):
            await stream.append(Message(MessageType.DATA, "v", b"x"))
        with pytest.raises(OnShutdownError, match="not started"):
            await stream.ready()
        stream.start()
        stream.start()  # idempotent: one recovery
        await stream.ready()
        result = await stream.append(Message(MessageType.DATA, "v", b"x"))
        assert result.timetick > 0
    finally:
        await stream.aclose()


async def test_a_consumer_reads_only_once_started() -> None:
    before = _tasks()
    consumer = Consumer(None, "p", "v")  # type: ignore[arg-type]  (no stub: it must not be used)
    assert _tasks() == before
    await consumer.aclose()  # closing one that never started is fine, and it stays unstarted
    consumer.start()
    assert _tasks() == before and consumer.closed
