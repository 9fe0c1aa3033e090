"""Message bodies: builders and parsers round-trip every supported type; garbage is a CodecError."""

from __future__ import annotations

import contextlib

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wal import bodies, columns
from wal.errors import CodecError, InvalidArgumentError, SchemaMismatchError
from wal.message import Message, MessageType

VEC16 = pa.list_(pa.float32(), 16)

ALL_TYPES = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("i32", pa.int32()),
    pa.field("f", pa.float32()),
    pa.field("d", pa.float64()),
    pa.field("b", pa.bool_()),
    pa.field("s", pa.string()),
    pa.field("ls", pa.large_string()),
    pa.field("bin", pa.binary()),
    pa.field("vec", VEC16),
    pa.field("j", pa.json_()),
])


def all_types_batch(n: int = 3) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({
        "id": list(range(n)),
        "i32": [None, *range(1, n)],
        "f": [0.5 * i for i in range(n)],
        "d": [1e300 * i for i in range(n)],
        "b": [i % 2 == 0 for i in range(n)],
        "s": ["héllo"] * (n - 1) + [None],
        "ls": ["x" * i for i in range(n)],
        "bin": [bytes([i, 0, 255]) for i in range(n)],
        "vec": [[float(i + k) for k in range(16)] for i in range(n)],
        "j": [f'{{"a": {i}}}' for i in range(n)],
    }, schema=ALL_TYPES)


def test_create_collection_round_trips_every_supported_type() -> None:
    msg = bodies.create_collection("v", "c", ALL_TYPES, "id")
    assert msg.message_type is MessageType.CREATE_COLLECTION
    assert msg.properties == {bodies.PROP_COLLECTION: "c", bodies.PROP_PRIMARY_KEY: "id"}
    schema = bodies.read_schema(msg)
    assert schema.equals(ALL_TYPES)
    assert columns.is_vector(schema.field("vec").type) and schema.field("vec").type.list_size == 16
    assert columns.is_json(schema.field("j").type)


@pytest.mark.parametrize("column", ALL_TYPES.names)
def test_insert_round_trips_each_column_type(column: str) -> None:
    full = all_types_batch()
    batch = full.select([column]) if column == "id" else full.select(["id", column])
    msg = bodies.insert("v", "c", batch, partition="p1")
    assert msg.properties == {bodies.PROP_COLLECTION: "c", bodies.PROP_PARTITION: "p1"}
    got = bodies.read_insert(msg)
    assert got.equals(batch) and got.schema.equals(batch.schema)


def test_insert_combines_a_chunked_table_into_one_batch() -> None:
    part = all_types_batch(4)
    table = pa.Table.from_batches([part, part.slice(1, 2), part])
    got = bodies.read_insert(bodies.insert("v", "c", table))
    assert got.num_rows == 10
    assert got.equals(pa.Table.from_batches([part, part.slice(1, 2), part]).combine_chunks().to_batches()[0])


def test_insert_of_a_stream_with_several_batches_reads_as_one() -> None:
    # Another language's writer may split the rows; the reader combines them.
    part = all_types_batch(2)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, part.schema) as w:
        w.write_batch(part)
        w.write_batch(part)
    msg = Message(MessageType.INSERT, "v", sink.getvalue().to_pybytes(), {"collection": "c"})
    assert bodies.read_insert(msg).num_rows == 4


def test_delete_round_trips_int_and_string_keys() -> None:
    ints = bodies.read_delete(bodies.delete("v", "c", [3, 1, 2]))
    assert ints.type == pa.int64() and ints.to_pylist() == [3, 1, 2]
    strs = bodies.read_delete(bodies.delete("v", "c", pa.chunked_array([["a"], ["b"]])))
    assert strs.type == pa.string() and strs.to_pylist() == ["a", "b"]
    with pytest.raises(InvalidArgumentError, match="needs keys"):
        bodies.delete("v", "c", [])
    with pytest.raises(InvalidArgumentError, match="not one Arrow type"):
        bodies.delete("v", "c", [1, "a"])


def test_ddl_and_flush_builders_set_their_properties() -> None:
    assert bodies.drop_collection("v", "c").properties == {"collection": "c"}
    cp = bodies.create_partition("v", "c", "p")
    dp = bodies.drop_partition("v", "c", "p")
    assert (cp.message_type, dp.message_type) == (MessageType.CREATE_PARTITION, MessageType.DROP_PARTITION)
    assert cp.properties == dp.properties == {"collection": "c", "partition": "p"}
    assert bodies.manual_flush("v").properties == {}
    assert bodies.manual_flush("v", "c").properties == {"collection": "c"}
    flush = bodies.flush_segment("v", "c", "p", 42, bodies.SEAL_ROWS)
    assert flush.message_type is MessageType.FLUSH
    assert flush.properties == {"collection": "c", "partition": "p", "segment": "42", "reason": "rows"}
    assert bodies.read_segment(flush) == 42


