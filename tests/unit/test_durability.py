"""What reaches the disk before an acknowledgement or a checkpoint, watched at the system calls.

A SIGKILL test cannot see a missing fsync: the page cache outlives the process.  These tests spy on
``os.writev``, ``os.fdatasync``, ``os.fsync`` and ``os.replace`` instead, and check at the moment of
each acknowledgement (or flusher checkpoint) that every byte it covers was synced, and every file it
names has a durable directory entry.  They also make the sync fail, which no real disk does on demand.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import stat
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from flusher import CHECKPOINT_META, Flusher, FlusherConfig
from interceptors.recovery.streaming_wal import ChainConfig, open_streaming_wal
from tests.reopening import SCHEMA, rows
from tests.waiting import until
from wal import ChannelFencedError, Message, MessageType, UnrecoverableError, WALManager, bodies
from wal.backends.rocks import RocksBackend

BIG = 256 << 10  # over the committer's lone-append limit: written, then synced on the sync thread
SMALL = 100  # a lone small append: written and synced in one durable write


def _msg(size: int, payload: bytes = b"x") -> Message:
    return Message(MessageType.DATA, "v", payload * size)


def _path_of(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


class FileCalls:
    """Records, per file, how many bytes ``writev`` wrote and how many a later sync covered; which
    files were created, and whether their directory was fsynced after that; renames in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.written: dict[str, int] = {}
        self.synced: dict[str, int] = {}
        self.created: dict[str, int] = {}  # path -> event index of its creation
        self.sizes: dict[str, int] = {}  # regular file -> its size when last synced
        self.events: list[tuple[str, str, str]] = []  # (what, path, other path)
        self.syncs = 0
        self._lock = threading.Lock()
        real_writev, real_fdatasync, real_fsync = os.writev, os.fdatasync, os.fsync
        real_open, real_replace = os.open, os.replace

        def writev(fd: int, buffers: Any) -> int:
            n = real_writev(fd, buffers)
            path = _path_of(fd)
            with self._lock:
                self.written[path] = self.written.get(path, 0) + n
            return n

        def syncing(real: Callable[[int], None]) -> Callable[[int], None]:
            def sync(fd: int) -> None:
                path = _path_of(fd)
                with self._lock:  # what was written before the call is what the call covers
                    upto = self.written.get(path, 0)
                real(fd)
                with self._lock:
                    self.synced[path] = max(self.synced.get(path, 0), upto)
                    self.syncs += 1
                    st = os.fstat(fd)
                    kind = "dirsync" if stat.S_ISDIR(st.st_mode) else "fsync"
                    if kind == "fsync":
                        self.sizes[path] = st.st_size
                    self.events.append((kind, path, ""))
            return sync

        def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            fd = real_open(path, flags, *args, **kwargs)
            if flags & os.O_CREAT:
                with self._lock:
                    self.created[_path_of(fd)] = len(self.events)
                    self.events.append(("create", _path_of(fd), ""))
            return fd

        def replace(src: Any, dst: Any, **kwargs: Any) -> None:
            real_replace(src, dst, **kwargs)
            with self._lock:
                self.events.append(("rename", os.path.realpath(src), os.path.realpath(dst)))

        monkeypatch.setattr(os, "writev", writev)
        monkeypatch.setattr(os, "fdatasync", syncing(real_fdatasync))
        monkeypatch.setattr(os, "fsync", syncing(real_fsync))
        monkeypatch.setattr(os, "open", open_)
        monkeypatch.setattr(os, "replace", replace)

    def dir_synced_after(self, directory: str, index: int) -> bool:
        return any(kind == "dirsync" and path == directory for kind, path, _ in self.events[index:])

    def check_journal_durable(self, what: str) -> None:
        """Every journal byte written so far is synced, in a file whose directory entry is synced."""
        with self._lock:
            assert self.written, "no journal write was seen: the spy watches nothing"
            for path, n in self.written.items():
                assert self.synced.get(path, 0) >= n, (
                    f"{what}: acknowledged with {n - self.synced.get(path, 0)} bytes of {path} not synced")
                assert path in self.created and self.dir_synced_after(os.path.dirname(path), self.created[path]), (
                    f"{what}: acknowledged while the directory entry of {path} was not synced")


