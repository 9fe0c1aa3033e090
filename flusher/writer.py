"""How one flusher writes files: on its own thread, through the commit protocol (``flusher.commit``), in
its term's staging directory, and held back (never stopped) by a full disk.

Every file a flusher writes (a buffer, a file rebuilt from the WAL, a renamed compaction output) and
every blocking file operation it runs goes through one ``FileWriter``, so they run one at a time, in
order, never on the event loop.
"""

from __future__ import annotations

import asyncio
import errno
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_exponential

from flusher import layout
from flusher._buffers import Buffer
from flusher.commit import StagingFencedError, commit_file, inside, open_staging, remove_temporaries
from wal.errors import ChannelFencedError

log = structlog.get_logger(__name__)

_T = TypeVar("_T")
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_FULL_RETRY_MAX_SECONDS = 5.0


class FileWriter:
    """The flusher's thread and its commits under ``root`` for pchannel ``pchannel`` at WAL ``term``.

    ``open()`` first (it fences older terms' writers); ``shutdown()`` last (it waits for the thread).
    """

    def __init__(self, root: Path, pchannel: str, term: int, compression: str) -> None:
        self._root = root
        self._pchannel = pchannel
        self._term = term
        self._compression = compression
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"flusher-{pchannel}")
        self.staging: Path | None = None
        """This term's staging directory (``flusher.commit.open_staging``), once open."""

    async def open(self) -> int:
        """Fence every older term's writer (its staging directory goes), then remove the temporaries
        left in the tree; returns how many.  Raises ChannelFencedError when a newer term writes here."""
        try:
            self.staging = await self.in_thread(open_staging, self._root, self._term)
        except StagingFencedError as exc:
            raise self.fenced(exc) from exc
        return await self.in_thread(remove_temporaries, self._root)

    def shutdown(self) -> None:
        """Wait for the thread's last task, then stop it."""
        self._executor.shutdown(wait=True)

    def fenced(self, exc: StagingFencedError) -> ChannelFencedError:
        """The error a commit (or a compaction record) fenced by a newer term raises."""
        return ChannelFencedError(
            f"flusher of pchannel {self._pchannel!r} term {self._term} is fenced: a newer term's "
            f"flusher writes its Parquet directory, so nothing more is committed here ({exc})",
            channel=self._pchannel, term=self._term)

    async def in_thread(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run blocking file work on the flusher's own thread; a cancel waits for it to finish, so
        a close never leaves a commit half done behind it."""
        fut = asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(fn, *args))
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            await asyncio.wait([fut])
            raise

    async def commit_buffer(self, b: Buffer) -> Path:
        """Commit ``b`` as its file (named by its first and last ids) and return the path, once durable."""
        return await self.commit_table(b.directory, layout.file_name(b.first_id, b.last_id), b.to_table(self._pchannel))

    async def commit_table(self, directory: str, name: str, table: pa.Table) -> Path:
        """Commit ``table`` as the Parquet file ``directory/name``."""
        compression = self._compression

        def write(f: Any) -> None:
            # Page checksums let a check of the data (``layout.check_data``) tell a damaged page.
            pq.write_table(table, f, compression=compression, coerce_timestamps="us",
                           allow_truncated_timestamps=True, write_page_checksum=True)

        return await self.commit_when_space(directory, name, write)

    async def commit_when_space(self, directory: str, name: str, write: Callable[[BinaryIO], None]) -> Path:
        """Commit a file; a full disk holds the flusher back instead of stopping it.  A failed commit
        leaves nothing behind and the name is deterministic, so the same file is tried again (backing
        off up to every 5 s) until space returns; the node frees space meanwhile
        (streamingnode.node.disk_guard)."""
        def full(rs: RetryCallState) -> None:
            log.warning("flusher: the disk is full, the file is written again once space returns",
                        pchannel=self._pchannel, file=f"{directory}/{name}", retry_seconds=rs.upcoming_sleep)

        retrying = AsyncRetrying(
            retry=retry_if_exception(_disk_full), wait=wait_exponential(multiplier=0.1, max=_FULL_RETRY_MAX_SECONDS),
            before_sleep=full, reraise=True)
        try:
            async for attempt in retrying:
                with attempt:
                    return await self.in_thread(_commit_under, self._root, directory, name, write, self.staging)
        except StagingFencedError as exc:
            raise self.fenced(exc) from exc
        raise AssertionError("unreachable: tenacity either returns or re-raises")  # pragma: no cover


def _disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS


def _commit_under(root: Path, directory: str, name: str, write: Callable[[BinaryIO], None],
                  staging: Path | None) -> Path:
    """``commit_file`` into ``root/directory``, a directory derived from collection and partition
    names read back from the log: checked to lie inside ``root`` before anything is written."""
    return commit_file(inside(root, directory), name, write, staging=staging)


__all__ = ["FileWriter"]
