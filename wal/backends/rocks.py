"""The RocksDB backend (through rocksdict): one database per data directory, many pchannels.

Key layout (all integers big-endian so that byte order is numeric order; see wal/README.md):

    b"M" + b"next_key"            -> u32   next channel key to hand out (never reused)
    b"C" + name (utf-8)           -> JSON  {"key", "term", "properties"} (+ "damaged", see _replay.py)
    b"D" + u32 key + u64 first_id -> block (codec block of messages first_id ..)
    b"T" + u32 key + u64 timetick -> u64 tick message id + u64 resume id
    b"H" + u32 key                -> u64   largest timetick acknowledged (written with every block)
    b"X" + u32 key + name         -> bytes small per-channel values (put_meta), e.g. the ts window,
                                           and the truncation mark (rocks_layout.TRUNCATED_META)

A write is one WriteBatch holding every block of a group commit and their time-index entries, so a
block and its index entries appear together or not at all.  By default (``SyncMethod.JOURNAL``) that
batch skips RocksDB's own log and the group commit goes to the data journal instead (see
wal/backends/_journal.py); channel records and metadata always use RocksDB's log.
"""

from __future__ import annotations

import json
import os

import rocksdict
import structlog

from wal._codec import block_count
from wal.backend import ChannelInfo, TickEntry, WriteGroup
from wal.backends._rocks_engine import (
    DEFAULT_BLOCK_CACHE_BYTES,
    DEFAULT_WRITE_BUFFER_BYTES,
    JOURNAL_PREALLOC_BYTES,
    MAX_WRITE_BUFFERS,
    MIN_WRITE_BUFFER_BYTES,
    SyncMethod,
    l0_compaction_trigger,
)
from wal.backends._rocks_journal import JournalWriter
from wal.backends.rocks_layout import (
    DAMAGED,
    KEY_ID,
    MAX_ID,
    NEXT_KEY,
    TICK_VALUE,
    TRUNCATED_META,
    U32,
    U64,
    data_key,
    tick_key,
)
from wal.errors import (
    ChannelExistError,
    CorruptedError,
    InvalidArgumentError,
)
from wal.message import MessageID

log = structlog.get_logger(__name__)


class RocksBackend(JournalWriter):
    """RocksDB through rocksdict, raw mode.  Thread-safe as described in wal.backend.  Its parts: the
    engine (``_rocks_engine``: opening, statuses, channel records), the journal writer
    (``_rocks_journal``) and, here, the channel and data operations of the Backend contract."""

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

    def flush_tables(self) -> None:
        """Write the memtables out to table files, from any thread (RocksDB's flush is thread-safe and
        rocksdict releases the GIL for it): a ``backup`` right after it flushes, on the writer thread,
        only what came since."""
        with self._engine("flush_tables"):
            self._db.flush(True)

    def backup(self, dest: str) -> None:
        with self._engine("backup"):
            if os.path.exists(dest):
                raise InvalidArgumentError(f"backup destination {dest} already exists", path=dest)
            # A RocksDB checkpoint: hard links to immutable SST files plus a consistent MANIFEST/WAL cut.
            # It flushes the memtables first (rocksdict asks for a flush whatever the log's size), and
            # every journaled write is in a memtable before its write returns: the journal need not be
            # emptied first, which would keep the appends waiting for a journal switch and a second flush.
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

__all__ = [
    "DEFAULT_BLOCK_CACHE_BYTES",
    "DEFAULT_WRITE_BUFFER_BYTES",
    "JOURNAL_PREALLOC_BYTES",
    "MAX_WRITE_BUFFERS",
    "MIN_WRITE_BUFFER_BYTES",
    "RocksBackend",
    "SyncMethod",
    "l0_compaction_trigger",
]
