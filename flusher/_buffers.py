"""In-memory buffers of rows (one per segment directory) and deletes (one per collection), and the
Arrow table each becomes in a file.

A buffer holds the decoded record batches exactly as they came out of the messages (zero-copy views
of the payloads) plus one timestamp per batch; the system columns are built only when the file is
written.  Its size is counted as the payload bytes it keeps alive, which is what the memory cap is
about.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from flusher.layout import FIRST_KEY, LAST_KEY, PCHANNEL, TS_COLUMN, DeliveryKey, encode_key, segment_dir
from wal import bodies, columns
from wal.clock import physical_ms
from wal.message import Message, Position

PRIMARY_KEY = b"streamingnode.primary_key"
"""The key the readers look up (``flusher.read.plan.PRIMARY_KEY_METADATA``)."""
SEGMENT_COLUMN = "_segment"
ID_COLUMN = "_id"
"""The WAL message id of the INSERT, UPSERT or DELETE a row or delete entry came from: with ``_ts`` it
orders the statements of one transaction (which share their commit ``_ts``); see ``flusher.read.plan``."""


@dataclass(slots=True, eq=False)
class Buffer:
    """Rows waiting for one output directory (a segment's, or a collection's ``_deletes``)."""

    directory: str
    """Relative to the root (``_layout.segment_dir`` / ``deletes_dir``)."""
    collection: str
    schema: pa.Schema
    """The user columns of the file (for deletes: the primary key field)."""
    segment: int | None
    """None for a delete buffer."""
    resume: Position
    """Where a reader must resume to get this buffer's first message again (its pack's start)."""
    born_ms: int = 0
    """Physical time (ms) of its first row's timestamp: the age limit counts from when the data was
    written, not from when this process buffered it, so a restart does not restart the clock."""
    vchannels: set[str] = field(default_factory=set)
    batches: list[pa.RecordBatch] = field(default_factory=list)
    stamps: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    """One message id per batch, beside its timestamp."""
    rows: int = 0
    nbytes: int = 0
    first_id: int = -1
    last_id: int = -1
    first_key: DeliveryKey = (0, 0)
    last_key: DeliveryKey = (0, 0)
    late: bool = False
    """Rows for a segment whose FLUSH was already seen (a transaction committed after the seal)."""
    primary_key: str = ""
    """Written into every file's metadata, so readers apply deletes without being told the key."""

    def add(self, batch: pa.RecordBatch, ts: int, key: DeliveryKey, vchannel: str, size: int) -> None:
        if not self.batches:
            self.first_id = key[1]
            self.first_key = key
            self.born_ms = physical_ms(ts)
        self.batches.append(batch)
        self.stamps.append(ts)
        self.ids.append(key[1])
        self.rows += batch.num_rows
        self.nbytes += size
        self.last_id = key[1]
        self.last_key = key
        self.vchannels.add(vchannel)

    def to_table(self, pchannel: str) -> pa.Table:
        """The file's content: user columns conformed to the schema, then ``_ts``, ``_id`` (and ``_segment``)."""
        fields = [parquet_field(f) for f in self.schema]
        fields.append(pa.field(TS_COLUMN, pa.int64(), nullable=False))
        fields.append(pa.field(ID_COLUMN, pa.int64(), nullable=False))
        if self.segment is not None:
            fields.append(pa.field(SEGMENT_COLUMN, pa.int64(), nullable=False))
        out_schema = pa.schema(fields, metadata={
            FIRST_KEY: encode_key(self.first_key),
            LAST_KEY: encode_key(self.last_key),
            PCHANNEL: pchannel.encode(),
            PRIMARY_KEY: self.primary_key.encode(),
        })
        out = []
        for batch, ts, mid in zip(self.batches, self.stamps, self.ids, strict=True):
            n = batch.num_rows
            arrays = [_to_parquet(_conform(batch.column(i), f.type), f) for i, f in enumerate(self.schema)]
            arrays.append(_constant(ts, n))
            arrays.append(_constant(mid, n))
            if self.segment is not None:
                arrays.append(_constant(self.segment, n))
            out.append(pa.RecordBatch.from_arrays(arrays, schema=out_schema))
        return pa.Table.from_batches(out, out_schema)


