"""Read a flushed collection back as of a timetick: with Spark (`read_collection`) or pyarrow (`read_collection_arrow`).

The layout (the flusher's contract; both readers code against it and nothing else)::

    <root>/<collection>/partition=<p>/segment=<id>/<first_id>-<last_id>.parquet   data (ids 20-digit zero-padded)
    <root>/<collection>/_deletes/<first_id>-<last_id>.parquet                      deletes: <primary key>, _ts
    <root>/<collection>/_dropped                                                   marker: the collection was dropped

* Data files hold the user columns plus ``_ts`` (int64 hybrid timetick of the row: ``physical_ms << 18 |
  logical``; for a transaction's rows, the commit timetick) and ``_segment`` (int64). Every data file names the
  primary key column in its Parquet key-value metadata under ``streamingnode.primary_key``.
* Any file or directory whose name starts with ``.`` is a file being written and is never read. Spark's file
  listing and pyarrow.dataset (``ignore_prefixes``) both skip names starting with ``.`` or ``_``, which is also
  what keeps ``_deletes/`` and ``_dropped`` out of the data.
* ``_dropped`` does not hide anything: a drop only stops new rows, so a dropped collection reads like any other
  (its rows up to the drop, minus its deletes).

Semantics of a read as of timetick ``T`` (``None`` means "everything": no bound on rows or deletes): the rows
with ``_ts <= T``, minus each row whose primary key has a delete with ``row._ts < delete._ts <= T``. A row
inserted again after its delete (a later ``_ts``) is visible again; a delete at the very timetick of a row does
not remove it (an upsert is a delete and an insert at one timetick). Rows are not de-duplicated: two inserts of
one key with no delete between them are two rows.

Columns of the result: the user columns, ``_ts``, ``_segment`` and ``partition`` (the partition name from the
directory, always a string: a partition called ``1`` stays ``"1"``). The discovered ``segment`` directory column is
dropped because ``_segment`` already carries the same id with a fixed type (int64), while the discovered one is
int or long depending on the values. A collection that exists but has no data file yet reads as zero rows with
only ``partition``, ``_ts`` and ``_segment``: there is no file to take the user schema from. Files of one
collection are expected to share a schema: the schema is taken from one file, as both engines do by default.

Types, as Spark reads them: int64 → long, float → float, double → double, bool → boolean, string and the
``arrow.json`` extension (Parquet JSON logical type) → string, binary → binary, ``fixed_size_list<float32>[16]`` and
``list<float>`` → ``array<float>``. Timestamp columns must be written with ``coerce_timestamps="us"``: Spark
refuses Parquet TIMESTAMP(NANOS).

The same files are plain Hive-layout Parquet, so other engines read them too: ``read_collection_arrow`` here does
it with pyarrow.dataset (the same semantics, tested against the Spark reader), and DuckDB would with
``read_parquet('<root>/<collection>/partition=*/segment=*/[!.]*.parquet', hive_partitioning = true)`` plus the same
anti-join on ``_deletes`` (not installed here, so not tested).

pyspark is an optional dependency (the ``spark`` extra); it is imported only by `read_collection`, so `as_of` and
`read_collection_arrow` work without it.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from wal.clock import LOGICAL_MAX, TIMETICK_MAX, compose, physical_ms

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "DELETES_DIR",
    "DROPPED_MARKER",
    "PRIMARY_KEY_METADATA",
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
SEGMENT_COLUMN = "_segment"
PARTITION_COLUMN = "partition"
_SEGMENT_DIR_COLUMN = "segment"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Names the anti-join gives the delete side; the double underscore keeps them off any user column.
_DEL_KEY = "__streamingnode_del_pk"
_DEL_TS = "__streamingnode_del_ts"


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
    if ts.tzinfo is None or ts.utcoffset() is None:
        raise ValueError(f"as_of() needs a timezone-aware datetime, got naive {ts.isoformat()}")
    ms = (ts - _EPOCH) // timedelta(milliseconds=1)
    if not 0 <= ms <= physical_ms(TIMETICK_MAX):
        raise ValueError(f"{ts.isoformat()} is outside the range a timetick can hold")
    return compose(ms, LOGICAL_MAX)


def _bound(as_of_ts: int | None) -> int | None:
    return None if as_of_ts is None else as_of(as_of_ts)


def _collection_path(root: str | os.PathLike[str], name: str) -> str:
    # A leading "_" is allowed (Milvus names may start with one); "." is a file being written.
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"not a collection name: {name!r}")
    return f"{os.fspath(root).rstrip('/')}/{name}"


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
        candidates = [c for c in delete_columns if c != TS_COLUMN]
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
    the one non-``_ts`` column of the deletes); a missing or empty ``_deletes`` means no deletes. See the module
    docstring for the exact semantics and the columns returned. The plan is lazy: the only work done here is
    listing files and reading a footer or two to learn the schemas.

    Spark logs "All paths were ignored: .../_deletes" at WARN when it reads the deletes: the warning is about the
    directory's ``_`` name, which hides it from the data listing; given as the path to read, it is read.

    Raises `CollectionNotFoundError` when the collection's directory does not exist, and `CollectionLayoutError`
    when deletes exist but no primary key can be found or it is not a column.
    """
    # pyspark is the optional `spark` extra: imported here so that the pyarrow reader works without it.
    from pyspark.errors import AnalysisException  # noqa: PLC0415
    from pyspark.sql import functions as F  # noqa: PLC0415
    from pyspark.sql.types import LongType, StringType, StructField, StructType  # noqa: PLC0415

    bound = _bound(as_of_ts)
    collection = _collection_path(root, name)
    try:
        rows = spark.read.parquet(collection)
    except AnalysisException as e:
        if e.getCondition() == "PATH_NOT_FOUND":
            raise CollectionNotFoundError(collection) from e
        if e.getCondition() != "UNABLE_TO_INFER_SCHEMA":
            raise
        empty = StructType(
            [StructField(c, t) for c, t in ((TS_COLUMN, LongType()), (SEGMENT_COLUMN, LongType()))]
            + [StructField(PARTITION_COLUMN, StringType())]
        )
        return spark.createDataFrame([], empty)

    # Partition discovery infers `partition=1` as an int (and would turn "007" into 7): read again with the
    # inferred schema but a string partition. Rare (names are usually like "_default"), so paid only then.
    partition_field = next((f for f in rows.schema.fields if f.name == PARTITION_COLUMN), None)
    if partition_field is not None and not isinstance(partition_field.dataType, StringType):
        schema = StructType(
            [StructField(f.name, StringType()) if f.name == PARTITION_COLUMN else f for f in rows.schema.fields]
        )
        rows = spark.read.schema(schema).parquet(collection)
    if _SEGMENT_DIR_COLUMN in rows.columns:
        rows = rows.drop(_SEGMENT_DIR_COLUMN)
    for column in (TS_COLUMN, SEGMENT_COLUMN):
        if column not in rows.columns:
            raise CollectionLayoutError(collection, f"data files have no {column!r} column: {rows.columns}")

    if bound is not None:
        rows = rows.where(F.col(TS_COLUMN) <= F.lit(bound))

    deletes = _spark_read_parquet(spark, f"{collection}/{DELETES_DIR}")
    if deletes is None:
        return rows
    key = _resolve_primary_key(collection, primary_key, rows.columns, deletes.columns)
    deletes = deletes.select(F.col(_quoted(key)).alias(_DEL_KEY), F.col(TS_COLUMN).alias(_DEL_TS))
    if bound is not None:
        deletes = deletes.where(F.col(_DEL_TS) <= F.lit(bound))
    # Only the latest delete of each key matters: a row is gone iff some delete is later than it, i.e. the latest.
    latest = deletes.groupBy(_DEL_KEY).agg(F.max(_DEL_TS).alias(_DEL_TS))
    condition = (F.col(_quoted(key)) == F.col(_DEL_KEY)) & (F.col(TS_COLUMN) < F.col(_DEL_TS))
    return rows.join(latest, on=condition, how="left_anti")


