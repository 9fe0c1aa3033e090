"""``streamingnode restore``: a data directory built from a backup (``streamingnode.offline.backup``).

1. The backup is read from its manifest only (``manifest``): ``--from`` names one backup directory, or a
   target holding several, whose newest complete one is taken.
2. **Every file is checked first** against the manifest's size and SHA-256.  A damaged or missing file
   is named and nothing is written.  The target must not exist or be empty.
3. Without ``--pchannel`` and ``--until`` (and for a backup of every pchannel) the database files are
   copied as they are.  Otherwise the database is rebuilt key by key, as ``salvage`` rebuilds one:
   - pchannels not restored lose every key (their channel keys are never handed out again);
   - ``--until`` cuts each pchannel at its first message stamped after the time (or, for an id, after
     it): blocks from there on go, the block holding the cut is re-encoded with the messages before it,
     time-index entries of cut ticks go.  A transaction whose commit is cut has no commit in the
     restored log: its body (before the cut) is rolled back at recovery, never delivered; one whose
     commit is kept is whole (its body is older).  Consumer-group positions past the cut come back to
     it, recovery snapshots past it are dropped (recovery replays instead), the flusher checkpoint goes
     back to the start of the retained log, and the channel opens with the next term;
4. Parquet files are copied into ``<data dir>/parquet/<pchannel>/`` (or ``--parquet-dir``).  With
   ``--until``, a file holding any row of a cut message is left out, with the compaction records that
   publish it: the restored node's flusher reads the log again from its start and writes what the
   remaining files lack, up to the cut, so Parquet ends consistent with the restored log.

Run it with no node on the target (the target is new; nothing else can hold it).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from streamingnode.offline.manifest import (
    PARQUET_DIR,
    WAL_DIR,
    BackupFormatError,
    ChannelPosition,
    Manifest,
    damaged_files,
    read_manifest,
    resolve_backup,
)
from wal.errors import StreamingError

_BATCH = 1000
_SOURCE_DIR = ".restore-source"


class RestoreRefusedError(StreamingError):
    """The restore cannot run as asked; nothing was written."""


class DamagedBackupError(RestoreRefusedError):
    """Files of the backup fail their check; ``damaged`` names each."""

    def __init__(self, message: str, damaged: list[str]) -> None:
        super().__init__(message)
        self.damaged = damaged


@dataclass(frozen=True, slots=True)
class Until:
    """Where ``--until`` cuts: after a time (a hybrid timestamp bound, inclusive) or after a message id."""

    timetick: int | None = None
    message_id: int | None = None

    def text(self) -> str:
        return f"id {self.message_id}" if self.message_id is not None else f"timetick {self.timetick}"


@dataclass(slots=True)
class ChannelOutcome:
    pchannel: str
    first_id: int
    next_id: int
    cut_at: int | None = None
    """The first id not restored (None: nothing cut)."""
    parquet_files: int = 0
    parquet_left_out: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Outcome:
    backup: Path
    manifest: Manifest
    channels: list[ChannelOutcome]
    rebuilt: bool


def restore(source: str, data_dir: str, pchannels: list[str] | None = None, until: Until | None = None,
            parquet_dir: str | None = None) -> Outcome:
    """Restore the backup at ``source`` into the new directory ``data_dir`` (see the module docstring).
    Raises DamagedBackupError, RestoreRefusedError."""
    try:
        backup = resolve_backup(Path(source))
        manifest = read_manifest(backup)
    except BackupFormatError as exc:
        raise RestoreRefusedError(str(exc), path=source) from None
    if manifest.wal != "rocksdb":
        raise RestoreRefusedError(f"{backup} is a backup of a cluster ({manifest.wal}): restore it with --nats and "
                                  "--cluster-prefix", path=str(backup))
    names = list(pchannels) if pchannels else [p.pchannel for p in manifest.pchannels]
    unknown = [n for n in names if manifest.channel(n) is None]
    if unknown:
        raise RestoreRefusedError(f"the backup {backup} holds no pchannel {unknown[0]!r} (it holds "
                                  f"{', '.join(p.pchannel for p in manifest.pchannels) or 'none'})", path=str(backup))
    if until is not None and until.message_id is not None and len(names) != 1:
        raise RestoreRefusedError("--until with a message id needs exactly one pchannel (--pchannel): ids are per "
                                  "pchannel")
    target = Path(data_dir)
    root = Path(parquet_dir) if parquet_dir is not None else target / PARQUET_DIR
    for d in {target, root}:
        if d.exists() and (not d.is_dir() or any(d.iterdir())):
            raise RestoreRefusedError(f"restore target {d} is not empty: restore into a new directory", path=str(d))
    damaged = damaged_files(backup, manifest)
    if damaged:
        raise DamagedBackupError(f"the backup {backup} is damaged; nothing was restored:\n  " + "\n  ".join(damaged),
                                 damaged)
    created = [d for d in (target, root) if not d.exists()]
    try:
        target.mkdir(parents=True, exist_ok=True)
        rebuild = until is not None or set(names) != {p.pchannel for p in manifest.pchannels} or manifest.partial
        cuts: dict[str, Cut] = {}
        if rebuild:
            channels, cuts = _rebuild(backup, manifest, target, names, until)
        else:
            _copy_wal(backup, manifest, target)
            channels = [ChannelOutcome(n, p.first_id, p.next_id) for n in names if (p := manifest.channel(n))]
        for ch in channels:
            copy_parquet(backup, manifest, root, ch, cuts.get(ch.pchannel))
        _fsync_tree(target)
        if root != target and root.exists():
            _fsync_tree(root)
    except BaseException:
        # Nothing half-built is left behind: the target was empty (or absent) before.
        for top in (target, root):
            if top.exists():
                for entry in top.iterdir():
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry)
                    else:
                        entry.unlink()
        for top in created:
            if top.exists():
                top.rmdir()
        raise
    return Outcome(backup, manifest, channels, rebuild)


def _copy_wal(backup: Path, manifest: Manifest, target: Path) -> None:
    for f in manifest.files:
        if f.path.startswith(f"{WAL_DIR}/"):
            shutil.copyfile(backup / f.path, target / f.path.split("/", 1)[1])


def _fsync_tree(top: Path) -> None:
    for dirpath, _, filenames in os.walk(top):
        for n in filenames:
            fd = os.open(os.path.join(dirpath, n), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(dirpath, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# --- the rebuild ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Cut:
    key: int
    at: int
    first_kept: int
    boundary: tuple[int, int]
    """(largest timestamp kept, at - 1): a Parquet file whose last delivery key is past it is left out."""


def _rebuild(
    backup: Path, manifest: Manifest, target: Path, names: list[str], until: Until | None,
) -> tuple[list[ChannelOutcome], dict[str, Cut]]:
    import rocksdict  # noqa: PLC0415

    from streamingnode.offline.verify import open_read_only  # noqa: PLC0415
    from wal.backends.rocks_layout import TRUNCATED_META, U32, U64  # noqa: PLC0415

    # The read-only open writes an info log: done on a copy, never in the backup itself.
    source = target / _SOURCE_DIR
    source.mkdir()
    _copy_wal(backup, manifest, source)
    src = open_read_only(str(source))
    try:
        keys = {p.key: p for p in manifest.pchannels if p.pchannel in names}
        cuts: dict[int, Cut] = {}
        outcomes: list[ChannelOutcome] = []
        for pos in (p for p in manifest.pchannels if p.pchannel in names):
            out = ChannelOutcome(pos.pchannel, pos.first_id, pos.next_id)
            if until is not None:
                cut = _find_cut(src, pos, until)
                if cut is not None:
                    cuts[pos.key] = cut
                    out.cut_at = cut.at
                    out.next_id = cut.at
            outcomes.append(out)
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(True)
        dest = rocksdict.Rdict(str(target), options=opts)
        try:
            wb = rocksdict.WriteBatch(raw_mode=True)
            n = 0
            it = src.iter()
            try:
                it.seek_to_first()
                while it.valid():
                    for k, v in _kept(bytes(it.key()), bytes(it.value()), keys, cuts):
                        wb.put(k, v)
                        n += 1
                        if n % _BATCH == 0:
                            dest.write(wb)
                            wb = rocksdict.WriteBatch(raw_mode=True)
                    it.next()
            finally:
                del it
            for cut in cuts.values():
                # Every block cut: ids must go on from the cut, not start again at 0, as after a truncation
                # of everything (the mark is where an empty channel's ids resume).
                if cut.at <= cut.first_kept:
                    wb.put(b"X" + U32.pack(cut.key) + TRUNCATED_META.encode(), U64.pack(cut.at))
            dest.write(wb)
            dest.flush(True)
        finally:
            dest.close()
        return outcomes, {keys[c.key].pchannel: c for c in cuts.values()}
    finally:
        src.close()
        shutil.rmtree(source, ignore_errors=True)


def _find_cut(db: Any, pos: ChannelPosition, until: Until) -> Cut | None:
    """The first id of ``pos``'s pchannel not restored (None: every message is kept)."""
    from wal._codec import decode_block  # noqa: PLC0415
    from wal.backends.rocks_layout import KEY_ID, TICK_VALUE, U32, data_key, tick_key  # noqa: PLC0415

    prefix = b"D" + U32.pack(pos.key)
    start = pos.first_id
    if until.message_id is not None:
        if until.message_id + 1 >= pos.next_id:
            return None
        at = max(until.message_id + 1, pos.first_id)
    else:
        assert until.timetick is not None
        # The time index: the last persisted tick at or before the bound.  Every message stamped after
        # that tick lies at or after the tick's resume id (what a read from that time starts at), so
        # every message before it is stamped at or before the bound: the search starts there.
        it = db.iter()
        try:
            it.seek_for_prev(tick_key(pos.key, until.timetick))
            if it.valid() and bytes(it.key()).startswith(b"T" + U32.pack(pos.key)):
                start = max(TICK_VALUE.unpack(bytes(it.value()))[1], pos.first_id)
        finally:
            del it
        at = pos.next_id
        it = db.iter()
        try:
            it.seek_for_prev(data_key(pos.key, start))
            if not (it.valid() and bytes(it.key()).startswith(prefix)):
                it.seek(data_key(pos.key, start))
            found = False
            while it.valid() and bytes(it.key()).startswith(prefix) and not found:
                first = KEY_ID.unpack_from(bytes(it.key()), 1)[1]
                for m in decode_block(bytes(it.value()), first):
                    assert m.message_id is not None
                    if m.message_id >= start and m.timetick > until.timetick:
                        at, found = m.message_id, True
                        break
                it.next()
        finally:
            del it
        if at >= pos.next_id:
            return None
    # The largest timestamp kept: of the messages before the cut in its block and the one before it.
    kept_ts = -1
    it = db.iter()
    try:
        it.seek_for_prev(data_key(pos.key, at - 1) if at > 0 else data_key(pos.key, 0))
        for _ in range(2):
            if not (it.valid() and bytes(it.key()).startswith(prefix)):
                break
            first = KEY_ID.unpack_from(bytes(it.key()), 1)[1]
            ts = [m.timetick for m in decode_block(bytes(it.value()), first)
                  if m.message_id is not None and m.message_id < at]
            kept_ts = max([kept_ts, *ts])
            it.prev()
    finally:
        del it
    return Cut(pos.key, at, pos.first_id, (kept_ts, at - 1) if kept_ts >= 0 else (-1, -1))


