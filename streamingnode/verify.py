"""``streamingnode verify``: an offline check of everything a data directory stores.

It reads the raw stores itself rather than through the WAL's open path, so that it finds damage
whatever that path makes of it:

- every journal record (``journal/*.jnl``: record header, metadata CRC, each block's CRC), reading on
  past a damaged record to the next valid one;
- every key of the RocksDB database with RocksDB's block checksums verified, continuing past an
  unreadable region to the next key range;
- every stored block (its CRC and framing) and, per pchannel, that the blocks (with those only the
  journal holds) cover the ids without a gap;
- the channel records and the recovery snapshot(s) of each pchannel;
- every Parquet file under the Parquet root: footer, row-group statistics, every row group read back,
  and the ids its name gives against the delivery keys its metadata holds.

One line per finding names the file (and the byte offset or key range where known).  The database is
opened read-only while a lock on RocksDB's own LOCK file keeps a node from opening it meanwhile; a
directory a running node holds is refused (``DataDirInUseError``).  ``salvage.py`` builds on the same
scan (``scan_wal``).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import struct
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from wal.backend import WriteGroup
from wal.backends._keys import KEY_ID as _KEY_ID
from wal.backends._keys import TICK_VALUE as _TICK_VALUE
from wal.backends._keys import U32 as _U32
from wal.errors import StreamingError, UnavailableError

JOURNAL_DIR = "journal"
PARQUET_DIR = "parquet"
# flusher/_layout.py: files whose name starts with these are not the flusher's committed data.
_HIDDEN = (".", "_quarantine")


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


# --- the lock --------------------------------------------------------------------------------------
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


# --- the journal -----------------------------------------------------------------------------------
@dataclass(slots=True)
class JournalRecord:
    path: str
    offset: int
    groups: list[WriteGroup]


def scan_journal(data_dir: str, findings: list[Finding], notes: list[str],
                 damaged_keys: list[tuple[int, ...]] | None = None) -> list[JournalRecord]:
    """Every valid record of every journal file, oldest first, reading on past damage.

    A damaged stretch is a finding, except one that ends the newest file with nothing valid after it
    and no trailer proving its record was written whole: a write torn by a crash, never acknowledged,
    which the node drops (a note).  The record format and that judgement are the journal's own
    (``wal.backends._journal``); what differs from replay is that this goes on after damage.
    """
    from wal.backends import _journal  # noqa: PLC0415

    paths = _journal.files(os.path.join(data_dir, JOURNAL_DIR))
    records: list[JournalRecord] = []
    for i, path in enumerate(paths):
        with open(path, "rb") as f:
            data = f.read()
        pos = 0
        while pos < len(data):
            parsed = _journal._parse(data, pos)
            if isinstance(parsed, tuple):
                groups, pos_next = parsed
                records.append(JournalRecord(path, pos, groups))
                pos = pos_next
                continue
            resume = _journal._valid_record_from(data, parsed.end if parsed.end is not None else pos + 1)
            if resume is None and i == len(paths) - 1 and not _journal._complete(data, pos, parsed):
                notes.append(f"{path} at byte {pos}: torn tail of {len(data) - pos} bytes ({parsed.reason}); "
                             "a write cut short by a crash, never acknowledged: the node drops it")
                break
            after = ("valid records follow it" if resume is not None
                     else "its trailer shows it was written whole" if i == len(paths) - 1
                     else "newer journal files follow it")
            keys = f" (channel keys {', '.join(map(str, parsed.channel_keys))})" if parsed.channel_keys else ""
            findings.append(Finding(path, f"damaged journal record{keys}: {parsed.reason}; {after}", offset=pos))
            if damaged_keys is not None:
                damaged_keys.append(tuple(parsed.channel_keys))  # () when its meta is unreadable
            if resume is None:
                break
            pos = resume
    return records


# --- RocksDB ---------------------------------------------------------------------------------------
def _next_boundary(key: bytes) -> bytes | None:
    """The first key of the next region after ``key``: the next channel's for keys that carry a channel
    key (D, T, H, X), else the next key letter."""
    if key[:1] in (b"D", b"T", b"H", b"X") and len(key) >= 5:
        (ck,) = _U32.unpack_from(key, 1)
        if ck < 0xFFFFFFFF:
            return key[:1] + _U32.pack(ck + 1)
    if not key or key[0] == 0xFF:
        return None
    return bytes([key[0] + 1])


def _rocks_file(message: str) -> str | None:
    """The file a RocksDB status names ("... in /path/000012.sst offset 4673 size 651")."""
    marker = " in /"
    at = message.find(marker)
    if at < 0:
        return None
    return message[at + 4:].split(maxsplit=1)[0]


@dataclass(slots=True)
class Unreadable:
    """Keys RocksDB could not read: somewhere after ``after`` (None: the start) and before ``before``
    (None: the end)."""

    after: bytes | None
    before: bytes | None
    file: str
    error: str
    until: bytes | None = None
    """The last key the scan sought to past the damage: no key lost lies at or after it."""


def scan_rocks(db: Any, unreadable: list[Unreadable]) -> Iterator[tuple[bytes, bytes]]:
    """Every readable key and value in order, checksums verified; each unreadable stretch goes to
    ``unreadable`` and the scan goes on at the next region (see ``_next_boundary``)."""
    import rocksdict  # noqa: PLC0415

    ro = rocksdict.ReadOptions()
    ro.set_verify_checksums(True)
    it = db.iter(ro)
    try:
        it.seek_to_first()
        last: bytes | None = None
        target: bytes | None = None
        while True:
            while it.valid():
                k = bytes(it.key())
                v = bytes(it.value())
                if unreadable and unreadable[-1].before is None:
                    unreadable[-1].before = k
                last = k
                yield k, v
                it.next()
            try:
                it.status()
            except Exception as exc:  # noqa: BLE001  (rocksdict raises plain Exception with RocksDB's status)
                text = str(exc)
                if unreadable and unreadable[-1].before is None:
                    unreadable[-1].error = unreadable[-1].error or text
                else:
                    unreadable.append(Unreadable(last, None, _rocks_file(text) or db.path(), text))
                base = max(last or b"", target or b"")
                target = _next_boundary(base)
                unreadable[-1].until = target
                if target is None:
                    return
                it.seek(target)
            else:
                return
    finally:
        del it


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]


def describe_key(key: bytes | None) -> str:
    if key is None:
        return "(start)"
    if key[:1] in (b"D", b"T") and len(key) == 13:
        ck, n = _KEY_ID.unpack_from(key, 1)
        return f"{key[:1].decode()}/{ck}/{n}"
    if key[:1] in (b"H", b"X") and len(key) >= 5:
        return f"{key[:1].decode()}/{_U32.unpack_from(key, 1)[0]}/{key[5:][:64]!r}"
    return repr(key[:80])


# --- the WAL as a whole ----------------------------------------------------------------------------
@dataclass(slots=True)
class Extent:
    """Stored ids ``[first, end)`` of one block; ``end`` None: the block is damaged."""

    first: int
    end: int | None
    where: str


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
    for record in scan.journal:
        for g in record.groups:
            ch = scan.channels.get(g.channel_key)
            if ch is not None:
                ch.extents.append(Extent(g.first_id, g.first_id + block_count(g.block), f"journal {record.path}"))
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
                    f"{_one_line(u.error)}{on}"))
    return scan


# --- recovery snapshots ----------------------------------------------------------------------------
def check_snapshots(data_dir: str, db: Any, scan: WalScan, only: str | None) -> None:
    from interceptors.snapshot import SNAPSHOT_META, RecoverySnapshot  # noqa: PLC0415
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


# --- Parquet ---------------------------------------------------------------------------------------
def parquet_files(root: Path, only: str | None) -> Iterator[Path]:
    """Committed Parquet files under ``root`` (temporaries, dot and quarantine directories skipped)."""
    base = root / only if only is not None else root
    if not base.is_dir():
        return
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(_HIDDEN))
        for fn in sorted(filenames):
            if fn.endswith(".parquet") and not fn.startswith("."):
                yield Path(dirpath) / fn


def check_parquet(path: Path) -> list[Finding]:
    """Footer, row-group statistics and data of one Parquet file, and its name against its metadata."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    from flusher import _layout  # noqa: PLC0415

    where = str(path)
    try:
        pf = pq.ParquetFile(path, page_checksum_verification=True)
    except (OSError, pa.ArrowException, ValueError) as exc:
        return [Finding(where, f"not a readable Parquet file (footer): {_one_line(str(exc))}")]
    out: list[Finding] = []
    try:
        meta = pf.metadata
        if sum(meta.row_group(i).num_rows for i in range(meta.num_row_groups)) != meta.num_rows:
            out.append(Finding(where, "the row groups' row counts do not add up to the file's"))
        for i in range(meta.num_row_groups):
            rg = meta.row_group(i)
            for c in range(rg.num_columns):
                stats = rg.column(c).statistics
                if stats is not None and stats.has_min_max:
                    stats.min, stats.max  # noqa: B018  (decoding them is the check)
            table = pf.read_row_group(i)
            if table.num_rows != rg.num_rows:
                out.append(Finding(where, f"row group {i} holds {table.num_rows} rows, its footer says {rg.num_rows}"))
        kv = meta.metadata or {}
        first, last = kv.get(_layout.FIRST_KEY), kv.get(_layout.LAST_KEY)
        if first is None or last is None:
            out.append(Finding(where, "no delivery-key metadata: not written by the flusher"))
        else:
            stem = path.name[: -len(".parquet")]
            a, _, b = stem.partition("-")
            ids = (_layout.decode_key(first)[1], _layout.decode_key(last)[1])
            if not (a.isdigit() and b.isdigit()) or (int(a), int(b)) != ids:
                out.append(Finding(where, f"the name's ids {stem!r} are not its first and last message ids {ids}"))
    except (OSError, pa.ArrowException, ValueError, KeyError) as exc:
        out.append(Finding(where, f"damaged Parquet data: {_one_line(str(exc))}"))
    finally:
        pf.close()
    return out