# --- pyarrow ------------------------------------------------------------------------------------------------------


# The flusher writes page checksums: verified, a damaged page is an error naming its file, not wrong rows.
_PARQUET = ds.ParquetFileFormat(
    default_fragment_scan_options=ds.ParquetFragmentScanOptions(page_checksum_verification=True))


def _arrow_dataset(fs: pafs.FileSystem, path: str, partitioning: ds.Partitioning | None) -> ds.Dataset:
    try:
        return ds.dataset(path, filesystem=fs, format=_PARQUET, partitioning=partitioning,
                          ignore_prefixes=[".", "_"])
    except (OSError, pa.ArrowException) as exc:  # discovery reads a footer
        raise _damaged(fs, path, exc) from exc


def _damaged(fs: pafs.FileSystem, path: str, exc: Exception) -> Exception:
    """The first file under `path` that cannot be read whole, as a DamagedFileError; else `exc` itself.

    pyarrow's errors do not always say which file of a dataset failed (a bad page names none), so the files are
    read one by one to find it: a cost paid only on the failure path.
    """
    selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
    for info in sorted(fs.get_file_info(selector), key=lambda i: i.path):
        relative = info.path[len(path):].lstrip("/")
        if info.type != pafs.FileType.File or any(p.startswith((".", "_")) for p in relative.split("/")):
            continue
        try:
            with fs.open_input_file(info.path) as f:
                pq.ParquetFile(f, page_checksum_verification=True).read()
        except (OSError, pa.ArrowException) as bad:
            return DamagedFileError(info.path, f"not a readable Parquet file: {str(bad)[:200]}")
    return exc


