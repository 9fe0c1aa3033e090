"""Read a flushed collection back as of a timetick with pyarrow: `read_collection_arrow`.

The same files, row rule and columns as `flusher.read.spark.read_collection` (`flusher.read.plan` says them), in
memory as a `pyarrow.Table`: for tests, tools and small collections.  Page checksums are verified, so a damaged
file is a `DamagedFileError` naming it, never wrong rows.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from flusher.read.plan import (
    ID_COLUMN,
    JOIN_ID,
    JOIN_KEY,
    JOIN_TS,
    NO_DELETE_ID,
    NO_ROW_ID,
    PARTITION_COLUMN,
    SEGMENT_COLUMN,
    SEGMENT_DIR_COLUMN,
    TS_COLUMN,
    CollectionLayoutError,
    CollectionNotFoundError,
    DamagedFileError,
    bound_of,
    collection_path,
    deletes_path,
    file_set,
    filesystem,
    resolve_primary_key,
)

# The flusher writes page checksums: verified, a damaged page is an error naming its file, not wrong rows.
_PARQUET = ds.ParquetFileFormat(
    default_fragment_scan_options=ds.ParquetFragmentScanOptions(page_checksum_verification=True))


def _arrow_dataset(
    fs: pafs.FileSystem, path: str, partitioning: ds.Partitioning | None, files: list[str] | None = None
) -> ds.Dataset:
    """The Parquet files under `path` (hidden names skipped), or exactly `files` (hive directories under `path`)."""
    try:
        if files is not None:  # a list is read as given: a compaction output still under its hidden name too
            return ds.dataset(files, filesystem=fs, format=_PARQUET, partitioning=partitioning,
                              partition_base_dir=path)
        return ds.dataset(path, filesystem=fs, format=_PARQUET, partitioning=partitioning,
                          ignore_prefixes=[".", "_"])
    except (OSError, pa.ArrowException) as exc:  # discovery reads a footer
        raise _damaged(fs, path if files is None else files, exc) from exc


def _damaged(fs: pafs.FileSystem, where: str | list[str], exc: Exception) -> Exception:
    """The first file of `where` (a list, or the visible files under a directory) that cannot be read whole, as a
    DamagedFileError; else `exc` itself.

    pyarrow's errors do not always say which file of a dataset failed (a bad page names none), so the files are
    read one by one to find it: a cost paid only on the failure path.
    """
    if isinstance(where, str):
        selector = pafs.FileSelector(where, recursive=True, allow_not_found=True)
        infos = fs.get_file_info(selector)
        paths = [i.path for i in infos if i.type == pafs.FileType.File and not any(
            p.startswith((".", "_")) for p in i.path[len(where):].lstrip("/").split("/"))]
    else:
        paths = where
    for path in sorted(paths):
        try:
            with fs.open_input_file(path) as f:
                pq.ParquetFile(f, page_checksum_verification=True).read()
        except (OSError, pa.ArrowException) as bad:
            return DamagedFileError(path, f"not a readable Parquet file: {str(bad)[:200]}")
    return exc


def _read(data: ds.Dataset, fs: pafs.FileSystem, **kwargs: object) -> pa.Table:
    try:
        return data.to_table(**kwargs)
    except (OSError, pa.ArrowException) as exc:
        raise _damaged(fs, list(data.files), exc) from exc


def _ids(table: pa.Table, missing: int) -> pa.ChunkedArray | pa.Array:
    """The ``_id`` column of ``table``, ``missing`` where a file had none (see the row rule)."""
    if ID_COLUMN not in table.column_names:
        return pa.nulls(table.num_rows, pa.int64()).fill_null(missing)
    return pc.fill_null(table[ID_COLUMN], missing)


def read_collection_arrow(
    root: str | os.PathLike[str], name: str, as_of_ts: int | None = None, primary_key: str | None = None
) -> pa.Table:
    """`read_collection` with pyarrow.dataset instead of Spark: the same rows and columns, as a `pyarrow.Table`.

    `root` is a local path or a URI pyarrow knows (``file://``, ``s3://``, ...). Reads the whole visible result into
    memory, so it suits tests, tools and small collections. Same errors as `read_collection`, and `DamagedFileError`
    naming the file when one cannot be read.
    """
    bound = bound_of(as_of_ts)
    collection = collection_path(root, name)
    fs, inner = filesystem(collection)
    if fs.get_file_info(inner).type != pafs.FileType.Directory:
        raise CollectionNotFoundError(collection)

    files = file_set(collection, bound)
    partitioning = ds.partitioning(
        pa.schema([(PARTITION_COLUMN, pa.string()), (SEGMENT_DIR_COLUMN, pa.int64())]), flavor="hive"
    )
    data = _arrow_dataset(fs, inner, partitioning, None if files is None else files.data)
    if not data.files:
        return pa.table(
            {
                TS_COLUMN: pa.array([], pa.int64()),
                SEGMENT_COLUMN: pa.array([], pa.int64()),
                PARTITION_COLUMN: pa.array([], pa.string()),
            }
        )
    columns = [c for c in data.schema.names if c != SEGMENT_DIR_COLUMN]
    for column in (TS_COLUMN, SEGMENT_COLUMN):
        if column not in columns:
            raise CollectionLayoutError(collection, f"data files have no {column!r} column: {columns}")
    row_filter = None if bound is None else pc.field(TS_COLUMN) <= bound
    rows = _read(data, fs, columns=columns, filter=row_filter)

    deletes_dir = deletes_path(inner)
    if files is not None:
        deletes_ds = _arrow_dataset(fs, deletes_dir, None, files.deletes)
    elif fs.get_file_info(deletes_dir).type == pafs.FileType.Directory:
        deletes_ds = _arrow_dataset(fs, deletes_dir, None)
    else:
        return rows
    if not deletes_ds.files:
        return rows
    key = resolve_primary_key(collection, primary_key, rows.column_names, deletes_ds.schema.names)
    has_ids = ID_COLUMN in deletes_ds.schema.names
    deletes = _read(deletes_ds, fs, columns=[key, TS_COLUMN, *([ID_COLUMN] if has_ids else [])],
                    filter=row_filter)
    del_ids = _ids(deletes, NO_DELETE_ID)
    # Only the latest (_ts, _id) delete of each key matters (see the row rule): sorted by that tuple, the last of
    # each key's group is it ("last" follows input order when the grouping is single-threaded).
    ordered = pa.table({JOIN_KEY: deletes[key], JOIN_TS: deletes[TS_COLUMN], JOIN_ID: del_ids}).sort_by(
        [(JOIN_TS, "ascending"), (JOIN_ID, "ascending")])
    grouped = ordered.group_by(JOIN_KEY, use_threads=False).aggregate([(JOIN_TS, "last"), (JOIN_ID, "last")])
    latest = pa.table({JOIN_KEY: grouped[JOIN_KEY], JOIN_TS: grouped[f"{JOIN_TS}_last"],
                       JOIN_ID: grouped[f"{JOIN_ID}_last"]})
    # Join only the key, _ts, _id and the row number: Acero's hash join does not carry every nested type (vectors),
    # so the surviving row numbers select from the full table afterwards, in the original order.
    slim = pa.table({JOIN_KEY: rows[key], TS_COLUMN: rows[TS_COLUMN], ID_COLUMN: _ids(rows, NO_ROW_ID),
                     "__row": pa.array(range(rows.num_rows), pa.int64())})
    joined = slim.join(latest, keys=JOIN_KEY, join_type="left outer")
    # Kept unless (row._ts, row._id) < (del._ts, del._id). Kleene or: "no delete" (null) or'd with the null
    # comparisons it causes must be true, not null.
    row_ts, del_ts = joined[TS_COLUMN], joined[JOIN_TS]
    not_earlier = pc.or_kleene(pc.greater(row_ts, del_ts), pc.and_kleene(
        pc.equal(row_ts, del_ts), pc.greater_equal(joined[ID_COLUMN], joined[JOIN_ID])))
    keep = pc.or_kleene(pc.is_null(del_ts), not_earlier)
    survivors = joined.filter(keep)["__row"]
    return rows.take(survivors.take(pc.sort_indices(survivors)))


__all__ = ["read_collection_arrow"]
