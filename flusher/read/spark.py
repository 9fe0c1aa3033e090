"""Read a flushed collection back as of a timetick: with Spark (`read_collection`) or pyarrow (`read_collection_arrow`).

The layout (the flusher's contract; both readers code against it and nothing else)::

    <root>/<collection>/partition=<p>/segment=<id>/<first_id>-<last_id>.parquet   data (ids 20-digit zero-padded)
    <root>/_deletes/<collection>/<first_id>-<last_id>.parquet                      deletes: <primary key>, _ts
    <root>/<collection>/_dropped                                                   marker: the collection was dropped

* Data files hold the user columns plus ``_ts`` (int64 hybrid timetick of the row: ``physical_ms << 18 |
  logical``; for a transaction's rows, the commit timetick) and ``_segment`` (int64). Every data file names the
  primary key column in its Parquet key-value metadata under ``streamingnode.primary_key``.
* Any file or directory whose name starts with ``.`` is a file being written and is never read. Spark's file
  listing and pyarrow.dataset (``ignore_prefixes``) both skip names starting with ``.`` or ``_``, which is also
  what keeps ``_dropped`` out of the data. Delete files live outside the collection's directory (``_deletes`` is a
  name the node refuses for a collection), so that no glob of the collection's directory reads them as rows.
* ``_dropped`` does not hide anything: a drop only stops new rows, so a dropped collection reads like any other
  (its rows up to the drop, minus its deletes).

The row rule: every reader of the layout applies exactly this. Data rows and delete entries both carry ``_ts`` (the
timetick they became visible: their message's own, or their transaction's commit timetick) and ``_id`` (the WAL
message id of the INSERT, UPSERT or DELETE they came from; ids increase in log order, so within one commit they
give statement order). As of timetick ``T`` (``None`` means "everything": no bound on rows or deletes) a row is
visible iff ``row._ts <= T`` and its primary key has no delete entry with ``delete._ts <= T`` and
``(row._ts, row._id) < (delete._ts, delete._id)`` (tuple order: ``_ts`` first, ``_id`` on a tie). Consequences:

* a delete removes the key's rows written before it, a row written after a delete of its key is visible;
* inside one transaction (one ``_ts``) statement order decides: ``insert(k); delete(k)`` leaves nothing,
  ``delete(k); insert(k)`` leaves the row, ``insert(k); delete(k); insert(k)`` leaves one row;
* an UPSERT writes, for each row, the row and a delete entry of its key at the same ``(_ts, _id)``: equal tuples,
  so it removes every older version of the key and never itself;
* rows are not de-duplicated: two inserts of one key with no delete between them are two rows (as in Milvus;
  use upsert to replace).

Files written before ``_id`` existed lack the column: their rows count as later, and their deletes as earlier,
than any statement at the same ``_ts`` (the old rule ``row._ts < delete._ts``).

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

Which files: on a local root (a path or ``file://``) the readers read exactly what ``layout.visible_files`` gives,
the files its compaction records publish (flusher/README.md, Compaction), and raise `AsOfBeforeHorizonError` for an
as-of before the compaction horizon. A root on another filesystem is read by listing its directories, without the
records: exact except during a compaction's grace period (a compacted row twice), and without the horizon check.

The same files are plain Hive-layout Parquet, so other engines read them too: ``read_collection_arrow`` here
does it with pyarrow.dataset and `flusher.read.duckdb.read_collection_duckdb` with DuckDB (the same rule; the
three are tested against one model). A plain read of ``<root>/<collection>`` returns the data files' rows only:
every version, deleted rows included, no as-of (flusher/README.md, Reading, says exactly what).

pyspark is an optional dependency (the ``spark`` extra); it is imported only by `read_collection`, so `as_of` and
`read_collection_arrow` work without it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from wal.clock import LOGICAL_MAX, TIMETICK_MAX, compose, physical_ms
from wal.zoned_time import require_zone

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

PRIMARY_KEY_METADATA = "streamingnode.primary_key"
DELETES_DIR = "_deletes"
DROPPED_MARKER = "_dropped"
TS_COLUMN = "_ts"
ID_COLUMN = "_id"
SEGMENT_COLUMN = "_segment"
PARTITION_COLUMN = "partition"
_SEGMENT_DIR_COLUMN = "segment"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Names the anti-join gives the delete side; the double underscore keeps them off any user column.
_DEL_KEY = "__streamingnode_del_pk"
_DEL_TS = "__streamingnode_del_ts"
_DEL_ID = "__streamingnode_del_id"
_LATEST = "__streamingnode_latest"
# A missing _id (a file from before the column) sorts a row after, and a delete before, any statement at its _ts.
_NO_ROW_ID = (1 << 63) - 1
_NO_DELETE_ID = -1


class CollectionNotFoundError(FileNotFoundError):
    """The collection's directory does not exist under the root; `path` is the directory looked for."""

    def __init__(self, path: str) -> None:
        super().__init__(f"collection not found: no directory {path}")
        self.path = path


