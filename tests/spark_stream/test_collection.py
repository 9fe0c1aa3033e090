"""Collection mode against a model: the rows a streaming query reads (inserts, deletes, upserts, some
in transactions, one rolled back), replayed in ``(_ts, _id)`` order, equal what ``read_collection_arrow``
reads from the flushed Parquet at the same timeticks; and the types are the ones Spark reads there."""

from __future__ import annotations

import asyncio
import datetime
import json
import math
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from flusher.read.spark import read_collection_arrow
from streamingnode.client import AsyncClient
from streamingnode.server import ServerThread
from tests.spark_stream.test_source import wait

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([
    pa.field("pk", pa.int64(), nullable=False),
    pa.field("name", pa.string()),
    pa.field("vec", pa.list_(pa.float32(), 3)),
    pa.field("h16", pa.list_(pa.float16(), 2)),
    pa.field("sp", pa.map_(pa.uint32(), pa.float32())),
    pa.field("j", pa.json_()),
    pa.field("tags", pa.list_(pa.string())),
    pa.field("at", pa.timestamp("ms", tz="UTC")),
    pa.field("bits", pa.binary(1)),
])
SPARK_TYPES = {"pk": "bigint", "name": "string", "vec": "array<float>", "h16": "array<float>",
               "sp": "map<bigint,float>", "j": "string", "tags": "array<string>", "at": "timestamp",
               "bits": "binary", "_ts": "bigint", "_id": "bigint", "_op": "string", "_txn": "bigint"}
USER = [f.name for f in SCHEMA]


def rows(*pks: int, tag: str = "") -> pa.RecordBatch:
    values: dict[str, list[Any]] = {
        "pk": list(pks), "name": [f"n{k}{tag}" for k in pks],
        "vec": [[k, -k, 0.5] for k in pks], "h16": [[k, 0.25] for k in pks],
        "sp": [[(k, 1.5), (2**32 - 2, -k)] if k % 2 else None for k in pks],
        "j": [json.dumps({"k": k, "tag": tag}) for k in pks], "tags": [[tag, None] for k in pks],
        "at": [datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(milliseconds=k) for k in pks],
        "bits": [bytes([k % 256]) for k in pks],
    }
    return pa.record_batch([pa.array(values[f.name], f.type) for f in SCHEMA], schema=SCHEMA)


async def _scenario(addr: str) -> list[int]:
    """Write the history; returns timeticks to compare at (each after some statements)."""
    marks = []
    async with AsyncClient(addr) as client:
        await client.create_channels(["p1"])
        data = client.data("p1")
        await data.create_collection("v0", "c", SCHEMA, primary_key="pk")
        await data.insert("v0", "c", rows(1, 2, 3, 4))
        await data.insert("v0", "c", rows(2, tag="again"))  # a second version of 2
        marks.append((await data.delete("v0", "c", [1, 9])).timetick)
        await data.upsert("v0", "c", rows(2, 5, tag="up"))  # replaces both versions of 2
        async with client.txn("p1", "v0") as tx:
            await tx.insert("c", rows(6, 7))
            await tx.delete("c", [6, 3])
            await tx.upsert("c", rows(7, tag="tx"))
            await tx.insert("c", rows(6, tag="back"))
        marks.append(tx.commit_timetick)
        try:  # a transaction with bodies, rolled back: readers never see them
            async with client.txn("p1", "v0") as rolled:
                await rolled.insert("c", rows(100, 101))
                await rolled.delete("c", [2, 4])
                raise _RollBack
        except _RollBack:
            pass
        async with client.txn("p1", "v0") as tx2:
            await tx2.upsert("c", rows(4, tag="tx2"))
            await tx2.delete("c", [5])
        marks.append(tx2.commit_timetick)
        await data.insert("v0", "c", rows(8))
        await data.delete("v0", "c", [8])
        await data.insert("v0", "c", rows(8, tag="new"))
        _, flushed = await data.flush("v0", "c")
        marks.append(flushed)
        await data.aclose()
    return marks


class _RollBack(Exception):
    pass


