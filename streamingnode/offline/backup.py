"""Online backup of a running node into a directory on the node's host (the ``Backup`` RPC).

1. **Cut.**  ``WALManager.backup`` takes a RocksDB checkpoint of the whole database into
   ``<data dir>/.backup-<ns>`` on the writer thread, between two group commits: hard links to the
   immutable table files, plus the database's small files.  Every pchannel's log, consumer groups,
   recovery snapshots and flusher checkpoints share that database, so the cut holds all of them as of
   one instant.  Appends wait only for this step (a memtable flush and some links).
2. **Positions.**  The checkpoint is opened read-only: per pchannel its ids ``[first, next)``, the largest
   acknowledged timestamp, the flusher checkpoint, the groups' positions and the snapshot's id.
3. **Parquet.**  Each pchannel's committed files whose rows all come from messages inside the cut
   (their last delivery key at or below it, their last id below ``next``) are hard-linked beside the
   checkpoint (so that a compaction removing one meanwhile cannot take it away), with the directory's
   incarnation marker, drop markers and the compaction records whose outputs are all kept.  A file
   written after the cut is left out: restored, the flusher writes it again from the log.
4. **Copy.**  Into ``<target>/<UTC time>/``: a file that the newest complete backup of the target holds
   under the same path with the same size and SHA-256 is hard-linked from it (RocksDB table files and
   Parquet files never change under one name), every other file is copied and hashed in one pass.
5. **Manifest**, written last and atomically (``manifest``).  The staging directory is removed.

Everything after the cut runs on a worker thread, outside every lock an append takes.  Only one backup
runs at a time per node (``BACKUP_LOCK``).
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from flusher import incarnation, layout
from flusher.checkpoint import CHECKPOINT_META
from interceptors.recovery.snapshot import PERIODIC_METAS, SNAPSHOT_META, RecoverySnapshot
from streamingnode.node.groups import META_KEY as GROUPS_META
from streamingnode.offline.manifest import (
    PARQUET_DIR,
    WAL_DIR,
    ChannelPosition,
    FileEntry,
    Manifest,
    Pace,
    backups_in,
    copy_hashed,
    file_sha256,
    fsync_dir,
    read_manifest,
    write_manifest,
)
from streamingnode.offline.verify import open_read_only
from wal.backend import ChannelInfo
from wal.backends.rocks_layout import KEY_ID, MAX_ID, TRUNCATED_META, U32, U64, data_key, tail_state
from wal.errors import ChannelNotExistError, InvalidArgumentError, StorageFullError, StreamingError
from wal.manager import WALManager

log = structlog.get_logger(__name__)

STAGING_PREFIX = ".backup-"
"""The checkpoint's directory inside the data directory while a backup runs (removed after it)."""
_LINKED_PARQUET = "_parquet"
# RocksDB files of a checkpoint a restore does not need: the lock and the info logs (the read-only
# open writes a LOG of its own).
_SKIP = ("LOCK", "LOG")


@dataclass(slots=True)
class Progress:
    phase: str
    files_done: int = 0
    files_total: int = 0
    bytes_done: int = 0
    bytes_total: int = 0


@dataclass(slots=True)
class Result:
    path: Path
    manifest: Manifest
    seconds: float


ProgressFn = Callable[[Progress], None]


def check_target(target: str, data_dir: Path, parquet_root: Path | None) -> Path:
    """The backup target as an absolute path on the node's host, refused inside the node's own
    directories (a backup there would back itself up next time)."""
    if not target:
        raise InvalidArgumentError("backup target directory is empty", field="to")
    path = Path(target)
    if not path.is_absolute():
        raise InvalidArgumentError(f"backup target {target!r} must be an absolute path on the node's host "
                                   "(the node writes the files)", field="to")
    resolved = Path(os.path.realpath(path))
    if resolved.exists() and not resolved.is_dir():
        raise InvalidArgumentError(f"backup target {target} exists and is not a directory", field="to")
    for own in (data_dir, parquet_root):
        if own is None:
            continue
        mine = Path(os.path.realpath(own))
        if resolved == mine or mine in resolved.parents or resolved in mine.parents:
            raise InvalidArgumentError(f"backup target {target} overlaps the node's directory {own}: choose a "
                                       "directory outside it (another volume, ideally)", field="to")
    return resolved


