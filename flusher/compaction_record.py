"""The compaction record's life: its commit (``write_record``, step ``record`` of a pass) and what
finishes or undoes a pass after it (``recover``: link the outputs' visible names, delete the inputs
after the grace period, delete outputs no record committed).  See ``flusher.compact`` for the pass
and flusher/README.md "Compaction" for the steps.

``STREAMINGNODE_COMPACT_KILL_AT=<step>[:<n>]`` kills the process right after a step (crash tests).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path

from flusher import layout
from flusher.commit import StagingFencedError, fsync_dir, make_dirs
from flusher.layout import CompactionRecord
from wal.crashpoints import CrashPoints

KILL_ENV = "STREAMINGNODE_COMPACT_KILL_AT"
STEPS = ("output", "record", "link", "inputs")
crash_point = CrashPoints(KILL_ENV, STEPS)
_HIDDEN_OUTPUT = re.compile(r"\.\d{20}-\d{20}(?:\.g\d{20})?\.parquet")


def collections(root: Path | str) -> list[str]:
    """The collections under ``root``: directories holding partitions, and those with delete files."""
    base = Path(root)
    if not base.is_dir():
        return []
    with os.scandir(base) as entries:  # closed even when a listing fails half-way (a ResourceWarning else)
        dirs = [e for e in entries if e.is_dir() and not e.name.startswith(("_", "."))]
    found = {e.name for e in dirs if any(p.name.startswith("partition=") for p in Path(e.path).iterdir())}
    deletes = base / layout.DELETES_DIR
    if deletes.is_dir():
        with os.scandir(deletes) as entries:
            found.update(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
    return sorted(found)


def write_record(root: Path, collection: str, rec: CompactionRecord, staging: Path | None) -> None:
    """Commit ``rec``: the pass's one visible step.  With ``staging`` (a flusher's directory of its
    term, see ``flusher.commit``) the temporary is written there, so a pass of a term whose staging
    directory a newer flusher removed fails here (StagingFencedError) and changes nothing readers see."""
    d = root / layout.compactions_dir(collection)
    make_dirs(d)
    name = layout.record_name(rec.generation)
    tmp = d / f".{name}.tmp" if staging is None else staging / f".{os.getpid()}-{collection}-{name}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(rec.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, d / name)
    except FileNotFoundError as exc:
        if staging is not None and not staging.is_dir():
            raise StagingFencedError(f"{d / name}: compaction record not committed: its staging directory "
                                     f"{staging.name} was removed by a newer term's flusher") from exc
        raise
    fsync_dir(d)


def _unlink(path: Path, dirs: set[Path]) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
        dirs.add(path.parent)


def _sync_and_prune(dirs: Iterable[Path], root: Path) -> None:
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        if not d.exists():
            continue
        fsync_dir(d)
        # An emptied segment directory goes too (a flusher that writes there again creates it).
        if d.name.startswith("segment=") and not any(d.iterdir()):
            with contextlib.suppress(OSError):
                d.rmdir()
                fsync_dir(d.parent)


def recover(root: Path, collection: str, grace_seconds: float = 0.0, *, now: float | None = None) -> int:
    """Finish committed records and delete uncommitted outputs (see the module docstring).

    Returns how many records are still waiting for their grace period."""
    records = layout.read_records(root, collection)
    wall = time.time() if now is None else now
    waiting = 0
    referenced: set[str] = set()
    # A path a record lists as both input and output (older code wrote such records) is never deleted
    # here: it is the only copy of that output; the flusher's repair (``repair_overlaps``) replaces it.
    kept = {q for rec in records for p in rec.overlap() for q in (p, layout.hidden(p))}
    for rec in records:
        referenced.update(layout.hidden(o) for o in rec.outputs)
        linked: set[Path] = set()
        for out in rec.outputs:
            if not (root / out).exists() and (root / layout.hidden(out)).exists():
                with contextlib.suppress(FileExistsError):
                    os.link(root / layout.hidden(out), root / out)
                linked.add((root / out).parent)
        for d in linked:
            fsync_dir(d)
        if linked:
            crash_point("link")
        leftovers = [p for p in (*rec.inputs, *map(layout.hidden, rec.outputs))
                     if p not in kept and (root / p).exists()]
        if not leftovers:
            continue
        record = root / layout.compactions_dir(collection) / layout.record_name(rec.generation)
        committed_at = record.stat().st_mtime
        if wall - committed_at < grace_seconds:
            waiting += 1
            continue
        touched: set[Path] = set()
        for p in leftovers:
            _unlink(root / p, touched)
        _sync_and_prune(touched, root)
        crash_point("inputs")
    # Outputs of a compaction that crashed before its record: never visible, deleted.
    stale: set[Path] = set()
    for top in (root / collection, root / layout.deletes_dir(collection)):
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [n for n in dirnames if n != layout.COMPACTIONS_DIR]
            rel = Path(dirpath).relative_to(root).as_posix()
            for n in filenames:
                if _HIDDEN_OUTPUT.fullmatch(n) and f"{rel}/{n}" not in referenced:
                    _unlink(Path(dirpath) / n, stale)
    cdir = root / layout.compactions_dir(collection)
    if cdir.is_dir():
        with os.scandir(cdir) as entries:
            temporaries = [Path(e.path) for e in entries if e.name.startswith(".") and e.name.endswith(".tmp")]
        for path in temporaries:
            _unlink(path, stale)
    _sync_and_prune(stale, root)
    return waiting


__all__ = ["KILL_ENV", "STEPS", "collections", "crash_point", "recover", "write_record"]
