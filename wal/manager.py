"""WALManager: owns a backend, its threads and group committer, and the WALs opened on it.

Lifetime: backend ⊃ WALManager ⊃ WAL ⊃ Scanner.  Every backend call runs on a worker thread — writes
and metadata changes on one writer thread (so they are serialised), reads on a small pool — never on
the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import os
from collections.abc import Callable
from typing import Any, TypeVar

import structlog

from wal import names
from wal._committer import GroupCommitter
from wal.backend import Backend, ChannelInfo, Durability
from wal.errors import ChannelNotExistError, InvalidArgumentError, OnShutdownError, StreamingError
from wal.tasks import cancel_and_wait
from wal.wal import WAL

log = structlog.get_logger(__name__)

T = TypeVar("T")

DEFAULT_TAIL_BUFFER_BYTES = 16 << 20
"""Each WAL's in-memory tail (``wal._tail``), counted as the messages' encoded bytes (Python objects
add ~15% for 1 KiB messages).  A tailing reader is seldom more than a few packs behind; one that
falls further back reads the same messages from storage instead, so this bounds memory, never what
is delivered.  16 MiB holds ~0.15 s of appends at 100 MB/s and minutes of a light load."""


class ManagerState(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    CLOSED = "closed"


class WALManager:
    """Start with ``await WALManager.start(backend)`` (or ``start_rocksdb(path)``); close with ``aclose``."""

    def __init__(
        self,
        backend: Backend,
        *,
        durability: Durability = Durability.SYNC,
        relaxed_sync_interval: float = 0.1,
        tail_buffer_bytes: int = DEFAULT_TAIL_BUFFER_BYTES,
        max_commit_bytes: int = 1 << 20,
        read_threads: int = 2,
    ) -> None:
        if relaxed_sync_interval <= 0:
            raise InvalidArgumentError("relaxed_sync_interval must be > 0 seconds")
        if tail_buffer_bytes < 0:
            raise InvalidArgumentError(f"tail_buffer_bytes must be >= 0, got {tail_buffer_bytes!r}",
                                       field="tail_buffer_bytes")
        self.backend = backend
        self.durability = durability
        self.tail_buffer_bytes = tail_buffer_bytes
        self._relaxed_sync_interval = relaxed_sync_interval
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="wal-writer")
        self._readers = concurrent.futures.ThreadPoolExecutor(read_threads, thread_name_prefix="wal-reader")
        durable = durability is Durability.SYNC
        self._syncer = (
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="wal-sync")
            if durable and backend.split_sync else None
        )
        self._committer = GroupCommitter(
            backend, self._writer, durable=durable, max_commit_bytes=max_commit_bytes, syncer=self._syncer
        )
        self._wals: dict[str, WAL] = {}
        self._relaxed_task: asyncio.Task[None] | None = None
        self.state = ManagerState.STARTING

    @classmethod
    async def start(cls, backend: Backend, **kwargs: Any) -> WALManager:
        manager = cls(backend, **kwargs)
        manager._committer.start()
        if manager.durability is Durability.RELAXED:
            manager._relaxed_task = asyncio.get_running_loop().create_task(manager._sync_loop(), name="wal-sync")
        manager.state = ManagerState.RUNNING
        return manager

    @classmethod
    async def start_rocksdb(
        cls, path: str | os.PathLike[str], *, write_buffer_bytes: int | None = None,
        block_cache_bytes: int | None = None, **kwargs: Any,
    ) -> WALManager:
        """A manager over the RocksDB database in ``path`` (created if missing); ``write_buffer_bytes``
        and ``block_cache_bytes`` bound RocksDB's memory (None: the backend's defaults)."""
        from wal.backends import rocks  # noqa: PLC0415  (keep import light)

        sync_method = kwargs.pop("sync_method", rocks.SyncMethod.JOURNAL)
        backend = await asyncio.to_thread(
            rocks.RocksBackend, path, sync_method,
            write_buffer_bytes=rocks.DEFAULT_WRITE_BUFFER_BYTES if write_buffer_bytes is None else write_buffer_bytes,
            block_cache_bytes=rocks.DEFAULT_BLOCK_CACHE_BYTES if block_cache_bytes is None else block_cache_bytes)
        return await cls.start(backend, **kwargs)

    # --- thread dispatch -------------------------------------------------------------------------
    def _check_running(self) -> None:
        if self.state is not ManagerState.RUNNING:
            raise OnShutdownError(f"WAL manager is {self.state.value}")

    async def _run_write(self, fn: Callable[..., T], *args: Any) -> T:
        self._check_running()
        return await self._on_writer(fn, *args)

    async def _on_writer(self, fn: Callable[..., T], *args: Any) -> T:
        """Run on the writer thread, and keep the committer from writing on the loop meanwhile: what
        runs there (a backup, a truncation) stays ordered with the appends around it."""
        self._committer.writer_jobs += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._writer, fn, *args)
        finally:
            self._committer.writer_jobs -= 1

    async def _run_read(self, fn: Callable[..., T], *args: Any) -> T:
        self._check_running()
        return await asyncio.get_running_loop().run_in_executor(self._readers, fn, *args)

    def write_failure(self) -> StreamingError | None:
        """Why every write of this manager is refused until it is reopened (a failed sync), or None."""
        return self._committer._fatal

    # --- channels --------------------------------------------------------------------------------
    async def create_channel(self, name: str, properties: dict[str, str] | None = None) -> ChannelInfo:
        """Create an empty pchannel.  Raises ChannelExistError, or InvalidArgumentError for a name
        ``wal.names.PCHANNEL`` refuses."""
        names.PCHANNEL.check(name)
        return await self._run_write(self.backend.create_channel, name, dict(properties or {}))

    async def describe_channel(self, name: str) -> ChannelInfo:
        info = await self._run_read(self.backend.describe_channel, name)
        wal = self._wals.get(name)
        if wal is not None:  # the open handle knows acknowledged state the storage scan cannot
            info.next_id, info.first_id, info.last_timetick = wal.next_id, wal.first_id, wal.last_timetick
        return info

    async def list_channels(self) -> list[str]:
        return await self._run_read(self.backend.list_channels)

    async def destroy_channel(self, name: str) -> None:
        """Remove a pchannel and its data; an open WAL on it is closed and its readers fail."""
        wal = self._wals.get(name)
        if wal is not None:
            wal._destroyed()
            await wal._idle.wait()
        await self._run_write(self.backend.destroy_channel, name)
        self._wals.pop(name, None)

    async def open(self, name: str) -> WAL:
        """Open a pchannel with a new term; a WAL already open on it is fenced."""
        names.PCHANNEL.check(name)
        old = self._wals.get(name)
        if old is not None:
            # Fenced before the term changes on the writer thread: an append the old handle already
            # handed to that thread is written first (below the new term's first id), and one still
            # queued is refused.  Fenced only afterwards, a queued append could be taken meanwhile and
            # written under the old term at an id the new term then hands out again.
            old._fence()
        info = await self._run_write(self.backend.open_channel, name)
        old = self._wals.get(name)  # a concurrent open may have registered another handle meanwhile
        if old is not None:
            old._fence()
        wal = WAL(self, info, self._committer)
        self._wals[name] = wal
        log.info("wal opened", pchannel=name, term=info.term, first_id=info.first_id, next_id=info.next_id)
        return wal

    def _forget(self, wal: WAL) -> None:
        if self._wals.get(wal.pchannel) is wal:
            del self._wals[wal.pchannel]

    async def backup(self, dest: str | os.PathLike[str]) -> None:
        """A consistent copy of every pchannel into the new directory ``dest``.

        Runs on the writer thread, so it sits between two group commits: it holds every append
        acknowledged before it was called.
        """
        await self._run_write(self.backend.backup, os.fspath(dest))

    # --- storage pressure ------------------------------------------------------------------------
    def refuse_appends(self, error: StreamingError | None) -> None:
        """Fail every append but TimeTicks and manual flushes at once with (a copy of) ``error``,
        until called with None: what the node does while its disk is nearly full."""
        self._committer.refusal = error

    @property
    def refused_appends(self) -> int:
        """Appends (batches) refused so far because of ``refuse_appends``."""
        return self._committer.refused

    # --- lifecycle -------------------------------------------------------------------------------
    async def _sync_loop(self) -> None:
        while True:
            await asyncio.sleep(self._relaxed_sync_interval)
            try:
                await self._on_writer(self.backend.sync)
            except Exception as exc:  # noqa: BLE001  (keep syncing; the next write surfaces a dead backend)
                log.warning("relaxed sync failed", error=repr(exc))

    async def aclose(self) -> None:
        """Close every WAL (draining appends in flight), stop the threads, close the backend."""
        if self.state in (ManagerState.DRAINING, ManagerState.CLOSED):
            return
        self.state = ManagerState.DRAINING
        for wal in list(self._wals.values()):
            await wal.aclose()
        await self._committer.aclose()
        if self._relaxed_task is not None:
            await cancel_and_wait(self._relaxed_task)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._writer, self.backend.close)
        self._writer.shutdown(wait=True)
        self._readers.shutdown(wait=True)
        if self._syncer is not None:
            self._syncer.shutdown(wait=True)
        self.state = ManagerState.CLOSED

    async def __aenter__(self) -> WALManager:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


__all__ = ["DEFAULT_TAIL_BUFFER_BYTES", "ChannelNotExistError", "ManagerState", "WALManager"]
