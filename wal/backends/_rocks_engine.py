"""The RocksDB backend's engine: opening the database (options, the LOCK held elsewhere), RocksDB's
statuses translated into the WAL's errors (corruption, a full disk, transient ones), reopening after a
full disk, and the channel records.  The backend itself is ``wal.backends.rocks``."""

from __future__ import annotations

import concurrent.futures
import contextlib
import enum
import errno
import json
import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import rocksdict
import structlog

from wal.backend import Backend, ChannelInfo
from wal.backends.rocks_layout import (
    JOURNAL_DIR,
    KEY_ID,
    MAX_ID,
    TRUNCATED_META,
    U32,
    U64,
    data_key,
    tail_state,
)
from wal.errors import (
    ChannelNotExistError,
    CorruptedError,
    ErrorCode,
    InvalidArgumentError,
    OnShutdownError,
    StorageFullError,
    StreamingError,
    UnavailableError,
    UnrecoverableError,
)

# RocksDB statuses that say "not now" rather than "broken": the redo step may run the append again.
_TRANSIENT_STATUSES = ("Busy", "TryAgain", "TimedOut", "Resource busy")
_IOV_MAX = 1024
JOURNAL_PREALLOC_BYTES = 4 << 20
"""The journal file is zero-written this far ahead of its records (in one step each time they reach
its end).  A sync of records written over zeros commits no change of the file's size, which on ext4
spares it a metadata commit: fdatasync took ~105 µs instead of ~150 here (bench/RESULTS.md).  The
reader takes a zero rest of a file for its end (wal/backends/_journal.py)."""
_ZEROS = bytes(1 << 20)
# How RocksDB words a full disk ("IO error: No space left on device: While appending to file: ...").
_NO_SPACE = "No space left on device"
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# After a full disk stopped RocksDB, at most one attempt per this many seconds to reopen it.
_REOPEN_EVERY_SECONDS = 1.0

DEFAULT_WRITE_BUFFER_BYTES = 16 << 20
"""One memtable's size.  A flush writes it as one table file: 16 MiB keeps the memtables small next
to a pchannel's other memory while a flush still writes ~15k 1 KiB messages at once."""
MIN_WRITE_BUFFER_BYTES = 1 << 20
MAX_WRITE_BUFFERS = 2
"""Memtables at most: the one taking writes and the one being flushed (RocksDB's minimum)."""
L0_COMPACT_BYTES = 256 << 20
"""Table files from memtable flushes gather in level 0 until about this many bytes are there; then
one compaction merges them into level 1.  Every level-0 file spans the whole key space (data, tick
index and metadata keys of every pchannel), so each of those compactions rewrites all of level 1: with
RocksDB's default of 4 files and 16 MiB memtables, level 1 was rewritten every 64 MiB written, which
cost bulk appends about a microsecond of compaction CPU per 1 KiB message (three times what 4 files
of 64 MiB cost).  Gathering 256 MiB (16 files) keeps that rate with small memtables; the files are on
disk, and their index and filter blocks live in the block cache, so memory does not grow."""
MAX_L0_COMPACTION_TRIGGER = 32
"""Level-0 files at most before a compaction (tiny memtables): every read merges them all."""


