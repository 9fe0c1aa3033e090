"""Cluster mode on the shared log (``--wal jetstream``): real node processes over real nats-servers.

The nodes keep nothing of their own: the log, its KV meta (recovery snapshots, consumer groups, the
flusher's checkpoint) and the leases are in NATS, the Parquet files under one shared root.  So a node
that takes a pchannel over (its owner SIGKILLed or SIGSTOPped past its lease) continues it exactly:
nothing acknowledged is lost or duplicated, the old term's open transactions are rolled back, the
flusher resumes from its checkpoint, and the old owner, woken up, can store nothing.

One NATS cluster per module; each test its own prefix (buckets and streams), nodes and Parquet root.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamingnode.client import AsyncClient
from streamingnode.cluster import preferred
from tests.cluster.conftest import start_cluster
from tests.natscluster import NatsCluster
from tests.node_process import NodeProcess

pytestmark = pytest.mark.integration

LEASE = 2.0  # seconds: short, so an owner's death shows within a few seconds
_prefixes = itertools.count()


@pytest.fixture(scope="module")
def natsc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("nats"), 3)
    yield cluster
    cluster.stop()


class Nodes:
    """Streaming node processes sharing one log (a prefix on ``natsc``) and one Parquet root."""

    def __init__(self, natsc: NatsCluster, root: Path, replicas: int, *extra: str) -> None:
        self.prefix = f"w{next(_prefixes)}"
        self.parquet = root / "parquet"
        self.common = ("--wal", "jetstream", "--nats", natsc.url, "--nats-replicas", str(replicas),
                       "--cluster-prefix", self.prefix, "--lease-seconds", str(LEASE), "--drain-seconds", "1",
                       "--parquet-root", self.parquet.as_uri(), *extra)
        self.root = root
        self.procs: dict[str, NodeProcess] = {}

    def add(self, node_id: str) -> NodeProcess:
        proc = self.procs[node_id] = NodeProcess(self.root / node_id, None, "--node-id", node_id, *self.common)
        return proc.start()

    @property
    def seeds(self) -> list[str]:
        return [p.address for p in self.procs.values()]

    def by_address(self, address: str) -> str:
        return next(n for n, p in self.procs.items() if p.address == address)

    def close(self) -> None:
        for proc in self.procs.values():
            proc.kill()


@pytest.fixture
def nodes(natsc: NatsCluster, tmp_path: Path) -> Iterator[Nodes]:
    group = Nodes(natsc, tmp_path, 1)
    try:
        yield group
    finally:
        group.close()


async def _owner(client: AsyncClient, pchannel: str) -> str:
    [desc] = await client.describe_channels([pchannel])
    return desc.owner.address


async def test_channels_created_on_one_node_are_served_by_their_preferred_node_and_destroyed_everywhere(
    nodes: Nodes,
) -> None:
    nodes.add("a")
    nodes.add("b")
    async with AsyncClient(nodes.seeds) as client:
        names = [f"c{i}" for i in range(4)]
        assert await client.create_channels(names) == names
        want = {n: nodes.procs[str(preferred(n, nodes.procs))].address for n in names}
        for name in names:
            assert await _owner(client, name) == want[name]
        async with client.producer(names[0]) as producer:
            await producer.send("v", b"hello")
        await client.destroy_channels(names)
        assert [d.name for d in await client.describe_channels()] == []