async def take_backup(
    manager: WALManager, data_dir: Path, parquet_root: Path | None, target: Path, *, pchannels: list[str],
    on_progress: ProgressFn, node_version: str, pace: Pace | None = None,
) -> Result:
    """Back up ``pchannels`` (every one when empty) into ``target``; see the module docstring.
    ``pace``: how fast to read (default: no limit); its ``stop()`` abandons the backup (``Stopped``),
    leaving nothing of it behind."""
    start = time.monotonic()
    await asyncio.to_thread(_remove_stale_staging, data_dir)
    staging = data_dir / f"{STAGING_PREFIX}{time.time_ns()}"
    on_progress(Progress("checkpoint"))
    flush_tables = getattr(manager.backend, "flush_tables", None)
    if flush_tables is not None:
        # Off the writer thread: the memtables' bulk reaches table files while appends go on, and the
        # checkpoint below, which appends wait for, has only the last milliseconds' writes to flush.
        await asyncio.to_thread(flush_tables)
    created = datetime.now(UTC)
    await manager.backup(staging)
    try:
        job = _Job(staging, parquet_root, target, pchannels, on_progress, node_version, created,
                   pace if pace is not None else Pace())
        try:
            manifest, dest = await asyncio.to_thread(_finish, job)
        except OSError as exc:
            raise _os_error(target, exc) from exc
    finally:
        await asyncio.to_thread(shutil.rmtree, staging, True)
    seconds = time.monotonic() - start
    log.info("backup taken", path=str(dest), seconds=round(seconds, 3), **manifest.copied)
    return Result(dest, manifest, seconds)


def _os_error(target: Path, exc: OSError) -> StreamingError:
    """What the caller hears of a failed write into the target (the half-written backup is removed)."""
    where = exc.filename or target
    text = f"backup into {target} failed: {exc.strerror or exc} ({where}); nothing of this backup was kept"
    if exc.errno == errno.ENOSPC:
        return StorageFullError(text, path=str(where))
    return InvalidArgumentError(text, field="to", path=str(where))


def _remove_stale_staging(data_dir: Path) -> None:
    """A backup that stopped half-way (the node was killed) leaves its checkpoint: links only."""
    for p in data_dir.glob(f"{STAGING_PREFIX}*"):
        shutil.rmtree(p, ignore_errors=True)


@dataclass(slots=True)
class _Job:
    staging: Path
    parquet_root: Path | None
    target: Path
    pchannels: list[str]
    on_progress: ProgressFn
    node_version: str
    created: datetime
    pace: Pace


def _finish(job: _Job) -> tuple[Manifest, Path]:
    staging, parquet_root, target, pchannels = job.staging, job.parquet_root, job.target, job.pchannels
    on_progress, created = job.on_progress, job.created
    on_progress(Progress("positions"))
    positions = read_positions(staging, pchannels)
    sources: list[tuple[Path, str]] = []  # (where to read it, path in the backup)
    for name in sorted(os.listdir(staging)):
        p = staging / name
        if p.is_file() and not name.startswith(_SKIP):
            sources.append((p, f"{WAL_DIR}/{name}"))
    if parquet_root is not None and parquet_root.is_dir():
        on_progress(Progress("parquet"))
        for pos in positions:
            for src, rel in parquet_files(parquet_root, pos):
                linked = _link_aside(src, staging / _LINKED_PARQUET / pos.pchannel / rel)
                sources.append((linked, f"{PARQUET_DIR}/{pos.pchannel}/{rel}"))
    previous = _previous(target)
    dest = new_backup_dir(target, created)
    try:
        return _copy_all(job, sources, previous, dest, positions)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)  # no manifest yet: nothing in it is usable
        raise


