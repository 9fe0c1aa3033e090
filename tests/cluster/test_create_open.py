"""CreateChannels on the shared log returns once every new pchannel is open at its owner: a call made
there right after it returns is served, never refused as "being opened"."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import grpc
import nats
import pytest

from streamingnode.cluster.kv import bucket
from streamingnode.cluster.leases import Leases
from streamingnode.cluster.membership import Membership
from streamingnode.cluster.ownership import Ownership
from streamingnode.node.node import Node
from streamingnode.server import ServerThread
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from streamingnode.wire.codes import from_rpc_error
from tests.integration.conftest import node_config
from tests.natscluster import NatsCluster
from tests.waiting import until

pytestmark = pytest.mark.integration

_prefixes = itertools.count()


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """Pchannel "slow" opens only once the gate is set (a long recovery), on every in-process node."""
    opened = threading.Event()
    real = Node._take

    async def slow_take(self: Node, name: str, term: int) -> int:
        if name == "slow":
            await asyncio.to_thread(opened.wait, 30)
        return await real(self, name, term)

    with mock.patch.object(Node, "_take", slow_take):
        try:
            yield opened
        finally:
            opened.set()


@pytest.fixture
def nodes(nats_r1: NatsCluster, tmp_path: Path, gate: threading.Event) -> Iterator[list[ServerThread]]:
    prefix = f"o{next(_prefixes)}"
    started: list[ServerThread] = []
    try:
        for node_id in ("a", "b"):
            started.append(ServerThread(node_config(
                tmp_path / node_id, wal="jetstream", cluster_nats=nats_r1.url, nats_replicas=1, node_id=node_id,
                lease_seconds=2.0, cluster_prefix=prefix, flusher=False)).start())
        yield started
    finally:
        gate.set()
        for srv in started:
            srv.stop()


async def test_create_channels_returns_once_the_pchannel_is_open_at_its_owner(
    nodes: list[ServerThread], gate: threading.Event,
) -> None:
    channels = {srv.address: grpc.aio.insecure_channel(srv.address) for srv in nodes}
    try:
        stubs = {addr: sgrpc.StreamingNodeStub(ch) for addr, ch in channels.items()}
        first = stubs[nodes[0].address]
        async def create_slow() -> None:
            await first.CreateChannels(spb.CreateChannelsRequest(channel_names=["slow"]))

        create = asyncio.create_task(create_slow())
        owner: list[str] = []

        async def leased() -> bool:
            try:
                described = await first.DescribeChannels(spb.DescribeChannelsRequest(channel_names=["slow"]))
            except grpc.aio.AioRpcError as exc:
                if exc.code() is grpc.StatusCode.NOT_FOUND:
                    return False  # not created yet
                raise
            owner[:] = [d.owner.address for d in described.descriptions if d.owner.address]
            return bool(owner)

        await until(leased, "the new pchannel's lease taken", timeout=20)
        # Leased but not open: CreateChannels is still waiting (a bounded look: nothing to wait on
        # for something that must not happen).
        done, _ = await asyncio.wait([create], timeout=1.0)
        assert not done, "CreateChannels returned before the pchannel was open at its owner"
        gate.set()
        await asyncio.wait_for(create, 20)
        try:  # at once, at the owner, with no retry
            await stubs[owner[0]].GetLatestPosition(spb.GetLatestPositionRequest(pchannel="slow"))
        except grpc.aio.AioRpcError as exc:
            raise AssertionError(f"at {owner[0]}: {from_rpc_error(exc)!r}") from exc
    finally:
        for ch in channels.values():
            await ch.close()


async def test_a_lease_says_serving_only_once_its_holder_opened_the_pchannel(nats_r1: NatsCluster) -> None:
    prefix = f"o{next(_prefixes)}"
    nc = await nats.connect(nats_r1.url)
    try:
        js = nc.jetstream()
        leases = Leases(await bucket(js, f"{prefix}_leases"), "a", "addr-a", 5.0)
        membership = Membership(await bucket(js, f"{prefix}_nodes"), "a", "addr-a", 5.0)
        opening, opened = asyncio.Event(), asyncio.Event()

        async def on_take(name: str, term: int) -> int:
            opening.set()
            await opened.wait()  # a slow open (recovery of a long log)
            return term

        async def on_lose(name: str, reason: str) -> None:
            return None

        async def names() -> list[str]:
            return ["p"]

        ownership = Ownership(membership, leases, names, on_take, on_lose)
        step = asyncio.create_task(ownership.step())
        await asyncio.wait_for(opening.wait(), 10)
        during = await leases.read("p")
        assert during.held() and during.node == "a" and not during.serving  # taken, not open yet
        opened.set()
        await asyncio.wait_for(step, 10)
        after = await leases.read("p")
        assert after.held() and after.serving and after.term == during.term

        async def renewed_still_serving() -> bool:
            await ownership.step()
            return (await leases.read("p")).revision > after.revision
        await until(renewed_still_serving, "a renewal")
        assert (await leases.read("p")).serving
        released = await leases.release(await leases.read("p"))
        assert released is not None and not released.serving
    finally:
        await nc.close()