def _kept(k: bytes, v: bytes, keys: dict[int, ChannelPosition], cuts: dict[int, Cut]) -> list[tuple[bytes, bytes]]:
    """What the new database holds for the key ``k`` of the backup."""
    from wal._codec import decode_block, encode_block  # noqa: PLC0415
    from wal.backends.rocks_layout import DAMAGED, KEY_ID, TICK_VALUE, U32  # noqa: PLC0415

    kind = k[:1]
    if kind == b"C":
        record = json.loads(v)
        key = int(record["key"])
        if key not in keys:
            return []
        if key in cuts:
            record["term"] = int(record["term"]) + 1  # the cut is a term of its own
        record.pop(DAMAGED, None)
        return [(k, json.dumps(record).encode())]
    if kind not in (b"D", b"T", b"H", b"X") or len(k) < 5:
        return [(k, v)]
    key = U32.unpack_from(k, 1)[0]
    if key not in keys:
        return []
    cut = cuts.get(key)
    if cut is None:
        return [(k, v)]
    if kind == b"D":
        first = KEY_ID.unpack_from(k, 1)[1]
        if first >= cut.at:
            return []
        messages = decode_block(v, first)
        if first + len(messages) > cut.at:
            return [(k, encode_block(messages[: cut.at - first]))]
        return [(k, v)]
    if kind == b"T":
        return [] if TICK_VALUE.unpack(v)[0] >= cut.at else [(k, v)]
    if kind == b"X":
        lowered = lower_positions(k[5:].decode(errors="replace"), v, cut)
        return [] if lowered is None else [(k, lowered)]
    return [(k, v)]