@pytest.fixture
async def rocks_manager(tmp_path: Path) -> AsyncIterator[WALManager]:
    manager = await WALManager.start_rocksdb(tmp_path / "db")
    try:
        yield manager
    finally:
        await manager.aclose()


# --- the journal: fdatasync before the acknowledgement ----------------------------------------------
async def test_every_append_is_acknowledged_only_after_its_journal_bytes_are_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = FileCalls(monkeypatch)  # before the database opens: it creates the journal file
    manager = await WALManager.start_rocksdb(tmp_path / "db")
    try:
        await manager.create_channel("p")
        wal = await manager.open("p")
        # Lone small appends (one durable write) and large ones (write, then the pipelined sync),
        # interleaved, so that both paths are acknowledged here.
        for i, size in enumerate((SMALL, SMALL, BIG, SMALL, BIG, BIG, SMALL)):
            syncs = calls.syncs
            await wal.append(_msg(size))
            calls.check_journal_durable(f"append {i} ({size} bytes)")
            assert calls.syncs > syncs
        # And when a rotation moves the journal to a new file mid-run.
        backend = manager.backend
        assert isinstance(backend, RocksBackend)
        backend._journal_rotate_bytes = BIG
        for i in range(4):
            await wal.append(_msg(BIG))
            calls.check_journal_durable(f"append {i} after a rotation")
        assert len(calls.written) >= 2, "the journal was expected to move to a second file"
    finally:
        await manager.aclose()


# --- a failed sync ------------------------------------------------------------------------------------
class FailingSync:
    """``os.fdatasync`` that fails with EIO while armed, as a disk that lost the write does."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed = False
        self.failures = 0
        real = os.fdatasync

        def fdatasync(fd: int) -> None:
            if self.armed:
                self.failures += 1
                raise OSError(errno.EIO, "Input/output error")
            real(fd)

        monkeypatch.setattr(os, "fdatasync", fdatasync)


@pytest.mark.parametrize("size", [SMALL, BIG], ids=["lone-write", "pipelined-sync"])
async def test_a_failed_sync_acknowledges_nothing_and_every_later_append_fails_unrecoverable(
    rocks_manager: WALManager, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    manager = rocks_manager
    await manager.create_channel("p")
    await manager.create_channel("q")
    p, q = await manager.open("p"), await manager.open("q")
    await p.append(_msg(SMALL))
    await q.append(_msg(SMALL))
    disk = FailingSync(monkeypatch)
    before = p.next_id
    disk.armed = True
    # A lone small append syncs inside its durable write; two large ones go to the sync thread as one
    # commit, and neither may be acknowledged.
    appends = [p.append(_msg(size, b"a"))]
    if size == BIG:
        appends.append(p.append(_msg(size, b"b")))
    results = await asyncio.wait_for(asyncio.gather(*appends, return_exceptions=True), 10)
    assert disk.failures >= 1
    for r in results:
        assert isinstance(r, UnrecoverableError), f"acknowledged although its sync failed: {r!r}"
    assert p.next_id == before

    # The disk answers again, but what the failed sync left is unknown (the kernel may have dropped
    # the dirty pages): nothing more may be acknowledged until the WAL is reopened.
    disk.armed = False
    for wal, later in ((p, SMALL), (p, BIG), (q, SMALL), (q, BIG)):
        with pytest.raises(UnrecoverableError):
            await asyncio.wait_for(wal.append(_msg(later)), 10)
    assert p.next_id == before
    assert [m.payload for m in await p.read_stored(before - 1)] == [b"x" * SMALL], "nothing after the failure"


# --- the fence race -------------------------------------------------------------------------------
class HeldBackend:
    """Holds the backend's ``sync`` (or ``write``) on its thread until released, counting calls."""

    def __init__(self, backend: RocksBackend, what: str) -> None:
        self.release = threading.Event()
        self.entered = 0
        real = getattr(backend, what)

        def held(*args: Any) -> Any:
            self.entered += 1
            if not self.release.wait(10):
                raise AssertionError(f"{what} was held for 10 s")
            return real(*args)

        setattr(backend, what, held)


