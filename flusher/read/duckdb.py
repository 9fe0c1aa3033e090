"""Read a flushed collection back as of a timetick with DuckDB: `read_collection_duckdb`.

The same layout, files, row rule and columns as `flusher.read.spark.read_collection` and `read_collection_arrow` (see
`flusher.read.spark`'s docstring): the files ``flusher.layout.visible_files`` gives (compaction records applied), rows
with ``_ts <= T``, minus every row whose key has a delete entry with ``_ts <= T`` and ``(row._ts, row._id) <
(delete._ts, delete._id)``. It returns a lazy `duckdb.DuckDBPyRelation` on the caller's connection rather than a
view: nothing is named in the caller's catalog, and the caller can filter, join, ``.create_view(name)`` or
``.arrow()`` it. The files are listed (and a footer or two read for the schemas) when it is built, and read when
it is executed: execute it soon (within the compactor's grace period, as for a Spark plan).

A plain ``read_parquet('<root>/<collection>/**/*.parquet', hive_partitioning = true)`` reads the data files only
(delete files live under ``<root>/_deletes/``), with every version and every deleted row, and, while a compaction's
grace period runs, a compacted row both in its input and in its output: this function is the exact read.

duckdb is a dev dependency, not one of the node's: it is imported by the caller, and here only for its types.
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import TYPE_CHECKING

from flusher.read.plan import (
    ID_COLUMN,
    NO_DELETE_ID,
    NO_ROW_ID,
    PARTITION_COLUMN,
    SEGMENT_COLUMN,
    SEGMENT_DIR_COLUMN,
    TS_COLUMN,
    CollectionLayoutError,
    CollectionNotFoundError,
    collection_path,
    file_set,
    local_dir,
    resolve_primary_key,
)
from flusher.read.plan import as_of as timetick_of

if TYPE_CHECKING:
    import duckdb

__all__ = ["read_collection_duckdb"]



# The SQL below is built from text (S608 is silenced where it is): every name goes through `_ident`, every path
# through `_files` (quoted literals), and the bound is an int; nothing else comes from outside.


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _files(paths: list[str]) -> str:
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"


def read_collection_duckdb(
    con: duckdb.DuckDBPyConnection,
    root: str | os.PathLike[str],
    name: str,
    as_of: datetime | int | None = None,
    primary_key: str | None = None,
) -> duckdb.DuckDBPyRelation:
    """The rows of collection `name` under `root` visible as of `as_of` (a timetick or an aware datetime, as
    `flusher.read.spark.as_of` takes; None: everything), as a relation on `con`.

    `root` is a local path or a ``file://`` URI. Columns: the user columns, ``_ts``, ``_id`` (when the files have
    it), ``_segment`` and ``partition`` (a string). Raises `CollectionNotFoundError`, `CollectionLayoutError` (no
    primary key to apply deletes with, a missing column) and `AsOfBeforeHorizonError` (an as-of before the
    compaction horizon) as the other readers do.
    """
    bound = None if as_of is None else timetick_of(as_of)
    collection = collection_path(root, name)
    local = local_dir(collection)
    if local is None:
        raise ValueError(f"read_collection_duckdb reads a local root (a path or a file:// URI), not "
                         f"{collection!r:.200}")
    if not os.path.isdir(local):
        raise CollectionNotFoundError(collection)
    files = file_set(collection, bound)
    assert files is not None  # a local root always has a file set
    if not files.data:
        return con.sql(f"SELECT NULL::BIGINT AS {TS_COLUMN}, NULL::BIGINT AS {SEGMENT_COLUMN}, "
                       f"NULL::VARCHAR AS {PARTITION_COLUMN} WHERE false")

    # union_by_name: files from before and after a column was added (_id) read as one table, NULL where absent.
    data = (f"read_parquet({_files(files.data)}, hive_partitioning = true, union_by_name = true, "
            f"hive_types = {{'{PARTITION_COLUMN}': VARCHAR, '{SEGMENT_DIR_COLUMN}': BIGINT}})")
    found = con.sql(f"SELECT * FROM {data} LIMIT 0").columns  # noqa: S608
    columns = [c for c in found if c != SEGMENT_DIR_COLUMN]
    for column in (TS_COLUMN, SEGMENT_COLUMN):
        if column not in columns:
            raise CollectionLayoutError(collection, f"data files have no {column!r} column: {columns}")
    # The discovered segment directory is dropped, as the other readers do: _segment holds the same id.
    rows = f"SELECT * EXCLUDE ({SEGMENT_DIR_COLUMN}) FROM {data}"  # noqa: S608
    if bound is not None:
        rows += f" WHERE {TS_COLUMN} <= {bound}"
    if not files.deletes:
        return con.sql(rows)

    deletes = f"read_parquet({_files(files.deletes)}, hive_partitioning = false, union_by_name = true)"
    delete_columns = con.sql(f"SELECT * FROM {deletes} LIMIT 0").columns  # noqa: S608
    key = resolve_primary_key(collection, primary_key, columns, delete_columns)
    del_id = f"coalesce({ID_COLUMN}, {NO_DELETE_ID})" if ID_COLUMN in delete_columns else str(NO_DELETE_ID)
    row_id = f"coalesce(r.{ID_COLUMN}, {NO_ROW_ID})" if ID_COLUMN in columns else str(NO_ROW_ID)
    # A row is gone iff some delete of its key (as of the bound) is later than it in (_ts, _id) order.
    query = f"""
        WITH r AS ({rows}),
        d AS (SELECT {_ident(key)} AS k, {TS_COLUMN} AS ts, {del_id} AS id FROM {deletes}
              {"" if bound is None else f"WHERE {TS_COLUMN} <= {bound}"})
        SELECT r.* FROM r WHERE NOT EXISTS (
            SELECT 1 FROM d WHERE d.k = r.{_ident(key)}
            AND (r.{TS_COLUMN} < d.ts OR (r.{TS_COLUMN} = d.ts AND {row_id} < d.id)))
    """  # noqa: S608
    return con.sql(query)