def replay(stream: list[dict[str, Any]], as_of: int) -> list[dict[str, Any]]:
    """The table the rows build, as of ``as_of``: inserts add a version, deletes remove every version
    of the key written before them (an upsert's delete comes before its insert at the same ``_id``)."""
    table: list[dict[str, Any]] = []
    for r in stream:
        if r["_ts"] > as_of:
            break
        if r["_op"] == "delete":
            table = [t for t in table if t["pk"] != r["pk"]]
        else:
            assert r["_op"] == "insert", r
            table.append(r)
    return table


def _normal(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, dict):
        return sorted(value.items())
    if isinstance(value, list) and value and isinstance(value[0], tuple):
        return sorted(value)
    return value


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(json.dumps(_normal(row[c]), default=str, sort_keys=True) for c in [*USER, "_ts", "_id"])


class Collected:
    def __init__(self) -> None:
        self.by_id: dict[int, list[dict[str, Any]]] = {}
        self.types: dict[str, str] = {}
        self._lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        got = df.toArrow().to_pylist()
        with self._lock:
            self.types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
            self.by_id[batch_id] = got

    def rows(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r for b in sorted(self.by_id) for r in self.by_id[b]]


def test_collection_rows_replayed_equal_the_flushed_table(sspark: Any, node: ServerThread, tmp_path: Path) -> None:
    marks = asyncio.run(_scenario(node.address))
    sink = Collected()
    query = (sspark.readStream.format("streamingnode").option("addr", node.address).option("pchannel", "p1")
             .option("collection", "c").option("startingOffsets", "earliest").option("maxMessagesPerTrigger", "3")
             .load().writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="100 milliseconds").start())
    try:
        # 24 rows: 4 + 1 inserts, 2 deletes, the upsert 2 + 2, the transaction 2 + 2 + 2 + 1, the
        # second 2 + 1, then 1 + 1 + 1.
        wait(query, lambda: len(sink.rows()) >= 24, "every row of the collection")
    finally:
        query.stop()
    stream = sink.rows()
    assert len(stream) == 24
    assert {k: sink.types.get(k) for k in SPARK_TYPES} == SPARK_TYPES
    assert [(r["_ts"], r["_id"]) for r in stream] == sorted((r["_ts"], r["_id"]) for r in stream), "commit order"
    assert not any(r["pk"] in (100, 101) for r in stream), "a rolled-back body was read"
    txns = {r["_txn"] for r in stream if r["_txn"] is not None}
    assert len(txns) == 2  # the two committed transactions, each with its id
    assert len({r["_ts"] for r in stream if r["_txn"] is not None}) == 2  # each at its commit
    root = node.node.config.parquet_root / "p1"
    for as_of in marks:
        flushed = read_collection_arrow(root, "c", as_of_ts=as_of, primary_key="pk").to_pylist()
        model = replay(stream, as_of)
        assert sorted(map(_key, model)) == sorted(map(_key, flushed)), f"as of {as_of}"
    assert sorted(r["pk"] for r in replay(stream, marks[-1])) == [2, 4, 6, 7, 8]


def test_a_collection_whose_creation_retention_truncated_is_named(sspark: Any, tmp_path: Path) -> None:
    from streamingnode.client import Client  # noqa: PLC0415
    from tests.integration.conftest import node_config  # noqa: PLC0415
    from tests.waiting import until_sync  # noqa: PLC0415

    config = node_config(tmp_path / "data", retention_seconds=0, retention_check_seconds=0.1)
    with ServerThread(config) as srv:
        async def write() -> int:
            async with AsyncClient(srv.address) as client:
                await client.create_channels(["p1"])
                data = client.data("p1")
                created = await data.create_collection("v0", "c", SCHEMA, primary_key="pk")
                await data.insert("v0", "c", rows(1))
                await data.flush("v0", "c")
                await data.aclose()
                return created.message_id

        created = asyncio.run(write())
        with Client(srv.address) as client:
            def truncated() -> bool:
                first = client.describe_channels(["p1"])[0].first_id
                return first is not None and first > created

            until_sync(truncated, "retention truncating the CREATE_COLLECTION", timeout=60)
        reader = (sspark.readStream.format("streamingnode").option("addr", srv.address).option("pchannel", "p1")
                  .option("collection", "c"))
        with pytest.raises(Exception, match="PYTHON_DATA_SOURCE_ERROR") as caught:
            reader.load()
    assert ("streamingnode option 'collection': the CREATE_COLLECTION of collection 'c' is no longer in the "
            "log of 'p1'") in str(caught.value)
