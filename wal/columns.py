"""The column contract: which Arrow types a collection's schema may use, and which values its rows may
hold.  The shard step checks every CREATE_COLLECTION, INSERT, UPSERT and DELETE against it (and the body
builders of ``wal.bodies`` check schemas already at the caller), so that nothing the flusher could not
write, or a reader could not read, is ever acknowledged.  The rules come from what Parquet, Spark and
DuckDB can hold (``flusher/README.md`` "Column types" has the table of what each type becomes); they are
checked here, below the flusher, because they decide what is accepted at the call.

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
"""

from __future__ import annotations

import math
import re
import zoneinfo

import pyarrow as pa
import pyarrow.compute as pc

from wal.errors import InvalidArgumentError, SchemaMismatchError

DELETE_COLUMN = "pk"
"""The one column of a DELETE body: the primary keys to delete."""
RESERVED_COLUMNS = frozenset({"_ts", "_id", "_segment"})
"""Column names the flusher adds to every Parquet file; a schema may not use them."""
MAX_VECTOR_DIM = 32768
MAX_VECTOR_DIM = 32768
_SCALARS = (
    pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.float32(), pa.float64(), pa.bool_(),
    pa.string(), pa.large_string(), pa.binary(), pa.large_binary(), pa.date32(),
)
VECTOR_METADATA = b"streamingnode.vector"
"""Field metadata key naming a vector kind the Arrow type alone does not tell: ``bfloat16`` on a
``fixed_size_binary`` field in a schema.  (The flusher reuses the key in Parquet files, on the float32
vector it widened a 16-bit one to: ``flusher/_buffers.py``.)"""
BFLOAT16 = b"bfloat16"
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