def l0_compaction_trigger(write_buffer_bytes: int) -> int:
    """Level-0 files that start a compaction: ``L0_COMPACT_BYTES`` of them, RocksDB's 4 at least."""
    return min(MAX_L0_COMPACTION_TRIGGER, max(4, L0_COMPACT_BYTES // write_buffer_bytes))


DEFAULT_BLOCK_CACHE_BYTES = 8 << 20
"""Blocks read back from table files, and every table's index and filter blocks.  Readers mostly
tail from memory (the WAL's tail buffer) or read each block once while catching up, so a small cache
loses little."""

log = structlog.get_logger("wal.backends.rocks")  # the backend's one logger, whichever part logs

class SyncMethod(enum.Enum):
    """How a durable write reaches the disk.

    JOURNAL (the default): the batch goes to RocksDB's memtable without its log, and the group commit
    to the data journal (wal/backends/_journal.py): ``writev`` then ``fdatasync``, both without the
    GIL, and no second copy or CRC of the data while the GIL is held.
    WRITE_SYNC: ``write(batch, sync=True)``: rocksdict holds the GIL during the fsync.
    FLUSH_WAL: ``write(batch)`` then ``flush_wal(sync=True)``: the fsync runs without the GIL, so the
    committer can encode and write the next group on another thread while this one syncs (see
    wal/_committer.py).
    All three are equally durable; JOURNAL and FLUSH_WAL let a sync overlap the next write
    (bench/RESULTS.md has the numbers).
    """

    WRITE_SYNC = "write_sync"
    FLUSH_WAL = "flush_wal"
    JOURNAL = "journal"

def _lock_held(exc: Exception) -> bool:
    """Whether opening failed because RocksDB's LOCK file is held: by another process ("While lock
    file: <dir>/LOCK: Resource temporarily unavailable") or by an earlier open in this one ("lock hold
    by current process ... <dir>/LOCK: No locks available")."""
    text = str(exc)
    return text.startswith("IO error") and "/LOCK" in text and ("lock hold by" in text or "While lock file" in text)

# Where RocksDB's corruption messages say what is damaged: "... in /data/000009.sst offset 142866 size 4077".
_DAMAGED_FILE = re.compile(r"(/\S+\.(?:sst|log|blob)|MANIFEST-\d+|CURRENT)\b(?: offset (\d+))?")


def _damage_fields(text: str) -> dict[str, Any]:
    """The file (and offset) a RocksDB status message names, as error fields."""
    found = _DAMAGED_FILE.search(text)
    if found is None:
        return {}
    fields: dict[str, Any] = {"file": found.group(1)}
    if found.group(2) is not None:
        fields["offset"] = int(found.group(2))
    return fields


def _is_corruption(exc: Exception) -> bool:
    return str(exc).startswith("Corruption")


def _show_key(key: bytes) -> str:
    """A stored key as a reader of wal/README.md's layout would write it: D/1/4096 (kind, channel key, id
    or timetick), the kind and channel key alone for shorter keys."""
    if len(key) == 1 + KEY_ID.size:
        channel_key, n = KEY_ID.unpack_from(key, 1)
        return f"{key[:1].decode('latin-1')}/{channel_key}/{'end' if n == MAX_ID else n}"
    if len(key) >= 1 + U32.size:
        return f"{key[:1].decode('latin-1')}/{U32.unpack_from(key, 1)[0]}"
    return key.hex()

class RocksEngine(Backend):
    """The database half of ``RocksBackend`` (see ``wal.backends.rocks`` for the arguments)."""

    def __init__(
        self, path: str | os.PathLike[str], sync_method: SyncMethod = SyncMethod.JOURNAL, *,
        journal_rotate_bytes: int = 64 << 20, journal_prealloc_bytes: int = JOURNAL_PREALLOC_BYTES,
        verify_checksums: bool = True,
        write_buffer_bytes: int = DEFAULT_WRITE_BUFFER_BYTES, block_cache_bytes: int = DEFAULT_BLOCK_CACHE_BYTES,
    ) -> None:
        if write_buffer_bytes < MIN_WRITE_BUFFER_BYTES:
            raise InvalidArgumentError(f"the RocksDB write buffer must be >= {MIN_WRITE_BUFFER_BYTES} bytes, got "
                                       f"{write_buffer_bytes!r}", field="rocksdb_write_buffer_bytes")
        if block_cache_bytes < 0:
            raise InvalidArgumentError(f"the RocksDB block cache must be >= 0 bytes, got {block_cache_bytes!r}",
                                       field="rocksdb_block_cache_bytes")
        self.path = os.fspath(path)
        self._sync_method = sync_method
        self.split_sync = sync_method is not SyncMethod.WRITE_SYNC
        self._meta_lock = threading.Lock()
        self._closed = False
        self._journaled = sync_method is SyncMethod.JOURNAL
        self._journal_dir = os.path.join(self.path, JOURNAL_DIR)
        self._journal_rotate_bytes = journal_rotate_bytes
        self._jfd = -1  # the journal file being appended to
        self._jseq = 0
        self._joffset = 0
        self._jalloc = 0  # the journal file is this long (zero-written past _joffset, see JOURNAL_PREALLOC_BYTES)
        self._journal_prealloc_bytes = journal_prealloc_bytes
        self._jprealloc = journal_prealloc_bytes > 0  # off for the rest of a file once it failed
        # Held to swap or close the journal file and by sync() around its fdatasync, never by a write:
        # the writer appends while the sync thread syncs the previous commit.
        self._jlock = threading.Lock()
        self._jflusher: concurrent.futures.ThreadPoolExecutor | None = None
        self._sync_failed: OSError | None = None  # see _fdatasync
        self._stalled: str | None = None  # see _reopen
        self._last_reopen = 0.0
        # Every engine call counts itself in here, so that _reopen can wait until none runs.
        self._gate = threading.Condition()
        self._users = 0
        self._reopening = False
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_paranoid_checks(True)
        # PointInTime recovery: after a crash the database is as of the last fully written batch;
        # a torn tail record is dropped, never surfaced.
        opts.set_wal_recovery_mode(rocksdict.DBRecoveryMode.point_in_time())
        opts.increase_parallelism(2)
        # Memory (docs/operations.md, "Memory"): at most MAX_WRITE_BUFFERS memtables of write_buffer_bytes each (one
        # taking writes, one being flushed), and one block cache that also holds the tables' index and
        # filter blocks, so that the SST files' readers are inside its bound rather than beside it.
        opts.set_write_buffer_size(write_buffer_bytes)
        opts.set_max_write_buffer_number(MAX_WRITE_BUFFERS)
        trigger = l0_compaction_trigger(write_buffer_bytes)
        opts.set_level_zero_file_num_compaction_trigger(trigger)
        # RocksDB's own gaps above the trigger (20 and 36 over its default 4): writes slow down, then
        # stop, only when compaction falls that far behind.
        opts.set_level_zero_slowdown_writes_trigger(trigger + 16)
        opts.set_level_zero_stop_writes_trigger(trigger + 32)
        table = rocksdict.BlockBasedOptions()
        if block_cache_bytes:
            self._cache: Any = rocksdict.Cache(block_cache_bytes)  # must outlive the database (and its reopen)
            table.set_block_cache(self._cache)
            table.set_cache_index_and_filter_blocks(True)
        else:  # no cache: each table reader keeps its index and filter blocks (RocksDB needs them)
            self._cache = None
            table.disable_cache()
        opts.set_block_based_table_factory(table)
        self.write_buffer_bytes = write_buffer_bytes
        self.block_cache_bytes = block_cache_bytes
        self._opts = opts
        # Every read checks RocksDB's block checksums (its default, made explicit; off only to measure
        # what it costs, bench/wal_append.py): a damaged table block then fails the read, naming its
        # file, instead of serving whatever the bytes say.  Iterators take these options per call.
        self._ropts = rocksdict.ReadOptions()
        self._ropts.set_verify_checksums(verify_checksums)
        self._names: dict[int, str] = {}  # channel key -> pchannel name, for errors
        try:
            os.makedirs(self.path, exist_ok=True)
            self._db: Any = rocksdict.Rdict(self.path, options=opts)
        except Exception as exc:  # rocksdict raises plain Exception for every engine error
            if _lock_held(exc):
                # Nothing is wrong with the data: another process (or another open in this one) has the
                # database.  Retriable: a node still shutting down lets go of it.
                raise UnavailableError(
                    f"WAL database at {self.path} is in use by another process (its LOCK file is held): stop "
                    f"that node or use another data directory", path=self.path, reason="in use",
                ) from exc
            raise CorruptedError(
                f"cannot open WAL database at {self.path}: {exc}", path=self.path, **_damage_fields(str(exc))
            ) from exc
        self._wopts_plain = rocksdict.WriteOptions()
        self._wopts_sync = rocksdict.WriteOptions()
        self._wopts_sync.sync = True
        self._wopts_nolog = rocksdict.WriteOptions()
        self._wopts_nolog.disable_wal = True  # type: ignore[method-assign,assignment]  # a property at run time
        try:
            # Whatever journal files are here hold writes that may not be in RocksDB's tables yet:
            # replay them before anything reads, whichever sync method is used from now on.
            self._replay_journal()
            if self._journaled:
                self._jflusher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="wal-journal-flush")
                self._open_journal(self._jseq + 1)
        except BaseException:
            if self._jflusher is not None:
                self._jflusher.shutdown(wait=True)
            if self._jfd >= 0:
                os.close(self._jfd)
            self._db.close()
            raise

    # --- helpers ---------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise OnShutdownError(f"WAL database at {self.path} is closed", path=self.path)

    def _pchannel(self, channel_key: int) -> str:
        """The name of the pchannel with this key, for an error (the key itself if it cannot be found)."""
        if channel_key not in self._names:
            try:
                self._names.update(self._channel_keys())
            except Exception:  # noqa: BLE001  (naming the damage must not fail on more of it)
                return f"#{channel_key}"
        return self._names.get(channel_key, f"#{channel_key}")

    def _channel_keys(self) -> dict[int, str]:
        names: dict[int, str] = {}
        it = self._db.iter(self._ropts)
        try:
            it.seek(b"C")
            while self._valid(it, "list channels", b"C", b"D", None) and it.key().startswith(b"C"):
                # A damaged channel record names nothing; opening that channel reports it.
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    names[int(json.loads(it.value())["key"])] = bytes(it.key()[1:]).decode()
                it.next()
        finally:
            del it
        return names

    def _damaged(
        self, exc: Exception, what: str, lo: bytes | None, hi: bytes | None, channel: int | str | None,
    ) -> CorruptedError:
        """RocksDB reported corruption (a block checksum that fails, a table that does not parse) while
        reading keys ``lo`` .. ``hi`` of a pchannel: name the pchannel, the keys and what RocksDB names."""
        fields: dict[str, Any] = {"path": self.path, **_damage_fields(str(exc))}
        whose = ""
        if channel is not None:
            name = channel if isinstance(channel, str) else self._pchannel(channel)
            fields["channel"] = fields["pchannel"] = name
            whose = f" of pchannel {name!r}"
        where = ""
        if lo is not None:
            fields["key_range"] = _show_key(lo) if hi is None or hi == lo else f"{_show_key(lo)} .. {_show_key(hi)}"
            where = f" in keys {fields['key_range']}"
        return CorruptedError(f"{what}{whose} in {self.path} found damaged storage{where}: {exc}", **fields)

    def _valid(self, it: Any, what: str, lo: bytes, hi: bytes | None, channel: int | str | None) -> bool:
        """``it.valid()``, except that an iterator stopped by an error raises it: RocksDB's iterator
        ends the same way at the end of the data and at a damaged block, only its status tells."""
        if it.valid():
            return True
        try:
            it.status()
        except Exception as exc:  # rocksdict raises plain Exception carrying RocksDB's status
            if _is_corruption(exc):
                raise self._damaged(exc, what, lo, hi, channel) from exc
            raise
        return False

    def _get(self, key: bytes, what: str, channel: int | str | None) -> Any:
        try:
            return self._db.get(key, read_opt=self._ropts)
        except Exception as exc:  # rocksdict raises plain Exception carrying RocksDB's status
            if _is_corruption(exc):
                raise self._damaged(exc, what, key, None, channel) from exc
            raise

    @contextmanager
    def _engine(self, what: str) -> Iterator[None]:
        """Translate engine failures at the boundary, naming the database path."""
        self._check_open()
        with self._in_use():
            try:
                yield
            except StreamingError:
                raise
            except Exception as exc:  # rocksdict raises plain Exception; its text carries RocksDB's status
                if _NO_SPACE in str(exc) or (isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS):
                    # RocksDB stops taking writes after a failed write of its own (a full disk while
                    # flushing a memtable or appending to its log) until it is reopened; the journal
                    # holds every acknowledged write meanwhile.  Retriable: _reopen brings it back.
                    if not isinstance(exc, OSError):
                        self._stalled = str(exc)
                    raise StorageFullError(f"{what} in {self.path}: the disk is full: {exc}", path=self.path) from exc
                if _is_corruption(exc):
                    raise self._damaged(exc, what, None, None, None) from exc
                if any(status in str(exc) for status in _TRANSIENT_STATUSES):
                    raise StreamingError(
                        f"{what} in {self.path} hit a transient condition: {exc}", code=ErrorCode.UNAVAILABLE,
                        path=self.path,
                    ) from exc
                raise UnrecoverableError(f"{what} failed in {self.path}: {exc}", path=self.path) from exc

    @contextmanager
    def _in_use(self) -> Iterator[None]:
        """Count the calling thread inside the engine (``_reopen`` waits until none is)."""
        with self._gate:
            while self._reopening:
                self._gate.wait()
            self._users += 1
        try:
            yield
        finally:
            with self._gate:
                self._users -= 1
                if not self._users:
                    self._gate.notify_all()

    def _reopen(self) -> None:
        """Bring RocksDB back after a full disk stopped it: close it, open it again and replay the
        journal (which holds every write since the last flush of its tables: nothing acknowledged is
        lost).  Called on the writer thread, outside any engine call, at most once a second while
        the disk stays full; waits until no other thread is inside the engine.

        Never after a failed journal sync (``_sync_failed``): that one is final, see ``_fdatasync``."""
        now = time.monotonic()
        if now - self._last_reopen < _REOPEN_EVERY_SECONDS:
            raise StorageFullError(
                f"the WAL database in {self.path} stopped on a full disk ({self._stalled}); it is reopened "
                "once space is free", path=self.path)
        self._last_reopen = now
        with self._gate:
            self._reopening = True
            while self._users:
                self._gate.wait()
        try:
            with self._jlock:
                if self._jfd >= 0:
                    os.close(self._jfd)  # its records are replayed below; a sync of it is not needed
                    self._jfd = -1
            try:
                self._db.close()
            except Exception as exc:  # noqa: BLE001  (it reports the error it stopped on; the lock is released)
                log.info("closing the stopped database", error=str(exc))
            try:
                self._db = rocksdict.Rdict(str(self.path), options=self._opts)
                self._replay_journal()
                if self._journaled:
                    self._open_journal(self._jseq + 1)
            except Exception as exc:
                log.warning("reopening the WAL database failed; tried again on a later write",
                            path=self.path, error=str(exc))
                raise StorageFullError(f"reopening the WAL database in {self.path} failed: {exc}",
                                       path=self.path) from exc
            self._stalled = None
            log.warning("WAL database reopened after a full disk", path=self.path)
        finally:
            with self._gate:
                self._reopening = False
                self._gate.notify_all()

    def _load(self, name: str) -> dict[str, Any]:
        raw = self._get(b"C" + name.encode(), "reading the channel record", name)
        if raw is None:
            raise ChannelNotExistError(f"pchannel {name!r} does not exist", channel=name)
        try:
            record: dict[str, Any] = json.loads(raw)
            int(record["key"]), int(record["term"])
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptedError(
                f"channel record of {name!r} in {self.path} is damaged", channel=name, path=self.path
            ) from exc
        return record

    def _info(self, name: str, record: dict[str, Any]) -> ChannelInfo:
        key = int(record["key"])
        info = ChannelInfo(name, key, int(record["term"]), 0, 0, 0, dict(record.get("properties", {})))
        self._names[key] = name
        lo, hi = data_key(key, 0), data_key(key, MAX_ID)
        it = self._db.iter(self._ropts)
        try:
            it.seek(lo)
            if self._valid(it, "finding the first block", lo, hi, name) and it.key()[:5] == b"D" + U32.pack(key):
                info.first_id = info.next_id = KEY_ID.unpack_from(it.key(), 1)[1]
            it.seek_for_prev(hi)
            last = None
            if self._valid(it, "finding the last block", lo, hi, name) and it.key()[:5] == b"D" + U32.pack(key):
                last = (KEY_ID.unpack_from(it.key(), 1)[1], bytes(it.value()))
        finally:
            del it
        raw_max = self._get(b"H" + U32.pack(key), "reading the high-water timetick", name)
        max_ts = U64.unpack(raw_max)[0] if raw_max is not None else 0
        if last is None:
            # Every block truncated: the ids go on from the truncation, never back to 0.
            raw_mark = self._get(b"X" + U32.pack(key) + TRUNCATED_META.encode(), "reading the truncation mark", name)
            if raw_mark is not None and len(raw_mark) == U64.size:
                info.first_id = info.next_id = U64.unpack(raw_mark)[0]
        return tail_state(info, last, str(self.path), max_ts)

    # --- the data journal (``JournalWriter``, wal/backends/_rocks_journal.py) --------------------------
    def _replay_journal(self) -> None:
        """Replay the journal files left into the database (on open and reopen)."""
        raise NotImplementedError

    def _open_journal(self, seq: int) -> None:
        """Start writing journal file ``seq``."""
        raise NotImplementedError
