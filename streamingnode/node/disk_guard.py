"""Free disk space, watched: appends are refused before the disk fills, and space is made meanwhile.

A monitor reads the free space (``os.statvfs``) of the volumes the node writes to, the data directory
(RocksDB and its journal) and the Parquet root, every ``CHECK_SECONDS``, never per append.  When one of
them has less than ``NodeConfig.storage_min_free_bytes`` free (the low-water mark), the node:

- refuses every append but TimeTicks and manual flushes at once with ``StorageFullError``
  (STORAGE_FULL, gRPC RESOURCE_EXHAUSTED, retriable), so neither RocksDB nor the journal meets
  ENOSPC half-way through a write;
- forces a flush of every flusher buffer and runs every pchannel's retention check at once (again
  every ``RELIEF_SECONDS`` while space stays low): written-out buffers let the flusher's checkpoint
  advance, and truncation then drops what every reader is past;
- takes appends again by itself once every volume has the mark plus a margin (``hysteresis``) free,
  so that a node hovering at the mark does not flap between refusing and taking.

How stale a reading may be: the node writes at most ~120 MB/s here (bench/RESULTS.md: 120k durable
1 KiB messages/s), so in half a second a producer eats ~60 MB of the margin before the next reading
sees it.  The default mark, 256 MiB, covers that four times over, and also what the node writes in
one piece below the mark: a RocksDB memtable flush (``rocksdb_write_buffer_bytes``, 16 MiB) and a
Parquet file (``flush_max_bytes``, 64 MiB), each possibly twice while compacting or replacing.

A disk filled anyway (another process) is caught where the write fails: the journal cuts the failed
record off and RocksDB is reopened once space returns (``wal/backends/rocks.py``); the append fails
with the same retriable STORAGE_FULL.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from wal.errors import StorageFullError, StreamingError
from wal.tasks import cancel_and_wait

if TYPE_CHECKING:
    from streamingnode.node.node import Node

log = structlog.get_logger(__name__)

DEFAULT_MIN_FREE_BYTES = 256 << 20
"""The default low-water mark (see the module docstring for why this much)."""
CHECK_SECONDS = 0.5
"""How often free space is read: two ``statvfs`` calls per check, on a worker thread."""
RELIEF_SECONDS = 10.0
"""While space stays low, how often the forced flush and retention run again."""
RELIEF_TIMEOUT_SECONDS = 60.0
"""Longest a forced flush of one pchannel is waited for (a lagging flusher must not hold the rest)."""


def free_bytes(path: Path, statvfs: Callable[[str], os.statvfs_result] = os.statvfs) -> int:
    """Bytes an unprivileged writer may still use on the volume of ``path`` (or of its nearest
    existing parent: the Parquet root is made only when the first file is written)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    st = statvfs(str(probe))
    return int(st.f_bavail) * int(st.f_frsize)


