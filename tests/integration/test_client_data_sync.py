"""The blocking data calls (``Client.data``, sync transaction ``insert``/``delete``), the commit
timetick a transaction gives back after its block, and how soon an idle insert reaches Parquet."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from flusher.read.spark import read_collection_arrow
from streamingnode.client import (
    AsyncClient,
    Client,
    CollectionNotExistError,
    InvalidTxnStateError,
    SchemaMismatchError,
    SyncDataClient,
)
from streamingnode.config import NodeConfig
from streamingnode.server import ServerThread
from tests.integration.conftest import node_config
from tests.waiting import until_sync

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("name", pa.string())])


def rows(*pks: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(list(pks), pa.int64()), pa.array([f"n{p}" for p in pks])], schema=SCHEMA)


def pks_as_of(root: Path, as_of: int | None = None) -> list[int]:
    return sorted(read_collection_arrow(root, "users", as_of_ts=as_of, primary_key="pk").column("pk").to_pylist())


def test_the_sync_client_writes_collections_and_transactions_of_rows(server_thread: ServerThread) -> None:
    root = server_thread.node.config.parquet_root / "p"
    with Client(server_thread.address) as client:
        client.create_channels(["p"])
        data = client.data("p")
        assert isinstance(data, SyncDataClient) and data.pchannel == "p"
        data.create_collection("v", "users", SCHEMA, primary_key="pk")
        first = data.insert("v", "users", rows(1, 2, 3))
        with pytest.raises(SchemaMismatchError, match="users"):
            data.insert("v", "users", pa.record_batch([pa.array(["x"])], names=["pk"]))
        with pytest.raises(CollectionNotExistError, match="nope"):
            data.insert("v", "nope", rows(9))
        data.delete("v", "users", [2])

        with client.txn("p", "v") as tx:
            inserted = tx.insert("users", rows(10, 11, 12))
            tx.delete("users", [1])
            assert tx.committed is None
            with pytest.raises(InvalidTxnStateError, match="still open"):
                _ = tx.commit_timetick
        assert tx.committed is not None and tx.committed.txn_id == tx.txn_id
        committed_at = tx.commit_timetick
        assert committed_at == tx.committed.timetick > inserted.timetick > first.timetick

        with pytest.raises(RuntimeError, match="abandon"), client.txn("p", "v") as rolled:
            rolled.insert("users", rows(20))
            raise RuntimeError("abandon")
        assert rolled.finished and rolled.committed is None
        with pytest.raises(InvalidTxnStateError, match="rolled back"):
            _ = rolled.commit_timetick

        files, flushed_at = data.flush("v", "users")
        assert files and flushed_at > committed_at
        data.close()

    # The commit timetick is the as-of bound that shows the whole transaction, and nothing of it before.
    assert pks_as_of(root, committed_at - 1) == [1, 3]
    assert pks_as_of(root, committed_at) == [3, 10, 11, 12]
    assert pks_as_of(root) == [3, 10, 11, 12], "the rolled back insert never reaches Parquet"


def test_the_sync_client_upserts_outside_and_inside_a_transaction(server_thread: ServerThread) -> None:
    root = server_thread.node.config.parquet_root / "p"
    with Client(server_thread.address) as client:
        client.create_channels(["p"])
        data = client.data("p")
        data.create_collection("v", "users", SCHEMA, primary_key="pk")
        data.insert("v", "users", rows(1, 2))
        data.upsert("v", "users", pa.record_batch([pa.array([2, 3], pa.int64()), pa.array(["new2", "new3"])],
                                                  schema=SCHEMA))
        with client.txn("p", "v") as tx:
            tx.insert("users", rows(4))
            tx.upsert("users", pa.record_batch([pa.array([4], pa.int64()), pa.array(["new4"])], schema=SCHEMA))
        data.flush("v", "users")
        data.close()
    got = read_collection_arrow(root, "users", primary_key="pk")
    assert sorted(zip(got.column("pk").to_pylist(), got.column("name").to_pylist(), strict=True)) == [
        (1, "n1"), (2, "new2"), (3, "new3"), (4, "new4")]


def test_the_sync_client_writes_a_sharded_collection(server_thread: ServerThread) -> None:
    root = server_thread.node.config.parquet_root / "p"
    with Client(server_thread.address) as client:
        client.create_channels(["p"])
        users = client.data("p").sharded("v", "users", 3, "pk")
        assert users.vchannels == ["v_0", "v_1", "v_2"] and users.shards == 3
        users.create(SCHEMA)
        inserted = users.insert(rows(*range(30)))
        assert len(inserted) == 3
        assert {users.shard_of(k) for k in range(30)} == {0, 1, 2}
        users.delete(list(range(0, 30, 2)))
        users.flush()
    assert pks_as_of(root) == list(range(1, 30, 2))


async def test_an_async_transaction_gives_its_commit_timetick_after_the_block(server: str) -> None:
    async with AsyncClient(server) as client:
        await client.create_channels(["p"])
        await client.data("p").create_collection("v", "users", SCHEMA, primary_key="pk")
        async with client.txn("p", "v") as tx:
            body = await tx.insert("users", rows(1))
            with pytest.raises(InvalidTxnStateError, match="still open"):
                _ = tx.commit_timetick
        assert tx.committed is not None
        assert tx.commit_timetick == tx.committed.timetick > body.timetick
        explicit = None
        async with client.txn("p", "v") as tx2:
            await tx2.insert("users", rows(2))
            explicit = await tx2.commit()
        assert tx2.committed == explicit


# --- freshness --------------------------------------------------------------------------------------
def test_by_default_an_idle_insert_reaches_parquet_within_a_minute() -> None:
    # The flusher writes a buffer once its first row is this old, even when nothing else comes.
    assert NodeConfig().flush_max_age_seconds <= 60


def test_an_idle_insert_reaches_parquet_once_the_age_limit_passes(tmp_path: Path) -> None:
    with ServerThread(node_config(tmp_path / "data", flush_max_age_seconds=0.5)) as srv:
        root = srv.node.config.parquet_root / "p"
        with Client(srv.address) as client:
            client.create_channels(["p"])
            data = client.data("p")
            data.create_collection("v", "users", SCHEMA, primary_key="pk")
            data.insert("v", "users", rows(1, 2))
            # No flush, no more writes: only the age limit can write the buffer.
            until_sync(lambda: any((root / "users").glob("partition=*/segment=*/*.parquet")),
                       "the idle rows to reach Parquet")
            assert pks_as_of(root) == [1, 2]
