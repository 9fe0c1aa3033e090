"""The RocksDB backend's data journal writer: group commits appended to ``journal/<seq>.jnl`` with one
``writev`` and ``fdatasync`` (no GIL), files rotated and dropped once RocksDB has flushed them, the
journal replayed on open.  The record format is ``wal.backends._journal``'s."""

from __future__ import annotations

import errno
import json
import os
from typing import Any

from wal.backend import WriteGroup
from wal.backends import _journal, _replay
from wal.backends._rocks_engine import (
    _IOV_MAX,
    _ZEROS,
    RocksEngine,
    log,  # the backend's one logger
)
from wal.backends.rocks_layout import (
    DAMAGED,
    TICK_VALUE,
    U32,
    U64,
    data_key,
    tick_key,
)
from wal.errors import (
    UnrecoverableError,
)


def _writev_some(fd: int, views: list[memoryview]) -> int:
    """``os.writev`` that writes at least one byte: none written (which a full disk may answer
    instead of ENOSPC) raises the ENOSPC it means."""
    n = os.writev(fd, views)
    if n <= 0:
        raise OSError(errno.ENOSPC, "journal write made no progress")
    return n

class JournalWriter(RocksEngine):
    """The journal half of ``RocksBackend``."""

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