async def _assert_new_term_owns_its_ids(manager: WALManager, old_term: int, first_new_id: int) -> None:
    new = manager._wals["p"]
    assert new.term == old_term + 1 and new.next_id >= first_new_id
    await new.append(_msg(SMALL, b"n"))
    stored = await new.read_stored(first_new_id)
    assert stored and all(m.wal_term == new.term for m in stored), (
        f"old-term messages at or after the new term's first id {first_new_id}: "
        f"{[(m.message_id, m.wal_term) for m in stored if m.wal_term != new.term]}")


async def test_an_append_queued_behind_held_syncs_is_fenced_by_a_reopen(rocks_manager: WALManager) -> None:
    manager = rocks_manager
    await manager.create_channel("p")
    old = await manager.open("p")
    backend = manager.backend
    assert isinstance(backend, RocksBackend)
    hold = HeldBackend(backend, "sync")
    try:
        # Two commits in flight (the most the committer allows), their syncs held: the next append
        # waits in the queue.
        written = [asyncio.ensure_future(old.append(_msg(BIG)))]
        await until(lambda: hold.entered == 1, "the first sync")
        written.append(asyncio.ensure_future(old.append(_msg(BIG))))
        await until(lambda: old._next_alloc == 2, "the second write")
        queued = asyncio.ensure_future(old.append(_msg(SMALL, b"q")))
        await until(lambda: bool(manager._committer._queue), "the third append to be queued")
        new = await manager.open("p")
        first_new_id = new.next_id
    finally:
        hold.release.set()
    acked = await asyncio.wait_for(asyncio.gather(*written), 10)
    assert all(r.message_id < first_new_id for r in acked)
    with pytest.raises(ChannelFencedError):
        await asyncio.wait_for(queued, 10)
    await _assert_new_term_owns_its_ids(manager, old.term, first_new_id)


async def test_an_append_taken_while_a_reopen_waits_for_the_writer_is_fenced_or_lies_before_the_new_term(
    rocks_manager: WALManager,
) -> None:
    # The reopen's term change queues on the writer thread behind a write in progress; an append
    # queued meanwhile must not be written under the old term after the term changed.
    manager = rocks_manager
    await manager.create_channel("p")
    old = await manager.open("p")
    backend = manager.backend
    assert isinstance(backend, RocksBackend)
    hold = HeldBackend(backend, "write")
    committer = manager._committer
    try:
        first = asyncio.ensure_future(old.append(_msg(BIG)))
        await until(lambda: hold.entered == 1, "the large append's write")
        queued = asyncio.ensure_future(old.append(_msg(SMALL, b"q")))
        await until(lambda: bool(committer._queue), "the small append to be queued")
        reopen = asyncio.ensure_future(manager.open("p"))
        await until(lambda: committer.writer_jobs == 1, "the term change to queue on the writer thread",
                    interval=0.001)
    finally:
        hold.release.set()
    new = await asyncio.wait_for(reopen, 10)
    first_new_id = new.next_id
    done = await asyncio.wait_for(asyncio.gather(first, queued, return_exceptions=True), 10)
    for r in done:
        if isinstance(r, BaseException):
            assert isinstance(r, ChannelFencedError), repr(r)
        else:
            assert r.message_id < first_new_id, f"acknowledged under the old term at {r.message_id}"
    await _assert_new_term_owns_its_ids(manager, old.term, first_new_id)


