"""The column types a collection accepts: the validator's answers (precise refusals naming the field
and listing what is accepted), the checks of inserted values, the flusher's conversion to Parquet,
and a round trip through a real node read back by pyarrow and DuckDB with nulls and edge values."""

from __future__ import annotations

import asyncio
import struct
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flusher import layout
from flusher._buffers import _to_parquet, parquet_field
from flusher.read.spark import read_collection_arrow
from streamingnode.client import AsyncClient
from streamingnode.server import ServerThread
from tests import typed_rows
from tests.integration.conftest import node_config
from wal import bodies
from wal import columns as wal_columns
from wal.errors import CodecError, InvalidArgumentError, SchemaMismatchError
from wal.message import Message, MessageType

PK = pa.field("id", pa.int64(), nullable=False)
BF16 = typed_rows.BF16


def _schema(*fields: pa.Field) -> pa.Schema:
    return pa.schema([PK, *fields])


@pytest.mark.parametrize("field", [
    pa.field("x", pa.int8()), pa.field("x", pa.int16()), pa.field("x", pa.date32()),
    pa.field("x", pa.timestamp("us")), pa.field("x", pa.timestamp("ms", tz="UTC")),
    pa.field("x", pa.timestamp("s", tz="-03:30")), pa.field("x", pa.timestamp("us", tz="America/New_York")),
    pa.field("x", pa.decimal128(1, 0)), pa.field("x", pa.decimal128(38, 38)),
    pa.field("x", pa.list_(pa.int8())), pa.field("x", pa.list_(pa.decimal128(10, 2))),
    pa.field("x", pa.list_(pa.timestamp("ms"))),
    pa.field("x", pa.struct([("a", pa.string()), ("b", pa.date32()), ("c", pa.float64())])),
    pa.field("x", pa.list_(pa.float16(), 1)), pa.field("x", pa.list_(pa.float16(), 32768)),
    pa.field("x", pa.binary(1)), pa.field("x", pa.binary(4096)),
    pa.field("x", pa.binary(2), metadata=BF16), pa.field("x", pa.binary(65536), metadata=BF16),
    pa.field("x", pa.map_(pa.uint32(), pa.float32())),
], ids=str)
def test_accepted_types(field: pa.Field) -> None:
    m = bodies.create_collection("v", "c", _schema(field), "id")
    assert bodies.read_schema(m).field("x").equals(field, check_metadata=True)


