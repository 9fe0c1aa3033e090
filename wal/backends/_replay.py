"""Journal replay that contains damage to the pchannels it touches (the RocksDB backend's open).

Every journal file left at open is read in order and its groups are put into RocksDB, as before.
What is new is what happens at a record that does not check out and is not a torn tail (see
``wal.backends._journal``): instead of refusing the whole database, replay works out which pchannels
the damage can have cost something, and only those fail.

- The record's meta checks out: its groups whose blocks check out are applied; a pchannel with a bad
  block is damaged, unless RocksDB's tables already hold a whole block under the same key (the
  journal file was kept for a flush that had in fact finished).
- The meta does not check out: the record's pchannels cannot be named.  Every pchannel becomes a
  suspect, cleared by its next group in a later record if that group continues its ids with no gap
  (ids are handed out in order, and records are written in order, so a pchannel that had a block in
  the damaged record shows a gap after it).  Suspects left at the end are damaged: the mistake goes
  towards refusing, never towards serving a pchannel that silently misses messages.

A damaged pchannel gets nothing more from the journal (its database content stays a clean prefix);
``first_id`` is the first id of it the database does not hold.  Groups below a pchannel's truncation
mark (``TRUNCATED_META``) are skipped: truncation deletes with no journal checkpoint, so replay must
not bring those blocks back.  The largest timetick (H) is put for every group, skipped or not, so time
never goes back.  What the caller does with the result (flush, mark the channel records, keep the
files) is ``RocksBackend._replay_journal``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import rocksdict

from wal._codec import block_checksum_ok, block_count
from wal.backend import WriteGroup
from wal.backends._journal import Torn
from wal.backends.rocks_layout import KEY_ID, TICK_VALUE, TRUNCATED_META, U32, U64

_MAX_ID = 0xFFFFFFFFFFFFFFFF


@dataclass(frozen=True, slots=True)
class Damage:
    """Why a pchannel gets nothing more from the journal: where, what, and from which id."""

    file: str
    offset: int
    reason: str
    first_id: int = 0

    def record(self) -> dict[str, Any]:
        return {"file": self.file, "offset": self.offset, "reason": self.reason, "first_id": self.first_id}


def data_key(key: int, first_id: int) -> bytes:
    return b"D" + KEY_ID.pack(key, first_id)


class Replay:
    """The state of one replay over a database (``db``: an open rocksdict, raw mode)."""

    def __init__(self, db: Any, read_options: Any, write_options: Any, channel_keys: list[int]) -> None:
        self._db = db
        self._ropts = read_options
        self._wopts = write_options
        self._channel_keys = channel_keys
        self._marks: dict[int, int] = {}
        self._next: dict[int, int] = {}
        self._suspects: dict[int, Damage] = {}
        self.damaged: dict[int, Damage] = {}
        self.records = 0
        self.skipped = 0

    # --- what the database holds -----------------------------------------------------------------
    def _mark(self, key: int) -> int:
        if key not in self._marks:
            raw = self._db.get(b"X" + U32.pack(key) + TRUNCATED_META.encode(), read_opt=self._ropts)
            self._marks[key] = U64.unpack(raw)[0] if raw is not None and len(raw) == U64.size else 0
        return self._marks[key]

    def next_id(self, key: int) -> int:
        """One past the last id the database holds of ``key`` (as replayed so far)."""
        if key not in self._next:
            end = self._mark(key)
            it = self._db.iter(self._ropts)
            try:
                it.seek_for_prev(data_key(key, _MAX_ID))
                if it.valid() and bytes(it.key()[:5]) == b"D" + U32.pack(key):
                    end = max(end, KEY_ID.unpack_from(it.key(), 1)[1] + block_count(bytes(it.value())))
            finally:
                del it
            self._next[key] = end
        return self._next[key]

    def _holds(self, key: int, first_id: int) -> bool:
        """Whether the tables already hold a whole block of ``key`` at ``first_id``."""
        raw = self._db.get(data_key(key, first_id), read_opt=self._ropts)
        return raw is not None and block_checksum_ok(bytes(raw))

    # --- the journal, record by record -------------------------------------------------------------
    def apply(self, groups: list[WriteGroup] | tuple[WriteGroup, ...]) -> None:
        wb = rocksdict.WriteBatch(raw_mode=True)
        for g in groups:
            key = g.channel_key
            wb.put(b"H" + U32.pack(key), U64.pack(g.max_timetick))
            if key in self.damaged or g.first_id < self._mark(key):
                self.skipped += 1
                continue
            expected = self.next_id(key)
            suspect = self._suspects.pop(key, None)
            if suspect is not None and g.first_id > expected:
                # A gap right after unreadable damage: the damaged record held blocks of this pchannel.
                self.damaged[key] = Damage(suspect.file, suspect.offset, suspect.reason, expected)
                self.skipped += 1
                continue
            wb.put(data_key(key, g.first_id), g.block)
            for t in g.ticks:
                wb.put(b"T" + KEY_ID.pack(key, t.timetick), TICK_VALUE.pack(t.message_id, t.resume_id))
            self._next[key] = max(expected, g.first_id + block_count(g.block))
        self._db.write(wb, self._wopts)
        self.records += 1

    def damage(self, path: str, torn: Torn) -> None:
        """A record that does not check out and is not a torn tail."""
        if torn.channel_keys:
            self.apply(torn.good)
            for key, first_id in torn.bad:
                if key in self.damaged or first_id < self._mark(key) or self._holds(key, first_id):
                    continue
                self.damaged[key] = Damage(path, torn.offset, torn.reason, self.next_id(key))
            return
        for key in self._channel_keys:
            if key not in self.damaged:
                self._suspects.setdefault(key, Damage(path, torn.offset, f"{torn.reason} (its pchannels cannot "
                                                                         "be named; no later block shows this "
                                                                         "one whole)"))

    def finish(self) -> dict[int, Damage]:
        """The damaged pchannels (suspects never cleared included), by channel key."""
        for key, suspect in self._suspects.items():
            self.damaged[key] = Damage(suspect.file, suspect.offset, suspect.reason, self.next_id(key))
        self._suspects.clear()
        return self.damaged


__all__ = ["Damage", "Replay"]
