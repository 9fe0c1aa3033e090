"""A full disk at each write step: journal writev, RocksDB write, Parquet write, rename.

Each fault is injected in-process (a real full disk is in tests/integration/test_disk_full.py).  The
write must fail cleanly with the retriable STORAGE_FULL, leave no half journal record and no Parquet
temporary behind, lose nothing acknowledged, and the next write must succeed once the fault is lifted,
on the same open WAL (no reopen by the caller).  A failed *sync* stays final: that is
tests/unit/test_durability.py's; here the contrast with a failed write is pinned too.
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import structlog.testing

from flusher import Flusher, FlusherConfig
from flusher.commit import commit_file, remove_temporaries
from flusher.flusher import FlusherState
from interceptors.recovery.streaming_wal import ChainConfig, open_streaming_wal
from streamingnode.node.disk_guard import StorageMonitor, free_bytes
from tests.reopening import SCHEMA, rows
from wal import Message, MessageType, StorageFullError, UnrecoverableError, WALManager, bodies
from wal.backends import _journal
from wal.backends.rocks import RocksBackend
from wal.errors import ErrorCode

ROCKS_FULL = "IO error: No space left on device: While appending to file: {}/000042.sst: No space left on device"


def _msg(i: int, size: int = 100) -> Message:
    return Message(MessageType.DATA, "v", b"%06d" % i + b"x" * size)


@pytest.fixture
async def manager(tmp_path: Path) -> AsyncIterator[WALManager]:
    m = await WALManager.start_rocksdb(tmp_path / "db")
    try:
        yield m
    finally:
        await m.aclose()


def _backend(manager: WALManager) -> RocksBackend:
    backend = manager.backend
    assert isinstance(backend, RocksBackend)
    return backend


def _journal_bytes(backend: RocksBackend) -> int:
    """The bytes the journal's records take: each file up to its last non-zero byte (a file is
    zero-written ahead of its records; a version 2 record never ends with a zero)."""
    total = 0
    for p in _journal.files(backend._journal_dir):
        with open(p, "rb") as f:
            total += len(f.read().rstrip(b"\0"))
    return total


async def _payloads(manager: WALManager, name: str) -> list[bytes]:
    wal = manager._wals[name]
    out: list[bytes] = []
    nid = wal.first_id
    while nid < wal.next_id:
        got = await wal.read_stored(nid)
        assert got, f"nothing stored from {nid}"
        out += [m.payload for m in got if m.message_type is MessageType.DATA]
        nid = got[-1].message_id + 1  # type: ignore[operator]
    return out


# --- journal writev ---------------------------------------------------------------------------------
class FullJournal:
    """``os.writev`` that, while armed, writes part of what it is given (a short write), then fails
    with ENOSPC: what a filling disk answers."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed = False
        self.failures = 0
        real = os.writev

        def writev(fd: int, buffers: Any) -> int:
            if not self.armed:
                return real(fd, buffers)
            if self.failures % 2 == 0:
                self.failures += 1
                first = bytes(buffers[0])
                return real(fd, [first[: max(1, len(first) // 2)]])
            self.failures += 1
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "writev", writev)


@pytest.mark.parametrize("size", [100, 256 << 10], ids=["lone-write", "pipelined"])
async def test_a_full_disk_at_the_journal_write_fails_cleanly_and_the_next_write_succeeds(
    manager: WALManager, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    backend = _backend(manager)
    await manager.create_channel("p")
    wal = await manager.open("p")
    acked = [_msg(i, size) for i in range(3)]
    for m in acked:
        await wal.append(m)
    disk = FullJournal(monkeypatch)
    before_bytes, before_id = _journal_bytes(backend), wal.next_id
    disk.armed = True
    with pytest.raises(StorageFullError) as failed:
        await asyncio.wait_for(wal.append(_msg(99, size)), 10)
    assert failed.value.retriable and failed.value.code is ErrorCode.STORAGE_FULL
    assert disk.failures >= 2, "the short write was not followed up: the error does not name the full disk"
    # Nothing of the failed record stays in the journal, and no id was used up.
    assert _journal_bytes(backend) == before_bytes
    assert wal.next_id == before_id

    disk.armed = False
    later = _msg(3, size)
    await asyncio.wait_for(wal.append(later), 10)  # the same WAL, not reopened
    assert later.message_id == before_id
    assert await _payloads(manager, "p") == [m.payload for m in (*acked, later)]


async def test_a_journal_that_cannot_be_cut_back_refuses_every_later_write(
    manager: WALManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Half a record that cannot be removed must never have records after it (replay would call the
    # file damaged): that failure is final, as a failed sync is.
    await manager.create_channel("p")
    wal = await manager.open("p")
    await wal.append(_msg(0))
    disk = FullJournal(monkeypatch)
    disk.armed = True

    def ftruncate(fd: int, length: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "ftruncate", ftruncate)
    with pytest.raises(UnrecoverableError):
        await asyncio.wait_for(wal.append(_msg(1)), 10)
    disk.armed = False
    monkeypatch.undo()
    with pytest.raises(UnrecoverableError):
        await asyncio.wait_for(wal.append(_msg(2)), 10)


# --- RocksDB write ----------------------------------------------------------------------------------
class StoppedRocks:
    """Stands in for the backend's database: once tripped, every write, flush and close fails with
    RocksDB's full-disk error, and keeps failing after space returns, as RocksDB does (it stops on a
    failed write of its own until it is reopened).  Reads still work."""

    def __init__(self, backend: RocksBackend) -> None:
        self._real = backend._db
        self._error = ROCKS_FULL.format(backend.path)
        self.tripped = False
        backend._db = self

    def _fail_if_tripped(self) -> None:
        if self.tripped:
            raise Exception(self._error)  # rocksdict raises plain Exception

    def write(self, *args: Any) -> None:
        self._fail_if_tripped()
        self._real.write(*args)

    def put(self, *args: Any) -> None:
        self._fail_if_tripped()
        self._real.put(*args)

    def flush(self, *args: Any) -> None:
        self._fail_if_tripped()
        self._real.flush(*args)

    def flush_wal(self, *args: Any) -> None:
        self._fail_if_tripped()
        self._real.flush_wal(*args)

    def close(self) -> None:
        self._real.close()
        self._fail_if_tripped()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


async def test_a_full_disk_in_rocksdb_fails_cleanly_and_the_database_comes_back_without_a_reopen(
    manager: WALManager,
) -> None:
    backend = _backend(manager)
    await manager.create_channel("p")
    wal = await manager.open("p")
    acked = [_msg(i) for i in range(3)]
    for m in acked:
        await wal.append(m)
    stopped = StoppedRocks(backend)
    stopped.tripped = True
    before_bytes, before_id = _journal_bytes(backend), wal.next_id
    with pytest.raises(StorageFullError) as failed:
        await asyncio.wait_for(wal.append(_msg(99)), 10)
    assert failed.value.retriable
    assert _journal_bytes(backend) == before_bytes, "the failed write stayed in the journal"
    assert wal.next_id == before_id

    # Space returns; the database would stay stopped if it were not reopened under the WAL.
    backend._last_reopen = 0.0
    later = _msg(3)
    await asyncio.wait_for(wal.append(later), 10)
    assert backend._db is not stopped, "the stopped database was not reopened"
    assert later.message_id == before_id
    assert await _payloads(manager, "p") == [m.payload for m in (*acked, later)]


async def test_a_stopped_database_is_retried_at_most_once_a_second(manager: WALManager) -> None:
    backend = _backend(manager)
    await manager.create_channel("p")
    wal = await manager.open("p")
    await wal.append(_msg(0))
    stopped = StoppedRocks(backend)
    stopped.tripped = True
    with pytest.raises(StorageFullError):
        await wal.append(_msg(1))
    backend._last_reopen = asyncio.get_running_loop().time() + 3600  # the last attempt was "just now"
    with pytest.raises(StorageFullError, match="reopened once space is free"):
        await wal.append(_msg(1))
    assert backend._db is stopped


async def test_closing_after_a_full_disk_does_not_raise_and_loses_nothing(tmp_path: Path) -> None:
    manager = await WALManager.start_rocksdb(tmp_path / "db")
    await manager.create_channel("p")
    wal = await manager.open("p")
    acked = [_msg(i) for i in range(5)]
    for m in acked:
        await wal.append(m)
    stopped = StoppedRocks(_backend(manager))
    stopped.tripped = True
    with pytest.raises(StorageFullError):
        await wal.append(_msg(99))
    await manager.aclose()  # what SIGTERM runs: it raised RocksDB's error before

    again = await WALManager.start_rocksdb(tmp_path / "db")
    try:
        await again.open("p")
        assert await _payloads(again, "p") == [m.payload for m in acked]
    finally:
        await again.aclose()


# --- Parquet write and rename ------------------------------------------------------------------------
def _full(*args: Any) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_while_writing_a_parquet_file_leaves_no_temporary(tmp_path: Path) -> None:
    def half_then_full(f: Any) -> None:
        f.write(b"PAR1 partial")
        _full()

    with pytest.raises(OSError, match="No space"):
        commit_file(tmp_path, "a.parquet", half_then_full)
    assert os.listdir(tmp_path) == []
    assert remove_temporaries(tmp_path) == 0
    commit_file(tmp_path, "a.parquet", lambda f: f.write(b"whole"))  # space is back: same name, whole
    assert (tmp_path / "a.parquet").read_bytes() == b"whole"


def test_a_full_disk_at_the_rename_leaves_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "replace", _full)
    with pytest.raises(OSError, match="No space"):
        commit_file(tmp_path, "a.parquet", lambda f: f.write(b"whole"))
    assert os.listdir(tmp_path) == []
    monkeypatch.undo()
    commit_file(tmp_path, "a.parquet", lambda f: f.write(b"whole"))
    assert os.listdir(tmp_path) == ["a.parquet"]


# --- the monitor --------------------------------------------------------------------------------------
class FakeVolume:
    def __init__(self, free: int) -> None:
        self.free = free

    def statvfs(self, path: str) -> os.statvfs_result:
        # f_bsize, f_frsize, f_blocks, f_bfree, f_bavail, f_files, f_ffree, f_favail, f_flag, f_namemax
        return os.statvfs_result((4096, 1, 1 << 40, self.free, self.free, 0, 0, 0, 0, 255))


async def test_the_monitor_refuses_under_the_mark_relieves_and_resumes_above_it(tmp_path: Path) -> None:
    volume = FakeVolume(10 << 20)
    refusals: list[Any] = []
    reliefs: list[int] = []

    async def relieve() -> None:
        reliefs.append(1)

    monitor = StorageMonitor({"data": tmp_path, "parquet": tmp_path / "not-yet"}, 4 << 20,
                             refuse=refusals.append, relieve=relieve, statvfs=volume.statvfs)
    await monitor.check()
    assert refusals == [] and monitor.low is None and monitor.free == {"data": 10 << 20, "parquet": 10 << 20}
    volume.free = (4 << 20) - 1
    await monitor.check()
    (err,) = refusals
    assert isinstance(err, StorageFullError) and err.retriable and "storage_min_free_bytes" in str(err)
    assert err.fields["volume"] == "data" and monitor.low == "data"
    await asyncio.sleep(0)  # the relief task runs
    assert reliefs == [1] and monitor.reliefs == 1
    volume.free = 4 << 20  # at the mark, not above it by the margin: still refused
    await monitor.check()
    assert len(refusals) == 1 and monitor.low == "data"
    volume.free = (4 << 20) + monitor.hysteresis
    await monitor.check()
    assert refusals[-1] is None and monitor.low is None
    await monitor.aclose()


def test_free_bytes_reads_the_nearest_existing_directory(tmp_path: Path) -> None:
    assert free_bytes(tmp_path / "a" / "b") == free_bytes(tmp_path) > 0


async def test_appends_are_refused_while_the_manager_refuses_but_ticks_and_flushes_pass(manager: WALManager) -> None:
    await manager.create_channel("p")
    wal = await manager.open("p")
    manager.refuse_appends(StorageFullError("full", volume="data"))
    with pytest.raises(StorageFullError) as refused:
        await wal.append(_msg(0))
    assert refused.value.fields == {"volume": "data", "channel": "p"}
    await wal.append(Message(MessageType.TIME_TICK, timetick=wal.last_timetick + 1))
    await wal.append(Message(MessageType.MANUAL_FLUSH, "v"))
    assert manager.refused_appends == 1
    manager.refuse_appends(None)
    await wal.append(_msg(1))


# --- the flusher on a full disk -----------------------------------------------------------------------
async def test_a_flusher_that_meets_a_full_disk_waits_for_space_instead_of_stopping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = await WALManager.start_rocksdb(tmp_path / "db")
    await manager.create_channel("p")
    swal = await open_streaming_wal(manager, "p", ChainConfig(tick_interval=0.01))
    await swal.ready()
    root = tmp_path / "out"
    failures: list[str] = []
    real_replace = os.replace

    def replace(src: Any, dst: Any) -> None:
        if str(dst).endswith(".parquet") and len(failures) < 3:
            failures.append(str(dst))
            _full()
        real_replace(src, dst)

    f = Flusher(swal, root, FlusherConfig())
    await f.start()
    try:
        await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
        await swal.append(bodies.insert("v", "c", rows(0, 10)))
        monkeypatch.setattr(os, "replace", replace)
        with structlog.testing.capture_logs() as logs:
            files = await asyncio.wait_for(f.flush("v"), 60)  # written once the disk takes it again
        assert len(failures) == 3 and f.state is FlusherState.RUNNING
        # Backing off from 0.1 s, doubling (up to 5 s): one warning per failure, naming the pause.
        assert [e["retry_seconds"] for e in logs if "disk is full" in e["event"]] == [0.1, 0.2, 0.4]
        assert files and all((root / name).is_file() for name in files)
        assert not [p for p in root.rglob("*") if p.name.endswith(".tmp")], "a temporary stayed behind"
        assert pq.read_table(root / files[0]).num_rows == 10
    finally:
        await f.aclose()
        await swal.aclose()
        await manager.aclose()
