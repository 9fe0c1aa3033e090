"""Where the flusher's files live, what they are called, and what the committed set says on start.

```
<root>/<collection>/partition=<p>/segment=<id>/<first_id>-<last_id>.parquet   rows + _ts, _segment
<root>/<collection>/_deletes/<first_id>-<last_id>.parquet                     primary keys + _ts
<root>/<collection>/_dropped                                                  JSON, once dropped
```

Ids are the WAL message ids of the first and last message in the file, in delivery order, zero-padded
to 20 digits so that names sort.  Names starting with ``_`` or ``.`` are hidden from Spark and Hive
readers of ``<root>/<collection>``, which is why deletes and the drop marker use them.

Every data file carries, in its Parquet key-value metadata, the *delivery key* ``(ts, id)`` of its
first and last message: ``ts`` is the timestamp the message became visible (a transaction body's
commit timestamp) and ``id`` its message id.  Scanners deliver messages in increasing delivery-key
order, whereas message ids alone are not increasing within a segment (a transaction's bodies are
older by id than the rows written while it was open, yet delivered after them).  On start the
flusher reads, per output directory, the largest last key of its files (``read_keys``): every message
at or below it is in a committed file.

A file that fails a check (``read_keys`` on its footer, ``check_data`` on its pages) is damaged: it
is moved to ``<root>/_quarantine/`` (``quarantine``) and never read again by the flusher or a reader.
The checks run in a child process (``flusher._probe``): pyarrow aborts the process on some damage.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flusher.commit import fsync_dir, make_dirs

DeliveryKey = tuple[int, int]
"""(visible timestamp, message id): the order in which a scanner delivers messages."""

FIRST_KEY = b"streamingnode.first_key"
LAST_KEY = b"streamingnode.last_key"
PCHANNEL = b"streamingnode.pchannel"
DELETES_DIR = "_deletes"
DROPPED_MARKER = "_dropped"
QUARANTINE_DIR = "_quarantine"
"""Under the pchannel's root: damaged files moved aside, never read by the flusher or a reader."""
SUFFIX = ".parquet"
TS_COLUMN = "_ts"


def segment_dir(collection: str, partition: str, segment: int) -> str:
    """The directory of one segment's files, relative to the root."""
    return f"{collection}/partition={partition}/segment={segment}"


def deletes_dir(collection: str) -> str:
    """The directory of one collection's delete files, relative to the root."""
    return f"{collection}/{DELETES_DIR}"


def file_name(first_id: int, last_id: int) -> str:
    return f"{first_id:020d}-{last_id:020d}{SUFFIX}"


def encode_key(key: DeliveryKey) -> bytes:
    return f"{key[0]}:{key[1]}".encode()


def decode_key(raw: bytes) -> DeliveryKey:
    ts, _, mid = raw.decode().partition(":")
    return int(ts), int(mid)


class LayoutError(Exception):
    """A file in the output tree that the flusher did not write (or that lost its metadata)."""


class DamagedFileError(LayoutError):
    """A committed Parquet file that cannot be trusted: ``path`` names it, ``reason`` says why."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Damaged:
    """A damaged file found under the root, before it is moved aside."""

    rel: str
    """Its path relative to the root (``<directory>/<name>``)."""
    reason: str

    @property
    def directory(self) -> str:
        return self.rel.rpartition("/")[0]

    @property
    def name(self) -> str:
        return self.rel.rpartition("/")[2]


@dataclass(slots=True)
class Committed:
    """What the footers of the committed files say (``flusher._probe.scan``)."""

    flushed: dict[str, DeliveryKey]
    """Per directory, the largest last delivery key of its sound files."""
    damaged: list[Damaged]
    files: list[str]
    """The sound files (relative paths): their footers are fine, their data is not read yet."""


def parse_name(name: str) -> tuple[int, int] | None:
    """The (first id, last id) a file name states, or None when it is not ``file_name``'s form."""
    m = _NAME.fullmatch(name)
    return None if m is None else (int(m[1]), int(m[2]))


_NAME = re.compile(r"(\d{20})-(\d{20})" + re.escape(SUFFIX))
_MAGIC = b"PAR1"
# Everything pyarrow raises for a file it cannot decode: ArrowInvalid is a ValueError, not an OSError.
_UNREADABLE = (OSError, ValueError, pa.ArrowException)


def _data_dirs(root: Path) -> list[Path]:
    out: list[Path] = []
    for coll in sorted(root.iterdir()) if root.is_dir() else []:
        if not coll.is_dir() or coll.name.startswith("."):
            continue
        deletes = coll / DELETES_DIR
        if deletes.is_dir():
            out.append(deletes)
        for part in sorted(coll.glob("partition=*")):
            out.extend(seg for seg in sorted(part.glob("segment=*")) if seg.is_dir())
    return out


