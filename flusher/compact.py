"""Compaction of a collection's small Parquet files (see flusher/README.md "Compaction").

A pass over one collection, all on the caller's thread (the flusher's own, so that it never races a
flusher commit):

1. ``recover``: finish every committed record (link its outputs' visible names; after the grace
   period delete its inputs and the hidden names) and delete outputs no record committed (a crash
   before step 4).
2. Plan: per partition, the small files (under half the target size) and the files with many dead
   rows, in delivery order, cut into groups of at most the target size.  A row is dead when a delete
   entry at or before the horizon removes it (the row rule: ``(row._ts, row._id) < (del._ts,
   del._id)``); no read as of the horizon or later can see it.
3. Write each group, minus its dead rows, as one hidden output ``.<first>-<last>.g<generation>.parquet``
   under ``<collection>/partition=<p>/segment=-<generation>/`` (a negative segment: never a real one,
   so no flusher buffer writes there), and the delete files as one, minus the entries that can no
   longer remove any row; fsync each, then the directories.  Step ``output``.  The generation in
   every name keeps an output from ever taking an input's name (a lone delete file rewritten keeps
   its first and last ids), and ``layout.check_record`` refuses a record that would list a path as
   both.
4. Commit the record ``<collection>/_compactions/<generation>.json`` (temporary, fsync, rename,
   directory fsync).  Step ``record``.  From here readers (``layout.visible_files``) see the new set.
5. Link each output's visible name (its hidden one stays readable for readers that listed it).
   Step ``link``.
6. After ``grace_seconds`` (at once when 0, else on a later pass), delete the inputs and the hidden
   names.  Step ``inputs``.

Steps 1, 4, 5 and 6 are the record's life (``flusher.compaction_record``: ``recover``, ``write_record``);
``STREAMINGNODE_COMPACT_KILL_AT=<step>[:<n>]`` kills the process right after a step (crash tests).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flusher import layout
from flusher.commit import fsync_dir, make_dirs
from flusher.compaction_config import CompactionConfig
from flusher.compaction_record import crash_point, recover, write_record
from flusher.layout import CompactionRecord, DeliveryKey
from wal.clock import compose

_TS = "_ts"
_ID = "_id"
_PRIMARY_KEY = b"streamingnode.primary_key"
_DEAD_SHARE = 0.2
"""A file at least this share of whose rows are dead is rewritten even when it is not small."""


@dataclass(slots=True)
class CompactionResult:
    collection: str
    generation: int | None = None
    """The record committed, or None when there was nothing to compact."""
    horizon: int | None = None
    files_before: int = 0
    bytes_before: int = 0
    files_after: int = 0
    bytes_after: int = 0
    rows_before: int = 0
    rows_after: int = 0
    delete_entries_dropped: int = 0
    seconds: float = 0.0

    @property
    def rows_dropped(self) -> int:
        return self.rows_before - self.rows_after


@dataclass(slots=True)
class _File:
    rel: str
    size: int
    first: DeliveryKey
    last: DeliveryKey
    rows: int
    dead: int = 0
    counted: bool = False
    """Whether ``dead`` was counted (only where it decides whether the file is rewritten)."""


@dataclass(slots=True)
class _Throttle:
    rate: int
    start: float = field(default_factory=time.monotonic)
    done: int = 0

    def __call__(self, nbytes: int) -> None:
        if self.rate <= 0:
            return
        self.done += nbytes
        ahead = self.done / self.rate - (time.monotonic() - self.start)
        if ahead > 0:
            time.sleep(ahead)  # the I/O limit: this runs on the flusher's thread, never the loop


# --- planning --------------------------------------------------------------------------------------


def _latest(table: pa.Table, key: str, pick: str) -> pa.Table:
    """Per key, the largest (pick="max") or smallest ("min") (_ts, _id): columns key, _ts, _id."""
    by_ts = table.group_by(key).aggregate([(_TS, pick)]).rename_columns([key, _TS])
    at = table.join(by_ts, [key, _TS], join_type="inner")
    return at.group_by([key, _TS]).aggregate([(_ID, pick)]).rename_columns([key, _TS, _ID])


def _keys_of(table: pa.Table, key: str) -> pa.Table:
    # A file from before the _id column reads as id 0 (also where a concatenation promoted it to null).
    ids = pc.fill_null(table.column(_ID), 0) if _ID in table.column_names \
        else pa.array([0] * table.num_rows, pa.int64())
    return pa.table({key: table.column(key), _TS: table.column(_TS), _ID: ids})


def _older_than(rows: pa.Table, bound: pa.Table, key: str, *, reverse: bool = False) -> pa.Array:
    """Per row of ``rows`` (key, _ts, _id), whether ``bound`` (one (_ts, _id) per key) holds its key
    with a larger tuple (with ``reverse``: a smaller one).  False when the key is not in ``bound``."""
    tagged = rows.append_column("_n", pa.array(range(rows.num_rows), pa.int64()))
    joined = tagged.join(bound.rename_columns([key, "_bts", "_bid"]), key, join_type="left outer")
    (lo_ts, lo_id), (hi_ts, hi_id) = ((joined["_bts"], joined["_bid"]), (joined[_TS], joined[_ID])) if reverse \
        else ((joined[_TS], joined[_ID]), (joined["_bts"], joined["_bid"]))
    less = pc.or_(pc.less(lo_ts, hi_ts), pc.and_(pc.equal(lo_ts, hi_ts), pc.less(lo_id, hi_id)))
    flags = pc.take(pc.fill_null(less, False), pc.sort_indices(joined["_n"]))  # the join does not keep order
    return flags.combine_chunks() if isinstance(flags, pa.ChunkedArray) else flags


def _read(root: Path, rel: str, throttle: _Throttle, columns: list[str] | None = None) -> pa.Table:
    path = root / rel
    with pq.ParquetFile(path) as f:  # half the cost of pq.read_table per small file (no dataset set-up)
        t = f.read(columns=columns)
    throttle(path.stat().st_size if columns is None else t.nbytes)
    return t


def _primary_key(root: Path, rel: str) -> str:
    meta = pq.read_schema(root / rel).metadata or {}
    raw = meta.get(_PRIMARY_KEY)
    if not raw:
        raise layout.LayoutError(f"{root / rel}: no primary key in its metadata")
    return str(raw.decode())


def _file(root: Path, rel: str) -> _File:
    first, last = layout.read_keys(str(root / rel))
    return _File(rel, (root / rel).stat().st_size, first, last, pq.read_metadata(root / rel).num_rows)


def _groups(files: list[_File], cfg: CompactionConfig) -> list[list[_File]]:
    """Cut ``files`` (delivery order) into runs of at most the target size (at least one file each)."""
    out: list[list[_File]] = []
    size = rows = 0
    for f in files:
        live = f.rows - f.dead
        est = f.size * live // max(f.rows, 1)
        if out and (size + est > cfg.target_bytes or (cfg.target_rows is not None and rows + live > cfg.target_rows)):
            out.append([])
            size = rows = 0
        if not out:
            out.append([])
        out[-1].append(f)
        size += est
        rows += live
    return out


# --- the pass --------------------------------------------------------------------------------------


def _write_hidden(root: Path, rel: str, table: pa.Table, compression: str, throttle: _Throttle) -> int:
    path = root / layout.hidden(rel)
    make_dirs(path.parent)
    with open(path, "wb") as f:
        pq.write_table(table, f, compression=compression, coerce_timestamps="us", allow_truncated_timestamps=True,
                       write_page_checksum=True)
        f.flush()
        os.fsync(f.fileno())
    size = path.stat().st_size
    throttle(size)
    return size


def _merged(tables: list[pa.Table], meta: dict[bytes, bytes], first: DeliveryKey, last: DeliveryKey) -> pa.Table:
    t = pa.concat_tables([x.replace_schema_metadata(None) for x in tables], promote_options="default")
    out = dict(meta)
    out[layout.FIRST_KEY] = layout.encode_key(first)
    out[layout.LAST_KEY] = layout.encode_key(last)
    return t.replace_schema_metadata(out)


def compact_collection(root: Path | str, collection: str, config: CompactionConfig | None = None, *,
                       now_ms: int | None = None, busy: Iterable[str] = (), drop_deletes: bool = True,
                       progress: Callable[[str], None] | None = None,
                       staging: Path | None = None) -> CompactionResult:
    """One pass over ``collection`` under ``root`` (see the module docstring).

    ``busy``: directories (relative to the root) with rows still buffered by a flusher; their files
    are left alone, and when any belongs to this collection no delete entry is dropped (a buffered
    row may be older than it).  ``drop_deletes=False`` keeps every delete entry (offline, where rows
    not yet flushed may be older than an entry).  ``staging``: the calling flusher's staging directory
    (``write_record``); None offline."""
    cfg = config or CompactionConfig()
    base = Path(root)
    say = progress or (lambda _msg: None)
    started = time.monotonic()
    result = CompactionResult(collection)
    recover(base, collection, cfg.grace_seconds)
    records = layout.read_records(base, collection)
    wall_ms = int(time.time() * 1000) if now_ms is None else now_ms
    previous = max((r.horizon for r in records), default=0)
    horizon = max(previous, compose(max(wall_ms - int(cfg.horizon_seconds * 1000), 0), 0))
    data_paths, delete_paths, _ = layout.visible_files(base, collection)
    busy_dirs = set(busy)
    data_rel = [Path(p).relative_to(base).as_posix() for p in data_paths]
    delete_rel = [Path(p).relative_to(base).as_posix() for p in delete_paths]
    if any(d == layout.deletes_dir(collection) or d.startswith(collection + "/") for d in busy_dirs):
        drop_deletes = False
    throttle = _Throttle(cfg.io_bytes_per_second)
    if not data_rel and len(delete_rel) < 2:
        result.seconds = time.monotonic() - started
        return result
    key = _primary_key(base, (data_rel or delete_rel)[0])
    deletes = [_keys_of(_read(base, r, throttle), key) for r in delete_rel]
    all_deletes = pa.concat_tables(deletes) if deletes else pa.table(
        {key: pa.array([], pq.read_schema(base / data_rel[0]).field(key).type), _TS: pa.array([], pa.int64()),
         _ID: pa.array([], pa.int64())})
    early = all_deletes.filter(pc.less_equal(all_deletes[_TS], horizon))
    removing = _latest(early, key, "max")

    # Plan: which files of which partition to rewrite.
    files: dict[str, list[_File]] = {}
    for rel in data_rel:
        directory = rel.rpartition("/")[0]
        if directory in busy_dirs:
            continue
        files.setdefault(directory.rpartition("/")[0], []).append(_file(base, rel))
    limit = cfg.target_bytes // 2

    def is_small(f: _File) -> bool:
        return f.size < limit and (cfg.target_rows is None or f.rows < cfg.target_rows // 2)

    def count_dead(fs: list[_File]) -> None:
        if not removing.num_rows or not fs:
            return
        keys = [_keys_of(_read(base, f.rel, throttle, [key, _TS, _ID]), key) for f in fs]
        dead = _older_than(pa.concat_tables(keys), removing, key)  # one join: one per file cost more
        at = 0
        for f, k in zip(fs, keys, strict=True):
            f.dead = pc.sum(dead.slice(at, k.num_rows).cast(pa.int64())).as_py() or 0
            f.counted = True
            at += k.num_rows

    # Dead rows are counted where they decide whether a file is rewritten: not for the small files of a
    # partition that has enough of them (rewritten anyway, their dead rows go at the write: reading
    # every file twice was most of a pass's time).
    count_dead([f for fs in files.values() for f in fs
                if not (is_small(f) and sum(map(is_small, fs)) >= cfg.min_files)])
    generation = (records[-1].generation + 1) if records else 1
    chosen: list[list[_File]] = []
    for partition, fs in sorted(files.items()):
        small = [f for f in fs if is_small(f)]
        dying = [f for f in fs if f.dead and f.dead >= _DEAD_SHARE * f.rows]
        if len(small) < cfg.min_files and not dying:
            continue
        picked = sorted({f.rel: f for f in (*small, *dying)}.values(), key=lambda f: f.first)
        groups = _groups(picked, cfg)
        count_dead([g[0] for g in groups if len(g) == 1 and not g[0].counted])  # a lone file: only if dead
        groups = [g for g in groups if len(g) > 1 or g[0].dead]
        say(f"{collection}: partition {partition}: {sum(map(len, groups))} files into {len(groups)}")
        chosen.extend(groups)

    inputs: list[str] = []
    outputs: list[str] = []
    flushed: dict[str, DeliveryKey] = {}
    kept_rows: list[pa.Table] = []
    for group in chosen:
        tables = []
        for f in group:
            t = _read(base, f.rel, throttle)
            result.rows_before += t.num_rows
            tables.append(t)
            inputs.append(f.rel)
            result.files_before += 1
            result.bytes_before += f.size
            d = f.rel.rpartition("/")[0]
            flushed[d] = max(flushed.get(d, f.last), f.last)
        first = min(f.first for f in group)
        last = max(f.last for f in group)
        merged = _merged(tables, dict(pq.read_schema(base / group[0].rel).metadata or {}), first, last)
        if removing.num_rows:  # the dead rows, by one join over the whole group
            merged = merged.filter(pc.invert(_older_than(_keys_of(merged, key), removing, key)))
        result.rows_after += merged.num_rows
        if merged.num_rows:
            partition = group[0].rel.rsplit("/", 2)[0]
            rel = f"{partition}/segment=-{generation}/{layout.file_name(first[1], last[1], generation)}"
            result.bytes_after += _write_hidden(base, rel, merged, cfg.compression, throttle)
            result.files_after += 1
            outputs.append(rel)
            kept_rows.append(_keys_of(merged, key))
        say(f"{collection}: wrote {len(outputs)} of {len(chosen)} outputs")

    # The delete files: merged into one, without the entries that can no longer remove a row.
    if len(delete_rel) >= 2 or (delete_rel and chosen):
        survivors = all_deletes
        if drop_deletes and early.num_rows:
            rest = [_keys_of(_read(base, r, throttle, [key, _TS, _ID]), key)
                    for r in data_rel if r not in set(inputs)]
            remaining = pa.concat_tables([*rest, *kept_rows]) if rest or kept_rows else all_deletes.slice(0, 0)
            # Only keys with a delete entry matter here: the rest go before the (costly) group-by.
            remaining = remaining.filter(pc.is_in(remaining[key], value_set=pc.unique(all_deletes[key])))
            oldest = _latest(remaining, key, "min")
            # An entry stays while some remaining row of its key is older than it (it may still remove
            # that row), or while it is after the horizon (reads before it must not see its removal).
            has_older = _older_than(all_deletes, oldest, key, reverse=True)
            drop = pc.and_(pc.less_equal(all_deletes[_TS], horizon), pc.invert(has_older))
            survivors = all_deletes.filter(pc.invert(drop))
            result.delete_entries_dropped = all_deletes.num_rows - survivors.num_rows
        if len(delete_rel) >= 2 or result.delete_entries_dropped:
            dfiles = [_file(base, r) for r in delete_rel]
            first = min(f.first for f in dfiles)
            last = max(f.last for f in dfiles)
            originals = [_read(base, r, throttle) for r in delete_rel]
            full = pa.concat_tables([x.replace_schema_metadata(None) for x in originals], promote_options="default")
            if result.delete_entries_dropped:
                full = full.filter(pc.invert(drop))
            meta = dict(pq.read_schema(base / delete_rel[0]).metadata or {})
            merged = _merged([full], meta, first, last)
            for f in dfiles:
                inputs.append(f.rel)
                result.files_before += 1
                result.bytes_before += f.size
            flushed[layout.deletes_dir(collection)] = last
            if merged.num_rows:
                # The generation in the name: one delete file rewritten keeps its first and last ids,
                # and without it would take its input's name (the record would list it as both).
                rel = f"{layout.deletes_dir(collection)}/{layout.file_name(first[1], last[1], generation)}"
                result.bytes_after += _write_hidden(base, rel, merged, cfg.compression, throttle)
                result.files_after += 1
                outputs.append(rel)
    if not inputs:
        result.seconds = time.monotonic() - started
        return result
    for out_dir in {(base / o).parent for o in outputs}:
        fsync_dir(out_dir)
    crash_point("output")
    rec = CompactionRecord(generation, horizon, tuple(inputs), tuple(outputs), flushed)
    layout.check_record(base, collection, rec)  # never published: readers would drop the output with the input
    write_record(base, collection, rec, staging)
    crash_point("record")
    say(f"{collection}: committed generation {generation} (horizon {horizon})")
    recover(base, collection, cfg.grace_seconds)
    result.generation = generation
    result.horizon = horizon
    result.seconds = time.monotonic() - started
    return result


@dataclass(slots=True)
class CompactionTotals:
    """What a flusher's compactions did since it started (the node's metrics read it)."""

    runs: int = 0
    files_before: int = 0
    bytes_before: int = 0
    files_after: int = 0
    bytes_after: int = 0
    rows_dropped: int = 0
    delete_entries_dropped: int = 0
    seconds: float = 0.0

    def add(self, r: CompactionResult) -> None:
        self.seconds += r.seconds
        if r.generation is None:
            return
        self.runs += 1
        self.files_before += r.files_before
        self.bytes_before += r.bytes_before
        self.files_after += r.files_after
        self.bytes_after += r.bytes_after
        self.rows_dropped += r.rows_dropped
        self.delete_entries_dropped += r.delete_entries_dropped


__all__ = [
    "CompactionConfig",
    "CompactionResult",
    "CompactionTotals",
    "compact_collection",
]