class CollectionLayoutError(ValueError):
    """The files do not follow the layout (no primary key to apply deletes with, a missing column)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class DamagedFileError(CollectionLayoutError):
    """A Parquet file of the collection cannot be read (bad magic, footer or page): `path` names the file.

    The node moves such a file to ``<root>/_quarantine/`` and writes it again from its log when it finds it; a
    reader that gets here first sees this error rather than wrong or missing rows.
    """


def as_of(ts: datetime | int) -> int:
    """Return the timetick that bounds a read at `ts`.

    A timezone-aware `datetime` becomes ``physical_ms << 18 | 0x3FFFF``: everything written up to and including that
    millisecond (sub-millisecond digits are truncated). A naive datetime is refused rather than guessed to be local
    time or UTC. An `int` is taken to be a timetick already and is returned unchanged after a range check, so a
    caller holding either kind of bound can pass it through here.
    """
    if isinstance(ts, bool):  # bool is an int; True as a timetick is surely a mistake
        raise TypeError("as_of() takes a datetime or an int timetick, not a bool")
    if isinstance(ts, int):
        if not 0 <= ts <= TIMETICK_MAX:
            raise ValueError(f"timetick {ts} is outside 0..2**63-1")
        return ts
    if not isinstance(ts, datetime):
        raise TypeError(f"as_of() takes a datetime or an int timetick, not {type(ts).__name__}")
    require_zone(ts, "as_of() time")
    ms = (ts - _EPOCH) // timedelta(milliseconds=1)
    if not 0 <= ms <= physical_ms(TIMETICK_MAX):
        raise ValueError(f"{ts.isoformat()} is outside the range a timetick can hold")
    return compose(ms, LOGICAL_MAX)


def _bound(as_of_ts: int | None) -> int | None:
    return None if as_of_ts is None else as_of(as_of_ts)


def _collection_path(root: str | os.PathLike[str], name: str) -> str:
    # A leading "_" is allowed (Milvus names may start with one); "." is a file being written; DELETES_DIR is the
    # directory of every collection's deletes, a name the node refuses for a collection.
    if not name or "/" in name or name.startswith(".") or name == DELETES_DIR:
        raise ValueError(f"not a collection name: {name!r}")
    return f"{os.fspath(root).rstrip('/')}/{name}"


def _deletes_path(collection: str) -> str:
    """``<root>/_deletes/<name>`` for the collection path ``<root>/<name>``: outside the data's directory."""
    root, _, name = collection.rpartition("/")
    return f"{root}/{DELETES_DIR}/{name}"


@dataclass(frozen=True, slots=True)
class _FileSet:
    """The files one read takes (local paths, compaction records applied), from ``layout.visible_files``."""

    data: list[str]
    deletes: list[str]


def _local_dir(path: str) -> str | None:
    """The local directory a plain path or a ``file://`` URI names; None for any other filesystem."""
    if "://" not in path:
        return os.path.abspath(path)
    if path.startswith("file://"):
        return os.path.abspath(unquote(urlparse(path).path))
    return None


def _file_set(collection: str, bound: int | None) -> _FileSet | None:
    """What a read of `collection` as of `bound` takes, with its compaction records applied; None for a root on
    another filesystem than the local one, which is read by listing its directories (see the module docstring).

    Raises `AsOfBeforeHorizonError` when `bound` is before the compaction horizon.
    """
    local = _local_dir(collection)
    if local is None:
        return None
    # Imported here: flusher.layout pulls in parts of the log's package, which spark-submit does not need
    # to import flusher.read.spark.
    from flusher import layout  # noqa: PLC0415

    root, _, name = local.rpartition("/")
    data, deletes, horizon = layout.visible_files(root, name)
    layout.check_as_of(bound, horizon, name)
    return _FileSet(data, deletes)


