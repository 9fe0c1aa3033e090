"""A real node (in-process, cluster mode over a one-server NATS) whose open of one pchannel fails or
is slow: the failing one backs off and DescribeChannels says why while the others serve; the slow one
keeps its lease through a recovery longer than the lease and then serves on the same node."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import nats
import pytest

from streamingnode.cluster.kv import bucket
from streamingnode.cluster.leases import Lease, Leases
from streamingnode.node.channel import Channel
from streamingnode.node.node import Node
from streamingnode.server import ServerThread
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from tests.integration.conftest import node_config
from tests.natscluster import NatsCluster
from tests.waiting import until_sync

pytestmark = pytest.mark.integration

LEASE = 1.5
_prefixes = itertools.count()


@pytest.fixture
def prefix() -> str:
    return f"no{next(_prefixes)}"


def describe(address: str) -> dict[str, pb.ChannelDescription]:
    async def ask() -> dict[str, Any]:
        async with grpc.aio.insecure_channel(address) as channel:
            resp = await sgrpc.StreamingNodeStub(channel).DescribeChannels(spb.DescribeChannelsRequest())
        return {d.channel_name: d for d in resp.descriptions}
    return asyncio.run(ask())


def read_lease(url: str, prefix: str, name: str) -> Lease:
    async def read() -> Lease:
        nc = await nats.connect(url)
        try:
            leases = Leases(await bucket(nc.jetstream(), f"{prefix}_leases"), "reader", "", LEASE)
            return await leases.read(name)
        finally:
            await nc.close()
    return asyncio.run(read())


@pytest.fixture
def patched_open(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Node._open with test controls: names in ``failing`` fail; a name in ``gates`` waits for its
    threading.Event (a recovery as long as the test wants)."""
    controls: dict[str, Any] = {"failing": set(), "gates": {}}
    original = Node._open

    async def _open(self: Node, name: str, *, new: bool = False) -> Channel:
        if name in controls["failing"]:
            raise RuntimeError(f"damaged channel record of {name}")
        gate: threading.Event | None = controls["gates"].get(name)
        if gate is not None:
            await asyncio.to_thread(gate.wait, 60)
        return await original(self, name, new=new)
    monkeypatch.setattr(Node, "_open", _open)
    yield controls
    for gate in controls["gates"].values():
        gate.set()


def test_a_pchannel_that_fails_to_open_backs_off_and_describe_says_why(
    nats_r1: NatsCluster, tmp_path: Path, prefix: str, patched_open: dict[str, Any],
) -> None:
    patched_open["failing"].add("p1")
    config = node_config(tmp_path / "n", cluster_nats=nats_r1.url, node_id="n", lease_seconds=LEASE,
                         cluster_prefix=prefix, channels=("p0", "p1", "p2"), flusher=False)
    with ServerThread(config) as srv:
        seen = describe(srv.address)
        assert {p: seen[p].owner.address for p in ("p0", "p2")} == {"p0": srv.address, "p2": srv.address}
        assert seen["p1"].owner.address == ""
        assert len(seen["p1"].problems) == 1, f"describe does not say why p1 is not open: {seen['p1']}"
        (problem,) = seen["p1"].problems
        assert "damaged channel record of p1" in problem and "next try in" in problem
        patched_open["failing"].clear()  # repaired: it opens at its next try
        until_sync(lambda: describe(srv.address)["p1"].owner.address == srv.address, "p1 open once repaired")
        assert list(describe(srv.address)["p1"].problems) == []


def test_a_recovery_longer_than_the_lease_keeps_the_lease_and_serves_on_the_same_node(
    nats_r1: NatsCluster, tmp_path: Path, prefix: str, patched_open: dict[str, Any],
) -> None:
    gate = patched_open["gates"]["p0"] = threading.Event()
    config = node_config(tmp_path / "n", cluster_nats=nats_r1.url, node_id="n", lease_seconds=LEASE,
                         cluster_prefix=prefix, channels=("p0",), flusher=False)
    srv = ServerThread(config)
    with ThreadPoolExecutor(1) as pool:
        starting = pool.submit(srv.start)  # returns once the node serves: after p0's open
        try:
            until_sync(lambda: read_lease(nats_r1.url, prefix, "p0").node == "n", "p0 taken")
            first = read_lease(nats_r1.url, prefix, "p0")

            def outlived_twice() -> bool:
                lease = read_lease(nats_r1.url, prefix, "p0")
                assert lease.held() and (lease.node, lease.term) == ("n", first.term), lease
                return lease.expires_ms > first.expires_ms + 2 * LEASE * 1000
            until_sync(outlived_twice, "the lease renewed past two TTLs while p0 opens", timeout=30)
            gate.set()
            starting.result(timeout=30)
            lease = read_lease(nats_r1.url, prefix, "p0")
            assert (lease.node, lease.term, lease.serving) == ("n", first.term, True)
            assert describe(srv.address)["p0"].owner.address == srv.address
        finally:
            gate.set()
            starting.result(timeout=60)
            srv.stop()


def test_a_node_whose_first_ownership_pass_times_out_tries_again_and_starts(
    nats_r1: NatsCluster, tmp_path: Path, prefix: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # NATS slow to answer at the start (an election, a busy host): the node used to exit with the
    # timeout of its first heartbeat.
    from streamingnode.cluster.membership import Membership  # noqa: PLC0415

    failures = [nats.errors.TimeoutError(), nats.errors.NoRespondersError()]
    heartbeat = Membership.heartbeat

    async def slow_at_first(self: Membership) -> None:
        if failures:
            raise failures.pop(0)
        await heartbeat(self)
    monkeypatch.setattr(Membership, "heartbeat", slow_at_first)
    monkeypatch.setattr("streamingnode.cluster.startup.FIRST_PASS_RETRY_SECONDS", 0.05, raising=False)
    config = node_config(tmp_path / "n", cluster_nats=nats_r1.url, node_id="n", lease_seconds=LEASE,
                         cluster_prefix=prefix, channels=("p0",), flusher=False)
    with ServerThread(config) as srv:
        assert failures == []
        assert describe(srv.address)["p0"].owner.address == srv.address


def test_a_node_gives_up_its_first_ownership_pass_after_the_deadline_naming_the_cause(
    nats_r1: NatsCluster, tmp_path: Path, prefix: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from streamingnode.cluster.membership import Membership  # noqa: PLC0415

    async def never(self: Membership) -> None:
        raise nats.errors.TimeoutError()
    monkeypatch.setattr(Membership, "heartbeat", never)
    monkeypatch.setattr("streamingnode.cluster.startup.FIRST_PASS_SECONDS", 0.3)
    monkeypatch.setattr("streamingnode.cluster.startup.FIRST_PASS_RETRY_SECONDS", 0.05, raising=False)
    config = node_config(tmp_path / "n", cluster_nats=nats_r1.url, node_id="n", lease_seconds=LEASE,
                         cluster_prefix=prefix, channels=("p0",), flusher=False)
    srv = ServerThread(config)
    with pytest.raises(nats.errors.TimeoutError):
        srv.start()
