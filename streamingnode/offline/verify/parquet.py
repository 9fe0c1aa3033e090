"""The Parquet part of ``verify``: every committed file under the Parquet root, its footer,
row-group statistics and data read back, and the ids its name gives against its metadata."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from streamingnode.offline.verify.access import Finding, one_line

PARQUET_DIR = "parquet"
# flusher/layout.py: files whose name starts with these are not the flusher's committed data.
_HIDDEN = (".", "_quarantine")


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

    from flusher import layout  # noqa: PLC0415

    where = str(path)
    try:
        pf = pq.ParquetFile(path, page_checksum_verification=True)
    except (OSError, pa.ArrowException, ValueError) as exc:
        return [Finding(where, f"not a readable Parquet file (footer): {one_line(str(exc))}")]
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
        first, last = kv.get(layout.FIRST_KEY), kv.get(layout.LAST_KEY)
        if first is None or last is None:
            out.append(Finding(where, "no delivery-key metadata: not written by the flusher"))
        else:
            stem = path.name.lstrip(".")[: -len(".parquet")]
            ids = (layout.decode_key(first)[1], layout.decode_key(last)[1])
            if layout.parse_name(path.name.lstrip(".")) != ids:
                out.append(Finding(where, f"the name's ids {stem!r} are not its first and last message ids {ids}"))
    except (OSError, pa.ArrowException, ValueError, KeyError) as exc:
        out.append(Finding(where, f"damaged Parquet data: {one_line(str(exc))}"))
    finally:
        pf.close()
    return out


def check_compactions(root: Path, only: str | None) -> tuple[list[Finding], int]:
    """The compaction records under ``root`` (``<pchannel>/<collection>/_compactions/*.json``): one that
    does not parse, lists a path as both input and output (the file is lost once its inputs are
    deleted: flusher/README.md, Compaction, Repair), or publishes an output missing under both its
    names.  Returns the findings and how many records were read."""
    from flusher import layout  # noqa: PLC0415

    out: list[Finding] = []
    read = 0
    pchannels = [root / only] if only is not None else sorted(
        p for p in root.iterdir() if p.is_dir() and not p.name.startswith(_HIDDEN)) if root.is_dir() else []
    for base in pchannels:
        collections = sorted(c.name for c in base.iterdir() if (c / layout.COMPACTIONS_DIR).is_dir()) \
            if base.is_dir() else []
        for c in collections:
            try:
                records = layout.read_records(base, c)
            except layout.LayoutError as exc:
                out.append(Finding(str(base / layout.compactions_dir(c)), one_line(str(exc)), channel=base.name))
                continue
            consumed = {p for r in records for p in r.inputs}
            for rec in records:
                read += 1
                where = str(base / layout.compactions_dir(c) / layout.record_name(rec.generation))
                both = rec.overlap()
                if both:
                    out.append(Finding(where, f"collection {c!r}: compaction record {rec.generation} lists "
                                              f"{', '.join(both)} as both input and output: readers refuse the "
                                              "collection; start the node to rebuild the file from the WAL",
                                       channel=base.name))
                for o in rec.outputs:
                    if o in both or o in consumed:
                        continue
                    if not (base / o).exists() and not (base / layout.hidden(o)).exists():
                        out.append(Finding(where, f"collection {c!r}: output {o} of compaction record "
                                                  f"{rec.generation} is missing under both its names",
                                           channel=base.name))
    return out, read


__all__ = ["PARQUET_DIR", "check_compactions", "check_parquet", "parquet_files"]
