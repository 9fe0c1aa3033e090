"""``streamingnode salvage``: cut a damaged pchannel at its first damaged block, offline.

Like a database's log-recovery tool, and never by default: without ``--truncate-at-corruption`` it
only reports what it would cut (exit 1 when there is something to cut).  With it:

1. the scan of ``verify`` (``scan_wal``) finds, per pchannel, the first id that is damaged or missing,
   whether the damage is in the journal, in a stored block or in a RocksDB table file;
   A pchannel a node marked damaged at open (its channel record's ``DAMAGED`` field) is cut at the
   first id the database lacks, or earlier;
2. a new database is built beside the old one (``<data dir>/.salvage-new``): every readable key,
   then every valid record of the live journal files (as replay applies them: copies below a
   truncation mark skipped), minus the cut pchannel's blocks and time-index entries from the cut on.
   Records of kept files (``.jnl.kept``) are not applied: the node applied them at open but for the
   damaged pchannels' groups, which lie past their cut, and applying them again would bring back
   blocks deleted since.  The cut channel record gets the next term and loses its mark; consumer
   positions past the cut are brought back to it, a recovery snapshot past it is dropped, and the
   flusher's checkpoint goes back to the start of the retained log (see ``_lower_positions``);
3. the Parquet files of the pchannel holding rows of cut messages (``_parquet_past_cut``) move into
   ``<data dir>/salvaged-<time>/parquet/``, then the old database files and the journal (kept files
   too) move into ``<data dir>/salvaged-<time>/`` (kept as evidence, never deleted), and the new
   files take their place.

Rebuilding rather than deleting in place is what makes damage in a table file survivable: a range
deletion would leave the damaged block in its file, and the next compaction that reads it would stop
the database.  Damage this cannot cut away (a channel record, a pchannel not named, keys outside any
pchannel's blocks) is refused, naming it, with nothing changed.  Opening the pchannel afterwards
recovers its ids from the blocks left: the next id is the cut, so ids from the cut on are handed out
again, under a higher term.  Run it in a process of its own, with the node stopped (see
``verify.offline``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from flusher.checkpoint import CHECKPOINT_META
from interceptors.recovery.snapshot import SNAPSHOT_META
from streamingnode.node.groups import META_KEY as GROUPS_META
from streamingnode.offline.verify import (
    PARQUET_DIR,
    ChannelScan,
    Unreadable,
    WalScan,
    describe_key,
    offline,
    open_read_only,
    scan_rocks,
    scan_wal,
)
from wal.backends.rocks_layout import DAMAGED
from wal.backends.rocks_layout import KEY_ID as _KEY_ID
from wal.backends.rocks_layout import TICK_VALUE as _TICK_VALUE
from wal.backends.rocks_layout import U32 as _U32
from wal.backends.rocks_layout import U64 as _U64
from wal.errors import StreamingError

NEW_DIR = ".salvage-new"
_BATCH = 1000
# What RocksDB keeps at the top of the data directory (the journal and Parquet live in directories).
_ROCKS_NAMES = ("CURRENT", "IDENTITY", "LOCK", "LOG", "rocksdict-config.json")
_ROCKS_PREFIXES = ("MANIFEST-", "OPTIONS-", "LOG.old")
_ROCKS_SUFFIXES = (".sst", ".log", ".blob")


class SalvageRefusedError(StreamingError):
    """Damage that cutting the named pchannels cannot remove; nothing was changed."""


@dataclass(slots=True)
class Cut:
    """What cutting one pchannel removes: ids ``[first, end)``."""

    pchannel: str
    key: int
    first: int
    end: int
    why: str
    first_kept: int = 0
    """The first id the new database holds of the pchannel (its first block below the cut)."""
    boundary: tuple[int, int] = (-1, -1)
    """The delivery key (timestamp, id) of the last message kept: a Parquet file whose last key is
    past it holds rows of cut messages."""
    parquet: list[str] = field(default_factory=list)
    """Parquet files holding rows of cut messages (relative to the Parquet root), moved aside."""

    @property
    def count(self) -> int:
        return max(self.end - self.first, 0)

    def line(self) -> str:
        if self.count == 0:
            return f"pchannel {self.pchannel!r}: nothing stored from id {self.first} on ({self.why})"
        return (f"pchannel {self.pchannel!r}: cut ids {self.first}..{self.end - 1} ({self.count} messages) "
                f"at the first damage: {self.why}")


@dataclass(slots=True)
class Plan:
    cuts: list[Cut] = field(default_factory=list)
    journal_damaged: bool = False
    clean: list[str] = field(default_factory=list)

    @property
    def needed(self) -> bool:
        return bool(self.journal_damaged or any(c.count or c.why for c in self.cuts))


def _is_rocks_file(name: str) -> bool:
    return name in _ROCKS_NAMES or name.startswith(_ROCKS_PREFIXES) or name.endswith(_ROCKS_SUFFIXES)


def _region(key: bytes) -> tuple[bytes, int] | None:
    """(kind, channel key) of a per-channel key."""
    if key[:1] in (b"D", b"T") and len(key) >= 5:
        return key[:1], _U32.unpack_from(key, 1)[0]
    return None


def _plan(scan: WalScan, names: list[str], db: Any = None) -> Plan:
    by_name = {ch.name: ch for ch in scan.channels.values()}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise SalvageRefusedError(f"no pchannel {missing[0]!r} in this data directory", pchannel=missing[0])
    plan = Plan(journal_damaged=bool(scan.journal_damage))
    cut_keys = {by_name[n].key for n in names}
    for u in scan.unreadable:
        _check_unreadable(u, cut_keys, scan)
    for ch in scan.channels.values():
        problem = ch.first_problem()
        if ch.name not in names:
            if problem is not None:
                raise SalvageRefusedError(
                    f"pchannel {ch.name!r} is damaged too ({problem[1]}): name it as well "
                    f"(--pchannel {ch.name}) to cut both", pchannel=ch.name)
            continue
        if problem is None:
            plan.clean.append(ch.name)
            continue
        first = problem[0]
        kept = [e.first for e in ch.extents if e.end is not None and not e.kept and e.first < first]
        plan.cuts.append(Cut(ch.name, ch.key, first, max(ch.end(), first), problem[1],
                             first_kept=min(kept, default=first), boundary=_last_kept_key(db, scan, ch, first)))
    return plan


def _last_kept_key(db: Any, scan: WalScan, ch: ChannelScan, cut: int) -> tuple[int, int]:
    """(largest timestamp of the messages below ``cut``, ``cut - 1``): every message kept is delivered
    at or below it (a transaction body at its commit's timestamp, which is below the cut too), every
    cut one above it (timestamps never go back).  (-1, -1) when nothing is kept."""
    from wal._codec import decode_block  # noqa: PLC0415
    from wal.errors import CodecError  # noqa: PLC0415

    holder = next((e for e in ch.extents if e.end is not None and not e.kept and e.first < cut <= e.end), None)
    if holder is None:
        return (-1, -1)
    block: bytes | None = None
    if holder.where == "database":
        raw = db.get(b"D" + _KEY_ID.pack(ch.key, holder.first)) if db is not None else None
        block = bytes(raw) if raw is not None else None
    else:
        block = next((g.block for r in scan.journal if not r.kept for g in r.groups
                      if g.channel_key == ch.key and g.first_id == holder.first), None)
    try:
        messages = decode_block(block, holder.first) if block is not None else []
    except CodecError:
        messages = []
    ticks = [m.timetick for m in messages if m.message_id is not None and m.message_id < cut]
    # Unknown (the block did not read back): every file is past it, the safe side.
    return (max(ticks), cut - 1) if ticks else (-1, -1)


def _check_unreadable(u: Unreadable, cut_keys: set[int], scan: WalScan) -> None:
    """Refuse unless every key RocksDB could not read is a block or time-index entry of a pchannel
    being cut (its blocks there are past the cut; a lost time-index entry only makes a time seek
    start earlier)."""
    region = _region(u.after) if u.after is not None else None
    if region is not None and region[1] in cut_keys:
        end = region[0] + _U32.pack(region[1] + 1)
        if u.until is not None and u.until <= end:
            return
    names = [ch.name for ch in scan.channels.values() if ch.key not in cut_keys]
    raise SalvageRefusedError(
        f"{u.file}: RocksDB cannot read keys after {describe_key(u.after)}, outside the blocks of the "
        f"pchannel(s) being cut ({u.error[:200]}); cutting cannot remove this damage (restore a backup"
        f"{'; other pchannels: ' + ', '.join(map(repr, names)) if names else ''})", path=u.file)


def _lower_positions(name: str, raw: bytes, c: Cut) -> bytes | None:
    """A stored position past the cut brought back to it (None: drop the value; unchanged bytes
    when it is not past the cut)."""
    cut = c.first
    try:
        if name == CHECKPOINT_META:
            # Parquet files past the cut are moved aside, and one may hold rows of kept messages too
            # (it spans the cut): the flusher reads the retained log again from its start and skips
            # what its remaining files hold (each directory's files are a prefix of its rows, the
            # moved ones were its last).  Done whether or not files moved now, so that a salvage run
            # again after one stopped between moving them and swapping the database still rewinds.
            doc = json.loads(raw)
            doc["message_id"] = min(int(doc["message_id"]), c.first_kept)
            doc["timetick"] = 0
            return json.dumps(doc).encode()
        if name == GROUPS_META:
            doc = json.loads(raw)
            changed = False
            for vs in doc.values():
                for v, pos in vs.items():
                    if int(pos[0]) > cut:
                        vs[v] = [cut, pos[1]]
                        changed = True
            if changed:
                return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
        elif name.startswith(SNAPSHOT_META) and int(json.loads(raw)["message_id"]) > cut:
            return None  # its state holds messages that are cut: recovery replays instead
    except (ValueError, KeyError, TypeError, AttributeError, IndexError):
        return raw
    return raw


def _kept(k: bytes, v: bytes, cuts: dict[int, Cut]) -> bytes | None:
    """What the new database holds under ``k`` (None: nothing)."""
    kind = k[:1]
    if kind == b"C":
        record = json.loads(v)
        if int(record["key"]) in cuts:
            record["term"] = int(record["term"]) + 1  # the cut is a term of its own
            # The damage the mark names is cut away: the pchannel opens again.
            record.pop(DAMAGED, None)
            return json.dumps(record).encode()
    elif kind in (b"D", b"T", b"X") and len(k) >= 5 and _U32.unpack_from(k, 1)[0] in cuts:
        cut = cuts[_U32.unpack_from(k, 1)[0]]
        if kind == b"D" and _KEY_ID.unpack_from(k, 1)[1] >= cut.first:
            return None
        if kind == b"T" and _TICK_VALUE.unpack(v)[0] >= cut.first:
            return None
        if kind == b"X":
            return _lower_positions(k[5:].decode(errors="replace"), v, cut)
    return v


def _build(data_dir: str, src: Any, scan: WalScan, plan: Plan) -> str:
    import rocksdict  # noqa: PLC0415

    cuts = {c.key: c for c in plan.cuts}
    new_dir = os.path.join(data_dir, NEW_DIR)
    shutil.rmtree(new_dir, ignore_errors=True)  # left by a salvage that stopped before its swap
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    dest = rocksdict.Rdict(new_dir, options=opts)
    try:
        wb = rocksdict.WriteBatch(raw_mode=True)
        n = 0

        def put(k: bytes, v: bytes) -> None:
            nonlocal wb, n
            wb.put(k, v)
            n += 1
            if n % _BATCH == 0:
                dest.write(wb)
                wb = rocksdict.WriteBatch(raw_mode=True)

        unreadable: list[Unreadable] = []
        for k, v in scan_rocks(src, unreadable):
            kept = _kept(k, v, cuts)
            if kept is not None:
                put(k, kept)
        marks = {ch.key: ch.truncated_before for ch in scan.channels.values()}
        for record in scan.journal:
            if record.kept:
                # A node applied it already, but for the damaged pchannels' groups (past their cut):
                # applying it again would bring back blocks truncated since.
                continue
            for g in record.groups:
                # The largest timestamp ever acknowledged stays, cut or not: time never goes back.
                put(b"H" + _U32.pack(g.channel_key), _U64.pack(g.max_timetick))
                cut = cuts.get(g.channel_key)
                if cut is not None and g.first_id >= cut.first:
                    continue
                if g.first_id < marks.get(g.channel_key, 0):
                    continue  # truncated (as replay skips it): the journal's copy is of deleted data
                put(b"D" + _KEY_ID.pack(g.channel_key, g.first_id), g.block)
                for t in g.ticks:
                    if cut is None or t.message_id < cut.first:
                        put(b"T" + _KEY_ID.pack(g.channel_key, t.timetick), _TICK_VALUE.pack(t.message_id, t.resume_id))
        dest.write(wb)
        dest.flush(True)
    finally:
        dest.close()
    return new_dir


def _parquet_past_cut(root: str, c: Cut) -> list[str]:
    """The committed Parquet files of the cut pchannel (relative to ``root``, the Parquet root) that
    hold rows of messages at or after the cut: their last delivery key is past ``c.boundary``, or
    their name's last id is at or past the cut (a damaged footer: the name is all there is)."""
    from flusher import incarnation, layout  # noqa: PLC0415

    directory = Path(root) / c.pchannel
    owner = incarnation.read_marker(directory)
    if not directory.is_dir() or owner not in (None, c.key):
        return []  # another incarnation's files: the node moves them aside itself
    out = []
    for rel in layout.committed_files(directory):
        path = directory / rel
        ids = layout.parse_name(path.name)
        try:
            last: tuple[int, int] | None = layout.read_keys(str(path))[1]
        except layout.DamagedFileError:
            last = None  # damaged below the cut: the flusher quarantines and rebuilds it
        if (ids is not None and ids[1] >= c.first) or (last is not None and last > c.boundary):
            out.append(f"{c.pchannel}/{rel}")
    return out


def _move_parquet(root: str, aside: str, plan: Plan) -> None:
    """Move the files past each cut to ``<aside>/parquet/<path relative to the Parquet root>``."""
    from flusher.commit import fsync_dir, make_dirs  # noqa: PLC0415

    for c in plan.cuts:
        for rel in c.parquet:
            target = Path(aside) / PARQUET_DIR / rel
            make_dirs(target.parent)
            shutil.move(os.path.join(root, rel), target)  # a copy when the root is on another filesystem
            fsync_dir(target.parent)
            fsync_dir((Path(root) / rel).parent)


def _new_aside(data_dir: str) -> str:
    aside = os.path.join(data_dir, f"salvaged-{time.strftime('%Y%m%dT%H%M%S')}-{time.time_ns() % 10**9:09d}")
    os.mkdir(aside)
    return aside


def _swap(data_dir: str, new_dir: str, aside: str) -> str:
    """Move the old database files and the journal (kept files included) into ``aside``, the new files
    in; returns ``aside``."""
    from flusher.commit import fsync_dir  # noqa: PLC0415

    for name in sorted(os.listdir(data_dir)):
        if _is_rocks_file(name) and os.path.isfile(os.path.join(data_dir, name)):
            os.rename(os.path.join(data_dir, name), os.path.join(aside, name))
    if os.path.isdir(os.path.join(data_dir, "journal")):
        os.rename(os.path.join(data_dir, "journal"), os.path.join(aside, "journal"))
    fsync_dir(Path(aside))
    for name in sorted(os.listdir(new_dir)):
        os.rename(os.path.join(new_dir, name), os.path.join(data_dir, name))
    os.rmdir(new_dir)
    fsync_dir(Path(data_dir))
    return aside


@dataclass(slots=True)
class Outcome:
    plan: Plan
    applied: bool
    moved_to: str | None = None
    findings: list[str] = field(default_factory=list)


def salvage(data_dir: str, pchannels: list[str], *, apply: bool, parquet_dir: str | None = None) -> Outcome:
    """Plan (and with ``apply``, carry out) the cut of ``pchannels``; see the module docstring.
    ``parquet_dir``: the Parquet root (default ``<data_dir>/parquet``).  Raises DataDirInUseError,
    SalvageRefusedError."""
    root = parquet_dir if parquet_dir is not None else os.path.join(data_dir, PARQUET_DIR)
    if not os.path.exists(os.path.join(data_dir, "CURRENT")):
        raise StreamingError(f"{data_dir} holds no WAL database", path=data_dir)
    with offline(data_dir):
        try:
            src = open_read_only(data_dir)
        except Exception as exc:
            raise SalvageRefusedError(f"RocksDB cannot open {data_dir} ({str(exc)[:300]}); cutting a pchannel "
                                      "cannot repair that: restore a backup", path=data_dir) from exc
        try:
            scan = scan_wal(data_dir, src)
            plan = _plan(scan, pchannels, src)
            for c in plan.cuts:
                c.parquet = _parquet_past_cut(root, c)
            outcome = Outcome(plan, applied=False, findings=[f.line() for f in scan.findings])
            if not apply or not plan.needed:
                return outcome
            new_dir = _build(data_dir, src, scan, plan)
        finally:
            src.close()
        aside = _new_aside(data_dir)
        # Before the swap: a salvage stopped in between leaves the old database, and run again it
        # cuts the same ids and rewinds the flusher all the same (``_lower_positions``).
        _move_parquet(root, aside, plan)
        outcome.moved_to = _swap(data_dir, new_dir, aside)
        outcome.applied = True
        return outcome


def run(data_dir: str, pchannels: list[str], *, apply: bool, parquet_dir: str | None = None,
        out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """The ``salvage`` command: 0 when done (or nothing to cut), 1 when something would be cut but
    ``--truncate-at-corruption`` was not given, 2 when refused."""
    try:
        outcome = salvage(data_dir, pchannels, apply=apply, parquet_dir=parquet_dir)
    except StreamingError as exc:
        print(f"salvage: {exc}", file=err)
        return 2
    plan = outcome.plan
    for line in outcome.findings:
        print(f"found: {line}", file=out)
    for name in plan.clean:
        print(f"pchannel {name!r}: no damage, nothing to cut", file=out)
    if not plan.needed:
        print(f"salvage {data_dir}: nothing to cut", file=out)
        return 0
    verb = "cut" if outcome.applied else "would cut"
    for c in plan.cuts:
        print(c.line().replace(": cut ids", f": {verb} ids", 1), file=out)
        where = f"{outcome.moved_to}/{PARQUET_DIR}" if outcome.moved_to else "the salvaged-<time> directory"
        for rel in c.parquet:
            print(f"pchannel {c.pchannel!r}: {'moved' if outcome.applied else 'would move'} Parquet file {rel} "
                  f"(rows of cut messages) to {where}", file=out)
    if plan.journal_damaged:
        print(f"journal: damaged records {'were' if outcome.applied else 'would be'} dropped after applying "
              "every valid one", file=out)
    if not outcome.applied:
        print(f"salvage {data_dir}: nothing changed; run again with --truncate-at-corruption to cut", file=out)
        return 1
    print(f"salvage {data_dir}: done; the old database files and journal are in {outcome.moved_to}; the "
          "cut pchannel(s) open with a new term", file=out, flush=True)
    return 0


__all__ = ["Cut", "Outcome", "Plan", "SalvageRefusedError", "run", "salvage"]
