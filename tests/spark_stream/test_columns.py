"""Plain rows built straight from a column pack (``_columns.plain_batch``, what executors do) equal the
rows built from the same messages one by one (``_range.visible_messages`` and ``_rows.plain_batches``,
what collection mode and the counting on the driver use), and both follow the range rule: a
transaction's body is visible at its commit's timetick, framing is never a row.  No Spark and no
node: the packs are made here."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from streamingnode.spark import _columns, _range, _rows
from streamingnode.v1 import common_pb2 as pb
from streamingnode.wire import codec
from wal import clock
from wal.message import MessageType, Position

# The plain schema as Spark hands it to the reader (to_arrow_schema of the source's schema).
SCHEMA = to_arrow_schema(StructType([
    StructField("id", LongType()), StructField("vchannel", StringType()), StructField("type", StringType()),
    StructField("timetick", LongType()), StructField("time", TimestampType()),
    StructField("properties", MapType(StringType(), StringType())), StructField("payload", BinaryType()),
]), timezone="UTC")

T0 = clock.compose(1_700_000_000_000)
DATA, TICK = int(MessageType.DATA), int(MessageType.TIME_TICK)
BEGIN, COMMIT = int(MessageType.BEGIN_TXN), int(MessageType.COMMIT_TXN)
TXN = 77

# (type, vchannel, timetick, id or None, payload, txn id or None, properties)
Row = tuple[int, str, int, int | None, bytes, int | None, dict[str, str]]
PACK: list[Row] = [
    (DATA, "v0", T0 + 1, 10, b"a", None, {}),
    (BEGIN, "v0", T0 + 2, 11, b"", TXN, {}),
    (DATA, "v0", T0 + 2, 12, b"t0", TXN, {}),
    (DATA, "v1", T0 + 3, 13, b"b", None, {"k": "v", "z": "1"}),
    (DATA, "v0", T0 + 4, 14, b"t1", TXN, {}),
    (DATA, "", T0 + 5, 15, b"broadcast", None, {}),
    (777, "v1", T0 + 6, 16, b"unknown type", None, {}),
    (-5, "v1", T0 + 6, 18, b"negative type", None, {}),
    (DATA, "v1", T0 + 6, None, b"no id", None, {}),
    (COMMIT, "v0", T0 + 9, 17, b"", TXN, {}),
    (TICK, "", T0 + 9, None, b"", None, {}),
]


def columns(rows: list[Row]) -> pb.MessageColumns:
    out = pb.MessageColumns()
    for i, (kind, vchannel, ts, mid, payload, txn, props) in enumerate(rows):
        out.types.append(kind)
        out.vchannels.append(vchannel)
        out.timeticks.append(ts)
        out.wal_terms.append(1)
        out.ids.append(mid or 0)
        out.payloads.append(payload)
        if txn is not None or props or mid is None:
            e = out.extras.add(index=i, no_id=mid is None)
            if txn is not None:
                e.txn.txn_id = txn
            e.properties.update(props)
    return out


def pack(*parts: list[Row]) -> _columns.ColumnPack:
    return _columns.ColumnPack(tuple(columns(p) for p in parts), T0 + 9, Position("p", 17, T0 + 9))


def by_columns(p: _columns.ColumnPack, end: int) -> list[dict[str, Any]]:
    batch = _columns.plain_batch(p, end, SCHEMA)
    return [] if batch is None else batch.to_pylist()


def by_messages(p: _columns.ColumnPack, end: int) -> list[dict[str, Any]]:
    visible = ((m, v) for m, v in _range.visible_messages(_columns.pack_messages(p)) if v <= end)
    return pa.Table.from_batches(list(_rows.plain_batches(visible, SCHEMA)), SCHEMA).to_pylist()


def test_column_rows_equal_message_rows_with_bodies_at_their_commit() -> None:
    rows = by_columns(pack(PACK), T0 + 100)
    assert rows == by_messages(pack(PACK), T0 + 100)
    assert [r["payload"] for r in rows] == [b"a", b"t0", b"b", b"t1", b"broadcast", b"unknown type", b"negative type",
                                            b"no id"]
    got = {r["payload"]: r for r in rows}
    assert got[b"t0"]["timetick"] == got[b"t1"]["timetick"] == T0 + 9  # the commit's, not their own
    assert got[b"a"]["timetick"] == T0 + 1
    assert sorted(got[b"b"]["properties"]) == [("k", "v"), ("z", "1")]
    assert got[b"unknown type"]["type"] == got[b"negative type"]["type"] == "undefined"
    assert got[b"a"]["type"] == "data"
    assert got[b"no id"]["id"] is None and got[b"a"]["id"] == 10
    assert got[b"broadcast"]["vchannel"] == ""
    assert got[b"a"]["time"].timestamp() == 1_700_000_000.0


def test_a_transaction_committed_after_the_end_is_left_out_whole() -> None:
    """Cut at T0 + 6: the body's own timeticks (T0 + 2, T0 + 4) are before it, its commit after."""
    expected = [b"a", b"b", b"broadcast", b"unknown type", b"negative type", b"no id"]
    assert [r["payload"] for r in by_columns(pack(PACK), T0 + 6)] == expected
    assert [r["payload"] for r in by_messages(pack(PACK), T0 + 6)] == expected
    assert by_columns(pack(PACK), T0) == []


def test_a_pack_in_parts_gives_the_rows_of_the_whole_pack() -> None:
    """A pack larger than one response arrives in parts, each part's extras indexed from its own first
    message; the commit (in the last part) still makes the body (in the first) visible at its timetick."""
    whole = by_columns(pack(PACK), T0 + 100)
    assert by_columns(pack(PACK[:3], PACK[3:7], PACK[7:]), T0 + 100) == whole
    assert by_messages(pack(PACK[:3], PACK[3:7], PACK[7:]), T0 + 100) == whole
    assert [r["payload"] for r in by_columns(pack(PACK[:3], PACK[3:]), T0 + 6)] == \
        [b"a", b"b", b"broadcast", b"unknown type", b"negative type", b"no id"]


def test_a_pack_of_framing_only_gives_no_batch() -> None:
    assert _columns.plain_batch(pack([PACK[-1]]), T0 + 100, SCHEMA) is None
    assert _columns.plain_batch(_columns.ColumnPack((), T0, Position("p", 0, T0)), T0 + 100, SCHEMA) is None


def test_messages_from_the_same_columns_are_the_sdk_decoders() -> None:
    messages = _columns.pack_messages(pack(PACK[:3], PACK[3:]))
    assert [m.payload for m in messages] == [r[4] for r in PACK]
    assert messages == codec.messages_from_columns(columns(PACK))
