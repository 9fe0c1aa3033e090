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
older by id than the rows written while it was open, yet delivered after them).  ``scan_committed``
returns, per output directory, the largest last key of its files: every message at or below it is in
a committed file.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.parquet as pq

DeliveryKey = tuple[int, int]
"""(visible timestamp, message id): the order in which a scanner delivers messages."""

FIRST_KEY = b"streamingnode.first_key"
LAST_KEY = b"streamingnode.last_key"
PCHANNEL = b"streamingnode.pchannel"
DELETES_DIR = "_deletes"
DROPPED_MARKER = "_dropped"
SUFFIX = ".parquet"


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


def scan_committed(root: Path) -> dict[str, DeliveryKey]:
    """Per directory (relative to ``root``, as ``segment_dir``/``deletes_dir`` name it): the largest
    delivery key in a committed file.  Reads only Parquet footers."""
    flushed: dict[str, DeliveryKey] = {}
    for d in _data_dirs(root):
        rel = d.relative_to(root).as_posix()
        for entry in os.scandir(d):
            if entry.name.startswith(".") or not entry.name.endswith(SUFFIX):
                continue
            try:
                meta = pq.read_metadata(entry.path).metadata or {}
            except OSError as exc:  # pyarrow raises ArrowInvalid (an OSError) for a damaged footer
                raise LayoutError(f"{entry.path} is not a readable Parquet file: {exc}") from exc
            raw = meta.get(LAST_KEY)
            if raw is None:
                raise LayoutError(f"{entry.path} has no {LAST_KEY.decode()!r} metadata: not written by the flusher")
            key = decode_key(raw)
            if rel not in flushed or key > flushed[rel]:
                flushed[rel] = key
    return flushed


__all__ = [
    "DELETES_DIR",
    "DROPPED_MARKER",
    "FIRST_KEY",
    "LAST_KEY",
    "DeliveryKey",
    "LayoutError",
    "deletes_dir",
    "file_name",
    "scan_committed",
    "segment_dir",
]
