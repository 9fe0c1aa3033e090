"""SDK data calls against a real node: collections, inserts checked against the schema before they
reach the log, deletes, transactions of data, and what a consumer then reads."""

from __future__ import annotations

import pyarrow as pa
import pytest

from streamingnode.client import AsyncClient
from wal import bodies
from wal.errors import CollectionNotExistError, SchemaMismatchError
from wal.message import MessageType

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("name", pa.string())])


def rows(*pks: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(list(pks), pa.int64()), pa.array([f"n{p}" for p in pks])], schema=SCHEMA)


async def _messages(client: AsyncClient, until_ts: int) -> list:
    out = []
    async with client.consumer("p", "v") as consumer:
        async for pack in consumer:
            out += [m for m in pack.messages if m.message_type is not MessageType.TIME_TICK]
            if pack.end_ts >= until_ts:
                return out
    return out


async def test_collection_insert_delete_and_refusals(server: str) -> None:
    async with AsyncClient(server) as client:
        await client.create_channels(["p"])
        data = client.data("p")
        await data.create_collection("v", "users", SCHEMA, primary_key="pk")
        first = await data.insert("v", "users", rows(1, 2, 3))
        with pytest.raises(SchemaMismatchError, match="users"):
            await data.insert("v", "users", pa.record_batch([pa.array(["x"])], names=["pk"]))
        with pytest.raises(CollectionNotExistError, match="nope"):
            await data.insert("v", "nope", rows(9))
        deleted = await data.delete("v", "users", [2])
        assert deleted.timetick > first.timetick

        async with client.txn("p", "v") as tx:
            await tx.insert("users", rows(10, 11))
        with pytest.raises(RuntimeError, match="abandon"):
            async with client.txn("p", "v") as tx:
                await tx.insert("users", rows(20))
                raise RuntimeError("abandon")
        last = await data.insert("v", "users", rows(4))

        got = await _messages(client, last.timetick)
        inserted = [pk for m in got if m.message_type is MessageType.INSERT
                    for pk in bodies.read_insert(m).column("pk").to_pylist()]
        assert inserted == [1, 2, 3, 10, 11, 4], "refused inserts and the rolled back one never reach the log"
        (delete,) = [m for m in got if m.message_type is MessageType.DELETE]
        assert bodies.read_delete(delete).to_pylist() == [2]
        assert all(m.properties.get(bodies.PROP_SEGMENT) for m in got if m.message_type is MessageType.INSERT)
        await data.drop_collection("v", "users")
        with pytest.raises(CollectionNotExistError):
            await data.insert("v", "users", rows(5))


async def test_flush_writes_exactly_the_committed_rows_to_parquet(server_thread) -> None:
    import pyarrow.dataset as ds  # noqa: PLC0415

    async with AsyncClient(server_thread.address) as client:
        await client.create_channels(["p"])
        data = client.data("p")
        await data.create_collection("v", "users", SCHEMA, primary_key="pk")
        await data.insert("v", "users", rows(1, 2, 3))
        async with client.txn("p", "v") as tx:
            await tx.insert("users", rows(10, 11))
        with pytest.raises(RuntimeError):
            async with client.txn("p", "v") as tx:
                await tx.insert("users", rows(20))
                raise RuntimeError("abandon")
        await data.delete("v", "users", [2])
        files, ts = await data.flush("v", "users")
        assert ts > 0 and files, "a flush of buffered rows names the files it wrote"
        root = server_thread.node.config.parquet_root / "p"
        for f in files:
            assert (root / f).is_file()
        table = ds.dataset(root / "users", format="parquet", partitioning="hive",
                           exclude_invalid_files=True).to_table()
        data_rows = table.filter(ds.field("_ts").is_valid())
        assert sorted(data_rows.column("pk").to_pylist()) == [1, 2, 3, 10, 11]
        assert (root / "_deletes" / "users").is_dir()
        again, _ = await data.flush("v", "users")
        assert again == [], "nothing buffered, nothing written"
