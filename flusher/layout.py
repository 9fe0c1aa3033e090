"""Where the flusher's files live, what they are called, and what the committed set says on start.

```
<root>/<collection>/partition=<p>/segment=<id>/<first_id>-<last_id>.parquet   rows + _ts, _id, _segment
<root>/_deletes/<collection>/<first_id>-<last_id>.parquet                     primary keys + _ts, _id
<root>/<collection>/_dropped                                                  JSON, once dropped
```

Ids are the WAL message ids of the first and last message in the file, in delivery order, zero-padded
to 20 digits so that names sort.  A compaction output adds its generation (``.g<generation>``, 20
digits) before the suffix, so that it never takes the name of an input (``file_name``).  Names
starting with ``_`` or ``.`` are hidden from Spark and Hive readers of ``<root>/<collection>``, which
is why the drop marker uses one.  Delete files live outside
the collection's directory altogether (``<root>/_deletes/``, a name collections cannot take), so that
a plain glob ``<root>/<collection>/**/*.parquet`` (DuckDB's, say) reads data files only: a delete file
there would add its keys as rows with NULL user columns.

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

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flusher.commit import fsync_dir, make_dirs
from wal.names import DELETES_DIR

DeliveryKey = tuple[int, int]
"""(visible timestamp, message id): the order in which a scanner delivers messages."""

FIRST_KEY = b"streamingnode.first_key"
LAST_KEY = b"streamingnode.last_key"
PCHANNEL = b"streamingnode.pchannel"
DROPPED_MARKER = "_dropped"
QUARANTINE_DIR = "_quarantine"
"""Under the pchannel's root: damaged files moved aside, never read by the flusher or a reader."""
SUFFIX = ".parquet"
TS_COLUMN = "_ts"


def segment_dir(collection: str, partition: str, segment: int) -> str:
    """The directory of one segment's files, relative to the root."""
    return f"{collection}/partition={partition}/segment={segment}"


def deletes_dir(collection: str) -> str:
    """The directory of one collection's delete files, relative to the root: outside the collection's
    own directory, so that no glob of data files under it can take a delete file for rows."""
    return f"{DELETES_DIR}/{collection}"


def file_name(first_id: int, last_id: int, generation: int | None = None) -> str:
    """``<first>-<last>.parquet`` for a file the flusher writes; a compaction output of ``generation``
    is ``<first>-<last>.g<generation>.parquet``: a name no flusher file and no other generation's
    output has, so an output never takes the name of an input (a pass rewriting one file keeps its
    first and last ids)."""
    if generation is None:
        return f"{first_id:020d}-{last_id:020d}{SUFFIX}"
    return f"{first_id:020d}-{last_id:020d}.g{generation:020d}{SUFFIX}"


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


def name_generation(name: str) -> int | None:
    """The compaction generation a file name states (``file_name``), or None (a flusher's file)."""
    m = _NAME.fullmatch(name)
    return None if m is None or m[3] is None else int(m[3])


_NAME = re.compile(r"(\d{20})-(\d{20})(?:\.g(\d{20}))?" + re.escape(SUFFIX))
_MAGIC = b"PAR1"
# Everything pyarrow raises for a file it cannot decode: ArrowInvalid is a ValueError, not an OSError.
_UNREADABLE = (OSError, ValueError, pa.ArrowException)


def _data_dirs(root: Path) -> list[Path]:
    out: list[Path] = []
    for coll in sorted(root.iterdir()) if root.is_dir() else []:
        if not coll.is_dir() or coll.name.startswith("."):
            continue
        if coll.name == DELETES_DIR:
            out.extend(d for d in sorted(coll.iterdir()) if d.is_dir() and not d.name.startswith("."))
            continue
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
        with os.scandir(d) as entries:  # closed even when a listing fails half-way (a ResourceWarning else)
            names = sorted(e.name for e in entries)
        files.extend(f"{rel}/{n}" for n in names if n.endswith(SUFFIX) and not n.startswith("."))
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


