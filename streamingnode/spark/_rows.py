"""Messages to Arrow record batches shaped exactly as Spark expects (``to_arrow_schema`` of the source's
schema, which the Python data source checks batch by batch).

Plain mode: one row per data message: ``id``, ``vchannel``, ``type`` (the MessageType name, lower case),
``timetick`` (when it became visible: a transaction body's is its commit's), ``time`` (the physical
part of ``timetick`` as a UTC timestamp), ``properties`` and ``payload``.

Collection mode: the collection's own columns, decoded from the INSERT / UPSERT / DELETE bodies, plus
``_ts`` (visible timetick, as ``_ts`` in the flusher's files), ``_id`` (the message id: with ``_ts`` it
orders statements, as the flusher's row rule does), ``_op`` (``insert`` or ``delete``; a delete row
carries only the primary key) and ``_txn`` (the transaction id, null outside one).  An UPSERT becomes
the delete of its keys followed by the insert of its rows, at one ``(_ts, _id)``: replaying the rows in
order keeps a table equal to what ``read_collection`` returns at the same timetick.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from flusher._buffers import _to_parquet, parquet_field
from wal import bodies, clock, columns
from wal.message import Message, MessageType

BATCH_ROWS = 8192
PLAIN_SCHEMA = ("id long, vchannel string, type string, timetick long, time timestamp, "
                "properties map<string,string>, payload binary")
SYSTEM_COLUMNS = ("_ts", "_id", "_op", "_txn")
OP_INSERT = "insert"
OP_DELETE = "delete"
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def plain_batches(messages: Iterable[tuple[Message, int]], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    chunk: list[tuple[Message, int]] = []
    for item in messages:
        chunk.append(item)
        if len(chunk) >= BATCH_ROWS:
            yield _plain(chunk, schema)
            chunk = []
    if chunk:
        yield _plain(chunk, schema)


_TYPE_NAMES = {t: t.name.lower() for t in MessageType}


def _plain(chunk: list[tuple[Message, int]], schema: pa.Schema) -> pa.RecordBatch:
    # Column by column over the chunk, and ``time`` computed by Arrow from ``timetick``: the
    # executor's read runs at about twice the rate of building the rows message by message.
    ms = [m for m, _ in chunk]
    visible = pa.array([v for _, v in chunk], pa.int64())
    ms_since_epoch = pc.shift_right(visible, clock.LOGICAL_BITS)
    arrays = [
        pa.array([m.message_id for m in ms], pa.int64()),
        pa.array([m.vchannel for m in ms], pa.string()),
        pa.array([_TYPE_NAMES[m.message_type] for m in ms], pa.string()),
        visible,
        pc.multiply(ms_since_epoch, 1000).cast(schema.field("time").type),
        pa.array([list(m.properties.items()) for m in ms], schema.field("properties").type),
        pa.array([m.payload for m in ms], pa.binary()),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _spark_ready(t: pa.DataType) -> pa.DataType:
    """The Arrow type a collection column is given to Spark as (Spark has no fixed-size lists,
    unsigned ints, float16 or extension types)."""
    if columns.is_json(t):
        return pa.string()
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return pa.binary()
    if pa.types.is_fixed_size_list(t) or pa.types.is_list(t):
        return pa.list_(_spark_ready(t.value_type))
    if pa.types.is_map(t):
        return pa.map_(pa.int64() if pa.types.is_unsigned_integer(t.key_type) else t.key_type,
                       _spark_ready(t.item_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(t.field(i).name, _spark_ready(t.field(i).type)) for i in range(t.num_fields)])
    return t


def spark_arrow_field(f: pa.Field) -> pa.Field:
    """``f`` as it is handed to Spark: 16-bit vectors widened as the flusher does, nullable (a delete
    row has only its key)."""
    return pa.field(f.name, _spark_ready(parquet_field(f).type), True)


def collection_spark_schema(schema: pa.Schema) -> Any:
    """The Spark ``StructType`` of collection mode for a collection of ``schema``."""
    from pyspark.sql.pandas.types import from_arrow_type  # noqa: PLC0415  (pyspark on the driver only)
    from pyspark.sql.types import LongType, StringType, StructField, StructType  # noqa: PLC0415

    fields = [StructField(f.name, from_arrow_type(spark_arrow_field(f).type, prefer_timestamp_ntz=True), True)
              for f in schema]
    fields += [StructField("_ts", LongType(), False), StructField("_id", LongType(), False),
               StructField("_op", StringType(), False), StructField("_txn", LongType(), True)]
    return StructType(fields)


class CollectionDecoder:
    """Turns the messages of one collection into Spark-shaped batches (see the module docstring)."""

    def __init__(self, collection: str, schema: pa.Schema, primary_key: str, out: pa.Schema) -> None:
        self._collection = collection
        self._schema = schema
        self._pk = primary_key
        self._out = out

    def batches(self, messages: Iterable[tuple[Message, int]]) -> Iterator[pa.RecordBatch]:
        pending: list[pa.RecordBatch] = []
        rows = 0
        for m, visible in messages:
            if m.properties.get(bodies.PROP_COLLECTION) != self._collection:
                continue
            for b in self._decode(m, visible):
                pending.append(b)
                rows += b.num_rows
            if rows >= BATCH_ROWS:
                yield from pa.Table.from_batches(pending, self._out).combine_chunks().to_batches()
                pending, rows = [], 0
        if pending:
            yield from pa.Table.from_batches(pending, self._out).combine_chunks().to_batches()

    def _decode(self, m: Message, visible: int) -> Iterator[pa.RecordBatch]:
        kind = m.message_type
        if kind is MessageType.DELETE:
            yield self._deletes(bodies.read_delete(m), m, visible)
        elif kind in bodies.ROW_TYPES:
            rows = bodies.read_rows(m)
            if kind is MessageType.UPSERT:
                yield self._deletes(rows.column(self._pk), m, visible)
            yield self._inserts(rows, m, visible)

    def _system(self, n: int, m: Message, visible: int, op: str) -> list[pa.Array]:
        txn = m.txn
        return [pa.array([visible] * n, pa.int64()), pa.array([m.message_id] * n, pa.int64()),
                pa.array([op] * n, pa.string()), pa.array([None if txn is None else txn.txn_id] * n, pa.int64())]

    def _inserts(self, rows: pa.RecordBatch, m: Message, visible: int) -> pa.RecordBatch:
        arrays = []
        for f, out in zip(self._schema, self._out, strict=False):
            column = rows.column(f.name) if f.name in rows.schema.names else pa.nulls(rows.num_rows, f.type)
            arrays.append(_cast(_to_parquet(column, f), out.type))
        return pa.RecordBatch.from_arrays(arrays + self._system(rows.num_rows, m, visible, OP_INSERT),
                                          schema=self._out)

    def _deletes(self, keys: pa.Array, m: Message, visible: int) -> pa.RecordBatch:
        n = len(keys)
        arrays = [_cast(keys, out.type) if f.name == self._pk else pa.nulls(n, out.type)
                  for f, out in zip(self._schema, self._out, strict=False)]
        return pa.RecordBatch.from_arrays(arrays + self._system(n, m, visible, OP_DELETE), schema=self._out)


def _cast(array: pa.Array, t: pa.DataType) -> pa.Array:
    if isinstance(array.type, pa.ExtensionType):
        array = array.storage
    return array if array.type == t else array.cast(t)


__all__ = ["OP_DELETE", "OP_INSERT", "PLAIN_SCHEMA", "SYSTEM_COLUMNS", "CollectionDecoder",
           "collection_spark_schema", "plain_batches", "spark_arrow_field"]