@pytest.mark.parametrize(("schema", "pk", "match"), [
    (pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("x", pa.uint8())]), "id", "'x'.*unsupported"),
    (pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.list_(pa.float64(), 4))]), "id",
     "'v'.*unsupported"),
    (pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.list_(pa.list_(pa.float32())))]), "id",
     "'v'.*unsupported"),
    (pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.list_(pa.float32(), 40000))]),
     "id", "'v'.*unsupported"),
    (pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("t", pa.timestamp("ns"))]), "id",
     "'t'.*unsupported"),
    (pa.schema([pa.field("id", pa.int64(), nullable=False)]), "nope", "'nope' is not a field"),
    (pa.schema([pa.field("id", pa.int64())]), "id", "'id' must not be nullable"),
    (pa.schema([pa.field("id", pa.float64(), nullable=False)]), "id", "'id' must be int64 or string"),
    (pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("id", pa.int32())]), "id", "twice"),
    (pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("_ts", pa.int64())]), "id", "reserved"),
    (pa.schema([]), "id", "no fields"),
])
def test_invalid_schemas_name_the_field(schema: pa.Schema, pk: str, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        bodies.create_collection("v", "c", schema, pk)


def test_string_primary_key_is_accepted() -> None:
    schema = pa.schema([pa.field("k", pa.string(), nullable=False)])
    assert bodies.read_schema(bodies.create_collection("v", "c", schema, "k")).equals(schema)


@pytest.mark.parametrize("name", ["", "1abc", "a/b", "..", "a b", "x" * 256, "é"])
def test_invalid_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidArgumentError, match="invalid collection name"):
        bodies.drop_collection("v", name)
    with pytest.raises(InvalidArgumentError, match="invalid partition name"):
        bodies.create_partition("v", "c", name)


def test_row_check_explains_mismatches() -> None:
    check = columns.RowCheck(ALL_TYPES, "id", "c")
    good = all_types_batch()
    assert check.check_insert(good) == 3
    cases = [
        (good.drop_columns(["s"]), "lacks column 's'"),
        (good.append_column("extra", pa.array([1, 2, 3])), "'extra', which is not in the schema"),
        (good.select([1, 0, *range(2, 10)]), "schema's order"),
        (good.set_column(1, "i32", pa.array([1, 2, 3], pa.int64())), "'i32' has type int64"),
        (good.set_column(8, "vec", pa.array([[1.0] * 8] * 3, pa.list_(pa.float32(), 8))), "'vec' has type"),
        (good.set_column(0, "id", pa.array([1, None, 3], pa.int64())), "'id' holds nulls"),
        (good.set_column(8, "vec", pa.array([[None] * 16] * 3, VEC16)), "'vec' holds null components"),
    ]
    for batch, match in cases:
        with pytest.raises(SchemaMismatchError, match=match):
            check.check_insert(batch)
    # Differences that are only declarations are fine: a nullable 'id' without nulls, a vector
    # whose child is named differently.
    relaxed = pa.schema([pa.field("id", pa.int64()), *list(ALL_TYPES)[1:8],
                         pa.field("vec", pa.list_(pa.field("element", pa.float32(), nullable=False), 16)),
                         ALL_TYPES.field("j")])
    assert check.check_insert(good.cast(relaxed)) == 3
    with pytest.raises(InvalidArgumentError, match="no rows"):
        check.check_insert(good.slice(0, 0))


def test_row_check_delete_keys() -> None:
    check = columns.RowCheck(ALL_TYPES, "id", "c")
    check.check_delete(pa.array([1, 2]))
    with pytest.raises(SchemaMismatchError, match="type string"):
        check.check_delete(pa.array(["a"]))
    with pytest.raises(SchemaMismatchError, match="nulls"):
        check.check_delete(pa.array([1, None]))
    strings = columns.RowCheck(pa.schema([pa.field("k", pa.large_string(), nullable=False)]), "k")
    strings.check_delete(pa.array(["a"]))  # string and large_string keys are interchangeable


def test_parsers_refuse_the_wrong_message_type() -> None:
    msg = bodies.drop_collection("v", "c")
    for parse in (bodies.read_schema, bodies.read_insert, bodies.read_delete, bodies.read_segment):
        with pytest.raises(CodecError):
            parse(msg)


def _valid_payloads() -> list[bytes]:
    return [
        bodies.create_collection("v", "c", ALL_TYPES, "id").payload,
        bodies.insert("v", "c", all_types_batch()).payload,
        bodies.delete("v", "c", [1, 2, 3]).payload,
    ]


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_garbage_payloads_raise_codec_error_only(data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from([MessageType.CREATE_COLLECTION, MessageType.INSERT, MessageType.DELETE]))
    source = data.draw(st.sampled_from(["random", "truncated", "flipped"]))
    if source == "random":
        payload = data.draw(st.binary(max_size=512))
    else:
        valid = data.draw(st.sampled_from(_valid_payloads()))
        if source == "truncated":
            payload = valid[: data.draw(st.integers(0, len(valid) - 1))]
        else:
            pos = data.draw(st.integers(0, len(valid) - 1))
            payload = valid[:pos] + bytes([valid[pos] ^ data.draw(st.integers(1, 255))]) + valid[pos + 1:]
    msg = Message(kind, "v", payload, {"collection": "c"})
    parse = {MessageType.CREATE_COLLECTION: bodies.read_schema, MessageType.INSERT: bodies.read_insert,
             MessageType.DELETE: bodies.read_delete}[kind]
    with contextlib.suppress(CodecError):  # decoding may succeed by chance; anything else fails the test
        parsed = parse(msg)
        # What decodes must be safe to check: the shard step raises only its own errors on it.
        check = columns.RowCheck(ALL_TYPES, "id", "c")
        with contextlib.suppress(SchemaMismatchError, InvalidArgumentError):
            if isinstance(parsed, pa.RecordBatch):
                check.check_insert(parsed)
            elif isinstance(parsed, pa.Array):
                check.check_delete(parsed)
            else:
                columns.validate_schema(parsed, "id", collection="c")


@pytest.mark.parametrize("raw", ["", "-1", "x", "1.5", "٣", None])
def test_bad_segment_property_is_codec_error(raw: str | None) -> None:
    props = {} if raw is None else {"segment": raw}
    with pytest.raises(CodecError):
        bodies.read_segment(Message(MessageType.FLUSH, "v", b"", props))
