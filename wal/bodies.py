"""Message bodies for DDL and DML: Arrow IPC payloads plus string properties.

The formats are language-neutral — any Arrow implementation can build and read them — and the gRPC
contract carries payload and properties unchanged.

| type              | payload                                         | properties                          |
|-------------------|-------------------------------------------------|-------------------------------------|
| CREATE_COLLECTION | Arrow IPC schema (``Schema.serialize()``)       | collection, primary_key             |
| DROP_COLLECTION   | empty                                           | collection                          |
| CREATE_PARTITION  | empty                                           | collection, partition               |
| DROP_PARTITION    | empty                                           | collection, partition               |
| INSERT            | Arrow IPC stream of record batches (the rows)   | collection, partition (+ segment,   |
|                   |                                                 | rows: stamped by the shard step)    |
| DELETE            | Arrow IPC stream, one column ``pk``             | collection                          |
| UPSERT            | as INSERT; no primary key twice                 | as INSERT                           |
| MANUAL_FLUSH      | empty                                           | collection (optional)               |
| FLUSH             | empty                                           | collection, partition, segment,     |
|                   |                                                 | reason                              |

Column types, and the values rows may hold: ``wal.columns`` (the column contract).

Collection and partition names become directory names in the flusher's output, so they are limited
to letters, digits, ``_`` and ``-`` (not first), at most 255 characters.  Columns ``_ts``, ``_id``
and ``_segment`` are reserved for the flusher's system columns.

An UPSERT replaces: for each of its rows, every older version of the row's primary key is deleted
and the row inserted, in one message (one atomic step, one timetick).  The flusher writes it as a
delete entry of the key plus the row, both stamped with the message's ``(ts, id)`` (see
``flusher.read.plan``, "the row rule").  An INSERT of an existing key adds a second version instead.

Builders raise ``InvalidArgumentError`` for bad arguments; parsers raise only ``CodecError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from wal import names
from wal.columns import DELETE_COLUMN, validate_schema
from wal.errors import CodecError, InvalidArgumentError
from wal.message import Message, MessageType

PROP_COLLECTION = "collection"
PROP_PARTITION = "partition"
PROP_SEGMENT = "segment"
PROP_PRIMARY_KEY = "primary_key"
PROP_REASON = "reason"
"""Why a FLUSH sealed its segment: one of the ``SEAL_*`` values (or a caller's own word)."""
PROP_ROWS = "rows"
"""Row count of an INSERT, stamped by the shard step so that replay need not decode the rows."""

DEFAULT_PARTITION = "_default"
"""Every collection is created with this partition; it cannot be dropped."""
ROW_TYPES = frozenset({MessageType.INSERT, MessageType.UPSERT})
"""Message types whose body is rows (stamped with a segment by the shard step)."""

SEAL_ROWS = "rows"
SEAL_BYTES = "bytes"
SEAL_AGE = "age"
SEAL_MANUAL = "manual"
SEAL_DROP = "drop"



# --- validation -------------------------------------------------------------------------------------
def validate_name(kind: str, name: object) -> str:
    """Check a collection or partition name (``kind`` says which); returns it.  The rules are
    ``wal.names.COLLECTION`` and ``wal.names.PARTITION``."""
    return (names.PARTITION if kind == "partition" else names.COLLECTION).check(name)


# --- builders ---------------------------------------------------------------------------------------
def _ipc_stream(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def create_collection(vchannel: str, name: str, schema: pa.Schema, primary_key: str) -> Message:
    """CREATE_COLLECTION of ``name`` with ``schema``; the collection starts with the default partition."""
    validate_name("collection", name)
    validate_schema(schema, primary_key, collection=name)
    return Message(MessageType.CREATE_COLLECTION, vchannel, bytes(schema.serialize().to_pybytes()),
                   {PROP_COLLECTION: name, PROP_PRIMARY_KEY: primary_key})


def drop_collection(vchannel: str, name: str) -> Message:
    """DROP_COLLECTION of ``name`` (its growing segments are sealed first, by the shard step)."""
    return Message(MessageType.DROP_COLLECTION, vchannel, b"", {PROP_COLLECTION: validate_name("collection", name)})


def create_partition(vchannel: str, collection: str, partition: str) -> Message:
    """CREATE_PARTITION ``partition`` in ``collection``."""
    return Message(MessageType.CREATE_PARTITION, vchannel, b"", {
        PROP_COLLECTION: validate_name("collection", collection),
        PROP_PARTITION: validate_name("partition", partition),
    })


def drop_partition(vchannel: str, collection: str, partition: str) -> Message:
    """DROP_PARTITION ``partition`` of ``collection`` (never the default partition)."""
    return Message(MessageType.DROP_PARTITION, vchannel, b"", {
        PROP_COLLECTION: validate_name("collection", collection),
        PROP_PARTITION: validate_name("partition", partition),
    })


def insert(vchannel: str, collection: str, batch: pa.RecordBatch | pa.Table,
           partition: str = DEFAULT_PARTITION) -> Message:
    """INSERT the rows of ``batch`` (a table is combined into one record batch) into ``partition``."""
    validate_name("collection", collection)
    validate_name("partition", partition)
    if isinstance(batch, pa.Table):
        batch = _one_batch(batch)
    elif not isinstance(batch, pa.RecordBatch):
        raise InvalidArgumentError(f"insert needs a RecordBatch or Table, got {type(batch).__name__}")
    if batch.num_rows == 0:
        raise InvalidArgumentError(f"insert into {collection!r} has no rows", collection=collection)
    return Message(MessageType.INSERT, vchannel, _ipc_stream(batch),
                   {PROP_COLLECTION: collection, PROP_PARTITION: partition})


def upsert(vchannel: str, collection: str, batch: pa.RecordBatch | pa.Table,
           partition: str = DEFAULT_PARTITION) -> Message:
    """UPSERT the rows of ``batch`` into ``partition``: each replaces the older versions of its key
    (in any partition of the collection).  The node refuses a batch that holds a key twice."""
    m = insert(vchannel, collection, batch, partition)
    return Message(MessageType.UPSERT, vchannel, m.payload, dict(m.properties))


def delete(vchannel: str, collection: str, keys: pa.Array | pa.ChunkedArray | Sequence[Any]) -> Message:
    """DELETE the rows of ``collection`` whose primary key is in ``keys``."""
    validate_name("collection", collection)
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    elif not isinstance(keys, pa.Array):
        try:
            keys = pa.array(list(keys))
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"delete keys of {collection!r} are not one Arrow type: {exc}",
                                       collection=collection) from exc
    if len(keys) == 0:
        raise InvalidArgumentError(f"a delete needs keys (collection {collection!r})", collection=collection)
    batch = pa.RecordBatch.from_arrays([keys], names=[DELETE_COLUMN])
    return Message(MessageType.DELETE, vchannel, _ipc_stream(batch), {PROP_COLLECTION: collection})


def manual_flush(vchannel: str, collection: str | None = None) -> Message:
    """MANUAL_FLUSH: seal every growing segment of ``vchannel`` (of one collection if given).

    An empty (broadcast) vchannel flushes every vchannel of the pchannel.
    """
    props = {} if collection is None else {PROP_COLLECTION: validate_name("collection", collection)}
    return Message(MessageType.MANUAL_FLUSH, vchannel, b"", props)


def flush_segment(vchannel: str, collection: str, partition: str, segment_id: int, reason: str) -> Message:
    """FLUSH: segment ``segment_id`` is sealed (takes no more rows) and may be written out."""
    return Message(MessageType.FLUSH, vchannel, b"", {
        PROP_COLLECTION: collection,
        PROP_PARTITION: partition,
        PROP_SEGMENT: str(segment_id),
        PROP_REASON: reason,
    })


# --- parsers ----------------------------------------------------------------------------------------
def _expect(msg: Message, kind: MessageType) -> None:
    if msg.message_type is not kind:
        raise CodecError(f"expected a {kind.name} message, got {msg.message_type.name}",
                         message_type=msg.message_type.name)


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    batches = table.combine_chunks().to_batches()
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    assert len(batches) == 1
    return batches[0]


_IPC_FILE_MAGIC = b"ARROW1"
"""How an Arrow IPC *file* begins; bodies are the IPC *stream* format, which has no such header."""


class _NotAStream(ValueError):
    """A body in a form the node refuses on purpose; its text is the whole explanation."""


def _read_stream(payload: bytes) -> pa.RecordBatch:
    """Decode an IPC stream into one validated batch (a writer may have split it into several)."""
    if payload.startswith(_IPC_FILE_MAGIC):
        # Arrow's own error would be "expected to read 1330795073 metadata bytes": say what it is.
        raise _NotAStream("is an Arrow IPC file (it starts with 'ARROW1'); send the IPC stream format "
                          "(a stream writer, e.g. RecordBatchStreamWriter or tableToIPC(table, 'stream'))")
    # Message by message rather than through ``ipc.open_stream``, whose Python wrapper costs more
    # than the decoding itself for small batches (it consults the environment on every call).
    reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(payload))
    schema = pa.ipc.read_schema(reader.read_next_message())
    for field in schema:
        if pa.types.is_dictionary(field.type):
            # Arrow would fail later with "expected record batch but got dictionary": name the column.
            raise _NotAStream(f"column {names.shorten(field.name)} is dictionary-encoded; dictionary encoding "
                              f"is refused: send the column as its plain type ({field.type.value_type})")
    batches = [pa.ipc.read_record_batch(message, schema) for message in reader]
    batch = batches[0] if len(batches) == 1 else _one_batch(pa.Table.from_batches(batches, schema))
    schema.names  # noqa: B018  (raises now, not in a caller, when a name is not UTF-8)
    # Full validation: the bytes come from clients, and a bad offset must not reach the flusher.
    batch.validate(full=True)
    return batch


