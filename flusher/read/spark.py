"""Read a flushed collection back as of a timetick with Spark: `read_collection` (and, re-exported for jobs
written against this module, pyarrow's `read_collection_arrow` from `flusher.read.arrow`).

The layout, the row rule every reader applies and which files a read takes: `flusher.read.plan`.

Columns of the result: the user columns, ``_ts``, ``_id``, ``_segment`` and ``partition`` (the partition name from the
directory, always a string: a partition called ``1`` stays ``"1"``). The discovered ``segment`` directory column is
dropped because ``_segment`` already carries the same id with a fixed type (int64), while the discovered one is
int or long depending on the values. A collection that exists but has no data file yet reads as zero rows with
only ``partition``, ``_ts`` and ``_segment``: there is no file to take the user schema from. Files of one
collection are expected to share a schema: the schema is taken from one file, as both engines do by default.

Types, as Spark reads them (the full table, with Parquet and DuckDB, is in ``flusher/README.md``): int8 → tinyint,
int16 → smallint, int32 → int, int64 → bigint, float → float, double → double, bool → boolean, string and the
``arrow.json`` extension (Parquet JSON logical type) → string, binary and binary vectors (``fixed_size_binary``) →
binary, date32 → date, ``decimal128(p, s)`` → ``decimal(p,s)``, a timestamp without a zone → ``timestamp_ntz`` and
with one → ``timestamp`` (the flusher writes every timestamp as microseconds, ``coerce_timestamps="us"``: Spark
refuses Parquet TIMESTAMP(NANOS), so ``timestamp[ns]`` columns are refused at CreateCollection), ``list<scalar>`` →
``array<…>``, a struct → ``struct<…>``, float, float16 and bfloat16 vectors → ``array<float>`` (the flusher widens the
16-bit ones to float32, exactly, and names them in the field metadata ``streamingnode.vector``), and sparse vectors
(``map<uint32, float32>``) → ``map<bigint,float>``.

The same files are plain Hive-layout Parquet, so other engines read them too: ``read_collection_arrow``
(`flusher.read.arrow`) does it with pyarrow.dataset and `flusher.read.duckdb.read_collection_duckdb` with DuckDB
(the same rule; the three are tested against one model). A plain read of ``<root>/<collection>`` returns the
data files' rows only: every version, deleted rows included, no as-of (flusher/README.md, Reading, says exactly
what).

pyspark is an optional dependency (the ``spark`` extra); it is imported only by `read_collection`, so `as_of` and
`read_collection_arrow` work without it.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from flusher.read import plan
from flusher.read.arrow import read_collection_arrow
from flusher.read.plan import (
    DELETES_DIR,
    DROPPED_MARKER,
    ID_COLUMN,
    JOIN_ID,
    JOIN_KEY,
    JOIN_TS,
    NO_DELETE_ID,
    NO_ROW_ID,
    PARTITION_COLUMN,
    PRIMARY_KEY_METADATA,
    SEGMENT_COLUMN,
    SEGMENT_DIR_COLUMN,
    TS_COLUMN,
    CollectionLayoutError,
    CollectionNotFoundError,
    DamagedFileError,
    FileSet,
    as_of,
    bound_of,
    collection_path,
    deletes_path,
    file_set,
    local_dir,
    resolve_primary_key,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, DataFrameReader, SparkSession

    from flusher.layout import AsOfBeforeHorizonError

__all__ = [
    "DELETES_DIR",
    "DROPPED_MARKER",
    "PRIMARY_KEY_METADATA",
    "AsOfBeforeHorizonError",
    "CollectionLayoutError",
    "CollectionNotFoundError",
    "DamagedFileError",
    "as_of",
    "read_collection",
    "read_collection_arrow",
]

_LATEST = "__streamingnode_latest"


def __getattr__(name: str) -> object:
    # AsOfBeforeHorizonError is flusher.read.plan's, loaded (from flusher.layout) only when asked for.
    if name == "AsOfBeforeHorizonError":
        return getattr(plan, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _spark_read_parquet(spark: SparkSession, path: str) -> DataFrame | None:
    """`spark.read.parquet(path)`, or None when the directory is missing or holds no (visible) Parquet file."""
    from pyspark.errors import AnalysisException  # noqa: PLC0415  (pyspark is the optional `spark` extra)

    try:
        return spark.read.parquet(path)
    except AnalysisException as e:
        if e.getCondition() in ("PATH_NOT_FOUND", "UNABLE_TO_INFER_SCHEMA"):
            return None
        raise


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


# How long a Spark read waits for a committed compaction output to get its visible name (see _spark_file_set).
_LINK_WAIT_SECONDS = 30.0


def _sparkfile_set(collection: str, bound: int | None) -> FileSet | None:
    """`_file_set` for Spark, which skips a file whose name starts with ``.`` even when it is named explicitly.

    A compaction output is under its hidden name only between its record's commit and the link of its visible name
    (a moment, unless the compactor died there: the node links it when it starts again), so the read waits for the
    link, and fails naming the file if it does not come.
    """
    deadline = time.monotonic() + _LINK_WAIT_SECONDS
    while True:
        files = file_set(collection, bound)
        hidden = [] if files is None else [
            p for p in (*files.data, *files.deletes) if os.path.basename(p).startswith(".")]
        if not hidden:
            return files
        if time.monotonic() >= deadline:
            raise CollectionLayoutError(hidden[0], "a committed compaction output still has only its hidden name, "
                                                   "which Spark does not read: retry once the node has linked it")
        time.sleep(0.05)


def _spark_paths(collection: str, paths: list[str]) -> list[str]:
    # Named as the root was: a plain path resolves against the session's default filesystem, as the root did.
    return [f"file://{p}" for p in paths] if collection.startswith("file:") else paths


def read_collection(
    spark: SparkSession,
    root: str | os.PathLike[str],
    name: str,
    as_of_ts: int | None = None,
    primary_key: str | None = None,
) -> DataFrame:
    """The rows of collection `name` under `root` visible as of timetick `as_of_ts` (None: all), as a DataFrame.

    `root` is a path or any URI the session's Hadoop configuration can read. Deletes are applied with a left
    anti-join on the primary key (`primary_key`, else the data files' ``streamingnode.primary_key`` metadata, else
    the one non-``_ts`` column of the deletes); a missing or empty ``<root>/_deletes/<name>`` means no deletes. See
    the module docstring for the exact semantics and the columns returned. The plan is lazy: the only work done here
    is listing files and reading a footer or two to learn the schemas.

    Raises `CollectionNotFoundError` when the collection's directory does not exist, and `CollectionLayoutError`
    when deletes exist but no primary key can be found or it is not a column.
    """
    # pyspark is the optional `spark` extra: imported here so that the pyarrow reader works without it.
    from pyspark.errors import AnalysisException  # noqa: PLC0415
    from pyspark.sql import functions as F  # noqa: PLC0415
    from pyspark.sql.types import LongType, StringType, StructField, StructType  # noqa: PLC0415

    bound = bound_of(as_of_ts)
    collection = collection_path(root, name)
    local = local_dir(collection)
    if local is not None and not os.path.isdir(local):
        raise CollectionNotFoundError(collection)
    files = _sparkfile_set(collection, bound)

    def read_data(reader: DataFrameReader) -> DataFrame:
        if files is None:
            return reader.parquet(collection)
        # basePath: partition discovery takes partition=/segment= from below the collection's directory.
        return reader.option("basePath", collection).parquet(*_spark_paths(collection, files.data))

    empty = StructType(
        [StructField(c, t) for c, t in ((TS_COLUMN, LongType()), (SEGMENT_COLUMN, LongType()))]
        + [StructField(PARTITION_COLUMN, StringType())]
    )
    if files is not None and not files.data:
        return spark.createDataFrame([], empty)
    try:
        rows = read_data(spark.read)
    except AnalysisException as e:
        if e.getCondition() == "PATH_NOT_FOUND":
            raise CollectionNotFoundError(collection) from e
        if e.getCondition() != "UNABLE_TO_INFER_SCHEMA":
            raise
        return spark.createDataFrame([], empty)

    # Partition discovery infers `partition=1` as an int (and would turn "007" into 7): read again with the
    # inferred schema but a string partition. Rare (names are usually like "_default"), so paid only then.
    partition_field = next((f for f in rows.schema.fields if f.name == PARTITION_COLUMN), None)
    if partition_field is not None and not isinstance(partition_field.dataType, StringType):
        schema = StructType(
            [StructField(f.name, StringType()) if f.name == PARTITION_COLUMN else f for f in rows.schema.fields]
        )
        rows = read_data(spark.read.schema(schema))
    if SEGMENT_DIR_COLUMN in rows.columns:
        rows = rows.drop(SEGMENT_DIR_COLUMN)
    for column in (TS_COLUMN, SEGMENT_COLUMN):
        if column not in rows.columns:
            raise CollectionLayoutError(collection, f"data files have no {column!r} column: {rows.columns}")

    if bound is not None:
        rows = rows.where(F.col(TS_COLUMN) <= F.lit(bound))

    if files is None:
        deletes = _spark_read_parquet(spark, deletes_path(collection))
    else:
        deletes = spark.read.parquet(*_spark_paths(collection, files.deletes)) if files.deletes else None
    if deletes is None:
        return rows
    key = resolve_primary_key(collection, primary_key, rows.columns, deletes.columns)
    no_id = F.lit(NO_DELETE_ID)
    del_id = F.coalesce(F.col(ID_COLUMN), no_id) if ID_COLUMN in deletes.columns else no_id
    deletes = deletes.select(F.col(_quoted(key)).alias(JOIN_KEY), F.col(TS_COLUMN).alias(JOIN_TS),
                             del_id.cast(LongType()).alias(JOIN_ID))
    if bound is not None:
        deletes = deletes.where(F.col(JOIN_TS) <= F.lit(bound))
    # Only the latest (_ts, _id) delete of each key matters: a row is gone iff some delete is later than it, i.e. the
    # latest. Spark orders structs field by field, which is the tuple order of the row rule.
    latest = (deletes.groupBy(JOIN_KEY).agg(F.max(F.struct(JOIN_TS, JOIN_ID)).alias(_LATEST))
              .select(JOIN_KEY, F.col(f"{_LATEST}.{JOIN_TS}").alias(JOIN_TS),
                      F.col(f"{_LATEST}.{JOIN_ID}").alias(JOIN_ID)))
    row_id = F.coalesce(F.col(ID_COLUMN), F.lit(NO_ROW_ID)) if ID_COLUMN in rows.columns else F.lit(NO_ROW_ID)
    row_ts = F.col(TS_COLUMN)
    earlier = (row_ts < F.col(JOIN_TS)) | ((row_ts == F.col(JOIN_TS)) & (row_id < F.col(JOIN_ID)))
    condition = (F.col(_quoted(key)) == F.col(JOIN_KEY)) & earlier
    return rows.join(latest, on=condition, how="left_anti")
