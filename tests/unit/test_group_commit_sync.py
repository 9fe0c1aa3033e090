"""Where the fsync of a durable commit runs: inline for a lone small append, pipelined otherwise.

Both must acknowledge only after the sync, in commit order; these tests watch the backend's calls.
"""

from __future__ import annotations

import asyncio
import pathlib
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest

from wal import WAL, Message, MessageType, WALManager
from wal.backends.rocks import RocksBackend


class _Recorder:
    """Wraps the backend's write and sync: records (what, durable flag, thread) and can hold a sync."""

    def __init__(self, backend: RocksBackend) -> None:
        self.calls: list[tuple[str, bool]] = []
        self.release_sync = threading.Event()
        self.release_sync.set()
        write, sync = backend.write, backend.sync

        def recording_write(groups: Any, durable: bool) -> None:
            write(groups, durable)
            self.calls.append(("write", durable))

        def recording_sync() -> None:
            self.release_sync.wait(10)
            sync()
            self.calls.append(("sync", True))

        backend.write = recording_write  # type: ignore[method-assign]
        backend.sync = recording_sync  # type: ignore[method-assign]


@pytest.fixture
async def opened(tmp_path: pathlib.Path) -> AsyncIterator[tuple[WAL, _Recorder]]:
    """Pchannel ``p`` of a RocksDB manager (pipelined sync), its backend's calls recorded from here."""
    manager = await WALManager.start_rocksdb(tmp_path / "db")
    assert isinstance(manager.backend, RocksBackend) and manager.backend.split_sync
    rec = _Recorder(manager.backend)
    try:
        await manager.create_channel("p")
        wal = await manager.open("p")
        rec.calls.clear()
        yield wal, rec
    finally:
        rec.release_sync.set()
        await manager.aclose()


def _msg(size: int) -> Message:
    return Message(MessageType.DATA, "v", b"x" * size)


async def test_a_lone_small_append_is_synced_by_the_writer_itself(opened: tuple[WAL, _Recorder]) -> None:
    wal, rec = opened
    for _ in range(3):
        await wal.append(_msg(100))
    assert rec.calls == [("write", True)] * 3, "durable write in one call, no separate sync"


async def test_a_large_append_is_acknowledged_only_after_the_pipelined_sync(opened: tuple[WAL, _Recorder]) -> None:
    wal, rec = opened
    rec.release_sync.clear()  # the sync thread blocks until released
    big = asyncio.ensure_future(wal.append(_msg(256 << 10)))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if rec.calls:
            break
    assert rec.calls == [("write", False)], "written without sync, the sync goes to the sync thread"
    small = asyncio.ensure_future(wal.append(_msg(10)))
    await asyncio.sleep(0.1)
    assert not big.done() and not small.done(), "nothing is acknowledged before its sync"
    assert ("write", True) not in rec.calls, "with a sync in flight a small append is pipelined too"
    rec.release_sync.set()
    first, second = await asyncio.wait_for(asyncio.gather(big, small), 10)
    assert first.message_id < second.message_id
    assert rec.calls == [("write", False), ("write", False), ("sync", True), ("sync", True)]
