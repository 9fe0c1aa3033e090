"""``streamingnode compact``: the offline compaction of a stopped node's Parquet files.

The command around the library: it holds the data directory's lock, finds the pchannels'
directories and their collections, and runs ``flusher.compact.compact_collection`` on each with the
defaults of ``flusher.compaction_config`` (the node's too), except that inputs go at once.
"""

from __future__ import annotations

import sys
from pathlib import Path

from flusher.compact import compact_collection
from flusher.compaction_config import DEFAULT_COMPACTION, CompactionConfig
from flusher.compaction_record import collections
from streamingnode.offline.verify.access import offline
from wal.errors import StreamingError


def run(data_dir: str, parquet_dir: str | None, pchannel: str | None, collection: str | None, *,
        target_bytes: int = DEFAULT_COMPACTION.target_bytes, min_files: int = DEFAULT_COMPACTION.min_files,
        horizon_seconds: float = DEFAULT_COMPACTION.horizon_seconds) -> int:
    """``streamingnode compact``: one pass over every pchannel's (or one's) collections of a stopped
    node.  Holds the data directory's lock (a running node refuses to start meanwhile, and a running
    one makes this fail).  Inputs go at once (grace 0): no node serves readers meanwhile, but a Spark
    job still reading the tree may fail on a vanished file and must be run again.  Delete entries are
    kept (a row the flusher has not written yet may be older than one)."""
    try:
        cfg = CompactionConfig(target_bytes=target_bytes, min_files=min_files, horizon_seconds=horizon_seconds,
                               grace_seconds=0)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    parquet = Path(parquet_dir) if parquet_dir is not None else Path(data_dir) / "parquet"

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    try:
        with offline(data_dir):
            roots = sorted(p for p in parquet.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))) \
                if parquet.is_dir() else []
            if pchannel is not None:
                roots = [p for p in roots if p.name == pchannel]
                if not roots:
                    print(f"error: no Parquet directory for pchannel {pchannel[:200]!r} under {parquet}",
                          file=sys.stderr)
                    return 2
            for root in roots:
                names = collections(root)
                if collection is not None:
                    names = [n for n in names if n == collection]
                prefix = root.name

                def tell(msg: str) -> None:
                    say(f"{prefix}: {msg}")  # noqa: B023  (called before the loop moves on)

                for name in names:
                    tell(f"compacting {name}")
                    r = compact_collection(root, name, cfg, drop_deletes=False, progress=tell)
                    print(f"{root.name}/{name}: generation {r.generation or '-'}: {r.files_before} files "
                          f"({r.bytes_before} bytes) -> {r.files_after} ({r.bytes_after} bytes), "
                          f"{r.rows_dropped} deleted rows dropped, {r.seconds:.2f}s", flush=True)
    except StreamingError as exc:
        print(f"error: {exc.code.name}: {exc}", file=sys.stderr)
        return 1
    return 0


__all__ = ["run"]
