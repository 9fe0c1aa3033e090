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

Column types (``ACCEPTED_TYPES`` is the list the errors quote; ``flusher/README.md`` has the table
of what each becomes in Parquet, Spark and DuckDB):

* scalars: int8, int16, int32, int64, float32, float64 (NaN and infinities kept), bool, string,
  large_string, binary, large_binary, ``date32``, ``timestamp`` in ``s``, ``ms`` or ``us`` with or
  without a time zone (a zone is ``UTC``, a ``+HH:MM`` offset or an IANA name), ``decimal128(p, s)``
  with 1 <= p <= 38 and 0 <= s <= p.  ``timestamp[ns]`` is refused: Spark cannot read Parquet
  nanosecond timestamps.  Dates and timestamps must lie in years 1..9999 (UTC), the range Spark,
  Python and every unit share; the flusher writes every timestamp as microseconds.
* JSON: Arrow's canonical extension type ``arrow.json`` (``pa.json_()``): on the wire a utf8 column
  whose field metadata names the extension, so a reader without the extension still sees a string
  column, and Parquet stores it with the JSON logical type (Spark reads it as a string).  The text
  is not checked to be valid JSON.
* ``list<scalar>`` (a Milvus ARRAY; elements may be null) and ``struct`` of scalar fields (at least
  one field, names non-empty and distinct).  Nothing nests deeper.