def _copy_all(job: _Job, sources: list[tuple[Path, str]], previous: tuple[Path, dict[str, FileEntry]] | None,
              dest: Path, positions: list[ChannelPosition]) -> tuple[Manifest, Path]:
    parquet_root, target, pchannels = job.parquet_root, job.target, job.pchannels
    on_progress, node_version, created = job.on_progress, job.node_version, job.created
    total = sum(src.stat().st_size for src, _ in sources)
    prog = Progress("copy", 0, len(sources), 0, total)
    on_progress(prog)
    entries: list[FileEntry] = []
    copied = {"files_copied": 0, "bytes_copied": 0, "files_reused": 0, "bytes_reused": 0}
    made: set[Path] = {dest}
    for src, rel in sources:
        out = dest / rel
        if out.parent not in made:
            out.parent.mkdir(parents=True, exist_ok=True)
            made.add(out.parent)
        entry = _reuse(src, rel, out, previous, job.pace)
        if entry is not None:
            copied["files_reused"] += 1
            copied["bytes_reused"] += entry.size
        else:
            size, digest = copy_hashed(src, out, job.pace)
            entry = FileEntry(rel, size, digest)
            copied["files_copied"] += 1
            copied["bytes_copied"] += size
        entries.append(entry)
        prog.files_done += 1
        prog.bytes_done += entry.size
        on_progress(prog)
    for d in sorted(made, key=lambda p: len(p.parts), reverse=True):
        fsync_dir(d)
    manifest = Manifest(node_version, created.isoformat(), positions, entries, parquet_root is not None,
                        partial=bool(pchannels), copied=copied)
    on_progress(Progress("manifest", prog.files_done, prog.files_total, prog.bytes_done, prog.bytes_total))
    write_manifest(dest, manifest)
    fsync_dir(target)
    return manifest, dest


def _previous(target: Path) -> tuple[Path, dict[str, FileEntry]] | None:
    """The newest complete backup of ``target`` and its files by path (None: there is none)."""
    complete, _ = backups_in(target)
    for d in reversed(complete):
        try:
            m = read_manifest(d)
        except ValueError:
            continue
        return d, {f.path: f for f in m.files}
    return None


def _reuse(
    src: Path, rel: str, out: Path, previous: tuple[Path, dict[str, FileEntry]] | None, pace: Pace,
) -> FileEntry | None:
    """Hard-link ``rel`` from the previous backup when it holds the same bytes; the entry, or None."""
    if previous is None:
        return None
    old = previous[1].get(rel)
    if old is None or old.size != src.stat().st_size:
        return None
    size, digest = file_sha256(src, pace)
    if (size, digest) != (old.size, old.sha256):
        return None
    try:
        os.link(previous[0] / rel, out)
    except OSError:
        return None  # a file system without hard links, or the old copy is gone: copy it
    return FileEntry(rel, size, digest)


def new_backup_dir(target: Path, created: datetime) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    stem = created.strftime("%Y%m%dT%H%M%S.%fZ")
    n = 0
    while True:
        dest = target / (stem if n == 0 else f"{stem}-{n}")
        try:
            dest.mkdir()
        except FileExistsError:
            n += 1
        else:
            return dest