# --- compaction records ----------------------------------------------------------------------------
#
# ``<root>/<collection>/_compactions/<generation, 20 digits>.json`` (``flusher/compact.py`` writes them):
# ``{"generation", "horizon", "inputs", "outputs", "flushed"}``, paths relative to the root.  Outputs
# are written first under hidden names (``.`` before the file name), the record is committed, then each
# output gets its visible name (a hard link, so that the hidden name a reader may hold stays readable)
# and, after a grace period, the inputs and the hidden names are deleted.  ``flushed`` keeps, per input
# directory, the largest delivery key of its files: a restarted flusher skips those messages even once
# the directory is gone.

COMPACTIONS_DIR = "_compactions"
_RECORD = re.compile(r"(\d{20})\.json")


class AsOfBeforeHorizonError(ValueError):
    """An as-of read before the compaction horizon: versions older than it may be gone, so the read
    cannot be exact.  ``as_of`` and ``horizon`` are timeticks."""

    def __init__(self, as_of: int, horizon: int, collection: str | None = None) -> None:
        where = "" if collection is None else f" of collection {collection[:200]!r}"
        super().__init__(f"as-of timetick {as_of} is before the compaction horizon {horizon}{where}: rows deleted "
                         f"at or before the horizon were compacted away, so only reads as of {horizon} or later "
                         f"are exact")
        self.as_of = as_of
        self.horizon = horizon


@dataclass(frozen=True, slots=True)
class CompactionRecord:
    generation: int
    horizon: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    flushed: dict[str, DeliveryKey]

    def overlap(self) -> list[str]:
        """The paths listed as both input and output, sorted: never in a record this code writes
        (``check_record``); a record of older code that holds one lost the file's contents once its
        inputs were deleted (flusher/README.md, Compaction, "Repair")."""
        return sorted(set(self.inputs) & set(self.outputs))

    def to_json(self) -> bytes:
        return json.dumps({"generation": self.generation, "horizon": self.horizon, "inputs": list(self.inputs),
                           "outputs": list(self.outputs),
                           "flushed": {d: list(k) for d, k in sorted(self.flushed.items())}}, indent=1).encode()

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> CompactionRecord:
        try:
            doc = json.loads(raw)
            rec = cls(int(doc["generation"]), int(doc["horizon"]), tuple(str(p) for p in doc["inputs"]),
                      tuple(str(p) for p in doc["outputs"]),
                      {str(d): (int(k[0]), int(k[1])) for d, k in doc.get("flushed", {}).items()})
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise LayoutError(f"{where}: not a compaction record ({str(exc)[:200]})") from exc
        return rec


class OverlappingRecordError(LayoutError):
    """A compaction record lists a path as both input and output.  Readers refuse it (subtracting the
    inputs would drop the output too, and the file is deleted with the inputs once the grace period
    is over): ``collection``, ``record`` (its path) and ``paths`` name what is wrong."""

    def __init__(self, collection: str, record: str, paths: list[str]) -> None:
        super().__init__(
            f"collection {collection[:200]!r}: compaction record {record} lists {', '.join(paths)} as both input "
            f"and output: the entries of that file are lost once its inputs are deleted; a node's flusher rebuilds "
            f"them from the WAL on start (flusher/README.md, Compaction, Repair)")
        self.collection = collection
        self.record = record
        self.paths = paths


def check_record(root: Path | str, collection: str, rec: CompactionRecord) -> None:
    """Raise OverlappingRecordError when ``rec`` lists a path as both input and output."""
    both = rec.overlap()
    if both:
        raise OverlappingRecordError(collection, str(Path(root) / compactions_dir(collection) /
                                                     record_name(rec.generation)), both)


def compactions_dir(collection: str) -> str:
    """The directory of one collection's compaction records, relative to the root."""
    return f"{collection}/{COMPACTIONS_DIR}"


def record_name(generation: int) -> str:
    return f"{generation:020d}.json"


def hidden(rel: str) -> str:
    """The name a compaction output is written under before its record is committed."""
    head, _, name = rel.rpartition("/")
    return f"{head}/.{name}" if head else f".{name}"


def read_records(root: Path | str, collection: str) -> list[CompactionRecord]:
    """The committed compaction records of ``collection``, oldest first.  A record that does not parse
    raises LayoutError naming it (records are written atomically: that is damage, not a crash)."""
    d = Path(root) / compactions_dir(collection)
    try:
        with os.scandir(d) as entries:
            names = sorted(e.name for e in entries if _RECORD.fullmatch(e.name))
    except FileNotFoundError:
        return []
    out = []
    for n in names:
        with open(d / n, "rb") as f:
            out.append(CompactionRecord.from_json(f.read(), str(d / n)))
    return out