@pytest.mark.parametrize(("field", "why"), [
    (pa.field("x", pa.timestamp("ns")), "Spark cannot read Parquet nanosecond timestamps: use timestamp('us')"),
    (pa.field("x", pa.timestamp("ns", tz="UTC")), "nanosecond"),
    (pa.field("x", pa.timestamp("us", tz="Mars/Olympus")), "unknown time zone 'Mars/Olympus'"),
    (pa.field("x", pa.decimal256(40, 2)), "decimal128(p, s) with p <= 38"),
    (pa.field("x", pa.decimal32(5, 2)), "decimal128(p, s) with p <= 38"),
    (pa.field("x", pa.uint8()), "uint8; accepted"),
    (pa.field("x", pa.uint64()), "uint64; accepted"),
    (pa.field("x", pa.float16()), "halffloat; accepted"),
    (pa.field("x", pa.date64()), "date64"),
    (pa.field("x", pa.time64("us")), "time64"),
    (pa.field("x", pa.duration("s")), "duration"),
    (pa.field("x", pa.large_list(pa.int32())), "large_list"),
    (pa.field("x", pa.list_(pa.list_(pa.int8()))), "list elements must be scalars (list<item: int8>)"),
    (pa.field("x", pa.list_(pa.json_())), "list elements must be scalars"),
    (pa.field("x", pa.list_(pa.timestamp("ns"))), "list elements must be scalars (Spark cannot read"),
    (pa.field("x", pa.struct([("a", pa.list_(pa.int8()))])), "struct fields must be scalars ('a'"),
    (pa.field("x", pa.struct([("a", pa.struct([("b", pa.int8())]))])), "struct fields must be scalars"),
    (pa.field("x", pa.struct([("a", pa.int8()), ("a", pa.int16())])), "names must be non-empty and distinct"),
    (pa.field("x", pa.struct([])), "a struct needs at least one field"),
    (pa.field("x", pa.list_(pa.float64(), 4)), "fixed-size lists are vectors: of float32 or float16 only"),
    (pa.field("x", pa.list_(pa.float32(), 32769)), "vector dim must be 1..32768"),
    (pa.field("x", pa.list_(pa.float16(), 40000)), "vector dim must be 1..32768"),
    (pa.field("x", pa.binary(4097)), "a binary vector is fixed_size_binary(dim/8), 8 <= dim <= 32768"),
    (pa.field("x", pa.binary(7), metadata=BF16), "a bfloat16 vector is fixed_size_binary(2*dim)"),
    (pa.field("x", pa.binary(65538), metadata=BF16), "a bfloat16 vector is fixed_size_binary(2*dim)"),
    (pa.field("x", pa.list_(pa.float32(), 4), metadata=BF16), "allowed only as 'bfloat16' on a fixed_size_binary"),
    (pa.field("x", pa.binary(8), metadata={b"streamingnode.vector": b"float8"}), "streamingnode.vector=b'float8'"),
    (pa.field("x", pa.map_(pa.string(), pa.float32())), "maps are sparse float vectors: map<uint32, float32> only"),
    (pa.field("x", pa.map_(pa.uint32(), pa.float64())), "map<uint32, float32> only"),
    (pa.field("x", pa.dictionary(pa.int32(), pa.string())), "dictionary"),
], ids=lambda v: str(v)[:40])
def test_refused_types_name_the_field_and_list_what_is_accepted(field: pa.Field, why: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        bodies.create_collection("v", "c", _schema(field), "id")
    text = str(caught.value)
    assert text.startswith("field 'x' of collection 'c' has unsupported type "), text
    assert why in text, text
    assert text.endswith(f"accepted: {wal_columns.ACCEPTED_TYPES}"), text
    assert caught.value.fields.get("field") == "x"
    assert not wal_columns.is_supported(field.type) or field.metadata


def test_the_accepted_list_names_every_kind() -> None:
    for word in ("int8", "int16", "date32", "timestamp[s|ms|us]", "decimal128", "list<scalar>", "struct",
                 "float16", "bfloat16", "fixed_size_binary(dim/8)", "map<uint32, float32>", "json"):
        assert word in wal_columns.ACCEPTED_TYPES, word


def test_primary_keys_stay_int64_or_string() -> None:
    for t in (pa.int8(), pa.int16(), pa.date32(), pa.timestamp("us"), pa.decimal128(10, 0)):
        with pytest.raises(InvalidArgumentError, match="must be int64 or string"):
            bodies.create_collection("v", "c", pa.schema([pa.field("id", t, nullable=False)]), "id")


SPARSE = pa.map_(pa.uint32(), pa.float32())
VALUES = _schema(
    pa.field("sp", SPARSE), pa.field("t", pa.timestamp("s")), pa.field("d", pa.date32()),
    pa.field("lt", pa.list_(pa.timestamp("ms", tz="UTC"))),
    pa.field("st", pa.struct([("when", pa.timestamp("us")), ("n", pa.int8())])),
)


def _values(**columns: list[Any]) -> pa.RecordBatch:
    n = len(next(iter(columns.values())))
    arrays = [pa.array(list(range(n)), pa.int64())]
    arrays += [pa.array(columns.get(f.name, [None] * n), f.type) for f in list(VALUES)[1:]]
    return pa.record_batch(arrays, schema=VALUES)


@pytest.mark.parametrize(("columns", "match"), [
    ({"sp": [[(5, 1.0), (1, 2.0)]]}, "'sp' \\(a sparse vector\\) holds indices that do not strictly increase"),
    ({"sp": [[(1, 1.0)], [(3, 1.0), (3, 2.0)]]}, "do not strictly increase within a vector"),
    ({"sp": [[(2**32 - 1, 1.0)]]}, "holds index 4294967295; indices are below 2\\*\\*32 - 1"),
    ({"sp": [[(1, float("nan"))]]}, "column 'sp' row 0 \\(a sparse vector\\) holds a NaN or infinite value"),
    ({"sp": [[], [(1, float("-inf"))]]}, "column 'sp' row 1 \\(a sparse vector\\) holds a NaN or infinite value"),
    ({"sp": [[(1, None)]]}, "holds a null value"),
    # 10**17 seconds would overflow int64 as microseconds, which is how the flusher writes it
    ({"t": [10**17]}, "'t' holds 100000000000000000 \\(seconds since 1970\\), outside years 1..9999"),
    ({"t": [253402300800]}, "outside years 1..9999"),
    ({"t": [-62135596801]}, "outside years 1..9999"),
    ({"d": [2932897]}, "'d' holds 2932897 \\(days since 1970\\)"),
    ({"d": [None, -719163]}, "'d' holds -719163"),
    ({"lt": [[0, 253402300800000]]}, "'lt' holds 253402300800000 \\(milliseconds since 1970\\)"),
    ({"st": [{"when": -62135596800000001, "n": 1}]}, "'st' field 'when' holds -62135596800000001 \\(microseconds"),
])
def test_inserted_values_are_checked(columns: dict[str, list[Any]], match: str) -> None:
    check = wal_columns.RowCheck(VALUES, "id", "c")
    with pytest.raises(SchemaMismatchError, match=match):
        check.check_insert(_values(**columns))


def test_edge_values_and_nulls_pass_the_checks() -> None:
    wal_columns.validate_schema(VALUES, "id", collection="c")
    check = wal_columns.RowCheck(VALUES, "id", "c")
    edges = _values(
        sp=[[], None, [(0, 0.0), (1, -1.5), (2**32 - 2, 3.0e38)]],
        t=[-62135596800, None, 253402300799], d=[-719162, 2932896, None],
        lt=[[], None, [None, -62135596800000, 253402300799999]],
        st=[None, {"when": None, "n": -128}, {"when": 253402300799999999, "n": 127}],
    )
    assert check.check_insert(edges) == 3
    # A sliced batch is checked on its own rows: the bad first row is outside the slice.
    sliced = _values(sp=[[(3, 1.0), (1, 1.0)], [(1, 1.0), (3, 1.0)]]).slice(1)
    assert check.check_insert(sliced) == 1
    assert wal_columns.RowCheck(typed_rows.SCHEMA, "pk", "c").check_insert(typed_rows.batch(typed_rows.EXPECTED)) == 3


VECTORS = _schema(pa.field("vec", pa.list_(pa.float32(), 2)), pa.field("h", pa.list_(pa.float16(), 2)),
                  pa.field("b", pa.binary(4), metadata=BF16))
_BF16_ONE = struct.pack("<H", 0x3F80)


def _vectors(vec: list[Any], h: list[Any] | None = None, b: list[Any] | None = None) -> pa.RecordBatch:
    n = len(vec)
    return pa.record_batch([pa.array(range(n), pa.int64()), pa.array(vec, VECTORS.field("vec").type),
                            pa.array(h or [[1.0, 1.0]] * n, VECTORS.field("h").type),
                            pa.array(b or [_BF16_ONE * 2] * n, pa.binary(4))], schema=VECTORS)


@pytest.mark.parametrize(("batch", "match"), [
    (lambda: _vectors([[1.0, 2.0], [3.0, float("nan")]]), "column 'vec' row 1 \\(a float vector\\)"),
    (lambda: _vectors([[float("inf"), 2.0]]), "column 'vec' row 0 \\(a float vector\\)"),
    # A null vector before it: the row is still the batch's row.
    (lambda: _vectors([None, [1.0, 2.0], [-float("inf"), 0.0]]), "column 'vec' row 2 \\(a float vector\\)"),
    # Sliced: the row counts from the slice's start.
    (lambda: _vectors([[float("nan"), 0.0], [1.0, 1.0], [1.0, float("nan")]]).slice(1),
     "column 'vec' row 1 \\(a float vector\\)"),
    (lambda: _vectors([[1.0, 1.0], [1.0, 1.0]], h=[[1.0, 1.0], [float("inf"), 1.0]]),
     "column 'h' row 1 \\(a float vector\\)"),
    (lambda: _vectors([[1.0, 1.0]], b=[_BF16_ONE + struct.pack("<H", 0x7FC0)]),  # a bfloat16 NaN
     "column 'b' row 0 \\(a bfloat16 vector\\)"),
    (lambda: _vectors([[1.0, 1.0]] * 2, b=[_BF16_ONE * 2, struct.pack("<H", 0xFF80) + _BF16_ONE]),  # -inf
     "column 'b' row 1 \\(a bfloat16 vector\\)"),
])
def test_a_vector_holding_a_nan_or_an_infinity_is_refused_naming_column_and_row(batch: Any, match: str) -> None:
    """As a sparse vector is (Milvus refuses both): one message, SCHEMA_MISMATCH (gRPC INVALID_ARGUMENT)."""
    from streamingnode.wire.codes import to_grpc_status  # noqa: PLC0415

    with pytest.raises(SchemaMismatchError, match=match + " holds a NaN or infinite value \\(collection 'c'\\)") as e:
        wal_columns.RowCheck(VECTORS, "id", "c").check_insert(batch())
    assert to_grpc_status(e.value).code.name == "INVALID_ARGUMENT"


def test_finite_vectors_and_null_ones_pass() -> None:
    check = wal_columns.RowCheck(VECTORS, "id", "c")
    big = 3.0e38
    assert check.check_insert(_vectors([[big, -big], None, [0.0, -0.0]])) == 3
    assert check.check_insert(_vectors([[big, big], [big, big]])) == 2  # large, finite: their sum too (in double)
    # Under a null bfloat16 vector the bytes mean nothing, even when they spell a NaN.
    raw = pa.Array.from_buffers(pa.binary(4), 2, [pa.py_buffer(bytes([0b01])),
                                                  pa.py_buffer(_BF16_ONE * 2 + struct.pack("<2H", 0x7FC0, 0x7FC0))])
    nullable = pa.record_batch([pa.array([0, 1], pa.int64()), pa.array([[1.0, 1.0]] * 2, VECTORS.field("vec").type),
                                pa.array([[1.0, 1.0]] * 2, VECTORS.field("h").type), raw], schema=VECTORS)
    assert check.check_insert(nullable) == 2


def test_nested_fields_may_be_declared_stricter_than_the_schema() -> None:
    schema = _schema(pa.field("l", pa.list_(pa.int32())), pa.field("s", pa.struct([("a", pa.int8())])))
    check = wal_columns.RowCheck(schema, "id", "c")
    strict = _schema(pa.field("l", pa.list_(pa.field("element", pa.int32(), nullable=False))),
                     pa.field("s", pa.struct([pa.field("a", pa.int8(), nullable=False)])))
    rows = pa.record_batch([pa.array([1]), pa.array([[1]], strict.field("l").type),
                            pa.array([{"a": 1}], strict.field("s").type)], schema=strict)
    assert check.check_insert(rows) == 1
    with pytest.raises(SchemaMismatchError, match="'l' has type"):  # the other way round would lie
        wal_columns.RowCheck(strict, "id", "c").check_insert(pa.record_batch(
            [pa.array([1]), pa.array([[1]], pa.list_(pa.int32())), pa.array([{"a": 1}], schema.field("s").type)],
            schema=schema))


def test_float16_and_bfloat16_vectors_become_float32_vectors_in_parquet() -> None:
    h16 = pa.field("h", pa.list_(pa.float16(), 2))
    bf16 = pa.field("b", pa.binary(4), metadata=BF16)
    for f, kind in ((h16, b"float16"), (bf16, b"bfloat16")):
        out = parquet_field(f)
        assert out.type == pa.list_(pa.float32(), 2) and out.metadata == {b"streamingnode.vector": kind}
    plain = pa.field("x", pa.binary(4))
    assert parquet_field(plain) is plain
    # bfloat16 1.0, -2.0 | null | 0.5, 3.140625, sliced past its first row so the offset counts.
    raw = [struct.pack("<2H", 0x4049, 0x4049), struct.pack("<2H", 0x3F80, 0xC000), None,
           struct.pack("<2H", 0x3F00, 0x4049)]
    widened = _to_parquet(pa.array(raw, pa.binary(4)).slice(1), bf16)
    assert widened.type == pa.list_(pa.float32(), 2)
    assert widened.to_pylist() == [[1.0, -2.0], None, [0.5, 3.140625]]
    halves = pa.FixedSizeListArray.from_arrays(pa.array([9.0, 9.0, 65504.0, -0.5, 1.0, 2.0], pa.float16()), 2)
    assert _to_parquet(halves.slice(1), h16).to_pylist() == [[65504.0, -0.5], [1.0, 2.0]]


def test_the_node_refuses_types_and_values_with_precise_errors(tmp_path: Path) -> None:
    with ServerThread(node_config(tmp_path / "data")) as srv:
        async def scenario() -> None:
            async with AsyncClient(srv.address) as client:
                await client.create_channels(["p"])
                data = client.data("p")
                # Sent raw: the SDK's builder would refuse it before the node sees it.
                bad = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("t", pa.timestamp("ns"))])
                raw = Message(MessageType.CREATE_COLLECTION, "v", bytes(bad.serialize().to_pybytes()),
                              {bodies.PROP_COLLECTION: "c", bodies.PROP_PRIMARY_KEY: "pk"})
                with pytest.raises(InvalidArgumentError, match=r"field 't' of collection 'c' .*nanosecond.*accepted"):
                    await data.send_all([raw])
                await data.create_collection("v", "c", VALUES, primary_key="id")
                with pytest.raises(SchemaMismatchError, match="'sp' \\(a sparse vector\\) holds indices"):
                    await data.insert("v", "c", _values(sp=[[(2, 1.0), (2, 1.0)]]))
                await data.create_collection("v", "vectors", VECTORS, primary_key="id")
                with pytest.raises(SchemaMismatchError, match="column 'vec' row 1 \\(a float vector\\) holds a NaN"):
                    await data.insert("v", "vectors", _vectors([[1.0, 1.0], [float("nan"), 1.0]]))
                with pytest.raises(SchemaMismatchError, match="'t' holds -62135596801 \\(seconds"):
                    await data.insert("v", "c", _values(t=[-62135596801]))
                await data.insert("v", "c", _values(t=[0]))
                # Arrow's own validation of the payload: a decimal wider than its precision.
                narrow = pa.schema([PK, pa.field("x", pa.decimal128(3, 2))])
                await data.create_collection("v", "n", narrow, primary_key="id")
                wide = pa.array([Decimal("999.99")], pa.decimal128(5, 2))
                over = pa.Array.from_buffers(pa.decimal128(3, 2), 1, [None, wide.buffers()[1]])
                with pytest.raises(CodecError, match="99999 does not fit in precision of decimal128"):
                    await data.insert("v", "n", pa.record_batch([pa.array([1]), over], schema=narrow))
                # One name is one table: a bfloat16 vector and a binary vector of the same width (one
                # Arrow type, told apart by field metadata) would write different Parquet columns.
                await data.create_collection("v", "e", _schema(pa.field("x", pa.binary(8), metadata=BF16)), "id")
                with pytest.raises(SchemaMismatchError, match="'e' exists on vchannel 'v' with another schema"):
                    await data.create_collection("w", "e", _schema(pa.field("x", pa.binary(8))), "id")

        asyncio.run(scenario())