def read_keys(path: str, pchannel: str | None = None) -> tuple[DeliveryKey, DeliveryKey]:
    """The first and last delivery keys of a committed file, read from its footer after checking
    what can be checked without reading the data: both magics, the footer, the delivery-key
    metadata against the ids in the file's name, the pchannel, and that every column chunk lies
    inside the file.  Raises DamagedFileError naming the file."""
    ids = parse_name(os.path.basename(path))
    if ids is None:
        raise DamagedFileError(path, "the name is not <first id>-<last id>.parquet: not a file the flusher wrote")
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(len(_MAGIC))
        meta = pq.read_metadata(path)
    except _UNREADABLE as exc:
        raise DamagedFileError(path, f"unreadable Parquet footer: {str(exc)[:200]}") from exc
    if head != _MAGIC:
        raise DamagedFileError(path, f"bad magic at the start: {head!r}")
    kv = meta.metadata or {}
    try:
        first, last = decode_key(kv[FIRST_KEY]), decode_key(kv[LAST_KEY])
    except (KeyError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise DamagedFileError(path, f"no readable delivery-key metadata ({exc!r:.100})") from exc
    if (first[1], last[1]) != ids:
        raise DamagedFileError(path, f"its metadata says ids {first[1]}..{last[1]}, its name {ids[0]}..{ids[1]}")
    if first > last:
        raise DamagedFileError(path, f"its first delivery key {first} is after its last {last}")
    if pchannel is not None and kv.get(PCHANNEL) != pchannel.encode():
        raise DamagedFileError(path, f"its metadata names pchannel {kv.get(PCHANNEL)!r:.100}, not {pchannel!r}")
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        for c in range(rg.num_columns):
            col = rg.column(c)
            start = min(o for o in (col.dictionary_page_offset, col.data_page_offset) if o is not None)
            if start + col.total_compressed_size > size:
                raise DamagedFileError(path, f"column chunk {c} of row group {i} ends past the end of the "
                                             f"file ({size} bytes): truncated")
            stats = col.statistics
            if col.path_in_schema == TS_COLUMN and stats is not None and stats.has_min_max and not (
                    first[0] <= stats.min and stats.max <= last[0]):
                # Every row's _ts is its message's visible ts, between the first and the last key's.
                raise DamagedFileError(path, f"its rows' {TS_COLUMN} {stats.min}..{stats.max} lie outside its "
                                             f"delivery keys' {first[0]}..{last[0]}")
    return first, last


def check_data(path: str) -> None:
    """Read every row group of a committed file, verifying page checksums (the flusher writes
    them) and the integer columns' min/max statistics against the values; raises DamagedFileError."""
    try:
        pf = pq.ParquetFile(path, page_checksum_verification=True)
    except _UNREADABLE as exc:
        raise DamagedFileError(path, f"unreadable Parquet footer: {str(exc)[:200]}") from exc
    try:
        meta = pf.metadata
        for i in range(meta.num_row_groups):
            rg = meta.row_group(i)
            table = pf.read_row_group(i)
            if table.num_rows != rg.num_rows:
                raise DamagedFileError(path, f"row group {i} holds {table.num_rows} rows, its footer {rg.num_rows}")
            for c in range(rg.num_columns):
                _check_stats(path, i, rg.column(c), table)
    except _UNREADABLE as exc:
        raise DamagedFileError(path, f"unreadable Parquet data: {str(exc)[:200]}") from exc
    finally:
        pf.close()


def _check_stats(path: str, group: int, col: pq.ColumnChunkMetaData, table: pa.Table) -> None:
    # Readers skip row groups by these (``_ts <= as_of``): a damaged bound would hide rows silently.
    stats = col.statistics
    name = col.path_in_schema
    if stats is None or not stats.has_min_max or name not in table.column_names:
        return
    column = table.column(name)
    if not pa.types.is_integer(column.type) or column.null_count == len(column):
        return
    found = pc.min_max(column)
    if (found["min"].as_py(), found["max"].as_py()) != (stats.min, stats.max):
        raise DamagedFileError(path, f"row group {group}: the statistics of {name!r} say {stats.min}..{stats.max}, "
                                     f"its values {found['min'].as_py()}..{found['max'].as_py()}")


def committed_files(root: Path) -> list[str]:
    """The committed files under ``root`` (relative paths, temporaries skipped), without opening any."""
    files: list[str] = []
    for d in _data_dirs(root):
        rel = d.relative_to(root).as_posix()
        files.extend(f"{rel}/{e.name}" for e in sorted(os.scandir(d), key=lambda e: e.name)
                     if e.name.endswith(SUFFIX) and not e.name.startswith("."))
    return files


def quarantine(root: Path, rel: str) -> Path:
    """Move ``root/rel`` to ``root/_quarantine/``, named after its relative path (``/`` becomes
    ``+``, which no collection or partition name holds) and, when that name is taken by an earlier
    one, suffixed ``.1``, ``.2``...  Never overwrites; returns the new path."""
    source = root / rel
    target_dir = root / QUARANTINE_DIR
    make_dirs(target_dir)
    flat = rel.replace("/", "+")
    n = 0
    while True:
        target = target_dir / (flat if n == 0 else f"{flat}.{n}")
        try:
            os.link(source, target)  # fails if the name is taken: an earlier file is never replaced
        except FileExistsError:
            n += 1
            continue
        break
    fsync_dir(target_dir)
    os.unlink(source)  # a crash before this leaves the file in both places: found and moved again
    fsync_dir(source.parent)
    return target


__all__ = [
    "DELETES_DIR",
    "DROPPED_MARKER",
    "FIRST_KEY",
    "LAST_KEY",
    "QUARANTINE_DIR",
    "Committed",
    "Damaged",
    "DamagedFileError",
    "DeliveryKey",
    "LayoutError",
    "check_data",
    "committed_files",
    "deletes_dir",
    "file_name",
    "parse_name",
    "quarantine",
    "read_keys",
    "segment_dir",
]
