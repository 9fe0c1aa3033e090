"""One collection of every accepted column type, with edge values and nulls, produced through a real
node and flushed: shared by the pyarrow / DuckDB test (tests/unit/test_types.py) and the Spark one
(tests/spark/test_types_spark.py), which read the same kind of files."""

from __future__ import annotations

import asyncio
import json
import math
import struct
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pyarrow as pa

from streamingnode.client import AsyncClient
from streamingnode.server import ServerThread
from tests.integration.conftest import node_config

COLLECTION = "typed"
BF16 = {b"streamingnode.vector": b"bfloat16"}
PARIS = ZoneInfo("Europe/Paris")
KOLKATA = timezone(timedelta(hours=5, minutes=30))

SCHEMA = pa.schema([
    pa.field("pk", pa.int64(), nullable=False),
    pa.field("i8", pa.int8()),
    pa.field("i16", pa.int16()),
    pa.field("ts", pa.timestamp("us")),
    pa.field("ts_utc", pa.timestamp("us", tz="UTC")),
    pa.field("ts_ms", pa.timestamp("ms", tz="Europe/Paris")),
    pa.field("ts_s", pa.timestamp("s", tz="+05:30")),
    pa.field("d", pa.date32()),
    pa.field("dec", pa.decimal128(12, 4)),
    pa.field("big", pa.decimal128(38, 0)),
    pa.field("f64", pa.float64()),
    pa.field("nums", pa.list_(pa.int64())),
    pa.field("tags", pa.list_(pa.string())),
    pa.field("addr", pa.struct([("city", pa.string()), ("zip", pa.int32()), ("at", pa.timestamp("us"))])),
    pa.field("vec", pa.list_(pa.float32(), 4)),
    pa.field("h16", pa.list_(pa.float16(), 4)),
    pa.field("bf16", pa.binary(8), metadata=BF16),
    pa.field("bits", pa.binary(2)),
    pa.field("sp", pa.map_(pa.uint32(), pa.float32())),
    pa.field("j", pa.json_()),
])

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
BIG = 10**38 - 1
# bfloat16 bit patterns (the high half of the float32) of 1.0, -2.0, 0.5 and 3.140625
BF16_BITS = (0x3F80, 0xC000, 0x3F00, 0x4049)
BF16_FLOATS = [1.0, -2.0, 0.5, 3.140625]

# Row 1 holds the low edges, row 2 the high ones, row 3 a null in every nullable column.
EXPECTED: list[dict[str, Any]] = [
    {
        "pk": 1, "i8": -128, "i16": -32768,
        "ts": datetime(1, 1, 1),
        "ts_utc": datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        "ts_ms": datetime(1900, 1, 1, 0, 0, 0, 1000, tzinfo=PARIS),
        "ts_s": datetime(1, 1, 2, tzinfo=KOLKATA),
        "d": date(1, 1, 1), "dec": Decimal("-99999999.9999"), "big": Decimal(-BIG), "f64": math.nan,
        "nums": [], "tags": [None, "a"],
        "addr": {"city": None, "zip": -1, "at": datetime(1960, 6, 1, 12, 0, 0, 5)},
        "vec": [-1.5, 0.0, 3.4028234663852886e38, 2.5], "h16": [0.5, -65504.0, 65504.0, 0.0], "bf16": BF16_FLOATS,
        "bits": b"\x00\xff", "sp": {}, "j": json.dumps({"k": [1, None]}),
    },
    {
        "pk": 2, "i8": 127, "i16": 32767,
        "ts": datetime(9999, 12, 31, 23, 59, 59, 999999),
        "ts_utc": datetime(2262, 4, 12, 0, 0, 0, 1, tzinfo=UTC),  # past what nanoseconds can hold
        "ts_ms": datetime(9999, 12, 30, 12, 0, 0, 999000, tzinfo=PARIS),
        "ts_s": datetime(2026, 11, 24, 21, 30, 15, tzinfo=KOLKATA),
        "d": date(9999, 12, 31), "dec": Decimal("99999999.9999"), "big": Decimal(BIG), "f64": -math.inf,
        "nums": [I64_MIN, 0, I64_MAX], "tags": ["é", ""],
        "addr": {"city": "Paris", "zip": 75001, "at": None},
        "vec": [1.0, 2.0, 3.0, 4.0], "h16": [1.0, -2.0, 0.0999755859375, 3.0], "bf16": BF16_FLOATS[::-1],
        "bits": b"\xa5\x01", "sp": {0: 0.5, 7: -1.0, 2**32 - 2: 3.5}, "j": "[]",
    },
    {"pk": 3, **dict.fromkeys([f.name for f in SCHEMA][1:])},
]


def _bf16_bytes(values: list[float] | None) -> bytes | None:
    if values is None:
        return None
    bits = {v: b for v, b in zip(BF16_FLOATS, BF16_BITS, strict=True)}
    return struct.pack("<4H", *(bits[v] for v in values))


def _sparse(value: dict[int, float] | None) -> list[tuple[int, float]] | None:
    return None if value is None else sorted(value.items())


def batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    """``rows`` (items of EXPECTED) as an insert batch of SCHEMA."""
    columns = []
    for f in SCHEMA:
        values = [r[f.name] for r in rows]
        if f.name == "bf16":
            values = [_bf16_bytes(v) for v in values]
        elif f.name == "sp":
            values = [_sparse(v) for v in values]
        columns.append(pa.array(values, f.type))
    return pa.record_batch(columns, schema=SCHEMA)


def produce(tmp_path: Path) -> tuple[Path, list[str]]:
    """Create the collection on a real node, insert EXPECTED (two messages, one inside a transaction),
    flush; returns the pchannel's Parquet root and the data files (relative to it)."""
    with ServerThread(node_config(tmp_path / "data")) as srv:
        async def scenario() -> list[str]:
            async with AsyncClient(srv.address) as client:
                await client.create_channels(["p"])
                data = client.data("p")
                await data.create_collection("v", COLLECTION, SCHEMA, primary_key="pk")
                await data.insert("v", COLLECTION, batch(EXPECTED[:2]))
                async with client.txn("p", "v") as tx:
                    await tx.insert(COLLECTION, batch(EXPECTED[2:]))
                files, _ = await data.flush("v", COLLECTION)
                return files

        files = asyncio.run(scenario())
        root = srv.node.config.parquet_root / "p"
    return root, [f for f in files if "/partition=" in f"/{f}"]


def same(got: Any, want: Any) -> bool:
    """Exact equality, except that NaN equals NaN (every float here is exact in float16 and float32)."""
    if isinstance(want, float) and isinstance(got, float) and math.isnan(want):
        return math.isnan(got)
    if isinstance(want, list) and isinstance(got, list):
        return len(got) == len(want) and all(same(g, w) for g, w in zip(got, want, strict=True))
    if isinstance(want, dict) and isinstance(got, dict):
        return got.keys() == want.keys() and all(same(got[k], want[k]) for k in want)
    return bool(got == want)


def mismatches(got_rows: list[dict[str, Any]], expected: list[dict[str, Any]]) -> list[str]:
    """The (pk, column, got, expected) of every value that differs, as text."""
    out = []
    assert [r["pk"] for r in got_rows] == [r["pk"] for r in expected], [r["pk"] for r in got_rows]
    for got, want in zip(got_rows, expected, strict=True):
        for name, value in want.items():
            if not same(got.get(name), value):
                out.append(f"pk {want['pk']} {name}: got {got.get(name)!r}, expected {value!r}")
    return out