def _arrow_rows(root: Path) -> list[dict[str, Any]]:
    rows = read_collection_arrow(root, typed_rows.COLLECTION).sort_by("pk").to_pylist()
    for r in rows:
        r["sp"] = None if r["sp"] is None else dict(r["sp"])
    return rows


def test_every_type_round_trips_through_the_node_into_parquet_read_by_pyarrow_and_duckdb(tmp_path: Path) -> None:
    root, files = typed_rows.produce(tmp_path)
    assert len(files) == 1, files
    path = root / files[0]

    problems = typed_rows.mismatches(_arrow_rows(root), typed_rows.EXPECTED)
    assert not problems, "\n".join(problems)
    layout.check_data(str(path))  # what a restarted flusher checks every file with: nothing to quarantine

    # Every timestamp is stored as microseconds (Spark reads neither nanoseconds nor, with a zone, seconds).
    parquet = pq.ParquetFile(path)
    try:
        physical = {parquet.schema.column(i).path: parquet.schema.column(i) for i in range(len(parquet.schema))}
    finally:
        parquet.close()
    for name in ("ts", "ts_utc", "ts_ms", "ts_s", "addr.at"):
        assert "timeUnit=microseconds" in str(physical[name].logical_type), (name, physical[name].logical_type)
    assert "isAdjustedToUTC=false" in str(physical["ts"].logical_type)
    assert "isAdjustedToUTC=true" in str(physical["ts_s"].logical_type)
    assert physical["dec"].logical_type.type == "DECIMAL" and physical["big"].precision == 38
    schema = pq.read_schema(path)
    assert schema.field("ts_s").type == pa.timestamp("us", tz="+05:30")
    assert schema.field("h16").type == pa.list_(pa.float32(), 4)
    assert schema.field("bf16").metadata == {b"streamingnode.vector": b"bfloat16"}
    assert schema.field("bits").type == pa.binary(2)
    assert schema.field("sp").type == typed_rows.SCHEMA.field("sp").type

    con = duckdb.connect()
    try:
        rel = con.sql(f"SELECT * FROM read_parquet('{path}') ORDER BY pk")
        types = dict(zip(rel.columns, (str(t) for t in rel.types), strict=True))
        rows = [dict(zip(rel.columns, r, strict=True)) for r in rel.fetchall()]
    finally:
        con.close()
    assert {k: types[k] for k in ("i8", "i16", "ts", "ts_utc", "ts_s", "d", "dec", "big", "nums", "addr", "h16",
                                  "bf16", "bits", "sp", "j")} == {
        "i8": "TINYINT", "i16": "SMALLINT", "ts": "TIMESTAMP", "ts_utc": "TIMESTAMP WITH TIME ZONE",
        "ts_s": "TIMESTAMP WITH TIME ZONE", "d": "DATE", "dec": "DECIMAL(12,4)", "big": "DECIMAL(38,0)",
        "nums": "BIGINT[]", "addr": 'STRUCT(city VARCHAR, zip INTEGER, "at" TIMESTAMP)', "h16": "FLOAT[]",
        "bf16": "FLOAT[]", "bits": "BLOB", "sp": "MAP(UINTEGER, FLOAT)", "j": "JSON"}
    problems = typed_rows.mismatches(rows, typed_rows.EXPECTED)
    assert not problems, "\n".join(problems)
    assert rows[0]["ts"] == datetime(1, 1, 1)
