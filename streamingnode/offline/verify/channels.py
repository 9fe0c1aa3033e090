"""The WAL as a whole, for ``verify`` and ``salvage``: per pchannel, the extents of its blocks (from
the database and the journal), where its ids stop being trustworthy and why, and its recovery
snapshots checked against them."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from streamingnode.offline.verify.access import Finding, Progress, one_line
from streamingnode.offline.verify.journal import JournalRecord, scan_journal
from streamingnode.offline.verify.tables import Unreadable, describe_key, scan_rocks
from wal.backends.rocks_layout import DAMAGED, KEPT_SUFFIX, TRUNCATED_META
from wal.backends.rocks_layout import KEY_ID as _KEY_ID
from wal.backends.rocks_layout import TICK_VALUE as _TICK_VALUE
from wal.backends.rocks_layout import U32 as _U32
from wal.backends.rocks_layout import U64 as _U64


@dataclass(slots=True)
class Extent:
    """Stored ids ``[first, end)`` of one block; ``end`` None: the block is damaged."""

    first: int
    end: int | None
    where: str
    kept: bool = False
    """From a kept journal file: its data is in the database already, or past a cut."""


@dataclass(slots=True)
class ChannelScan:
    name: str
    key: int
    record: dict[str, Any]
    extents: list[Extent] = field(default_factory=list)
    damage: list[tuple[int, str]] = field(default_factory=list)
    """(id from which the log cannot be trusted, why), from the database and the journal."""
    tail_end: int = 0
    """One past the last id of the last stored block, when damage kept the scan from reaching it."""
    truncated_before: int = 0
    """The truncation mark (``TRUNCATED_META``): journal copies of blocks below it are deleted data."""
    marked: dict[str, Any] | None = None
    """The channel record's DAMAGED field: a node found damaged journal records of this pchannel."""

    def first_problem(self) -> tuple[int, str] | None:
        """The first id that is damaged or missing, and why; None when every block is whole."""
        gaps, damaged = self._walk()
        return min([*self.damage, *gaps, *damaged], default=None)

    def gaps(self) -> list[tuple[int, str]]:
        """Where the blocks, walked in id order up to the first damaged one, miss or overlap ids."""
        return self._walk()[0]

    def _walk(self) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
        problems: list[tuple[int, str]] = []
        damaged: list[tuple[int, str]] = []
        best: dict[int, Extent] = {}
        for e in self.extents:
            prev = best.get(e.first)
            if prev is None or (prev.end is None and e.end is not None):
                best[e.first] = e  # a good copy (the journal's, replayed over a damaged one) wins
        expected: int | None = None
        for first in sorted(best):
            e = best[first]
            if expected is not None and first > expected:
                problems.append((expected, f"ids [{expected}, {first}) are missing (no block holds them)"))
                break
            if expected is not None and first < expected:
                problems.append((first, f"the block at id {first} ({e.where}) overlaps the one before it"))
                break
            if e.end is None:
                damaged.append((first, f"the block at id {first} ({e.where}) is damaged"))
                break
            expected = e.end
        return problems, damaged

    def end(self) -> int:
        """One past the last id any readable block holds."""
        return max([self.tail_end, *(e.end for e in self.extents if e.end is not None)])


@dataclass(slots=True)
class WalScan:
    channels: dict[int, ChannelScan] = field(default_factory=dict)
    journal: list[JournalRecord] = field(default_factory=list)
    unreadable: list[Unreadable] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    keys: int = 0
    journal_damage: list[tuple[int, ...]] = field(default_factory=list)
    """Channel keys of each damaged journal record (empty: not known)."""

    def explained(self, ch: ChannelScan) -> bool:
        """Whether a damaged journal record may be why ``ch`` misses ids (a finding already)."""
        return any(not keys or ch.key in keys for keys in self.journal_damage)


def _region_channels(scan: WalScan, u: Unreadable) -> list[tuple[ChannelScan, bool]]:
    """Channels whose blocks may lie in an unreadable stretch: (channel, whether the stretch starts
    inside its blocks, so that its blocks read before it are whole)."""
    out = []
    for ch in scan.channels.values():
        lo, hi = b"D" + _U32.pack(ch.key), b"D" + _U32.pack(ch.key + 1)
        after = u.after or b""
        if (u.before is None or u.before > lo) and after < hi:
            out.append((ch, lo <= after))
    return out


def _block_problem(block: bytes, first_id: int) -> str | None:
    """What is wrong with a stored block (its CRC, its framing), or None."""
    from wal._codec import block_checksum_ok, block_count, decode_block  # noqa: PLC0415
    from wal.errors import CodecError  # noqa: PLC0415

    if not block_checksum_ok(block):
        return "its checksum or length does not match its body"
    try:
        if len(decode_block(block, first_id, checksum_verified=True)) != block_count(block):
            return "it holds fewer messages than its header counts"
    except CodecError as exc:
        return str(exc)
    return None