def lower_positions(name: str, raw: bytes, cut: Cut) -> bytes | None:
    """A stored position brought back to the cut (None: drop the value)."""
    from flusher.checkpoint import CHECKPOINT_META  # noqa: PLC0415
    from interceptors.recovery.snapshot import SNAPSHOT_META, RecoverySnapshot  # noqa: PLC0415
    from streamingnode.node.groups import META_KEY as GROUPS_META  # noqa: PLC0415

    if name == CHECKPOINT_META:
        # Files holding rows of cut messages are left out, and one may hold rows of kept messages too:
        # the flusher reads the retained log again and skips what the remaining files hold.
        doc = json.loads(raw)
        doc["message_id"] = min(int(doc["message_id"]), cut.first_kept)
        doc["timetick"] = 0
        return json.dumps(doc).encode()
    if name == GROUPS_META:
        doc = json.loads(raw)
        for vs in doc.values():
            for v, pos in vs.items():
                if int(pos[0]) > cut.at:
                    vs[v] = [cut.at, pos[1]]
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    if name.startswith(SNAPSHOT_META):
        snapshot = RecoverySnapshot.decode(raw, name)
        return None if snapshot.message_id > cut.at else raw
    return raw


# --- Parquet -------------------------------------------------------------------------------------


def copy_parquet(backup: Path, manifest: Manifest, root: Path, ch: ChannelOutcome, cut: Cut | None) -> None:
    from flusher import layout  # noqa: PLC0415

    prefix = f"{PARQUET_DIR}/{ch.pchannel}/"
    files = [f for f in manifest.files if f.path.startswith(prefix)]
    left_out: set[str] = set()
    if cut is not None:
        for f in files:
            rel = f.path[len(prefix):]
            ids = layout.parse_name(rel.rsplit("/", 1)[-1])
            if ids is None:
                continue
            last = layout.read_keys(str(backup / f.path))[1]
            if ids[1] >= cut.at or last > cut.boundary:
                left_out.add(rel)
    for f in files:
        rel = f.path[len(prefix):]
        if rel in left_out or (cut is not None and _publishes(backup / f.path, rel, left_out)):
            continue
        dst = root / ch.pchannel / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(backup / f.path, dst)
        if rel.endswith(".parquet"):
            ch.parquet_files += 1
    ch.parquet_left_out = sorted(left_out)