def _decode_names(fields: list[pa.Field]) -> None:
    """Raise ``UnicodeDecodeError`` now, not in a caller, if a name (nested ones too) is not UTF-8."""
    for f in fields:
        f.name  # noqa: B018
        t = f.type
        _decode_names([t.field(i) for i in range(t.num_fields)])


def read_schema(msg: Message) -> pa.Schema:
    """The schema of a CREATE_COLLECTION message."""
    _expect(msg, MessageType.CREATE_COLLECTION)
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(msg.payload))
        _decode_names(list(schema))
    except Exception as exc:
        raise CodecError(f"CREATE_COLLECTION payload is not an Arrow IPC schema: {exc}") from exc
    return schema


def read_insert(msg: Message) -> pa.RecordBatch:
    """The rows of an INSERT message, as one record batch."""
    _expect(msg, MessageType.INSERT)
    return read_rows(msg)


def read_upsert(msg: Message) -> pa.RecordBatch:
    """The rows of an UPSERT message, as one record batch."""
    _expect(msg, MessageType.UPSERT)
    return read_rows(msg)


def read_rows(msg: Message) -> pa.RecordBatch:
    """The rows of an INSERT or an UPSERT message (the two share a body), as one record batch."""
    if msg.message_type not in ROW_TYPES:
        raise CodecError(f"expected an INSERT or UPSERT message, got {msg.message_type.name}",
                         message_type=msg.message_type.name)
    try:
        return _read_stream(msg.payload)
    except _NotAStream as exc:
        raise CodecError(f"{msg.message_type.name} payload {exc}") from exc
    except Exception as exc:
        raise CodecError(f"{msg.message_type.name} payload is not an Arrow IPC stream: {exc}") from exc