def _link_aside(src: Path, dst: Path) -> Path:
    """A hard link to ``src`` at ``dst`` (the file stays readable whatever happens to ``src``); ``src``
    itself when the Parquet root is on another file system."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        return src
    return dst


def read_positions(db_dir: Path, pchannels: list[str]) -> list[ChannelPosition]:
    """Every pchannel's (or the named ones') position in the checkpoint ``db_dir``."""
    db = open_read_only(str(db_dir))
    try:
        records: dict[str, dict[str, Any]] = {}
        it = db.iter()
        try:
            it.seek(b"C")
            while it.valid() and bytes(it.key()).startswith(b"C"):
                records[bytes(it.key())[1:].decode()] = json.loads(bytes(it.value()))
                it.next()
        finally:
            del it
        missing = [n for n in pchannels if n not in records]
        if missing:
            raise ChannelNotExistError(f"no pchannel {missing[0]!r} on this node", channel=missing[0])
        return [_position(db, name, records[name]) for name in sorted(pchannels or records)]
    finally:
        db.close()


def _position(db: Any, name: str, record: dict[str, Any]) -> ChannelPosition:
    key = int(record["key"])
    info = ChannelInfo(name, key, int(record["term"]), 0, 0, 0)
    prefix = b"D" + U32.pack(key)
    it = db.iter()
    last: tuple[int, bytes] | None = None
    try:
        it.seek(data_key(key, 0))
        if it.valid() and bytes(it.key()).startswith(prefix):
            info.first_id = info.next_id = KEY_ID.unpack_from(bytes(it.key()), 1)[1]
        it.seek_for_prev(data_key(key, MAX_ID))
        if it.valid() and bytes(it.key()).startswith(prefix):
            last = (KEY_ID.unpack_from(bytes(it.key()), 1)[1], bytes(it.value()))
    finally:
        del it

    def meta(meta_name: str) -> bytes | None:
        raw = db.get(b"X" + U32.pack(key) + meta_name.encode())
        return None if raw is None else bytes(raw)

    if last is None:
        mark = meta(TRUNCATED_META)
        if mark is not None and len(mark) == U64.size:
            info.first_id = info.next_id = U64.unpack(mark)[0]
    raw_max = db.get(b"H" + U32.pack(key))
    info = tail_state(info, last, str(name), U64.unpack(bytes(raw_max))[0] if raw_max is not None else 0)
    pos = ChannelPosition(name, key, info.first_id, info.next_id, info.last_timetick)
    raw = meta(CHECKPOINT_META)
    if raw is not None:
        doc = json.loads(raw)
        pos.flusher_checkpoint = (int(doc["message_id"]), int(doc["timetick"]))
    raw = meta(GROUPS_META)
    if raw:
        pos.groups = {g: {v: [int(p[0]), int(p[1])] for v, p in vs.items()} for g, vs in json.loads(raw).items()}
    ids = []
    for slot in (SNAPSHOT_META, *PERIODIC_METAS):
        raw = meta(slot)
        if raw is not None:
            ids.append(RecoverySnapshot.decode(raw, name).message_id)
    pos.snapshot_id = max(ids, default=None)
    return pos


def parquet_files(parquet_root: Path, pos: ChannelPosition) -> list[tuple[Path, str]]:
    """The files of ``pos``'s pchannel to back up: (path, path relative to its directory)."""
    directory = parquet_root / pos.pchannel
    if not directory.is_dir() or incarnation.read_marker(directory) not in (None, pos.key):
        return []  # another incarnation's directory: the node moves it aside at its next open
    boundary = (pos.last_timetick, pos.next_id - 1)
    out: list[tuple[Path, str]] = []
    kept: set[str] = set()
    for rel in layout.committed_files(directory):
        ids = layout.parse_name(rel.rsplit("/", 1)[-1])
        if ids is None or ids[1] >= pos.next_id:
            continue
        try:
            last = layout.read_keys(str(directory / rel))[1]
        except layout.DamagedFileError:
            continue  # the flusher quarantines and rebuilds it; a restore rebuilds it from the log too
        except FileNotFoundError:
            continue  # removed by a compaction since the listing: its rows are in the outputs
        if last <= boundary:
            out.append((directory / rel, rel))
            kept.add(rel)
    marker = directory / incarnation.MARKER
    if marker.is_file():
        out.append((marker, incarnation.MARKER))
    for coll in sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
        if (coll / layout.DROPPED_MARKER).is_file():
            out.append((coll / layout.DROPPED_MARKER, f"{coll.name}/{layout.DROPPED_MARKER}"))
        if (coll / layout.COMPACTIONS_DIR).is_dir():
            out.extend(_records(directory, coll.name, kept))
    return out


def _records(directory: Path, collection: str, kept: set[str]) -> list[tuple[Path, str]]:
    """The compaction records of ``collection`` whose outputs are all in the backup (a record naming an
    output left out would make readers look for a file that is not there)."""
    try:
        records = layout.read_records(directory, collection)
    except layout.LayoutError:
        return []
    consumed = {p for r in records for p in r.inputs}
    out = []
    for rec in records:
        if all(o in kept or o in consumed for o in rec.outputs):
            rel = f"{layout.compactions_dir(collection)}/{layout.record_name(rec.generation)}"
            out.append((directory / rel, rel))
    return out


__all__ = ["STAGING_PREFIX", "Progress", "ProgressFn", "Result", "check_target", "new_backup_dir", "parquet_files",
           "read_positions", "take_backup"]