class StorageMonitor:
    """Watches ``volumes`` (label -> path) against ``min_free_bytes``; see the module docstring.

    ``refuse`` is called with the error appends fail with when space gets low, and with None when it
    returns; ``relieve`` runs the forced flush and retention.  ``min_free_bytes`` 0 turns it off.
    """

    def __init__(
        self, volumes: dict[str, Path], min_free_bytes: int, *,
        refuse: Callable[[StreamingError | None], None], relieve: Callable[[], Coroutine[Any, Any, None]],
        refused: Callable[[], int] = lambda: 0, check_seconds: float = CHECK_SECONDS,
        relief_seconds: float = RELIEF_SECONDS, statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
    ) -> None:
        self.volumes = dict(volumes)
        self.min_free_bytes = min_free_bytes
        # Taking appends again needs a little more than the mark: 1/8 of it, at most 64 MiB.
        self.hysteresis = min(min_free_bytes // 8, 64 << 20)
        self._refuse = refuse
        self.refused_appends = refused
        """How many appends were refused so far (read for the metrics)."""
        self._relieve = relieve
        self._check_seconds = check_seconds
        self._relief_seconds = relief_seconds
        self._statvfs = statvfs
        self.free: dict[str, int] = {}
        """Free bytes of each volume at the last check."""
        self.low: str | None = None
        """The label of the volume under the mark while appends are refused, else None."""
        self.reliefs = 0
        """Forced flush-and-retention runs started."""
        self._last_relief = -float("inf")
        self._task: asyncio.Task[None] | None = None
        self._relief: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return self.min_free_bytes > 0

    def start(self) -> None:
        if self.enabled and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="storage-monitor")

    async def aclose(self) -> None:
        for task in (self._task, self._relief):
            if task is not None:
                await cancel_and_wait(task)
        self._task = self._relief = None

    async def _loop(self) -> None:
        while True:
            try:
                await self.check()
            except OSError as exc:  # a volume that cannot be read (unmounted?): say so, keep watching
                log.warning("free space could not be read", error=repr(exc))
            await asyncio.sleep(self._check_seconds)

    def _measure(self) -> dict[str, int]:
        return {label: free_bytes(path, self._statvfs) for label, path in self.volumes.items()}

    async def check(self) -> None:
        """One reading now: refuse, relieve or resume as it says."""
        self.free = free = await asyncio.to_thread(self._measure)
        if self.low is None:
            low = next((label for label, f in free.items() if f < self.min_free_bytes), None)
            if low is not None:
                self.low = low
                path = self.volumes[low]
                self._refuse(StorageFullError(
                    f"the {low} volume ({str(path)[:200]}) has {free[low]} bytes free, under the node's low-water "
                    f"mark of {self.min_free_bytes} (storage_min_free_bytes): appends are refused until space is "
                    "freed, then taken again without a restart; retry later",
                    volume=low, free_bytes=free[low], min_free_bytes=self.min_free_bytes))
                log.warning("storage low: appends refused, forcing a flush and retention", volume=low,
                            path=str(path), free_bytes=free[low], min_free_bytes=self.min_free_bytes)
        elif all(f >= self.min_free_bytes + self.hysteresis for f in free.values()):
            log.warning("storage space returned: appends taken again", free_bytes=free,
                        min_free_bytes=self.min_free_bytes)
            self.low = None
            self._refuse(None)
            return
        if (self.low is not None and (self._relief is None or self._relief.done())
                and time.monotonic() - self._last_relief >= self._relief_seconds):
            self._last_relief = time.monotonic()
            self.reliefs += 1
            self._relief = asyncio.get_running_loop().create_task(self._relieve(), name="storage-relief")


async def relieve(node: Node) -> None:
    """Write out every flusher buffer and run retention now, on every pchannel the node serves; log
    what it did.  A pchannel that fails is logged and skipped: the others still make space."""
    started = time.monotonic()
    files = truncated = 0
    for name in node.channel_names():
        try:
            channel = node.channel(name)
        except StreamingError:
            continue  # closing, destroyed or failed meanwhile
        try:
            if channel.flusher is not None:
                async with asyncio.timeout(RELIEF_TIMEOUT_SECONDS):
                    files += len(await channel.flusher.flush(""))
            if channel.retention is not None:
                cut = await channel.retention.check()
                truncated += cut.messages if cut is not None else 0
        except (StreamingError, OSError, TimeoutError) as exc:
            log.warning("storage relief failed on a pchannel", pchannel=name, error=repr(exc))
    log.warning("storage low: flushed and truncated", files_written=files, messages_truncated=truncated,
                seconds=round(time.monotonic() - started, 3))


def start_monitor(node: Node) -> StorageMonitor:
    """The node's monitor over its data directory and Parquet root, started."""
    config = node.config
    monitor = StorageMonitor(
        {"data": config.data_dir, "parquet": config.parquet_root}, config.storage_min_free_bytes,
        refuse=node.manager.refuse_appends, relieve=lambda: relieve(node),
        refused=lambda: node.manager.refused_appends)
    monitor.start()
    return monitor


__all__ = ["CHECK_SECONDS", "DEFAULT_MIN_FREE_BYTES", "StorageMonitor", "free_bytes", "relieve", "start_monitor"]
