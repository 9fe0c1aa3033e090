"""How the offline tools reach a data directory and what they report: the lock that keeps a node
out while they run, the read-only open of the database, a finding, a progress line."""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TextIO

from wal.errors import UnavailableError


class DataDirInUseError(UnavailableError):
    """The data directory's database is held by a running node (RocksDB's LOCK file is locked)."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem found: the file it is in, where in it, and what is wrong."""

    path: str
    problem: str
    offset: int | None = None
    key: str | None = None
    channel: str | None = None

    def line(self) -> str:
        where = self.path
        if self.offset is not None:
            where += f" at byte {self.offset}"
        if self.key is not None:
            where += f" key {self.key}"
        return f"{where}: {self.problem}"


@contextmanager
def offline(data_dir: str) -> Iterator[None]:
    """Hold RocksDB's LOCK file of ``data_dir`` (a node opening it meanwhile fails "in use"); raise
    DataDirInUseError if a node holds it.

    An open-file-description lock conflicts with RocksDB's fcntl lock even within one process.  Run
    this in a process of its own (the CLI does): closing the lock's descriptor drops every classic
    fcntl lock the process holds on the file, so a database opened in the same process would lose its
    lock.
    """
    lock = os.path.join(data_dir, "LOCK")
    if not os.path.exists(lock):
        yield
        return
    fd = os.open(lock, os.O_RDWR)
    try:
        cmd = getattr(fcntl, "F_OFD_SETLK", fcntl.F_SETLK)
        try:
            # struct flock: type, whence, start, length 0 (the whole file), pid 0 (required for OFD).
            fcntl.fcntl(fd, cmd, struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise DataDirInUseError(
                    f"data directory {data_dir} is in use by a running node (its LOCK file is held): stop the "
                    "node first; verify and salvage work offline", path=data_dir, reason="in use",
                ) from exc
            raise
        yield
    finally:
        os.close(fd)


def open_read_only(data_dir: str) -> Any:
    import rocksdict  # noqa: PLC0415  (keep `--help` fast)

    opts = rocksdict.Options(raw_mode=True)
    opts.set_paranoid_checks(True)
    return rocksdict.Rdict(data_dir, options=opts, access_type=rocksdict.AccessType.read_only())


def one_line(text: str) -> str:
    """``text`` on one line, at most 300 characters (RocksDB's and pyarrow's messages span lines)."""
    return " ".join(text.split())[:300]


class Progress:
    """A progress line on stderr at most every ``interval`` seconds (long runs only)."""

    def __init__(self, stream: TextIO, interval: float = 2.0) -> None:
        self._stream = stream
        self._interval = interval
        self._last = time.monotonic()

    def tick(self, what: str) -> None:
        now = time.monotonic()
        if now - self._last >= self._interval:
            self._last = now
            print(f"verify: {what} checked so far", file=self._stream, flush=True)


__all__ = ["DataDirInUseError", "Finding", "Progress", "offline", "one_line", "open_read_only"]