* vectors, 1 <= dim <= 32768 (``MAX_VECTOR_DIM``), never with null components (a whole vector may be
  null when its field is nullable) and, for every float kind (float, float16, bfloat16, sparse), never
  a NaN or an infinite component (Milvus refuses them; ``SchemaMismatchError`` names the column and the
  row: "column 'v' row 3 (a float vector) holds a NaN or infinite value"):

  - float: ``fixed_size_list<float32>[dim]``;
  - float16: ``fixed_size_list<float16>[dim]``;
  - bfloat16: ``fixed_size_binary(2 * dim)``, each component the two little-endian bytes of a
    bfloat16 (what Milvus's SDK sends), with field metadata ``streamingnode.vector: bfloat16``
    (``VECTOR_METADATA``): Arrow has no bfloat16 type;
  - binary: ``fixed_size_binary(dim / 8)`` (dim bits, a multiple of 8, packed eight to a byte as
    Milvus sends them);
  - sparse float: ``map<uint32, float32>`` from index to value; in each vector the indices strictly
    increase and are below 2**32 - 1, and the values are finite (Milvus's rules).

The primary key is a non-nullable int64 or string column.

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

import math
import re
import zoneinfo
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

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
RESERVED_COLUMNS = frozenset({"_ts", "_id", "_segment"})
"""Column names the flusher adds to every Parquet file; a schema may not use them."""
MAX_VECTOR_DIM = 32768
ROW_TYPES = frozenset({MessageType.INSERT, MessageType.UPSERT})
"""Message types whose body is rows (stamped with a segment by the shard step)."""

SEAL_ROWS = "rows"
SEAL_BYTES = "bytes"
SEAL_AGE = "age"
SEAL_MANUAL = "manual"
SEAL_DROP = "drop"

_SCALARS = (
    pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.float32(), pa.float64(), pa.bool_(),
    pa.string(), pa.large_string(), pa.binary(), pa.large_binary(), pa.date32(),
)
VECTOR_METADATA = b"streamingnode.vector"
"""Field metadata key naming a vector kind the Arrow type alone does not tell: ``bfloat16`` on a
``fixed_size_binary`` field in a schema; in Parquet files, ``float16`` or ``bfloat16`` on the float32
vector the flusher widened it to (``flusher/_buffers.py``)."""
BFLOAT16 = b"bfloat16"
FLOAT16 = b"float16"
ACCEPTED_TYPES = (
    "int8, int16, int32, int64, float32, float64, bool, string, large_string, binary, large_binary, "
    "date32, timestamp[s|ms|us] with or without a time zone, decimal128(p, s) with p <= 38, "
    "json (pa.json_()), list<scalar>, struct<scalar fields>, float vector fixed_size_list<float32>[dim], "
    "float16 vector fixed_size_list<float16>[dim], bfloat16 vector fixed_size_binary(2*dim) with field "
    "metadata streamingnode.vector=bfloat16, binary vector fixed_size_binary(dim/8), "
    f"sparse float vector map<uint32, float32>; 1 <= dim <= {MAX_VECTOR_DIM}"
)
"""What ``validate_schema`` accepts, as its errors list it."""
_OFFSET = re.compile(r"[+-](?:[01][0-9]|2[0-3]):[0-5][0-9]")
"""A fixed time-zone offset as Arrow spells one."""
_PK_TYPES = (pa.int64(), pa.string(), pa.large_string())


# --- validation -------------------------------------------------------------------------------------
def validate_name(kind: str, name: object) -> str:
    """Check a collection or partition name (``kind`` says which); returns it.  The rules are
    ``wal.names.COLLECTION`` and ``wal.names.PARTITION``."""
    return (names.PARTITION if kind == "partition" else names.COLLECTION).check(name)


def is_vector(t: pa.DataType) -> bool:
    """True for a float vector type: a fixed-size list of float32."""
    return bool(pa.types.is_fixed_size_list(t) and t.value_type == pa.float32())


def is_float16_vector(t: pa.DataType) -> bool:
    """True for a float16 vector type: a fixed-size list of float16."""
    return bool(pa.types.is_fixed_size_list(t) and t.value_type == pa.float16())


def is_bfloat16_vector(f: pa.Field) -> bool:
    """True for a bfloat16 vector field: ``fixed_size_binary`` named so by ``VECTOR_METADATA``."""
    return bool(pa.types.is_fixed_size_binary(f.type) and (f.metadata or {}).get(VECTOR_METADATA) == BFLOAT16)


def is_sparse_vector(t: pa.DataType) -> bool:
    """True for a sparse float vector type: ``map<uint32, float32>``."""
    return bool(pa.types.is_map(t) and t.key_type == pa.uint32() and t.item_type == pa.float32())


def is_json(t: pa.DataType) -> bool:
    """True for the ``arrow.json`` extension type."""
    return isinstance(t, pa.BaseExtensionType) and t.extension_name == "arrow.json"


def is_supported(t: pa.DataType) -> bool:
    """True when a column of type ``t`` (without field metadata) may appear in a collection schema."""
    return _type_problem(pa.field("f", t)) is None


def same_columns(a: pa.Schema, b: pa.Schema) -> bool:
    """True when collections of schemas ``a`` and ``b`` write the same Parquet columns: equal schemas
    (``Schema.equals`` ignores metadata) that also agree on which fields are bfloat16 vectors, the one
    kind field metadata decides (a bfloat16 vector and a binary vector share their Arrow type)."""
    return bool(a.equals(b)) and all(is_bfloat16_vector(f) == is_bfloat16_vector(g) for f, g in zip(a, b, strict=True))


def _scalar_problem(t: pa.DataType) -> str | None:
    """Why ``t`` is not an accepted scalar, or None."""
    if t in _SCALARS:
        return None
    if pa.types.is_timestamp(t):
        if t.unit == "ns":
            return "Spark cannot read Parquet nanosecond timestamps: use timestamp('us')"
        return _zone_problem(t.tz)
    if pa.types.is_decimal(t):
        if not pa.types.is_decimal128(t):
            return "decimals are decimal128(p, s) with p <= 38"
        return None if 1 <= t.precision <= 38 and 0 <= t.scale <= t.precision else "decimal scale must be 0..p"
    return ""


def _zone_problem(tz: str | None) -> str | None:
    if tz is None or tz == "UTC" or _OFFSET.fullmatch(tz):
        return None
    try:
        zoneinfo.ZoneInfo(tz)
    except (ValueError, zoneinfo.ZoneInfoNotFoundError):
        return f"unknown time zone {tz[:200]!r}"
    return None


def _type_problem(f: pa.Field) -> str | None:
    """Why field ``f`` may not appear in a collection schema (an empty string when there is nothing more
    to say than that its type is not accepted), or None when it may."""
    t = f.type
    kind = (f.metadata or {}).get(VECTOR_METADATA)
    if kind is not None and not (kind == BFLOAT16 and pa.types.is_fixed_size_binary(t)):
        return (f"field metadata {VECTOR_METADATA.decode()}={kind[:200]!r} is allowed only as "
                f"{BFLOAT16.decode()!r} on a fixed_size_binary field")
    if is_vector(t) or is_float16_vector(t):
        return None if 1 <= t.list_size <= MAX_VECTOR_DIM else f"vector dim must be 1..{MAX_VECTOR_DIM}"
    if pa.types.is_fixed_size_binary(t):
        if kind == BFLOAT16:
            ok = t.byte_width % 2 == 0 and 1 <= t.byte_width // 2 <= MAX_VECTOR_DIM
            return None if ok else f"a bfloat16 vector is fixed_size_binary(2*dim), 1 <= dim <= {MAX_VECTOR_DIM}"
        ok = 1 <= t.byte_width * 8 <= MAX_VECTOR_DIM
        return None if ok else f"a binary vector is fixed_size_binary(dim/8), 8 <= dim <= {MAX_VECTOR_DIM}"
    if pa.types.is_fixed_size_list(t):
        return "fixed-size lists are vectors: of float32 or float16 only"
    if pa.types.is_map(t):
        return None if is_sparse_vector(t) else "maps are sparse float vectors: map<uint32, float32> only"
    if is_json(t):
        return None
    if pa.types.is_list(t):
        inner = _scalar_problem(t.value_type)
        return None if inner is None else f"list elements must be scalars ({inner or t.value_type})"
    if pa.types.is_struct(t):
        if t.num_fields == 0:
            return "a struct needs at least one field"
        names_seen: set[str] = set()
        for child in (t.field(i) for i in range(t.num_fields)):
            if not child.name or child.name in names_seen:
                return f"struct field names must be non-empty and distinct ({child.name!r})"
            names_seen.add(child.name)
            inner = _scalar_problem(child.type)
            if inner is not None:
                return f"struct fields must be scalars ({child.name!r}: {inner or child.type})"
        return None
    return _scalar_problem(t)


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
        problem = _type_problem(f)
        if problem is not None:
            raise InvalidArgumentError(
                f"field {f.name!r} of collection {collection!r} has unsupported type {str(f.type)[:200]}"
                f"{': ' + problem if problem else ''}; accepted: {ACCEPTED_TYPES}",
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
    """Checks INSERT (and UPSERT) rows and DELETE keys against one collection's schema (built once per collection).

    Columns must match the schema's names, order and types (a list's or vector's child field name is
    free, and a nested field may be declared non-nullable where the schema's is nullable).
    Nullability is checked on the data: a column of a non-nullable field must hold no nulls, whatever
    the batch's field declares, and vectors never hold null components.  Dates and timestamps must lie
    in years 1..9999 and sparse vectors follow Milvus's rules (see the module docstring).  The work is a
    schema comparison, null counts and a few vectorised passes over the columns that need them: rows
    are never visited in Python.
    """

    __slots__ = ("_bfloat16", "_collection", "_nonnull", "_pk_index", "_pk_type", "_schema", "_valued", "_vectors")

    def __init__(self, schema: pa.Schema, primary_key: str, collection: str = "") -> None:
        self._schema = schema
        self._collection = collection
        self._pk_type = schema.field(primary_key).type
        self._pk_index = schema.get_field_index(primary_key)
        self._nonnull = tuple(i for i, f in enumerate(schema) if not f.nullable)
        self._vectors = tuple(i for i, f in enumerate(schema) if is_vector(f.type) or is_float16_vector(f.type))
        self._valued = tuple(i for i, f in enumerate(schema) if _needs_value_check(f.type))
        self._bfloat16 = tuple(i for i, f in enumerate(schema) if is_bfloat16_vector(f))

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
            row = _non_finite_vector(batch.column(i))
            if row is not None:  # Milvus refuses them, as it does in a sparse vector (_sparse_problem)
                name = self._schema.field(i).name
                raise self._mismatch(f"column {name!r} row {row} (a float vector) {_NON_FINITE}", name)
        for i in self._bfloat16:
            row = _non_finite_bfloat16(batch.column(i))
            if row is not None:
                name = self._schema.field(i).name
                raise self._mismatch(f"column {name!r} row {row} (a bfloat16 vector) {_NON_FINITE}", name)
        for i in self._valued:
            problem = _value_problem(batch.column(i), self._schema.field(i).type)
            if problem is not None:
                name = self._schema.field(i).name
                raise self._mismatch(f"column {name!r} {problem}", name)
        if batch.num_rows == 0:
            raise InvalidArgumentError(f"insert into {self._collection!r} has no rows", collection=self._collection)
        return int(batch.num_rows)

    def check_upsert(self, batch: pa.RecordBatch) -> int:
        """``check_insert``, and no primary key twice: two rows of one upsert would share one ``(ts, id)``,
        so neither could replace the other.  Raises ``InvalidArgumentError`` quoting the first such key."""
        rows = self.check_insert(batch)
        keys = batch.column(self._pk_index)
        if rows > 1 and pc.count_distinct(keys).as_py() != rows:
            counts = pa.table({"k": keys}).group_by("k").aggregate([("k", "count")])
            twice = counts.filter(pc.greater(counts["k_count"], 1))["k"][0].as_py()
            field = self._schema.field(self._pk_index).name
            raise InvalidArgumentError(
                f"upsert into {self._collection!r} holds primary key {str(twice)[:200]!r} more than once",
                collection=self._collection, field=field)
        return rows

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


_NON_FINITE = "holds a NaN or infinite value"
"""One message for every vector kind (dense, 16-bit, sparse): Milvus refuses such values in each."""


def _first_false_row(finite: pa.Array, parents: pa.Array | None, per_row: int) -> int | None:
    """The row of the first false of ``finite`` (its parent index, or its index // ``per_row``)."""
    if pc.all(finite).as_py() is not False:
        return None
    at = pc.index(finite, False).as_py()
    return int(parents[at].as_py()) if parents is not None else at // per_row


def _sum_is_finite(values: pa.Array) -> bool:
    """True when the sum of ``values`` is finite, so that none is a NaN or an infinity: one pass and no
    allocation, about a third cheaper than ``is_finite`` over every component on this path of every
    insert.  False does not by itself mean a bad value: the caller asks ``is_finite`` which one."""
    total = pc.sum(values).as_py()
    return total is None or math.isfinite(total)


def _non_finite_vector(vectors: pa.FixedSizeListArray) -> int | None:
    """The row of the first float (or float16) vector holding a NaN or an infinity, or None."""
    values = vectors.values
    size = vectors.type.list_size
    if vectors.null_count == 0 and vectors.offset == 0 and len(values) == len(vectors) * size:
        if values.type == pa.float32() and _sum_is_finite(values):  # the common case: no copy, one pass
            return None  # (Arrow has no sum of float16)
        return _first_false_row(pc.is_finite(values), None, size)
    return _first_false_row(pc.is_finite(pc.list_flatten(vectors)), pc.list_parent_indices(vectors), size)


def _non_finite_bfloat16(vectors: pa.FixedSizeBinaryArray) -> int | None:
    """The row of the first bfloat16 vector holding a NaN or an infinity (every exponent bit set), or None."""
    if len(vectors) == 0 or vectors.null_count == len(vectors):
        return None
    per_row = vectors.type.byte_width // 2
    halves = pa.Array.from_buffers(pa.uint16(), len(vectors) * per_row, [None, vectors.buffers()[1]],
                                   offset=vectors.offset * per_row)
    finite = pc.not_equal(pc.bit_wise_and(halves, 0x7F80), 0x7F80)  # little-endian, as the SDK sends them
    if vectors.null_count:  # the bytes under a null vector mean nothing
        valid = pc.is_valid(vectors)
        finite = pc.or_(finite, pc.invert(pc.take(valid, pc.divide(pa.array(range(len(halves)), pa.int64()),
                                                                     per_row))))
    return _first_false_row(finite, None, per_row)


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
    if is_vector(want) or is_float16_vector(want):
        return bool(pa.types.is_fixed_size_list(got) and got.value_type == want.value_type
                    and want.list_size == got.list_size)
    return _fits(want, got)


def _fits(want: pa.DataType, got: pa.DataType) -> bool:
    """True when ``got`` is ``want`` but for child names and nested fields it declares non-nullable
    where ``want`` allows nulls (a cast to ``want`` then loses nothing)."""
    if want == got:
        return True
    if pa.types.is_list(want) and pa.types.is_list(got):
        pairs = [(want.value_field, got.value_field)]
    elif pa.types.is_struct(want) and pa.types.is_struct(got) and want.num_fields == got.num_fields:
        pairs = [(want.field(i), got.field(i)) for i in range(want.num_fields)]
        if any(w.name != g.name for w, g in pairs):
            return False
    else:
        return False
    return all((w.nullable or not g.nullable) and _fits(w.type, g.type) for w, g in pairs)


# Years 1..9999 (UTC): what Spark's and Python's dates and timestamps hold, and small enough that
# seconds and milliseconds become microseconds without overflow.
_MIN_SECONDS = -62135596800
_MAX_SECONDS = 253402300799
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000}
_UNIT_WORDS = {"s": "seconds", "ms": "milliseconds", "us": "microseconds"}
_MIN_DAY = -719162
_MAX_DAY = 2932896
_MAX_SPARSE_INDEX = 2**32 - 2


def _needs_value_check(t: pa.DataType) -> bool:
    if pa.types.is_timestamp(t) or pa.types.is_date32(t) or is_sparse_vector(t):
        return True
    if pa.types.is_list(t):
        return _needs_value_check(t.value_type)
    if pa.types.is_struct(t):
        return any(_needs_value_check(t.field(i).type) for i in range(t.num_fields))
    return False


def _value_problem(column: pa.Array, t: pa.DataType) -> str | None:
    """What is wrong with the values of ``column`` (of a type ``_needs_value_check`` is true for)."""
    if pa.types.is_timestamp(t) or pa.types.is_date32(t):
        if pa.types.is_date32(t):
            low, high, unit = _MIN_DAY, _MAX_DAY, "days"
        else:
            per = _PER_SECOND[t.unit]
            low, high, unit = _MIN_SECONDS * per, (_MAX_SECONDS + 1) * per - 1, _UNIT_WORDS[t.unit]
        if column.null_count == len(column):
            return None
        found = pc.min_max(column.cast(pa.int32() if pa.types.is_date32(t) else pa.int64()))
        for value in (found["min"].as_py(), found["max"].as_py()):
            if not low <= value <= high:
                return f"holds {value} ({unit} since 1970), outside years 1..9999"
        return None
    if pa.types.is_list(t):
        return _value_problem(column.flatten(), t.value_type)
    if pa.types.is_struct(t):
        for i, child in enumerate(column.flatten()):
            if _needs_value_check(t.field(i).type):
                problem = _value_problem(child, t.field(i).type)
                if problem is not None:
                    return f"field {t.field(i).name!r} {problem}"
        return None
    return _sparse_problem(column)


def _sparse_problem(column: pa.MapArray) -> str | None:
    # Compute kernels do not all take map arrays (some abort the process): the keys and values are
    # read as plain lists over the map's offsets instead.
    keys_by_row = pa.ListArray.from_arrays(column.offsets, column.keys)
    values_by_row = pa.ListArray.from_arrays(column.offsets, column.items)
    values = pc.list_flatten(values_by_row)
    if values.null_count:
        return "(a sparse vector) holds a null value"
    if len(values) == 0:
        return None
    row = _first_false_row(pc.is_finite(values), pc.list_parent_indices(values_by_row), 1)
    if row is not None:
        return f"row {row} (a sparse vector) {_NON_FINITE}"
    keys = pc.list_flatten(keys_by_row).cast(pa.int64())
    if pc.max(keys).as_py() > _MAX_SPARSE_INDEX:
        return f"(a sparse vector) holds index {pc.max(keys).as_py()}; indices are below 2**32 - 1"
    same_row = pc.equal(pc.pairwise_diff(pc.list_parent_indices(keys_by_row)), 0)
    if pc.any(pc.and_(same_row, pc.less_equal(pc.pairwise_diff(keys), 0))).as_py():
        return "(a sparse vector) holds indices that do not strictly increase within a vector"
    return None


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
    "ACCEPTED_TYPES",
    "BFLOAT16",
    "DEFAULT_PARTITION",
    "DELETE_COLUMN",
    "FLOAT16",
    "MAX_VECTOR_DIM",
    "PROP_COLLECTION",
    "PROP_PARTITION",
    "PROP_PRIMARY_KEY",
    "PROP_REASON",
    "PROP_ROWS",
    "PROP_SEGMENT",
    "RESERVED_COLUMNS",
    "ROW_TYPES",
    "SEAL_AGE",
    "SEAL_BYTES",
    "SEAL_DROP",
    "SEAL_MANUAL",
    "SEAL_ROWS",
    "VECTOR_METADATA",
    "RowCheck",
    "create_collection",
    "create_partition",
    "delete",
    "drop_collection",
    "drop_partition",
    "flush_segment",
    "insert",
    "is_bfloat16_vector",
    "is_float16_vector",
    "is_json",
    "is_sparse_vector",
    "is_supported",
    "is_vector",
    "manual_flush",
    "read_delete",
    "read_insert",
    "read_rows",
    "read_schema",
    "read_segment",
    "read_upsert",
    "same_columns",
    "upsert",
    "validate_name",
    "validate_schema",
]
