"""The RocksDB backend (through rocksdict): one database per data directory, many pchannels.

Key layout (all integers big-endian so that byte order is numeric order; see wal/README.md):

    b"M" + b"next_key"            -> u32   next channel key to hand out (never reused)
    b"C" + name (utf-8)           -> JSON  {"key", "term", "properties"}
    b"D" + u32 key + u64 first_id -> block (codec block of messages first_id ..)
    b"T" + u32 key + u64 timetick -> u64 tick message id + u64 resume id
    b"H" + u32 key                -> u64   largest timetick acknowledged (written with every block)
    b"X" + u32 key + name         -> bytes small per-channel values (put_meta), e.g. the ts window

A write is one WriteBatch holding every block of a group commit and their time-index entries, so a
block and its index entries appear together or not at all.  By default (``SyncMethod.JOURNAL``) that
batch skips RocksDB's own log and the group commit goes to the data journal instead (see
wal/backends/_journal.py); channel records and metadata always use RocksDB's log.
"""

from __future__ import annotations

import concurrent.futures
import enum
import json
import os
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import rocksdict
import structlog

from wal._codec import block_count
from wal.backend import Backend, ChannelInfo, TickEntry, WriteGroup
from wal.backends import _journal
from wal.backends._keys import tail_state
from wal.errors import (
    ChannelExistError,
    ChannelNotExistError,
    CorruptedError,
    ErrorCode,
    InvalidArgumentError,
    OnShutdownError,
    StreamingError,
    UnavailableError,
    UnrecoverableError,
)
from wal.message import MessageID

_U32 = struct.Struct(">I")
_KEY_ID = struct.Struct(">IQ")
_TICK_VALUE = struct.Struct(">QQ")
_U64 = struct.Struct(">Q")
_NEXT_KEY = b"Mnext_key"
_MAX_ID = 0xFFFFFFFFFFFFFFFF
# RocksDB statuses that say "not now" rather than "broken": the redo step may run the append again.
_TRANSIENT_STATUSES = ("Busy", "TryAgain", "TimedOut", "Resource busy")
_JOURNAL_DIR = "journal"
_IOV_MAX = 1024

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


def _data_key(key: int, message_id: MessageID) -> bytes:
    return b"D" + _KEY_ID.pack(key, message_id)


def _lock_held(exc: Exception) -> bool:
    """Whether opening failed because RocksDB's LOCK file is held: by another process ("While lock
    file: <dir>/LOCK: Resource temporarily unavailable") or by an earlier open in this one ("lock hold
    by current process ... <dir>/LOCK: No locks available")."""
    text = str(exc)
    return text.startswith("IO error") and "/LOCK" in text and ("lock hold by" in text or "While lock file" in text)


def _tick_key(key: int, ts: int) -> bytes:
    return b"T" + _KEY_ID.pack(key, ts)


