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

from tests.waiting import until
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
    # Which thread writes must not depend on how fast this machine's disk is right now: every write
    # counts as fast unless a test says otherwise.
    manager._committer.inline_max_seconds = 10.0
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
    # A limit of 20 ms: one 200 ms write moves the moving average (1/8 per write) over it, and real
    # writes, even on a loaded disk, bring it back under.
    wal._committer.inline_max_seconds = 0.02
    rec.write_delay = 0.2
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
    committer = wal._committer
    big = asyncio.ensure_future(wal.append(_msg(256 << 10)))
    await until(lambda: committer.commits == 1, "the large append's write")
    assert rec.calls == [("write", False)], "written without sync, the sync goes to the sync thread"
    small = asyncio.ensure_future(wal.append(_msg(10)))
    await until(lambda: committer.commits == 2, "the small append's write")
    for _ in range(3):  # an acknowledgement made with the write would reach the callers by now
        await asyncio.sleep(0)
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
    release = threading.Event()

    def held_put_meta(key: int, name: str, value: bytes) -> None:
        running.set()
        if not release.wait(10):
            raise AssertionError("put_meta was held for 10 s")
        put_meta(key, name, value)
        rec.calls.append(("put_meta", True))

    backend.put_meta = held_put_meta  # type: ignore[method-assign]
    meta = asyncio.ensure_future(wal.put_meta("m", b"1"))
    await until(running.is_set, "put_meta to run on the writer thread")
    append = asyncio.ensure_future(wal.append(_msg(100)))
    await until(lambda: wal._next_alloc == 1, "the committer to take the append")
    release.set()
    await asyncio.wait_for(append, 10)
    await meta
    assert rec.calls == [("put_meta", True), ("write", True)]
    assert rec.threads[-1] != threading.get_ident()
    await wal.append(_msg(100))  # and with the writer free again, back on the loop
    assert rec.threads[-1] == threading.get_ident()