def __getattr__(name: str) -> object:
    # AsOfBeforeHorizonError lives in flusher.layout (the compactor raises it too), loaded only when asked for.
    if name == "AsOfBeforeHorizonError":
        from flusher.layout import AsOfBeforeHorizonError  # noqa: PLC0415

        return AsOfBeforeHorizonError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem for a plain path or a URI (file://, s3://, ...), and the path inside it."""
    if "://" in path:
        fs, inner = pafs.FileSystem.from_uri(path)
        return fs, inner
    return pafs.LocalFileSystem(), os.path.abspath(path)


def _visible(info: pafs.FileInfo) -> bool:
    return not info.base_name.startswith((".", "_"))


def _primary_key_from_footer(fs: pafs.FileSystem, collection: str) -> str | None:
    """The primary key named in the first data file found, walking partition=/segment= dirs; None if no file."""

    def children(path: str, kind: pafs.FileType) -> list[pafs.FileInfo]:
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        return sorted((i for i in infos if i.type == kind and _visible(i)), key=lambda i: i.path)

    for partition in children(collection, pafs.FileType.Directory):
        for segment in children(partition.path, pafs.FileType.Directory):
            for file in children(segment.path, pafs.FileType.File):
                if not file.base_name.endswith(".parquet"):
                    continue
                metadata = pq.read_metadata(file.path, filesystem=fs).metadata or {}
                value = metadata.get(PRIMARY_KEY_METADATA.encode())
                return value.decode() if value is not None else None
    return None


def _resolve_primary_key(
    collection: str, explicit: str | None, data_columns: list[str], delete_columns: list[str]
) -> str:
    """The argument if given, else the data files' metadata, else the one non-system column of the deletes."""
    key = explicit
    if key is None:
        try:
            fs, inner = _filesystem(collection)
            key = _primary_key_from_footer(fs, inner)
        except (OSError, pa.ArrowException):
            key = None  # a filesystem pyarrow cannot open (hdfs without libhdfs, ...): fall back to the deletes
    if key is None:
        candidates = [c for c in delete_columns if c not in (TS_COLUMN, ID_COLUMN)]
        if len(candidates) != 1:
            raise CollectionLayoutError(
                collection,
                f"cannot tell the primary key: no {PRIMARY_KEY_METADATA!r} in the data files' metadata and the "
                f"deletes have columns {delete_columns}; pass primary_key=",
            )
        key = candidates[0]
    for where, columns in (("data", data_columns), ("deletes", delete_columns)):
        if key not in columns:
            raise CollectionLayoutError(collection, f"primary key {key!r} is not a column of the {where} {columns}")
    return key


# --- Spark --------------------------------------------------------------------------------------------------------


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


def _spark_file_set(collection: str, bound: int | None) -> _FileSet | None:
    """`_file_set` for Spark, which skips a file whose name starts with ``.`` even when it is named explicitly.

    A compaction output is under its hidden name only between its record's commit and the link of its visible name
    (a moment, unless the compactor died there: the node links it when it starts again), so the read waits for the
    link, and fails naming the file if it does not come.
    """
    deadline = time.monotonic() + _LINK_WAIT_SECONDS
    while True:
        files = _file_set(collection, bound)
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

    bound = _bound(as_of_ts)
    collection = _collection_path(root, name)
    local = _local_dir(collection)
    if local is not None and not os.path.isdir(local):
        raise CollectionNotFoundError(collection)
    files = _spark_file_set(collection, bound)

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
    if _SEGMENT_DIR_COLUMN in rows.columns:
        rows = rows.drop(_SEGMENT_DIR_COLUMN)
    for column in (TS_COLUMN, SEGMENT_COLUMN):
        if column not in rows.columns:
            raise CollectionLayoutError(collection, f"data files have no {column!r} column: {rows.columns}")

    if bound is not None:
        rows = rows.where(F.col(TS_COLUMN) <= F.lit(bound))

    if files is None:
        deletes = _spark_read_parquet(spark, _deletes_path(collection))
    else:
        deletes = spark.read.parquet(*_spark_paths(collection, files.deletes)) if files.deletes else None
    if deletes is None:
        return rows
    key = _resolve_primary_key(collection, primary_key, rows.columns, deletes.columns)
    no_id = F.lit(_NO_DELETE_ID)
    del_id = F.coalesce(F.col(ID_COLUMN), no_id) if ID_COLUMN in deletes.columns else no_id
    deletes = deletes.select(F.col(_quoted(key)).alias(_DEL_KEY), F.col(TS_COLUMN).alias(_DEL_TS),
                             del_id.cast(LongType()).alias(_DEL_ID))
    if bound is not None:
        deletes = deletes.where(F.col(_DEL_TS) <= F.lit(bound))
    # Only the latest (_ts, _id) delete of each key matters: a row is gone iff some delete is later than it, i.e. the
    # latest. Spark orders structs field by field, which is the tuple order of the row rule.
    latest = (deletes.groupBy(_DEL_KEY).agg(F.max(F.struct(_DEL_TS, _DEL_ID)).alias(_LATEST))
              .select(_DEL_KEY, F.col(f"{_LATEST}.{_DEL_TS}").alias(_DEL_TS),
                      F.col(f"{_LATEST}.{_DEL_ID}").alias(_DEL_ID)))
    row_id = F.coalesce(F.col(ID_COLUMN), F.lit(_NO_ROW_ID)) if ID_COLUMN in rows.columns else F.lit(_NO_ROW_ID)
    row_ts = F.col(TS_COLUMN)
    earlier = (row_ts < F.col(_DEL_TS)) | ((row_ts == F.col(_DEL_TS)) & (row_id < F.col(_DEL_ID)))
    condition = (F.col(_quoted(key)) == F.col(_DEL_KEY)) & earlier
    return rows.join(latest, on=condition, how="left_anti")


# --- pyarrow ------------------------------------------------------------------------------------------------------


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
    bound = _bound(as_of_ts)
    collection = _collection_path(root, name)
    fs, inner = _filesystem(collection)
    if fs.get_file_info(inner).type != pafs.FileType.Directory:
        raise CollectionNotFoundError(collection)

    files = _file_set(collection, bound)
    partitioning = ds.partitioning(
        pa.schema([(PARTITION_COLUMN, pa.string()), (_SEGMENT_DIR_COLUMN, pa.int64())]), flavor="hive"
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
    columns = [c for c in data.schema.names if c != _SEGMENT_DIR_COLUMN]
    for column in (TS_COLUMN, SEGMENT_COLUMN):
        if column not in columns:
            raise CollectionLayoutError(collection, f"data files have no {column!r} column: {columns}")
    row_filter = None if bound is None else pc.field(TS_COLUMN) <= bound
    rows = _read(data, fs, columns=columns, filter=row_filter)

    deletes_path = _deletes_path(inner)
    if files is not None:
        deletes_ds = _arrow_dataset(fs, deletes_path, None, files.deletes)
    elif fs.get_file_info(deletes_path).type == pafs.FileType.Directory:
        deletes_ds = _arrow_dataset(fs, deletes_path, None)
    else:
        return rows
    if not deletes_ds.files:
        return rows
    key = _resolve_primary_key(collection, primary_key, rows.column_names, deletes_ds.schema.names)
    has_ids = ID_COLUMN in deletes_ds.schema.names
    deletes = _read(deletes_ds, fs, columns=[key, TS_COLUMN, *([ID_COLUMN] if has_ids else [])],
                    filter=row_filter)
    del_ids = _ids(deletes, _NO_DELETE_ID)
    # Only the latest (_ts, _id) delete of each key matters (see the row rule): sorted by that tuple, the last of
    # each key's group is it ("last" follows input order when the grouping is single-threaded).
    ordered = pa.table({_DEL_KEY: deletes[key], _DEL_TS: deletes[TS_COLUMN], _DEL_ID: del_ids}).sort_by(
        [(_DEL_TS, "ascending"), (_DEL_ID, "ascending")])
    grouped = ordered.group_by(_DEL_KEY, use_threads=False).aggregate([(_DEL_TS, "last"), (_DEL_ID, "last")])
    latest = pa.table({_DEL_KEY: grouped[_DEL_KEY], _DEL_TS: grouped[f"{_DEL_TS}_last"],
                       _DEL_ID: grouped[f"{_DEL_ID}_last"]})
    # Join only the key, _ts, _id and the row number: Acero's hash join does not carry every nested type (vectors),
    # so the surviving row numbers select from the full table afterwards, in the original order.
    slim = pa.table({_DEL_KEY: rows[key], TS_COLUMN: rows[TS_COLUMN], ID_COLUMN: _ids(rows, _NO_ROW_ID),
                     "__row": pa.array(range(rows.num_rows), pa.int64())})
    joined = slim.join(latest, keys=_DEL_KEY, join_type="left outer")
    # Kept unless (row._ts, row._id) < (del._ts, del._id). Kleene or: "no delete" (null) or'd with the null
    # comparisons it causes must be true, not null.
    row_ts, del_ts = joined[TS_COLUMN], joined[_DEL_TS]
    not_earlier = pc.or_kleene(pc.greater(row_ts, del_ts), pc.and_kleene(
        pc.equal(row_ts, del_ts), pc.greater_equal(joined[ID_COLUMN], joined[_DEL_ID])))
    keep = pc.or_kleene(pc.is_null(del_ts), not_earlier)
    survivors = joined.filter(keep)["__row"]
    return rows.take(survivors.take(pc.sort_indices(survivors)))