def insert_destination(m: Message, collection: str) -> tuple[str, int]:
    """The directory (and segment) the rows of an INSERT or UPSERT of ``collection`` go to."""
    segment = bodies.read_segment(m)
    partition = m.properties.get(bodies.PROP_PARTITION, bodies.DEFAULT_PARTITION)
    return segment_dir(collection, partition, segment), segment


def delete_rows(m: Message, schema: pa.Schema, primary_key: str) -> tuple[pa.Schema, pa.RecordBatch]:
    """A DELETE's keys as a delete buffer's schema and batch (the primary key column of ``schema``)."""
    pk = schema.field(primary_key)
    return pa.schema([pk]), pa.RecordBatch.from_arrays([bodies.read_delete(m)], names=[pk.name])


def upsert_delete_rows(rows: pa.RecordBatch, schema: pa.Schema, primary_key: str) -> tuple[pa.Schema, pa.RecordBatch]:
    """An UPSERT's delete entries (the key of each of its ``rows``) as a delete buffer's schema and batch.

    Written at the UPSERT's own ``(ts, id)``, like its rows: the delete then removes every older
    version of the keys and none of the rows it came with."""
    pk = schema.field(primary_key)
    return pa.schema([pk]), pa.RecordBatch.from_arrays([rows.column(primary_key)], names=[pk.name])


def _conform(array: pa.Array, t: pa.DataType) -> pa.Array:
    # Inserts may differ from the schema only where RowCheck allows it (a vector's child name,
    # string vs large_string delete keys); a cast makes every batch of one file the same type.
    return array if array.type == t else array.cast(t)


FLOAT16 = b"float16"
"""The ``columns.VECTOR_METADATA`` value on a float32 vector in a Parquet file that a float16 vector was
widened to (a bfloat16 one carries ``columns.BFLOAT16``, its value in a schema too)."""


def parquet_field(f: pa.Field) -> pa.Field:
    """The field a schema's field becomes in a Parquet file: itself, except for float16 and bfloat16
    vectors, widened to float32 vectors (exactly: every 16-bit value is a float32) named by field
    metadata, because Spark cannot read Parquet FLOAT16 (it fails on the whole file) and nothing
    reads bfloat16 bytes as numbers.  Timestamps stay as they are; the writer stores them as
    microseconds (``coerce_timestamps="us"``)."""
    if columns.is_float16_vector(f.type):
        kind = FLOAT16
    elif columns.is_bfloat16_vector(f):
        kind = columns.BFLOAT16
    else:
        return f
    dim = f.type.list_size if kind == FLOAT16 else f.type.byte_width // 2
    metadata = {**(f.metadata or {}), columns.VECTOR_METADATA: kind}
    return pa.field(f.name, pa.list_(pa.float32(), dim), f.nullable, metadata)


def _to_parquet(array: pa.Array, f: pa.Field) -> pa.Array:
    if columns.is_float16_vector(f.type):
        return array.cast(pa.list_(pa.float32(), f.type.list_size))
    if columns.is_bfloat16_vector(f):
        return _widen_bfloat16(array, f.type.byte_width // 2)
    return array


def _widen_bfloat16(array: pa.FixedSizeBinaryArray, dim: int) -> pa.FixedSizeListArray:
    # A bfloat16 is the high half of a float32: each little-endian 16-bit value shifted left by 16
    # is the float32's bit pattern.  Done on the buffers, in C++ (no numpy here).
    n = len(array)
    halves = pa.Array.from_buffers(
        pa.uint16(), n * dim, [None, array.buffers()[1]], offset=array.offset * dim)
    bits = pc.shift_left(halves.cast(pa.uint32()), pa.scalar(16, pa.uint32()))  # a plain 16 widens to int64
    floats = pa.Array.from_buffers(pa.float32(), n * dim, [None, bits.buffers()[1]], offset=bits.offset)
    return pa.FixedSizeListArray.from_arrays(floats, dim, mask=array.is_null() if array.null_count else None)


def _constant(value: int, n: int) -> pa.Array:
    # Built in C++ (no numpy here): an all-null int64 array filled with the value.
    return pa.nulls(n, pa.int64()).fill_null(value)


__all__ = ["ID_COLUMN", "SEGMENT_COLUMN", "TS_COLUMN", "Buffer", "delete_rows", "insert_destination",
           "upsert_delete_rows"]
