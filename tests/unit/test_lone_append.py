"""A lone append on an idle node: written on the loop once the loop has run every callback that was
ready when it came (without a wake-up of the committer's run task), and kept there when no other
append came meanwhile even when the disk is slower than the usual inline limit.

Grouping must survive both: appends of many tasks ready at once still share writes.
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


class _Threads:
    """Records which thread runs each backend write (durable flag too)."""

    def __init__(self, backend: RocksBackend) -> None:
        self.writes: list[tuple[int, bool]] = []
        write = backend.write

        def recording_write(groups: Any, durable: bool) -> None:
            write(groups, durable)
            self.writes.append((threading.get_ident(), durable))

        backend.write = recording_write  # type: ignore[method-assign]


@pytest.fixture
async def opened(tmp_path: pathlib.Path) -> AsyncIterator[tuple[WAL, _Threads]]:
    manager = await WALManager.start_rocksdb(tmp_path / "db")
    # The disk's speed must decide nothing: every write counts as fast unless a test says otherwise.
    manager._committer.inline_max_seconds = 10.0
    rec = _Threads(manager.backend)  # type: ignore[arg-type]
    try:
        await manager.create_channel("p")
        wal = await manager.open("p")
        rec.writes.clear()
        yield wal, rec
    finally:
        await manager.aclose()


def _msg() -> Message:
    return Message(MessageType.DATA, "v", b"x" * 100)


async def test_a_lone_append_on_an_idle_loop_is_written_after_the_ready_callbacks_without_waking_the_run_task(
    opened: tuple[WAL, _Threads],
) -> None:
    wal, rec = opened
    committer = wal._committer
    await asyncio.sleep(0)  # the committer's run task parks
    msg = _msg()
    first = wal._next_alloc
    fut = committer.submit(wal, [msg], 164)
    # Not yet: the callbacks ready now run first (their appends would join this one).
    assert not fut.done() and rec.writes == []
    await asyncio.sleep(0)
    assert fut.done() and fut.exception() is None
    assert msg._id == first and wal._next_alloc == first + 1
    assert rec.writes == [(threading.get_ident(), True)], "one durable write, on the loop"
    assert not committer._wake.is_set(), "the run task was not woken"
    got = await wal.append(_msg())
    assert got.message_id == first + 1 and len(rec.writes) == 2


async def test_an_append_of_a_task_ready_meanwhile_joins_the_lone_one(opened: tuple[WAL, _Threads]) -> None:
    wal, rec = opened
    committer = wal._committer
    await asyncio.sleep(0)
    before = committer.commits
    results = await asyncio.gather(wal.append(_msg()), wal.append(_msg()))
    assert [r.message_id for r in results] == [0, 1]
    assert committer.commits - before == 1 and len(rec.writes) == 1, "one write for both"


async def test_appends_of_many_ready_tasks_still_share_writes(opened: tuple[WAL, _Threads]) -> None:
    wal, _ = opened
    committer = wal._committer
    await asyncio.sleep(0)
    before = committer.commits
    results = await asyncio.gather(*(wal.append(_msg()) for _ in range(200)))
    assert sorted(r.message_id for r in results) == list(range(200))
    assert committer.commits - before < 100, "appends ready together are grouped, not written one by one"


async def test_a_slowish_disk_keeps_lone_writes_on_an_idle_loop_but_not_when_other_appends_come(
    opened: tuple[WAL, _Threads],
) -> None:
    wal, rec = opened
    committer = wal._committer
    loop_thread = threading.get_ident()
    # Slower than the inline limit, faster than the limit for an idle loop.
    committer.inline_max_seconds = 0.0
    committer.inline_idle_max_seconds = 10.0
    committer._lone_seconds = 0.001
    for _ in range(3):
        await wal.append(_msg())
    assert [t for t, _ in rec.writes] == [loop_thread] * 3, "nothing else to run: the loop writes"
    # Another append arriving while the loop runs what is ready: the two share one write, which is not
    # lone, and goes to the writer thread (a slowish write on the loop would delay the next ones).
    rec.writes.clear()
    committer._lone_seconds = 0.001
    await asyncio.gather(wal.append(_msg()), wal.append(_msg()))
    assert len(rec.writes) == 1 and rec.writes[0][0] != loop_thread, "a write of two is handed off"
    # A disk slower than both limits goes to the writer thread even on an idle loop.
    committer.inline_idle_max_seconds = 0.0005
    rec.writes.clear()
    committer._lone_seconds = 0.001
    started = time.perf_counter()
    await wal.append(_msg())
    assert rec.writes[0][0] != loop_thread, f"written on the loop ({time.perf_counter() - started:.4f} s)"