def compacted_keys(root: Path | str, collections: list[str] | None = None) -> dict[str, DeliveryKey]:
    """Per directory, the largest delivery key that compaction records say was flushed into it."""
    base = Path(root)
    if collections is None:
        collections = [c.name for c in sorted(base.iterdir()) if c.is_dir() and (c / COMPACTIONS_DIR).is_dir()] \
            if base.is_dir() else []
    out: dict[str, DeliveryKey] = {}
    for c in collections:
        for rec in read_records(base, c):
            for d, k in rec.flushed.items():
                if k > out.get(d, (-1, -1)):
                    out[d] = k
    return out


def _listed(base: Path, under: str, skip_hidden_dirs: bool) -> set[str]:
    top = base / under
    found: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(top):
        if skip_hidden_dirs:
            dirnames[:] = [n for n in dirnames if not n.startswith(("_", "."))]
        rel = Path(dirpath).relative_to(base).as_posix()
        found.update(f"{rel}/{n}" for n in filenames if n.endswith(SUFFIX) and not n.startswith(("_", ".")))
    return found


def visible_files(root: Path | str, collection: str) -> tuple[list[str], list[str], int | None]:
    """What a reader of ``collection`` reads: ``(data files, delete files, horizon)``.

    Files are absolute paths, sorted; ``horizon`` is the largest compaction horizon (None before any
    compaction): a read as of an earlier timetick must raise ``AsOfBeforeHorizonError``
    (``check_as_of``).  The set is every visible data and delete file, minus the inputs of every
    committed compaction record, plus its outputs (under the visible name, or the hidden one while it
    is not yet linked).  A record listing a path as both input and output raises
    OverlappingRecordError: its set cannot be read right.  The files are listed before the records
    are read: a compaction that commits in between is then seen whole (its inputs, still present
    during the grace period, are subtracted), never half.
    """
    base = Path(root)
    data = _listed(base, collection, skip_hidden_dirs=True)
    deletes = _listed(base, deletes_dir(collection), skip_hidden_dirs=False)
    records = read_records(base, collection)
    for r in records:
        check_record(base, collection, r)
    consumed = {p for r in records for p in r.inputs}
    prefix = deletes_dir(collection) + "/"
    for r in records:
        for out in r.outputs:
            if out in consumed:
                continue  # compacted again by a later record (an output of one, an input of the next)
            # The hidden name stays until the grace period after the visible one was linked.
            if (base / out).exists():
                chosen = out
            elif (base / hidden(out)).exists():
                chosen = hidden(out)
            else:
                raise LayoutError(f"{base / out}: an output of compaction record {r.generation} of "
                                  f"{collection!r} is missing under both its names")
            (deletes if out.startswith(prefix) else data).add(chosen)
    data -= consumed
    deletes -= consumed
    horizon = max((r.horizon for r in records), default=None)
    return sorted(str(base / p) for p in data), sorted(str(base / p) for p in deletes), horizon


def check_as_of(as_of: int | None, horizon: int | None, collection: str | None = None) -> None:
    """Raise AsOfBeforeHorizonError when a read as of ``as_of`` (None: no bound) is before ``horizon``."""
    if as_of is not None and horizon is not None and as_of < horizon:
        raise AsOfBeforeHorizonError(as_of, horizon, collection)


__all__ = [
    "COMPACTIONS_DIR",
    "DELETES_DIR",
    "DROPPED_MARKER",
    "FIRST_KEY",
    "LAST_KEY",
    "QUARANTINE_DIR",
    "AsOfBeforeHorizonError",
    "Committed",
    "CompactionRecord",
    "Damaged",
    "DamagedFileError",
    "DeliveryKey",
    "LayoutError",
    "OverlappingRecordError",
    "check_as_of",
    "check_data",
    "check_record",
    "committed_files",
    "compacted_keys",
    "compactions_dir",
    "deletes_dir",
    "file_name",
    "hidden",
    "name_generation",
    "parse_name",
    "quarantine",
    "read_keys",
    "read_records",
    "record_name",
    "segment_dir",
    "visible_files",
]