def _last_block_end(db: Any, channel_key: int) -> int:
    """One past the last id of a channel's last block, read past damage where RocksDB can (0 when it
    cannot): only to say how much a cut removes."""
    from wal._codec import block_count  # noqa: PLC0415
    from wal.errors import CodecError  # noqa: PLC0415

    it = db.iter()
    try:
        it.seek_for_prev(b"D" + _KEY_ID.pack(channel_key, 0xFFFFFFFFFFFFFFFF))
        if it.valid() and bytes(it.key()).startswith(b"D" + _U32.pack(channel_key)):
            return int(_KEY_ID.unpack_from(bytes(it.key()), 1)[1] + block_count(bytes(it.value())))
    except (Exception, CodecError):  # noqa: BLE001  (rocksdict raises plain Exception; the count is a hint)
        return 0
    finally:
        del it
    return 0


_TRUNCATED = TRUNCATED_META.encode()


def _marked(scan: WalScan, ch: ChannelScan, mark: Any, rocks_name: str, key: str) -> None:
    """A channel record with the DAMAGED field: a finding at the damaged journal record it names,
    and the pchannel's ids untrustworthy from the first one the database lacks."""
    try:
        path, offset, first_id = str(mark["file"]), int(mark["offset"]), int(mark["first_id"])
        reason = str(mark.get("reason", ""))
    except (KeyError, TypeError, ValueError):
        scan.findings.append(Finding(rocks_name, f"pchannel {ch.name!r} is marked damaged, but the mark is not "
                                                 f"readable: {str(mark)[:200]}", key=key, channel=ch.name))
        ch.damage.append((0, "its channel record is marked damaged (an unreadable mark)"))
        return
    ch.marked = mark
    if not os.path.exists(path) and os.path.exists(path + KEPT_SUFFIX):
        path += KEPT_SUFFIX  # the mark names the file as it was read; the node renamed it after
    why = (f"a node found its journal record in {path} at byte {offset} damaged ({one_line(reason)[:200]}); "
           f"the database holds its ids below {first_id} only")
    scan.findings.append(Finding(path, f"pchannel {ch.name!r} is marked damaged (first id not held: {first_id}): "
                                       f"{why}; it fails to open until salvaged", offset=offset, channel=ch.name))
    ch.damage.append((first_id, why))


def scan_wal(data_dir: str, db: Any, progress: Progress | None = None) -> WalScan:
    """Read the journal and every key of ``db``: findings for what is damaged, and per pchannel the
    extents of its blocks (see ``ChannelScan.first_problem``)."""
    from wal._codec import block_count  # noqa: PLC0415

    scan = WalScan()
    scan.journal = scan_journal(data_dir, scan.findings, scan.notes, scan.journal_damage)
    rocks_name = os.path.join(data_dir, "(rocksdb)")
    for k, v in scan_rocks(db, scan.unreadable):
        scan.keys += 1
        if progress is not None:
            progress.tick(f"{scan.keys} keys")
        kind = k[:1]
        if kind == b"C":
            name = k[1:].decode(errors="replace")
            try:
                record = json.loads(v)
                ck = int(record["key"])
                int(record["term"])
            except (ValueError, KeyError, TypeError):
                scan.findings.append(Finding(rocks_name, "channel record is not readable", key=describe_key(k),
                                             channel=name))
                continue
            scan.channels[ck] = ChannelScan(name, ck, record)
            mark = record.get(DAMAGED)
            if mark is not None:
                _marked(scan, scan.channels[ck], mark, rocks_name, describe_key(k))
        elif kind == b"D" and len(k) == 13:
            ck, first = _KEY_ID.unpack_from(k, 1)
            ch = scan.channels.get(ck)
            if ch is None:
                scan.findings.append(Finding(rocks_name, "block of no pchannel (no channel record has its key)",
                                             key=describe_key(k)))
                continue
            problem = _block_problem(v, first)
            if problem is None:
                ch.extents.append(Extent(first, first + block_count(v), "database"))
            else:
                ch.extents.append(Extent(first, None, "database"))
                scan.findings.append(Finding(rocks_name, f"stored block of pchannel {ch.name!r} is damaged: {problem}",
                                             key=describe_key(k), channel=ch.name))
        elif kind == b"T" and len(k) == 13 and len(v) != _TICK_VALUE.size:
            scan.findings.append(Finding(rocks_name, f"time-index entry has {len(v)} bytes, not 16",
                                         key=describe_key(k)))
        elif kind == b"H" and len(v) != 8:
            scan.findings.append(Finding(rocks_name, f"timetick mark has {len(v)} bytes, not 8",
                                         key=describe_key(k)))
        elif kind == b"X" and k[5:] == _TRUNCATED and len(k) >= 5:
            owner = scan.channels.get(_U32.unpack_from(k, 1)[0])
            if owner is not None and len(v) == _U64.size:
                owner.truncated_before = _U64.unpack(v)[0]
    for record in scan.journal:
        for g in record.groups:
            ch = scan.channels.get(g.channel_key)
            # Below the truncation mark a journal copy is of deleted data: replay skips it, and so
            # do the extents (else a truncated pchannel would show a gap up to its first kept block).
            if ch is not None and g.first_id >= ch.truncated_before:
                where = f"{'kept ' if record.kept else ''}journal {record.path}"
                ch.extents.append(Extent(g.first_id, g.first_id + block_count(g.block), where, record.kept))
    for u in scan.unreadable:
        names = []
        for ch, inside in _region_channels(scan, u):
            good = [e.end for e in ch.extents if e.end is not None and e.where == "database"
                    and (u.after is None or b"D" + _KEY_ID.pack(ch.key, e.first) <= u.after)]
            start = max(good, default=0) if inside else 0
            ch.damage.append((start, f"RocksDB cannot read its blocks from id {start} on ({u.file})"))
            ch.tail_end = max(ch.tail_end, _last_block_end(db, ch.key))
            names.append(ch.name)
        on = f"; holds blocks of pchannel(s) {', '.join(map(repr, names))}" if names else ""
        scan.findings.append(Finding(
            u.file, f"RocksDB cannot read keys after {describe_key(u.after)} up to {describe_key(u.before)}: "
                    f"{one_line(u.error)}{on}"))
    return scan