def _read(data: ds.Dataset, fs: pafs.FileSystem, path: str, **kwargs: object) -> pa.Table:
    try:
        return data.to_table(**kwargs)
    except (OSError, pa.ArrowException) as exc:
        raise _damaged(fs, path, exc) from exc


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

    partitioning = ds.partitioning(
        pa.schema([(PARTITION_COLUMN, pa.string()), (_SEGMENT_DIR_COLUMN, pa.int64())]), flavor="hive"
    )
    data = _arrow_dataset(fs, inner, partitioning)
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
    rows = _read(data, fs, inner, columns=columns, filter=row_filter)

    deletes_path = f"{inner}/{DELETES_DIR}"
    if fs.get_file_info(deletes_path).type != pafs.FileType.Directory:
        return rows
    deletes_ds = _arrow_dataset(fs, deletes_path, None)
    if not deletes_ds.files:
        return rows
    key = _resolve_primary_key(collection, primary_key, rows.column_names, deletes_ds.schema.names)
    deletes = _read(deletes_ds, fs, deletes_path, columns=[key, TS_COLUMN], filter=row_filter)
    latest = deletes.group_by(key).aggregate([(TS_COLUMN, "max")]).rename_columns([_DEL_KEY, _DEL_TS])
    # Join only the key, _ts and the row number: Acero's hash join does not carry every nested type (vectors),
    # so the surviving row numbers select from the full table afterwards, in the original order.
    slim = pa.table(
        {_DEL_KEY: rows[key], TS_COLUMN: rows[TS_COLUMN], "__row": pa.array(range(rows.num_rows), pa.int64())}
    )
    joined = slim.join(latest, keys=_DEL_KEY, join_type="left outer")
    # Kleene or: "no delete" (null) or'd with the null comparison it causes must be true, not null.
    keep = pc.or_kleene(pc.is_null(joined[_DEL_TS]), pc.greater_equal(joined[TS_COLUMN], joined[_DEL_TS]))
    survivors = joined.filter(keep)["__row"]
    return rows.take(survivors.take(pc.sort_indices(survivors)))
