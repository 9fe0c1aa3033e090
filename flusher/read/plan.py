"""The as-of planning every reader of a flushed collection shares: the layout, the row rule, which files
one read takes (compaction records applied) and the horizon check, the primary key, and the bound.

The three readers (`flusher.read.spark.read_collection`, `flusher.read.arrow.read_collection_arrow`,
`flusher.read.duckdb.read_collection_duckdb`) take their files, key and bound from here and apply the row rule
below, each in its own engine.

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

Which files: on a local root (a path or ``file://``) the readers read exactly what ``layout.visible_files`` gives,
the files its compaction records publish (flusher/README.md, Compaction), and raise `AsOfBeforeHorizonError` for an
as-of before the compaction horizon. A root on another filesystem is read by listing its directories, without the
records: exact except during a compaction's grace period (a compacted row twice), and without the horizon check.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from wal.clock import LOGICAL_MAX, TIMETICK_MAX, compose, physical_ms
from wal.zoned_time import require_zone

if TYPE_CHECKING:
    from flusher.layout import AsOfBeforeHorizonError

PRIMARY_KEY_METADATA = "streamingnode.primary_key"
DELETES_DIR = "_deletes"
DROPPED_MARKER = "_dropped"
TS_COLUMN = "_ts"
ID_COLUMN = "_id"
SEGMENT_COLUMN = "_segment"
PARTITION_COLUMN = "partition"
SEGMENT_DIR_COLUMN = "segment"
"""The ``segment=`` directory column partition discovery finds; readers drop it (``_segment`` holds the id)."""

# Names a reader's anti-join gives the delete side; the double underscore keeps them off any user column.
JOIN_KEY = "__streamingnode_del_pk"
JOIN_TS = "__streamingnode_del_ts"
JOIN_ID = "__streamingnode_del_id"
# A missing _id (a file from before the column) sorts a row after, and a delete before, any statement at its _ts.
NO_ROW_ID = (1 << 63) - 1
NO_DELETE_ID = -1

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


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


def bound_of(as_of_ts: int | None) -> int | None:
    return None if as_of_ts is None else as_of(as_of_ts)


def collection_path(root: str | os.PathLike[str], name: str) -> str:
    # A leading "_" is allowed (Milvus names may start with one); "." is a file being written; DELETES_DIR is the
    # directory of every collection's deletes, a name the node refuses for a collection.
    if not name or "/" in name or name.startswith(".") or name == DELETES_DIR:
        raise ValueError(f"not a collection name: {name!r}")
    return f"{os.fspath(root).rstrip('/')}/{name}"


def deletes_path(collection: str) -> str:
    """``<root>/_deletes/<name>`` for the collection path ``<root>/<name>``: outside the data's directory."""
    root, _, name = collection.rpartition("/")
    return f"{root}/{DELETES_DIR}/{name}"


@dataclass(frozen=True, slots=True)
class FileSet:
    """The files one read takes (local paths, compaction records applied), from ``layout.visible_files``."""

    data: list[str]
    deletes: list[str]


def local_dir(path: str) -> str | None:
    """The local directory a plain path or a ``file://`` URI names; None for any other filesystem."""
    if "://" not in path:
        return os.path.abspath(path)
    if path.startswith("file://"):
        return os.path.abspath(unquote(urlparse(path).path))
    return None


def file_set(collection: str, bound: int | None) -> FileSet | None:
    """What a read of `collection` as of `bound` takes, with its compaction records applied; None for a root on
    another filesystem than the local one, which is read by listing its directories (see the module docstring).

    Raises `AsOfBeforeHorizonError` when `bound` is before the compaction horizon.
    """
    local = local_dir(collection)
    if local is None:
        return None
    # Imported here: flusher.layout pulls in parts of the log's package, which spark-submit does not need
    # to import the readers.
    from flusher import layout  # noqa: PLC0415

    root, _, name = local.rpartition("/")
    data, deletes, horizon = layout.visible_files(root, name)
    layout.check_as_of(bound, horizon, name)
    return FileSet(data, deletes)


def __getattr__(name: str) -> object:
    # AsOfBeforeHorizonError lives in flusher.layout (the compactor raises it too), loaded only when asked for.
    if name == "AsOfBeforeHorizonError":
        from flusher.layout import AsOfBeforeHorizonError  # noqa: PLC0415

        return AsOfBeforeHorizonError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def filesystem(path: str) -> tuple[pafs.FileSystem, str]:
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


def resolve_primary_key(
    collection: str, explicit: str | None, data_columns: list[str], delete_columns: list[str]
) -> str:
    """The argument if given, else the data files' metadata, else the one non-system column of the deletes."""
    key = explicit
    if key is None:
        try:
            fs, inner = filesystem(collection)
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


__all__ = [
    "DELETES_DIR",
    "DROPPED_MARKER",
    "ID_COLUMN",
    "JOIN_ID",
    "JOIN_KEY",
    "JOIN_TS",
    "NO_DELETE_ID",
    "NO_ROW_ID",
    "PARTITION_COLUMN",
    "PRIMARY_KEY_METADATA",
    "SEGMENT_COLUMN",
    "SEGMENT_DIR_COLUMN",
    "TS_COLUMN",
    "AsOfBeforeHorizonError",
    "CollectionLayoutError",
    "CollectionNotFoundError",
    "DamagedFileError",
    "FileSet",
    "as_of",
    "bound_of",
    "collection_path",
    "deletes_path",
    "file_set",
    "filesystem",
    "local_dir",
    "resolve_primary_key",
]