def read_delete(msg: Message) -> pa.Array:
    """The primary keys of a DELETE message."""
    _expect(msg, MessageType.DELETE)
    try:
        batch = _read_stream(msg.payload)
    except _NotAStream as exc:
        raise CodecError(f"DELETE payload {exc}") from exc
    except Exception as exc:
        raise CodecError(f"DELETE payload is not an Arrow IPC stream: {exc}") from exc
    if batch.num_columns != 1 or batch.schema.names[0] != DELETE_COLUMN:
        raise CodecError(f"DELETE payload must hold exactly one column {DELETE_COLUMN!r}, "
                         f"got {batch.schema.names}")
    return batch.column(0)


def read_segment(msg: Message) -> int:
    """The segment id of an INSERT or UPSERT (stamped by the shard step) or a FLUSH message."""
    raw = msg.properties.get(PROP_SEGMENT)
    try:
        value = int(raw) if raw is not None and raw.isascii() and raw.isdigit() else -1
    except ValueError:
        value = -1
    if value < 0:
        raise CodecError(f"{msg.message_type.name} message has no valid {PROP_SEGMENT!r} property: {raw!r}")
    return value


__all__ = [
    "DEFAULT_PARTITION",
    "DELETE_COLUMN",
    "PROP_COLLECTION",
    "PROP_PARTITION",
    "PROP_PRIMARY_KEY",
    "PROP_REASON",
    "PROP_ROWS",
    "PROP_SEGMENT",
    "ROW_TYPES",
    "SEAL_AGE",
    "SEAL_BYTES",
    "SEAL_DROP",
    "SEAL_MANUAL",
    "SEAL_ROWS",
    "create_collection",
    "create_partition",
    "delete",
    "drop_collection",
    "drop_partition",
    "flush_segment",
    "insert",
    "manual_flush",
    "read_delete",
    "read_insert",
    "read_rows",
    "read_schema",
    "read_segment",
    "read_upsert",
    "upsert",
    "validate_name",
]