# --- the flusher: a file is durable before the checkpoint passes it -------------------------------------
async def test_a_parquet_file_is_synced_renamed_and_its_directory_synced_before_the_checkpoint_moves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = await WALManager.start_rocksdb(tmp_path / "db")
    await manager.create_channel("p")
    swal = await open_streaming_wal(manager, "p", ChainConfig(tick_interval=0.01))
    await swal.ready()
    root = tmp_path / "out"
    calls = FileCalls(monkeypatch)
    checked: list[int] = []
    put_meta = swal.wal.put_meta

    async def checkpointing(name: str, value: bytes) -> None:
        if name == CHECKPOINT_META:
            # At the moment the checkpoint is stored: every file under the root must be durable.
            with calls._lock:
                for f in sorted(p for p in root.rglob("*.parquet") if not p.name.startswith(".")):
                    final = str(f.resolve())
                    # The temporary is in the flusher's staging directory (flusher.commit): any name.
                    renames = [i for i, e in enumerate(calls.events) if e[0] == "rename" and e[2] == final]
                    assert renames, f"{f} appeared without a rename from its temporary"
                    at = renames[-1]
                    tmp = calls.events[at][1]
                    assert Path(tmp).name.startswith(".") and tmp.endswith(".tmp"), tmp
                    assert ("fsync", tmp, "") in calls.events[:at], f"{tmp} was renamed before its fsync"
                    assert calls.dir_synced_after(final.rsplit("/", 1)[0], at), (
                        f"checkpoint {json.loads(value)['message_id']} stored before the directory of {f} "
                        "was synced after the rename")
                    checked.append(1)
        await put_meta(name, value)

    monkeypatch.setattr(swal.wal, "put_meta", checkpointing)
    f = Flusher(swal, root, FlusherConfig())
    await f.start()
    try:
        await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
        await swal.append(bodies.insert("v", "c", rows(0, 10)))
        await f.flush("v")
        await swal.append(bodies.delete("v", "c", [1, 2]))
        await swal.append(bodies.insert("v", "c", rows(10, 5)))
        await f.flush("v")
        assert checked, "no checkpoint was stored with a file to check"
    finally:
        await f.aclose()
        await swal.aclose()
        await manager.aclose()


# --- compaction: outputs are durable before the record that publishes them --------------------------
def test_compaction_outputs_and_their_directories_are_synced_before_the_record_publishes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flusher import layout  # noqa: PLC0415
    from flusher.compact import CompactionConfig, compact_collection  # noqa: PLC0415
    from tests.unit.test_compact import _write  # noqa: PLC0415

    for i in range(3):  # three small data files of two partitions' worth, and two delete files
        _write(tmp_path, "c/partition=p/segment=1", [2 * i, 2 * i + 1], 10 + i, i)
        _write(tmp_path, "c/partition=q/segment=2", [100 + i], 10 + i, 10 + i)
    _write(tmp_path, layout.deletes_dir("c"), [0], 20, 20, data=False)
    _write(tmp_path, layout.deletes_dir("c"), [100], 21, 21, data=False)
    calls = FileCalls(monkeypatch)
    r = compact_collection(tmp_path, "c", CompactionConfig(min_files=2, horizon_seconds=0, grace_seconds=60),
                           drop_deletes=False)
    [rec] = layout.read_records(tmp_path, "c")
    assert r.generation == rec.generation == 1 and len(rec.outputs) == 3  # two partitions and the deletes
    record = str((tmp_path / layout.compactions_dir("c") / layout.record_name(1)).resolve())
    [published] = [i for i, e in enumerate(calls.events) if e[0] == "rename" and e[2] == record]
    for out in rec.outputs:
        path = str((tmp_path / layout.hidden(out)).resolve())  # the name it was written under
        synced = [i for i, e in enumerate(calls.events[:published]) if e == ("fsync", path, "")]
        assert synced, f"compaction output {out} was published before it was fsynced"
        assert calls.sizes[path] == os.path.getsize(path), f"{out} grew after its fsync"
        assert calls.dir_synced_after(os.path.dirname(path), synced[-1]) and any(
            e == ("dirsync", os.path.dirname(path), "") for e in calls.events[synced[-1]:published]), (
            f"the directory of compaction output {out} was not fsynced before the record published it")
