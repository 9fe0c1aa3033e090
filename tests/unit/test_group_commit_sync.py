"""Where the fsync of a durable commit runs: with the write for a lone small append (on the event loop
while such writes are fast, else on the writer thread), pipelined otherwise.

Both must acknowledge only after the sync, in commit order; these tests watch the backend's calls.
"""

from __future__ import annotations

import asyncio
import pathlib
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from wal import WAL, Message, MessageType, WALManager
from wal.backends.rocks import RocksBackend


class _Recorder:
    """Wraps the backend's write and sync: records (what, durable flag) and the writing thread, can
    hold a sync and slow every write down."""

    def __init__(self, backend: RocksBackend) -> None:
        self.calls: list[tuple[str, bool]] = []
        self.threads: list[int] = []
        self.write_delay = 0.0
        self.release_sync = threading.Event()
        self.release_sync.set()
        write, sync = backend.write, backend.sync

        def recording_write(groups: Any, durable: bool) -> None:
            time.sleep(self.write_delay)
            write(groups, durable)
            self.calls.append(("write", durable))
            self.threads.append(threading.get_ident())

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


async def test_a_lone_small_append_is_written_and_synced_on_the_loop(opened: tuple[WAL, _Recorder]) -> None:
    wal, rec = opened
    for _ in range(3):
        await wal.append(_msg(100))
    assert rec.calls == [("write", True)] * 3, "durable write in one call, no separate sync"
    assert rec.threads == [threading.get_ident()] * 3, "no thread hand-off"


async def test_a_slow_disk_sends_lone_appends_to_the_writer_thread_until_it_is_fast_again(
    opened: tuple[WAL, _Recorder]
) -> None:
    wal, rec = opened
    loop_thread = threading.get_ident()
    rec.write_delay = 0.01  # far over the inline limit: one such write moves the average over it
    for _ in range(3):
        await wal.append(_msg(100))
    assert rec.threads[0] == loop_thread and loop_thread not in rec.threads[1:]
    rec.write_delay = 0.0
    for _ in range(60):
        await wal.append(_msg(100))
        if rec.threads[-1] == loop_thread:
            break
    assert rec.threads[-1] == loop_thread, "fast writes bring lone appends back to the loop"
    assert rec.calls == [("write", True)] * len(rec.calls)


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


async def test_a_lone_append_waits_behind_other_work_on_the_writer_thread(opened: tuple[WAL, _Recorder]) -> None:
    # A backup or a truncation on the writer thread stays ordered with the appends around it: while
    # one runs, a lone append is not written on the loop beside it.
    wal, rec = opened
    backend = wal._manager.backend
    put_meta = backend.put_meta
    running = threading.Event()

    def slow_put_meta(key: int, name: str, value: bytes) -> None:
        running.set()
        time.sleep(0.2)
        put_meta(key, name, value)
        rec.calls.append(("put_meta", True))

    backend.put_meta = slow_put_meta  # type: ignore[method-assign]
    meta = asyncio.ensure_future(wal.put_meta("m", b"1"))
    while not running.is_set():
        await asyncio.sleep(0.005)
    await wal.append(_msg(100))
    await meta
    assert rec.calls == [("put_meta", True), ("write", True)]
    assert rec.threads[-1] != threading.get_ident()
    await wal.append(_msg(100))  # and with the writer free again, back on the loop
    assert rec.threads[-1] == threading.get_ident()
