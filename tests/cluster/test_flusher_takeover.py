"""The flusher across a takeover on the shared log: the owner of a pchannel SIGKILLed with rows buffered
in its flusher; the node that takes the pchannel over resumes from the checkpoint in NATS KV and the
shared Parquet root ends up holding every inserted row exactly once, in the previous owner's
directory (its ``.incarnation`` adopted, not moved aside)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from flusher import incarnation
from flusher.read.spark import read_collection_arrow
from streamingnode.client import AsyncClient
from streamingnode.cluster.ownership import preferred
from tests.cluster.conftest import owner_seen_by
from tests.natscluster import NatsCluster
from tests.node_process import NodeProcess
from tests.waiting import until
from wal.message import MessageType

pytestmark = pytest.mark.integration

LEASE = 2.0
SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), ("name", pa.string())])
_prefixes = itertools.count()


@pytest.fixture
def procs(nats_r1: NatsCluster, tmp_path: Path) -> Iterator[dict[str, NodeProcess]]:
    common = ("--wal", "jetstream", "--nats", nats_r1.url, "--nats-replicas", "1",
              "--cluster-prefix", f"t{next(_prefixes)}", "--lease-seconds", str(LEASE), "--drain-seconds", "1",
              "--parquet-root", str(tmp_path / "parquet"))
    nodes = {n: NodeProcess(tmp_path / n, None, "--node-id", n, *common) for n in ("a", "b")}
    try:
        yield nodes
    finally:
        for proc in nodes.values():
            proc.kill()


def _rows(first: int, n: int) -> pa.Table:
    return pa.table({"pk": list(range(first, first + n)), "name": [f"r{k}" for k in range(first, first + n)]},
                    schema=SCHEMA)


async def test_rows_buffered_at_a_sigkilled_owner_reach_parquet_exactly_once_through_the_next_owner(
    procs: dict[str, NodeProcess], tmp_path: Path,
) -> None:
    p = next(f"p{i}" for i in itertools.count() if preferred(f"p{i}", ["a", "b"]) == "a")
    await asyncio.gather(*(asyncio.to_thread(proc.start) for proc in procs.values()))
    a, b = procs["a"].address, procs["b"].address
    root = tmp_path / "parquet" / p

    async def owned_by(address: str) -> bool:
        return await owner_seen_by(b, p) == address  # asked of b: a may be stopped

    async with AsyncClient([a, b], reconnect_timeout=30) as client:
        await client.create_channels([p])
        await until(lambda: owned_by(a), "node a to own the pchannel", timeout=30)
        data = client.data(p)
        await data.create_collection("v", "users", SCHEMA, primary_key="pk")
        await data.insert("v", "users", _rows(0, 50))
        files, _ = await data.flush("v")
        assert files
        marker = (root / incarnation.MARKER).stat()
        for k in range(5):  # buffered in a's flusher (its limits are far): only the log holds them
            await data.insert("v", "users", _rows(100 + 10 * k, 10))
        await data.aclose()
        assert read_collection_arrow(root, "users").num_rows == 50

        procs["a"].kill()
        await until(lambda: owned_by(b), "node b to take the pchannel over", timeout=30)
        data = client.data(p)
        await data.insert("v", "users", _rows(200, 30))
        await data.upsert("v", "users", pa.table({"pk": [0], "name": ["again"]}, schema=SCHEMA))
        await data.flush("v")
        await data.aclose()

        # The log's rows: every INSERT / UPSERT acknowledged, read back through the new owner.
        async with client.producer(p) as producer:
            await producer.send("v", b"END")
        logged = 0
        async with client.consumer(p, "v") as consumer:
            async for pack in consumer:
                kinds = [m.message_type for m in pack.messages]
                logged += kinds.count(MessageType.INSERT) + kinds.count(MessageType.UPSERT)
                if any(m.payload == b"END" for m in pack.messages):
                    break
        assert logged == 1 + 5 + 1 + 1

    table = read_collection_arrow(root, "users").sort_by("pk")
    want = [*range(50), *range(100, 150), *range(200, 230)]
    assert table.column("pk").to_pylist() == want  # each once: nothing lost, nothing written twice
    assert table.column("name").to_pylist()[0] == "again"
    # b adopted the directory a created: same marker, nothing moved aside.
    assert incarnation.read_marker(root) is not None
    assert (root / incarnation.MARKER).stat().st_mtime_ns == marker.st_mtime_ns
    assert not (tmp_path / "parquet" / incarnation.GRAVEYARD).exists()

