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
| MANUAL_FLUSH      | empty                                           | collection (optional)               |
| FLUSH             | empty                                           | collection, partition, segment,     |
|                   |                                                 | reason                              |

Supported column types: int64, int32, float32, float64, bool, string, large_string, binary,
large_binary, float vectors (``pa.list_(pa.float32(), dim)``, a fixed-size list, 1 <= dim <= 32768)
and JSON.  JSON is Arrow's canonical extension type ``arrow.json`` (``pa.json_()``): on the wire a
utf8 column whose field metadata names the extension, so a reader without the extension still sees
a string column, and Parquet stores it with the JSON logical type (Spark reads it as a string).  The
text is not checked to be valid JSON.  The primary key is a non-nullable int64 or string column.

Collection and partition names become directory names in the flusher's output, so they are limited
to letters, digits, ``_`` and ``-`` (not first), at most 255 characters.  Columns ``_ts`` and
``_segment`` are reserved for the flusher's system columns.

Builders raise ``InvalidArgumentError`` for bad arguments; parsers raise only ``CodecError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from wal import names
from wal.errors import CodecError, InvalidArgumentError, SchemaMismatchError
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
DELETE_COLUMN = "pk"
"""The one column of a DELETE body: the primary keys to delete."""
RESERVED_COLUMNS = frozenset({"_ts", "_segment"})
"""Column names the flusher adds to every Parquet file; a schema may not use them."""
MAX_VECTOR_DIM = 32768

SEAL_ROWS = "rows"
SEAL_BYTES = "bytes"
SEAL_AGE = "age"
SEAL_MANUAL = "manual"
SEAL_DROP = "drop"

_SCALARS = (
    pa.int64(), pa.int32(), pa.float32(), pa.float64(), pa.bool_(),
    pa.string(), pa.large_string(), pa.binary(), pa.large_binary(),
)
_PK_TYPES = (pa.int64(), pa.string(), pa.large_string())


# --- validation -------------------------------------------------------------------------------------
def validate_name(kind: str, name: object) -> str:
    """Check a collection or partition name (``kind`` says which); returns it.  The rules are
    ``wal.names.COLLECTION`` and ``wal.names.PARTITION``."""
    return (names.PARTITION if kind == "partition" else names.COLLECTION).check(name)


def is_vector(t: pa.DataType) -> bool:
    """True for a float vector type: a fixed-size list of float32."""
    return bool(pa.types.is_fixed_size_list(t) and t.value_type == pa.float32())


def is_json(t: pa.DataType) -> bool:
    """True for the ``arrow.json`` extension type."""
    return isinstance(t, pa.BaseExtensionType) and t.extension_name == "arrow.json"


def is_supported(t: pa.DataType) -> bool:
    """True when a column of type ``t`` may appear in a collection schema."""
    if is_vector(t):
        return bool(1 <= t.list_size <= MAX_VECTOR_DIM)
    return is_json(t) or t in _SCALARS


def validate_schema(schema: object, primary_key: object, *, collection: str = "") -> None:
    """Check a collection schema; raises ``InvalidArgumentError`` naming the offending field."""
    if not isinstance(schema, pa.Schema):
        raise InvalidArgumentError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
    if len(schema) == 0:
        raise InvalidArgumentError(f"schema of collection {collection!r} has no fields", collection=collection)
    seen: set[str] = set()
    for f in schema:
        if not f.name:
            raise InvalidArgumentError(f"collection {collection!r} has a field with an empty name",
                                       collection=collection)
        if f.name in seen:
            raise InvalidArgumentError(f"field {f.name!r} appears twice in collection {collection!r}",
                                       collection=collection, field=f.name)
        seen.add(f.name)
        if f.name in RESERVED_COLUMNS:
            raise InvalidArgumentError(f"field name {f.name!r} is reserved for system columns",
                                       collection=collection, field=f.name)
        if not is_supported(f.type):
            raise InvalidArgumentError(
                f"field {f.name!r} of collection {collection!r} has unsupported type {f.type}",
                collection=collection, field=f.name,
            )
    if not isinstance(primary_key, str) or primary_key not in seen:
        raise InvalidArgumentError(f"primary key {primary_key!r} is not a field of collection {collection!r}",
                                   collection=collection, field=primary_key)
    pk = schema.field(primary_key)
    if pk.type not in _PK_TYPES:
        raise InvalidArgumentError(f"primary key {primary_key!r} must be int64 or string, not {pk.type}",
                                   collection=collection, field=primary_key)
    if pk.nullable:
        raise InvalidArgumentError(f"primary key {primary_key!r} must not be nullable",
                                   collection=collection, field=primary_key)


