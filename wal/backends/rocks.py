"""The RocksDB backend (through rocksdict): one database per data directory, many pchannels.

Key layout (all integers big-endian so that byte order is numeric order; see wal/README.md):

    b"M" + b"next_key"            -> u32   next channel key to hand out (never reused)
    b"C" + name (utf-8)           -> JSON  {"key", "term", "properties"} (+ "damaged", see _replay.py)
    b"D" + u32 key + u64 first_id -> block (codec block of messages first_id ..)
    b"T" + u32 key + u64 timetick -> u64 tick message id + u64 resume id
    b"H" + u32 key                -> u64   largest timetick acknowledged (written with every block)
    b"X" + u32 key + name         -> bytes small per-channel values (put_meta), e.g. the ts window,
                                           and the truncation mark (_keys.TRUNCATED_META)

A write is one WriteBatch holding every block of a group commit and their time-index entries, so a
block and its index entries appear together or not at all.  By default (``SyncMethod.JOURNAL``) that
batch skips RocksDB's own log and the group commit goes to the data journal instead (see
wal/backends/_journal.py); channel records and metadata always use RocksDB's log.
"""

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

from wal._codec import block_count
from wal.backend import Backend, ChannelInfo, TickEntry, WriteGroup
from wal.backends import _journal, _replay
from wal.backends.rocks_layout import (
    DAMAGED,
    JOURNAL_DIR,
    KEY_ID,
    MAX_ID,
    NEXT_KEY,
    TICK_VALUE,
    TRUNCATED_META,
    U32,
    U64,
    data_key,
    tail_state,
    tick_key,
)
from wal.errors import (
    ChannelExistError,
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
from wal.message import MessageID

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
DEFAULT_BLOCK_CACHE_BYTES = 8 << 20
"""Blocks read back from table files, and every table's index and filter blocks.  Readers mostly
tail from memory (the WAL's tail buffer) or read each block once while catching up, so a small cache
loses little."""

log = structlog.get_logger(__name__)


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


def _writev_some(fd: int, views: list[memoryview]) -> int:
    """``os.writev`` that writes at least one byte: none written (which a full disk may answer
    instead of ENOSPC) raises the ENOSPC it means."""
    n = os.writev(fd, views)
    if n <= 0:
        raise OSError(errno.ENOSPC, "journal write made no progress")
    return n


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


class RocksBackend(Backend):
    """RocksDB through rocksdict, raw mode.  Thread-safe as described in wal.backend."""

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
        # Memory (README "Memory"): at most MAX_WRITE_BUFFERS memtables of write_buffer_bytes each (one
        # taking writes, one being flushed), and one block cache that also holds the tables' index and
        # filter blocks, so that the SST files' readers are inside its bound rather than beside it.
        opts.set_write_buffer_size(write_buffer_bytes)
        opts.set_max_write_buffer_number(MAX_WRITE_BUFFERS)
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

    # --- the data journal ------------------------------------------------------------------------
    def _replay_journal(self) -> None:
        """Replay what the journal holds (see wal/backends/_replay.py): damage fails only the
        pchannels it touches; their channel records are marked and the files from the first damaged
        one on are kept (``.kept``), never replayed again nor deleted."""
        paths = _journal.files(self._journal_dir)
        if not paths:
            return
        replay = _replay.Replay(self._db, self._ropts, self._wopts_nolog, sorted(self._channel_keys()))
        kept_from: int | None = None
        for i, path in enumerate(paths):
            self._jseq = max(self._jseq, _journal.sequence_of(path))
            newest = i == len(paths) - 1
            for item in _journal.read(path, past_damage=True):
                if not isinstance(item, _journal.Torn):
                    replay.apply(item)
                elif item.damaged or not newest:
                    kept_from = i if kept_from is None else kept_from
                    replay.damage(path, item)
                else:
                    # Cut short by a crash before its sync: in SYNC durability never acknowledged; in
                    # RELAXED it is the loss a power failure may cause (see wal/README.md).  What is
                    # dropped is kept beside the journal, never replayed.
                    aside = _journal.keep_torn_tail(path, item.offset)
                    log.warning("journal ends in a torn write, dropped",
                                path=path, offset=item.offset, reason=item.reason,
                                dropped_bytes=os.path.getsize(aside) if aside else 0, kept_in=aside)
        damaged = replay.finish()
        # In RocksDB's tables before anything is marked or moved: the files are the only other copy.
        self._db.flush(True)
        if damaged:
            self._mark_damaged(damaged)
        if kept_from is not None:
            for path in paths[kept_from:]:
                os.rename(path, path + _journal.KEPT_SUFFIX)
            _journal.fsync_dir(self._journal_dir)
        self._drop_journal_before(self._jseq + 1)
        log.info("journal replayed", path=self._journal_dir, files=len(paths), records=replay.records,
                 skipped_groups=replay.skipped, damaged_pchannels=len(damaged))

    def _mark_damaged(self, damaged: dict[int, _replay.Damage]) -> None:
        """Mark each damaged pchannel's channel record (synced), so that it stays FAILED until
        ``salvage`` cuts it, though its journal files are no longer replayed."""
        names = self._channel_keys()
        for key, damage in sorted(damaged.items()):
            name = names.get(key)
            if name is None:
                log.warning("damaged journal records of a channel key no channel has", channel_key=key,
                            file=damage.file, offset=damage.offset)
                continue
            record = self._load(name)
            # A mark from an earlier open stays: its first_id is where the loss began.
            record.setdefault(DAMAGED, damage.record())
            self._db.put(b"C" + name.encode(), json.dumps(record).encode(), self._wopts_sync)
            log.error("journal damage: pchannel fails to open until salvaged", pchannel=name,
                      file=damage.file, offset=damage.offset, reason=damage.reason, first_missing_id=damage.first_id)

    def _open_journal(self, seq: int) -> None:
        """Start appending to journal file ``seq`` (the previous one is synced and closed first)."""
        os.makedirs(self._journal_dir, exist_ok=True)
        fd = os.open(_journal.file_name(self._journal_dir, seq), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        _journal.fsync_dir(self._journal_dir)
        with self._jlock:
            old, self._jfd = self._jfd, fd
            self._jseq, self._joffset, self._jalloc = seq, 0, 0
            self._jprealloc = self._journal_prealloc_bytes > 0
            if old >= 0:
                self._fdatasync(old)  # a sync in flight may still be for writes in the old file
                os.close(old)

    def _drop_journal_before(self, seq: int) -> None:
        """Flush RocksDB (what the older files hold reaches its tables), then delete those files."""
        self._db.flush(True)
        for path in _journal.files(self._journal_dir):
            if _journal.sequence_of(path) < seq:
                os.remove(path)
        _journal.fsync_dir(self._journal_dir)

    def _flush_in_background(self, seq: int) -> None:
        try:
            with self._in_use():
                self._drop_journal_before(seq)
        except Exception as exc:  # noqa: BLE001  (the files stay and are replayed on open: nothing is lost)
            log.warning("journal flush failed; the older files stay until the next one", error=repr(exc))

    def _journal_checkpoint(self) -> None:
        """Empty the journal: everything written so far is in RocksDB's tables afterwards.  Called
        before a deletion, so that replaying older writes can never undo it."""
        if not self._journaled:
            return
        assert self._jflusher is not None
        self._open_journal(self._jseq + 1)
        self._jflusher.submit(self._drop_journal_before, self._jseq).result()

    def _journal_append(self, groups: list[WriteGroup]) -> int:
        """Append one record; returns where the file ended before it (to cut a failed write off).

        A write that fails (a full disk: ENOSPC, usually after a short write) is cut off the file
        again, so it never leaves half a record behind and the next append starts where this one
        did: retrying is safe, since nothing of it was written, unlike after a failed sync (see
        ``_fdatasync``).  Only a cut that fails itself is final."""
        parts = _journal.encode(groups)
        start = self._joffset
        total = sum(map(len, parts))
        written = 0
        try:
            # A commit of many pchannels can have more blocks than one writev may take (IOV_MAX), and
            # writev may write less than asked (the disk filled up): go on from there, so that a full
            # disk ends in the OSError that names it.
            if start + total > self._jalloc and self._jprealloc:
                try:
                    self._preallocate(start + total + self._journal_prealloc_bytes)
                except OSError:
                    # No room ahead of the records (a filling disk): what was zero-written goes, and
                    # this file grows with its records alone, so that a full disk still takes
                    # every record that fits.
                    self._cut_journal(start)
                    self._jprealloc = False
            views = [memoryview(p) for p in parts]
            while views:
                n = _writev_some(self._jfd, views[:_IOV_MAX])
                written += n
                while views and n >= len(views[0]):
                    n -= len(views[0])
                    views.pop(0)
                if n:
                    views[0] = views[0][n:]
        except BaseException:
            self._cut_journal(start)
            raise
        self._joffset = start + total
        return start

    def _preallocate(self, end: int) -> None:
        """Write zeros from the journal file's end up to ``end`` (past the file position, which stays
        where the next record goes).  A failure (a full disk) is cut off again by the caller."""
        at = self._jalloc
        while at < end:
            n = os.pwrite(self._jfd, memoryview(_ZEROS)[:min(len(_ZEROS), end - at)], at)
            if n <= 0:
                raise OSError(errno.ENOSPC, "journal preallocation made no progress")
            at += n
            self._jalloc = at

    def _fdatasync(self, fd: int) -> None:
        """``fdatasync`` a journal file.  A failure is final, as databases treat a failed fsync: the
        kernel may have dropped the pages it could not write, and a later sync that succeeds would not
        bring them back, so what the journal holds after it is unknown.  Every later write and sync
        fails until the database is reopened (replay then applies what did reach the disk)."""
        try:
            os.fdatasync(fd)
        except OSError as exc:
            self._sync_failed = exc
            raise

    def _check_synced(self) -> None:
        if self._sync_failed is not None:
            raise UnrecoverableError(
                f"a journal sync in {self.path} failed ({self._sync_failed}); nothing more can be made durable "
                "until the database is reopened", path=self.path)

    def _cut_journal(self, offset: int) -> None:
        try:
            os.ftruncate(self._jfd, offset)
            os.lseek(self._jfd, offset, os.SEEK_SET)
        except OSError as exc:
            # Half a record may stay in the file: nothing may be appended after it, ever (replay
            # would take it for damage), so this is as final as a failed sync.
            self._sync_failed = exc
            raise
        self._joffset = offset
        self._jalloc = offset  # the zeros past it are cut too

    @staticmethod
    def _put_groups(wb: Any, groups: list[WriteGroup]) -> None:
        for g in groups:
            wb.put(data_key(g.channel_key, g.first_id), g.block)
            wb.put(b"H" + U32.pack(g.channel_key), U64.pack(g.max_timetick))
            for t in g.ticks:
                wb.put(tick_key(g.channel_key, t.timetick), TICK_VALUE.pack(t.message_id, t.resume_id))

    # --- channels --------------------------------------------------------------------------------
    def create_channel(self, name: str, properties: dict[str, str]) -> ChannelInfo:
        if not name:
            raise InvalidArgumentError("pchannel name must not be empty")
        with self._engine("create_channel"), self._meta_lock:
            if self._get(b"C" + name.encode(), "reading the channel record", name) is not None:
                raise ChannelExistError(f"pchannel {name!r} already exists", channel=name)
            raw_next = self._get(NEXT_KEY, "reading the next channel key", None)
            key = U32.unpack(raw_next)[0] if raw_next is not None else 1
            record = {"key": key, "term": 0, "properties": dict(properties)}
            wb = rocksdict.WriteBatch(raw_mode=True)
            wb.put(NEXT_KEY, U32.pack(key + 1))
            wb.put(b"C" + name.encode(), json.dumps(record).encode())
            self._db.write(wb, self._wopts_sync)
            return ChannelInfo(name, key, 0, 0, 0, 0, dict(properties))

    def open_channel(self, name: str) -> ChannelInfo:
        with self._engine("open_channel"), self._meta_lock:
            record = self._load(name)
            damage = record.get(DAMAGED)
            if isinstance(damage, dict):
                raise CorruptedError(
                    f"pchannel {name!r} lost journal records: {damage.get('file')} is damaged at byte "
                    f"{damage.get('offset')} ({damage.get('reason')}); the database holds its ids below "
                    f"{damage.get('first_id')} only, the rest is kept in that journal file: `streamingnode "
                    f"salvage --pchannel {name} --truncate-at-corruption` cuts it there",
                    channel=name, pchannel=name, path=str(damage.get("file")), file=str(damage.get("file")),
                    offset=damage.get("offset"), message_id=damage.get("first_id"))
            record["term"] = int(record["term"]) + 1
            self._db.put(b"C" + name.encode(), json.dumps(record).encode(), self._wopts_sync)
            return self._info(name, record)

    def describe_channel(self, name: str) -> ChannelInfo:
        with self._engine("describe_channel"):
            return self._info(name, self._load(name))

    def list_channels(self) -> list[str]:
        with self._engine("list_channels"):
            names: list[str] = []
            it = self._db.iter(self._ropts)
            try:
                it.seek(b"C")
                while self._valid(it, "listing channels", b"C", b"D", None):
                    k = it.key()
                    if not k.startswith(b"C"):
                        break
                    names.append(k[1:].decode())
                    it.next()
            finally:
                del it
            return names

    def destroy_channel(self, name: str) -> None:
        with self._engine("destroy_channel"), self._meta_lock:
            key = int(self._load(name)["key"])
            self._journal_checkpoint()
            wb = rocksdict.WriteBatch(raw_mode=True)
            wb.delete(b"C" + name.encode())
            wb.delete(b"H" + U32.pack(key))
            wb.delete_range(b"X" + U32.pack(key), b"X" + U32.pack(key + 1))
            wb.delete_range(data_key(key, 0), b"D" + U32.pack(key + 1))
            wb.delete_range(tick_key(key, 0), b"T" + U32.pack(key + 1))
            self._db.write(wb, self._wopts_sync)

    # --- data ------------------------------------------------------------------------------------
    def write(self, groups: list[WriteGroup], durable: bool) -> None:
        if self._stalled is not None and not self._closed:
            self._reopen()
        with self._engine("write"):
            wb = rocksdict.WriteBatch(raw_mode=True)
            self._put_groups(wb, groups)
            if self._journaled:
                self._check_synced()
                # Journal first: a write that fails after it is cut off the journal again, so nothing
                # unacknowledged can come back at replay.
                start = self._journal_append(groups)
                try:
                    self._db.write(wb, self._wopts_nolog)
                except BaseException:
                    self._cut_journal(start)
                    raise
                if durable:
                    self._fdatasync(self._jfd)
                if self._joffset >= self._journal_rotate_bytes:
                    assert self._jflusher is not None
                    self._open_journal(self._jseq + 1)
                    self._jflusher.submit(self._flush_in_background, self._jseq)
                return
            if not durable:
                self._db.write(wb, self._wopts_plain)
            elif self._sync_method is SyncMethod.WRITE_SYNC:
                self._db.write(wb, self._wopts_sync)
            else:
                self._db.write(wb, self._wopts_plain)
                self._db.flush_wal(True)

    def read_blocks(
        self, channel_key: int, from_id: MessageID, max_bytes: int
    ) -> list[tuple[MessageID, bytes]]:
        with self._engine("read"):
            prefix = b"D" + U32.pack(channel_key)
            out: list[tuple[MessageID, bytes]] = []
            total = 0
            lo, hi = data_key(channel_key, from_id), data_key(channel_key, MAX_ID)
            it = self._db.iter(self._ropts)
            try:
                it.seek_for_prev(lo)
                # Checked before the next seek, which would clear an error the first one met.
                if not self._valid(it, "reading", lo, hi, channel_key) or not it.key().startswith(prefix):
                    it.seek(lo)
                else:
                    # The block before from_id holds it only if it reaches that far.
                    first = KEY_ID.unpack_from(it.key(), 1)[1]
                    if first + block_count(it.value()) <= from_id:
                        it.next()
                while self._valid(it, "reading", lo, hi, channel_key):
                    k = it.key()
                    if not k.startswith(prefix):
                        break
                    v = it.value()
                    out.append((KEY_ID.unpack_from(k, 1)[1], v))
                    total += len(v)
                    if total >= max_bytes:
                        break
                    it.next()
            finally:
                del it
            return out

    def seek_time(self, channel_key: int, timetick: int) -> TickEntry | None:
        with self._engine("seek_time"):
            it = self._db.iter(self._ropts)
            try:
                it.seek_for_prev(tick_key(channel_key, timetick))
                found = self._valid(it, "searching the time index", tick_key(channel_key, 0),
                                    tick_key(channel_key, timetick), channel_key)
                if not found or not it.key().startswith(b"T" + U32.pack(channel_key)):
                    return None
                ts = KEY_ID.unpack_from(it.key(), 1)[1]
                mid, resume = TICK_VALUE.unpack(it.value())
                return TickEntry(ts, mid, resume)
            finally:
                del it

    def truncate(self, channel_key: int, before_id: MessageID) -> MessageID:
        with self._engine("truncate"):
            prefix = b"D" + U32.pack(channel_key)
            lo, hi = data_key(channel_key, 0), data_key(channel_key, before_id)
            it = self._db.iter(self._ropts)
            try:
                it.seek_for_prev(hi)
                if not self._valid(it, "truncating", lo, hi, channel_key) or not it.key().startswith(prefix):
                    # Nothing starts at or before before_id: nothing to drop.
                    it.seek(lo)
                    if self._valid(it, "truncating", lo, hi, channel_key) and it.key().startswith(prefix):
                        return int(KEY_ID.unpack_from(it.key(), 1)[1])
                    return before_id
                first = KEY_ID.unpack_from(it.key(), 1)[1]
                end = first + block_count(it.value())
                # Keep the block holding before_id; when before_id is exactly past its end, drop it too.
                keep_from = end if end <= before_id else first
                # Time-index entries of ticks that are gone go too: ticks are ordered by id as by time.
                stale_ticks: list[bytes] = []
                it.seek(tick_key(channel_key, 0))
                tprefix = b"T" + U32.pack(channel_key)
                tlo, thi = tick_key(channel_key, 0), tick_key(channel_key, MAX_ID)
                while (self._valid(it, "truncating the time index", tlo, thi, channel_key)
                       and it.key().startswith(tprefix)):
                    if TICK_VALUE.unpack(it.value())[0] >= keep_from:
                        break
                    stale_ticks.append(it.key())
                    it.next()
            finally:
                del it
            # No journal checkpoint (a RocksDB flush, milliseconds on the writer thread): the mark,
            # written with the deletion, makes replay skip the journal's copies of what is deleted.
            wb = rocksdict.WriteBatch(raw_mode=True)
            wb.put(b"X" + U32.pack(channel_key) + TRUNCATED_META.encode(), U64.pack(keep_from))
            wb.delete_range(data_key(channel_key, 0), data_key(channel_key, keep_from))
            for k in stale_ticks:
                wb.delete(k)
            self._db.write(wb, self._wopts_sync)
            return int(keep_from)

    def put_meta(self, channel_key: int, name: str, value: bytes) -> None:
        with self._engine("put_meta"):
            self._db.put(b"X" + U32.pack(channel_key) + name.encode(), value, self._wopts_sync)

    def get_meta(self, channel_key: int, name: str) -> bytes | None:
        with self._engine("get_meta"):
            raw = self._get(b"X" + U32.pack(channel_key) + name.encode(), f"reading {name!r}", channel_key)
            return bytes(raw) if raw is not None else None

    def sync(self) -> None:
        with self._engine("sync"):
            if self._journaled:
                with self._jlock:
                    self._check_synced()
                    self._fdatasync(self._jfd)
            else:
                self._db.flush_wal(True)

    def backup(self, dest: str) -> None:
        with self._engine("backup"):
            if os.path.exists(dest):
                raise InvalidArgumentError(f"backup destination {dest} already exists", path=dest)
            # A RocksDB checkpoint: hard links to immutable SST files plus a consistent MANIFEST/WAL cut;
            # what only the journal holds goes into the tables first.
            self._journal_checkpoint()
            cp = rocksdict.Checkpoint(self._db)
            try:
                cp.create_checkpoint(dest)
            finally:
                del cp

    def close(self) -> None:
        """Close, never raising for a storage failure: what the failure kept from reaching RocksDB's
        tables is still in the journal (or RocksDB's log) and is replayed at the next open, so a
        node stopping after a disk error (full, failed sync) logs it and exits cleanly."""
        if self._closed:
            return
        self._closed = True
        with self._in_use():
            try:
                # A clean close leaves nothing to replay: the next open starts at once.  (Switching
                # the file syncs the old one first.)
                if self._stalled is None and self._sync_failed is None:
                    self._journal_checkpoint()
                    self._db.flush_wal(True)
            except Exception as exc:  # noqa: BLE001  (see the docstring: nothing is lost)
                log.warning("closing the WAL database left work for the next open", path=self.path, error=str(exc))
            finally:
                if self._jflusher is not None:
                    self._jflusher.shutdown(wait=True)
                if self._jfd >= 0:
                    os.close(self._jfd)
                    self._jfd = -1
                try:
                    self._db.close()
                except Exception as exc:  # noqa: BLE001  (RocksDB repeats the error it stopped on)
                    log.warning("the WAL database reported an error on close", path=self.path, error=str(exc))


__all__ = ["RocksBackend", "SyncMethod"]
