"""Produce through a real node, flush, read with real Spark: exactly the committed rows, deletes
applied, as of three timestamps, and nothing of a rolled back or expired transaction."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flusher.read.spark import read_collection
from streamingnode.client import AsyncClient
from streamingnode.server import ServerThread
from tests.integration.conftest import node_config
from wal.errors import StreamingError

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([
    pa.field("pk", pa.int64(), nullable=False),
    pa.field("f", pa.float32()),
    pa.field("d", pa.float64()),
    pa.field("b", pa.bool_()),
    pa.field("s", pa.string()),
    pa.field("raw", pa.binary()),
    pa.field("vec", pa.list_(pa.float32(), 4)),
    pa.field("j", pa.json_()),
])


def rows(*pks: int) -> pa.RecordBatch:
    return pa.record_batch([
        pa.array(list(pks), pa.int64()),
        pa.array([p / 2 for p in pks], pa.float32()),
        pa.array([p * 1.25 for p in pks], pa.float64()),
        pa.array([p % 2 == 0 for p in pks]),
        pa.array([f"name-{p}" for p in pks]),
        pa.array([bytes([p % 256]) * 3 for p in pks], pa.binary()),
        pa.array([[float(p), 1.0, 2.0, 3.0] for p in pks], pa.list_(pa.float32(), 4)),
        pa.array([json.dumps({"k": p}) for p in pks], pa.json_()),
    ], schema=SCHEMA)


def test_produce_flush_and_read_as_of_with_spark(tmp_path: Path, spark) -> None:
    with ServerThread(node_config(tmp_path / "data")) as srv:
        async def scenario() -> tuple[list[str], int, int, int]:
            async with AsyncClient(srv.address) as client:
                await client.create_channels(["p"])
                data = client.data("p")
                await data.create_collection("v", "items", SCHEMA, primary_key="pk")
                t1 = (await data.insert("v", "items", rows(1, 2, 3))).timetick
                t2 = (await data.delete("v", "items", [2])).timetick
                async with client.txn("p", "v") as tx:
                    await tx.insert("items", rows(10, 11))
                with pytest.raises(RuntimeError):
                    async with client.txn("p", "v") as tx:
                        await tx.insert("items", rows(20))
                        raise RuntimeError("rolled back")
                with pytest.raises(StreamingError):  # idle past its keepalive: expired, commit refused
                    async with client.txn("p", "v", keepalive_ms=100) as tx:
                        await tx.insert("items", rows(30))
                        await asyncio.sleep(0.6)
                t3 = (await data.insert("v", "items", rows(4))).timetick
                files, _ = await data.flush("v", "items")
                return files, t1, t2, t3

        files, t1, t2, t3 = asyncio.run(scenario())
        assert files
        root = str(srv.node.config.parquet_root / "p")
        for f in files:
            meta = pq.read_schema(f"{root}/{f}").metadata
            assert meta[b"streamingnode.primary_key"] == b"pk", f

    def pks(as_of: int | None) -> list[int]:
        df = read_collection(spark, root, "items", as_of_ts=as_of, primary_key="pk")
        return sorted(r["pk"] for r in df.select("pk").collect())

    assert pks(None) == [1, 3, 4, 10, 11]
    assert pks(t1) == [1, 2, 3]
    assert pks(t2) == [1, 3]
    assert pks(t3 - 1) == [1, 3, 10, 11]

    # The key comes from the files' metadata when it is not given.
    assert sorted(r["pk"] for r in read_collection(spark, root, "items", as_of_ts=t2).collect()) == [1, 3]
    row = read_collection(spark, root, "items", primary_key="pk").where("pk = 11").collect()[0]
    assert row["f"] == pytest.approx(5.5) and row["d"] == pytest.approx(13.75) and row["b"] is False
    assert row["s"] == "name-11" and bytes(row["raw"]) == bytes([11]) * 3
    assert list(row["vec"]) == [11.0, 1.0, 2.0, 3.0] and json.loads(row["j"]) == {"k": 11}
    assert row["_ts"] > t2, "a transaction's rows carry its commit timestamp"