class RowCheck:
    """Checks INSERT rows and DELETE keys against one collection's schema (built once per collection).

    Columns must match the schema's names, order and types (a vector's child field name is free).
    Nullability is checked on the data: a column of a non-nullable field must hold no nulls, whatever
    the batch's field declares, and vectors never hold null components.  The work is a schema
    comparison and a few null counts per batch: rows are never visited in Python.
    """

    __slots__ = ("_collection", "_nonnull", "_pk_type", "_schema", "_vectors")

    def __init__(self, schema: pa.Schema, primary_key: str, collection: str = "") -> None:
        self._schema = schema
        self._collection = collection
        self._pk_type = schema.field(primary_key).type
        self._nonnull = tuple(i for i, f in enumerate(schema) if not f.nullable)
        self._vectors = tuple(i for i, f in enumerate(schema) if is_vector(f.type))

    def _mismatch(self, text: str, field: str) -> SchemaMismatchError:
        return SchemaMismatchError(f"{text} (collection {self._collection!r})", collection=self._collection,
                                   field=field)

    def check_insert(self, batch: pa.RecordBatch) -> int:
        """Raise ``SchemaMismatchError`` naming the first bad field; return the row count (at least 1)."""
        try:
            if not batch.schema.equals(self._schema):
                self._explain(batch.schema)
            for i in self._vectors:
                batch.schema.field(i).type.value_field.name  # noqa: B018  (equals() ignores it; must decode)
        except UnicodeDecodeError as exc:
            raise self._mismatch("insert schema holds a name that is not UTF-8", "") from exc
        for i in self._nonnull:
            if batch.column(i).null_count:
                name = self._schema.field(i).name
                raise self._mismatch(f"column {name!r} holds nulls but is not nullable", name)
        for i in self._vectors:
            if _null_components(batch.column(i)):
                name = self._schema.field(i).name
                raise self._mismatch(f"vector column {name!r} holds null components", name)
        if batch.num_rows == 0:
            raise InvalidArgumentError(f"insert into {self._collection!r} has no rows", collection=self._collection)
        return int(batch.num_rows)

    def _explain(self, got: pa.Schema) -> None:
        """Raise for a real difference; return when only nullability flags or child names differ."""
        want = self._schema
        if got.names != want.names:
            have = set(got.names)
            for name in want.names:
                if name not in have:
                    raise self._mismatch(f"insert lacks column {name!r}", name)
            for name in got.names:
                if name not in want.names:
                    raise self._mismatch(f"insert has column {name!r}, which is not in the schema", name)
            for i, name in enumerate(got.names):
                if i >= len(want) or name != want.names[i]:
                    raise self._mismatch(
                        f"column {i} of the insert is {name!r}; columns must follow the schema's order "
                        f"{want.names}", name)
        for f, g in zip(want, got, strict=True):
            if not _same_type(f.type, g.type):
                raise self._mismatch(f"column {f.name!r} has type {g.type}, expected {f.type}", f.name)

    def check_delete(self, keys: pa.Array) -> None:
        """Raise ``SchemaMismatchError`` unless ``keys`` are non-null values of the primary key's type."""
        pk = self._pk_type
        t = keys.type
        strings = (pa.types.is_string(t) or pa.types.is_large_string(t)) and (
            pa.types.is_string(pk) or pa.types.is_large_string(pk))
        if t != pk and not strings:
            raise self._mismatch(f"delete keys have type {t}, the primary key is {pk}", DELETE_COLUMN)
        if keys.null_count:
            raise self._mismatch("delete keys hold nulls", DELETE_COLUMN)
        if len(keys) == 0:
            raise InvalidArgumentError(f"a delete needs keys (collection {self._collection!r})",
                                       collection=self._collection)


def _null_components(vectors: pa.FixedSizeListArray) -> int:
    values = vectors.values
    # The common case — no null vectors, not sliced — reads the child's null count without copying;
    # otherwise flatten() leaves out the slots under null vectors and outside the slice.
    if vectors.null_count == 0 and vectors.offset == 0 and len(values) == len(vectors) * vectors.type.list_size:
        return int(values.null_count)
    return int(vectors.flatten().null_count)


def _same_type(want: pa.DataType, got: pa.DataType) -> bool:
    if want == got:
        return True
    # Arrow writers name a list's child differently ("item", "element") and may mark it non-nullable.
    return bool(is_vector(want) and is_vector(got) and want.list_size == got.list_size)


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


def _read_stream(payload: bytes) -> pa.RecordBatch:
    """Decode an IPC stream into one validated batch (a writer may have split it into several)."""
    # Message by message rather than through ``ipc.open_stream``, whose Python wrapper costs more
    # than the decoding itself for small batches (it consults the environment on every call).
    reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(payload))
    schema = pa.ipc.read_schema(reader.read_next_message())
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
    try:
        return _read_stream(msg.payload)
    except Exception as exc:
        raise CodecError(f"INSERT payload is not an Arrow IPC stream: {exc}") from exc


def read_delete(msg: Message) -> pa.Array:
    """The primary keys of a DELETE message."""
    _expect(msg, MessageType.DELETE)
    try:
        batch = _read_stream(msg.payload)
    except Exception as exc:
        raise CodecError(f"DELETE payload is not an Arrow IPC stream: {exc}") from exc
    if batch.num_columns != 1 or batch.schema.names[0] != DELETE_COLUMN:
        raise CodecError(f"DELETE payload must hold exactly one column {DELETE_COLUMN!r}, "
                         f"got {batch.schema.names}")
    return batch.column(0)


def read_segment(msg: Message) -> int:
    """The segment id of an INSERT (stamped by the shard step) or a FLUSH message."""
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
    "MAX_VECTOR_DIM",
    "PROP_COLLECTION",
    "PROP_PARTITION",
    "PROP_PRIMARY_KEY",
    "PROP_REASON",
    "PROP_ROWS",
    "PROP_SEGMENT",
    "RESERVED_COLUMNS",
    "SEAL_AGE",
    "SEAL_BYTES",
    "SEAL_DROP",
    "SEAL_MANUAL",
    "SEAL_ROWS",
    "RowCheck",
    "create_collection",
    "create_partition",
    "delete",
    "drop_collection",
    "drop_partition",
    "flush_segment",
    "insert",
    "is_json",
    "is_supported",
    "is_vector",
    "manual_flush",
    "read_delete",
    "read_insert",
    "read_schema",
    "read_segment",
    "validate_name",
    "validate_schema",
]