def _publishes(path: Path, rel: str, left_out: set[str]) -> bool:
    """A compaction record naming an output that is left out."""
    from flusher import layout  # noqa: PLC0415

    if f"/{layout.COMPACTIONS_DIR}/" not in f"/{rel}" or not left_out:
        return False
    try:
        doc = json.loads(path.read_text())
    except ValueError:
        return True
    outputs = doc.get("outputs", []) if isinstance(doc, dict) else []
    return any(str(o) in left_out for o in outputs)


# --- the command ---------------------------------------------------------------------------------


def parse_until(text: str) -> Until:
    """``--until``: a message id (digits), or a time: ISO 8601 with its zone, or ``@UNIX_SECONDS``.
    A time keeps every message stamped at or before it, to the millisecond."""
    from streamingnode.cli.parsing import parse_time  # noqa: PLC0415
    from wal.clock import LOGICAL_BITS  # noqa: PLC0415

    if text.isdigit():
        return Until(message_id=int(text))
    ts = parse_time(text)
    return Until(timetick=ts | ((1 << LOGICAL_BITS) - 1))


def run(source: str, data_dir: str, pchannels: list[str] | None, until: str | None, *, parquet_dir: str | None = None,
        out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """The ``restore`` command: 0 when restored, 1 when the backup is damaged, 2 when refused."""
    from streamingnode.cli.parsing import CliError  # noqa: PLC0415

    try:
        cut = parse_until(until) if until is not None else None
        outcome = restore(source, data_dir, pchannels, cut, parquet_dir)
    except CliError as exc:
        print(f"restore: --until: {exc}", file=err)
        return 2
    except DamagedBackupError as exc:
        print(f"restore: {exc}", file=err)
        return 1
    except StreamingError as exc:
        print(f"restore: {exc}", file=err)
        return 2
    m = outcome.manifest
    print(f"restore: from {outcome.backup} (taken {m.created}, streamingnode {m.node_version}); every checksum "
          "verified", file=out)
    for ch in outcome.channels:
        last = ch.next_id - 1 if ch.next_id > ch.first_id else None
        held = f"ids {ch.first_id}..{last}" if last is not None else "no messages"
        cut_text = f"; cut at id {ch.cut_at} (--until {until})" if ch.cut_at is not None else ""
        print(f"pchannel {ch.pchannel!r}: {held}{cut_text}; {ch.parquet_files} Parquet files", file=out)
        for rel in ch.parquet_left_out:
            print(f"pchannel {ch.pchannel!r}: left out Parquet file {rel} (rows after the cut; the flusher "
                  "writes the rows before it again)", file=out)
    print(f"restore {data_dir}: done; start it with `streamingnode serve --data-dir {data_dir}`", file=out, flush=True)
    return 0


def run_cluster(source: str, servers: str, prefix: str, replicas: int, parquet_dir: str | None, *,
                until: str | None = None, pchannels: list[str] | None = None,
                out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """``restore --nats``: a cluster backup into NATS under ``prefix``; exit codes as ``run``."""
    import asyncio  # noqa: PLC0415

    from streamingnode.cli.parsing import CliError  # noqa: PLC0415
    from streamingnode.offline.cluster_backup import restore_cluster  # noqa: PLC0415

    if not prefix:
        print("restore: --cluster-prefix is required with --nats: a prefix that holds no pchannel", file=err)
        return 2
    try:
        cut = parse_until(until) if until is not None else None
        manifest, cuts = asyncio.run(restore_cluster(source, servers, prefix, replicas, parquet_dir,
                                                     pchannels=pchannels, until=cut))
    except CliError as exc:
        print(f"restore: --until: {exc}", file=err)
        return 2
    except DamagedBackupError as exc:
        print(f"restore: {exc}", file=err)
        return 1
    except (StreamingError, BackupFormatError) as exc:
        print(f"restore: {exc}", file=err)
        return 2
    for p in manifest.pchannels:
        if pchannels and p.pchannel not in pchannels:
            continue
        end = cuts.get(p.pchannel, p.next_id)
        held = f"ids {p.first_id}..{end - 1}" if end > p.first_id else "no messages"
        cut_text = f"; cut at id {end} (--until {until})" if p.pchannel in cuts else ""
        print(f"pchannel {p.pchannel!r}: {held}{cut_text}", file=out)
    print(f"restore: done under cluster prefix {prefix!r}; start the nodes with --cluster-prefix {prefix}"
          f"{f' --parquet-root {parquet_dir}' if parquet_dir else ''}", file=out, flush=True)
    return 0


__all__ = ["Cut", "DamagedBackupError", "Outcome", "RestoreRefusedError", "Until", "copy_parquet",
           "lower_positions", "parse_until", "restore", "run", "run_cluster"]