# --- the command -----------------------------------------------------------------------------------
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


@dataclass(slots=True)
class Report:
    findings: list[Finding]
    notes: list[str]
    counted: dict[str, int]


def verify(data_dir: str, pchannel: str | None = None, parquet_dir: str | None = None,
           progress: Progress | None = None) -> Report:
    """Check ``data_dir`` offline (see the module docstring).  Raises DataDirInUseError."""
    if not os.path.isdir(data_dir):
        raise StreamingError(f"data directory {data_dir} does not exist", path=data_dir)
    findings: list[Finding] = []
    notes: list[str] = []
    counted = {"journal records": 0, "keys": 0, "blocks": 0, "parquet files": 0}
    with offline(data_dir):
        if os.path.exists(os.path.join(data_dir, "CURRENT")):
            try:
                db = open_read_only(data_dir)
            except Exception as exc:  # noqa: BLE001  (rocksdict raises plain Exception)
                text = str(exc)
                findings.append(Finding(_rocks_file(text) or data_dir, f"RocksDB cannot open: {_one_line(text)}"))
                db = None
            if db is not None:
                try:
                    scan = scan_wal(data_dir, db, progress)
                    check_snapshots(data_dir, db, scan, pchannel)
                finally:
                    db.close()
                keep = {ch.name for ch in scan.channels.values()}
                if pchannel is not None and pchannel not in keep:
                    raise StreamingError(f"pchannel {pchannel!r} does not exist in {data_dir}", path=data_dir)
                findings.extend(f for f in scan.findings if pchannel is None or f.channel in (None, pchannel))
                notes.extend(scan.notes)
                for ch in scan.channels.values():
                    if pchannel is not None and ch.name != pchannel:
                        continue
                    # Damaged blocks are findings already; what only the walk shows is a missing id,
                    # unless a damaged journal record (a finding too) may have held it.
                    if not scan.explained(ch):
                        findings.extend(Finding(os.path.join(data_dir, "(rocksdb)"), f"pchannel {ch.name!r}: {why}",
                                                channel=ch.name) for _, why in ch.gaps())
                counted.update({"journal records": len(scan.journal), "keys": scan.keys,
                                "blocks": sum(len(c.extents) for c in scan.channels.values())})
        else:
            notes.append(f"{data_dir} holds no WAL database")
        root = Path(parquet_dir) if parquet_dir is not None else Path(data_dir) / PARQUET_DIR
        for path in parquet_files(root, pchannel):
            findings.extend(check_parquet(path))
            counted["parquet files"] += 1
            if progress is not None:
                progress.tick(f"{counted['parquet files']} Parquet files")
    return Report(findings, notes, counted)


def run(data_dir: str, pchannel: str | None, parquet_dir: str | None, out: TextIO = sys.stdout,
        err: TextIO = sys.stderr) -> int:
    """The ``verify`` command: 0 when clean, 1 on any finding, 2 when the check could not run."""
    try:
        report = verify(data_dir, pchannel, parquet_dir, Progress(err))
    except StreamingError as exc:
        print(f"verify: {exc}", file=err)
        return 2
    for note in report.notes:
        print(f"note: {note}", file=out)
    for f in report.findings:
        print(f.line(), file=out)
    counts = ", ".join(f"{n} {what}" for what, n in report.counted.items())
    verdict = f"{len(report.findings)} finding(s)" if report.findings else "clean"
    print(f"verify {data_dir}: {verdict} ({counts})", file=out, flush=True)
    return 1 if report.findings else 0


__all__ = ["DataDirInUseError", "Finding", "Report", "WalScan", "offline", "run", "scan_wal", "verify"]