def check_snapshots(data_dir: str, db: Any, scan: WalScan, only: str | None) -> None:
    from interceptors.recovery.snapshot import SNAPSHOT_META, RecoverySnapshot  # noqa: PLC0415
    from wal.errors import CorruptedError  # noqa: PLC0415

    for ch in scan.channels.values():
        if only is not None and ch.name != only:
            continue
        prefix = b"X" + _U32.pack(ch.key) + SNAPSHOT_META.encode()
        it = db.iter()
        try:
            it.seek(prefix)
            while it.valid() and bytes(it.key()).startswith(prefix):
                key, raw = bytes(it.key()), bytes(it.value())
                try:
                    snap = RecoverySnapshot.decode(raw, ch.name)
                except CorruptedError as exc:
                    scan.findings.append(Finding(os.path.join(data_dir, "(rocksdb)"), str(exc), key=describe_key(key),
                                                 channel=ch.name))
                else:
                    if snap.message_id > ch.end():
                        scan.findings.append(Finding(
                            os.path.join(data_dir, "(rocksdb)"),
                            f"recovery snapshot of pchannel {ch.name!r} is at id {snap.message_id}, past the "
                            f"last stored id {ch.end() - 1}", key=describe_key(key), channel=ch.name))
                it.next()
        finally:
            del it


def check_groups(data_dir: str, db: Any, scan: WalScan, only: str | None) -> None:
    """A finding for every consumer group position stored out of range (left by a version that
    checked less): past the last stored id, below the oldest retained one, or with a timetick above
    any the pchannel has allocated (its timetick mark and its timestamp window).  Such a group would
    fail to open, or read nothing until the clock reached that time."""
    from streamingnode.node.groups import META_KEY, range_problem  # noqa: PLC0415
    from wal.clock import WINDOW_META, decode_window  # noqa: PLC0415

    rocks_name = os.path.join(data_dir, "(rocksdb)")
    for ch in scan.channels.values():
        if only is not None and ch.name != only:
            continue
        key = b"X" + _U32.pack(ch.key) + META_KEY.encode()
        raw = db.get(key)
        if raw is None:
            continue
        try:
            doc = json.loads(bytes(raw))
            groups = {str(g): {str(v): (int(p[0]), int(p[1])) for v, p in vs.items()} for g, vs in doc.items()}
        except (ValueError, TypeError, AttributeError, IndexError):
            scan.findings.append(Finding(rocks_name, f"consumer groups of pchannel {ch.name!r} are not readable",
                                         key=describe_key(key), channel=ch.name))
            continue
        firsts = [e.first for e in ch.extents if e.end is not None]
        first = max(ch.truncated_before, min(firsts, default=0))
        end = max(ch.end(), ch.truncated_before)
        mark = db.get(b"H" + _U32.pack(ch.key))
        newest = _U64.unpack(bytes(mark))[0] if mark is not None and len(mark) == _U64.size else 0
        window = db.get(b"X" + _U32.pack(ch.key) + WINDOW_META.encode())
        newest = max(newest, decode_window(None if window is None else bytes(window)))
        for group, positions in sorted(groups.items()):
            for vchannel, (mid, ts) in sorted(positions.items()):
                why = range_problem(mid, ts, first, end, newest)
                if why is not None:
                    scan.findings.append(Finding(
                        rocks_name, f"consumer group {group[:200]!r} of pchannel {ch.name!r}, vchannel "
                                    f"{vchannel[:200]!r}: committed position ({mid}, {ts}) is out of range: {why}; "
                                    "opening the group fails until SeekConsumerGroup moves it",
                        key=describe_key(key), channel=ch.name))


__all__ = ["ChannelScan", "Extent", "WalScan", "check_groups", "check_snapshots", "scan_wal"]