class RocksBackend(Backend):
    """RocksDB through rocksdict, raw mode.  Thread-safe as described in wal.backend."""

    def __init__(
        self, path: str | os.PathLike[str], sync_method: SyncMethod = SyncMethod.JOURNAL, *,
        journal_rotate_bytes: int = 64 << 20,
    ) -> None:
        self.path = os.fspath(path)
        self._sync_method = sync_method
        self.split_sync = sync_method is not SyncMethod.WRITE_SYNC
        self._meta_lock = threading.Lock()
        self._closed = False
        self._journaled = sync_method is SyncMethod.JOURNAL
        self._journal_dir = os.path.join(self.path, _JOURNAL_DIR)
        self._journal_rotate_bytes = journal_rotate_bytes
        self._jfd = -1  # the journal file being appended to
        self._jseq = 0
        self._joffset = 0
        # Held to swap or close the journal file and by sync() around its fdatasync, never by a write:
        # the writer appends while the sync thread syncs the previous commit.
        self._jlock = threading.Lock()
        self._jflusher: concurrent.futures.ThreadPoolExecutor | None = None
        self._sync_failed: OSError | None = None  # see _fdatasync
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_paranoid_checks(True)
        # PointInTime recovery: after a crash the database is as of the last fully written batch;
        # a torn tail record is dropped, never surfaced.
        opts.set_wal_recovery_mode(rocksdict.DBRecoveryMode.point_in_time())
        opts.increase_parallelism(2)
        opts.set_write_buffer_size(64 << 20)
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
                f"cannot open WAL database at {self.path}: {exc}", path=self.path
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

    @contextmanager
    def _engine(self, what: str) -> Iterator[None]:
        """Translate engine failures at the boundary, naming the database path."""
        self._check_open()
        try:
            yield
        except StreamingError:
            raise
        except Exception as exc:  # rocksdict raises plain Exception; its text carries RocksDB's status
            if any(status in str(exc) for status in _TRANSIENT_STATUSES):
                raise StreamingError(
                    f"{what} in {self.path} hit a transient condition: {exc}", code=ErrorCode.UNAVAILABLE,
                    path=self.path,
                ) from exc
            raise UnrecoverableError(f"{what} failed in {self.path}: {exc}", path=self.path) from exc

    def _load(self, name: str) -> dict[str, Any]:
        raw = self._db.get(b"C" + name.encode())
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
        it = self._db.iter()
        try:
            it.seek(_data_key(key, 0))
            if it.valid() and it.key()[:5] == b"D" + _U32.pack(key):
                info.first_id = info.next_id = _KEY_ID.unpack_from(it.key(), 1)[1]
            it.seek_for_prev(_data_key(key, _MAX_ID))
            last = None
            if it.valid() and it.key()[:5] == b"D" + _U32.pack(key):
                last = (_KEY_ID.unpack_from(it.key(), 1)[1], bytes(it.value()))
        finally:
            del it
        raw_max = self._db.get(b"H" + _U32.pack(key))
        max_ts = _U64.unpack(raw_max)[0] if raw_max is not None else 0
        return tail_state(info, last, str(self.path), max_ts)

    # --- the data journal ------------------------------------------------------------------------
    def _replay_journal(self) -> None:
        paths = _journal.files(self._journal_dir)
        if not paths:
            return
        replayed = 0
        for i, path in enumerate(paths):
            self._jseq = max(self._jseq, _journal.sequence_of(path))
            for item in _journal.read(path):
                if isinstance(item, _journal.Torn):
                    if i != len(paths) - 1:
                        raise _journal.corrupted(path, item)
                    # Cut short by a crash before its sync: in SYNC durability never acknowledged; in
                    # RELAXED it is the loss a power failure may cause (see wal/README.md).
                    log.warning("journal ends in a torn write, dropped",
                                path=path, offset=item.offset, reason=item.reason,
                                dropped_bytes=os.path.getsize(path) - item.offset)
                    break
                wb = rocksdict.WriteBatch(raw_mode=True)
                self._put_groups(wb, item)
                self._db.write(wb, self._wopts_nolog)
                replayed += 1
        # In RocksDB's tables now: the files can go.
        self._drop_journal_before(self._jseq + 1)
        log.info("journal replayed", path=self._journal_dir, files=len(paths), records=replayed)

    def _open_journal(self, seq: int) -> None:
        """Start appending to journal file ``seq`` (the previous one is synced and closed first)."""
        os.makedirs(self._journal_dir, exist_ok=True)
        fd = os.open(_journal.file_name(self._journal_dir, seq), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        _journal.fsync_dir(self._journal_dir)
        with self._jlock:
            old, self._jfd = self._jfd, fd
            self._jseq, self._joffset = seq, 0
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
        """Append one record; returns where the file ended before it (to cut a failed write off)."""
        parts = _journal.encode(groups)
        start = self._joffset
        total = sum(map(len, parts))
        written = 0
        try:
            # A commit of many pchannels can have more blocks than one writev may take (IOV_MAX).
            for i in range(0, len(parts), _IOV_MAX):
                written += os.writev(self._jfd, parts[i:i + _IOV_MAX])
        except BaseException:
            self._cut_journal(start)
            raise
        if written != total:
            self._cut_journal(start)
            raise OSError(f"short journal write: {written} of {total} bytes")
        self._joffset = start + total
        return start

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
        os.ftruncate(self._jfd, offset)
        os.lseek(self._jfd, offset, os.SEEK_SET)
        self._joffset = offset

    @staticmethod
    def _put_groups(wb: Any, groups: list[WriteGroup]) -> None:
        for g in groups:
            wb.put(_data_key(g.channel_key, g.first_id), g.block)
            wb.put(b"H" + _U32.pack(g.channel_key), _U64.pack(g.max_timetick))
            for t in g.ticks:
                wb.put(_tick_key(g.channel_key, t.timetick), _TICK_VALUE.pack(t.message_id, t.resume_id))

    # --- channels --------------------------------------------------------------------------------
    def create_channel(self, name: str, properties: dict[str, str]) -> ChannelInfo:
        if not name:
            raise InvalidArgumentError("pchannel name must not be empty")
        with self._engine("create_channel"), self._meta_lock:
            if self._db.get(b"C" + name.encode()) is not None:
                raise ChannelExistError(f"pchannel {name!r} already exists", channel=name)
            raw_next = self._db.get(_NEXT_KEY)
            key = _U32.unpack(raw_next)[0] if raw_next is not None else 1
            record = {"key": key, "term": 0, "properties": dict(properties)}
            wb = rocksdict.WriteBatch(raw_mode=True)
            wb.put(_NEXT_KEY, _U32.pack(key + 1))
            wb.put(b"C" + name.encode(), json.dumps(record).encode())
            self._db.write(wb, self._wopts_sync)
            return ChannelInfo(name, key, 0, 0, 0, 0, dict(properties))

    def open_channel(self, name: str) -> ChannelInfo:
        with self._engine("open_channel"), self._meta_lock:
            record = self._load(name)
            record["term"] = int(record["term"]) + 1
            self._db.put(b"C" + name.encode(), json.dumps(record).encode(), self._wopts_sync)
            return self._info(name, record)

    def describe_channel(self, name: str) -> ChannelInfo:
        with self._engine("describe_channel"):
            return self._info(name, self._load(name))

    def list_channels(self) -> list[str]:
        with self._engine("list_channels"):
            names: list[str] = []
            it = self._db.iter()
            try:
                it.seek(b"C")
                while it.valid():
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
            wb.delete(b"H" + _U32.pack(key))
            wb.delete_range(b"X" + _U32.pack(key), b"X" + _U32.pack(key + 1))
            wb.delete_range(_data_key(key, 0), b"D" + _U32.pack(key + 1))
            wb.delete_range(_tick_key(key, 0), b"T" + _U32.pack(key + 1))
            self._db.write(wb, self._wopts_sync)

    # --- data ------------------------------------------------------------------------------------
    def write(self, groups: list[WriteGroup], durable: bool) -> None:
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
            prefix = b"D" + _U32.pack(channel_key)
            out: list[tuple[MessageID, bytes]] = []
            total = 0
            it = self._db.iter()
            try:
                it.seek_for_prev(_data_key(channel_key, from_id))
                if not it.valid() or not it.key().startswith(prefix):
                    it.seek(_data_key(channel_key, from_id))
                else:
                    # The block before from_id holds it only if it reaches that far.
                    first = _KEY_ID.unpack_from(it.key(), 1)[1]
                    if first + block_count(it.value()) <= from_id:
                        it.next()
                while it.valid():
                    k = it.key()
                    if not k.startswith(prefix):
                        break
                    v = it.value()
                    out.append((_KEY_ID.unpack_from(k, 1)[1], v))
                    total += len(v)
                    if total >= max_bytes:
                        break
                    it.next()
            finally:
                del it
            return out

    def seek_time(self, channel_key: int, timetick: int) -> TickEntry | None:
        with self._engine("seek_time"):
            it = self._db.iter()
            try:
                it.seek_for_prev(_tick_key(channel_key, timetick))
                if not it.valid() or not it.key().startswith(b"T" + _U32.pack(channel_key)):
                    return None
                ts = _KEY_ID.unpack_from(it.key(), 1)[1]
                mid, resume = _TICK_VALUE.unpack(it.value())
                return TickEntry(ts, mid, resume)
            finally:
                del it

    def truncate(self, channel_key: int, before_id: MessageID) -> MessageID:
        with self._engine("truncate"):
            prefix = b"D" + _U32.pack(channel_key)
            it = self._db.iter()
            try:
                it.seek_for_prev(_data_key(channel_key, before_id))
                if not it.valid() or not it.key().startswith(prefix):
                    # Nothing starts at or before before_id: nothing to drop.
                    it.seek(_data_key(channel_key, 0))
                    if it.valid() and it.key().startswith(prefix):
                        return int(_KEY_ID.unpack_from(it.key(), 1)[1])
                    return before_id
                first = _KEY_ID.unpack_from(it.key(), 1)[1]
                end = first + block_count(it.value())
                # Keep the block holding before_id; when before_id is exactly past its end, drop it too.
                keep_from = end if end <= before_id else first
                # Time-index entries of ticks that are gone go too: ticks are ordered by id as by time.
                stale_ticks: list[bytes] = []
                it.seek(_tick_key(channel_key, 0))
                tprefix = b"T" + _U32.pack(channel_key)
                while it.valid() and it.key().startswith(tprefix):
                    if _TICK_VALUE.unpack(it.value())[0] >= keep_from:
                        break
                    stale_ticks.append(it.key())
                    it.next()
            finally:
                del it
            self._journal_checkpoint()
            wb = rocksdict.WriteBatch(raw_mode=True)
            wb.delete_range(_data_key(channel_key, 0), _data_key(channel_key, keep_from))
            for k in stale_ticks:
                wb.delete(k)
            self._db.write(wb, self._wopts_sync)
            return int(keep_from)

    def put_meta(self, channel_key: int, name: str, value: bytes) -> None:
        with self._engine("put_meta"):
            self._db.put(b"X" + _U32.pack(channel_key) + name.encode(), value, self._wopts_sync)

    def get_meta(self, channel_key: int, name: str) -> bytes | None:
        with self._engine("get_meta"):
            raw = self._db.get(b"X" + _U32.pack(channel_key) + name.encode())
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
        if self._closed:
            return
        self._closed = True
        try:
            # A clean close leaves nothing to replay: the next open starts at once.  (Switching the
            # file syncs the old one first.)
            self._journal_checkpoint()
            self._db.flush_wal(True)
        finally:
            if self._jflusher is not None:
                self._jflusher.shutdown(wait=True)
            if self._jfd >= 0:
                os.close(self._jfd)
                self._jfd = -1
            self._db.close()


__all__ = ["RocksBackend", "SyncMethod"]
