"""A producer whose owner went away while the other nodes answer every owner lookup with
DEADLINE_EXCEEDED (as nodes that cannot read the shared log do during a NATS outage) keeps its sends
buffered and goes on looking, until the lookups answer again; then everything is delivered once, in
order.  Before, the first lookup answered DEADLINE_EXCEEDED was re-raised, DEADLINE_EXCEEDED was not a
code a reopening stream retries, and the producer failed everything it held at once.

On the routing test's cluster of real nodes whose ownership the test sets
(``tests/cluster/test_client_routing.py``), with one more rule in each node's interceptor: while
``lookups_time_out`` is set, DescribeChannels is refused DEADLINE_EXCEEDED (with the ErrorInfo a node's
own refusal carries)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import grpc
import pytest

from streamingnode.client import AsyncClient
from streamingnode.server import ServerThread
from streamingnode.wire.codes import to_grpc_status
from tests.cluster import test_client_routing as routing
from tests.cluster.test_client_routing import Cluster, ServerThreadClient, _payloads
from tests.integration.conftest import node_config
from tests.waiting import until
from wal.errors import DeadlineExceededError

pytestmark = pytest.mark.integration


class _Outage:
    def __init__(self) -> None:
        self.lookups_time_out = False
        self.timed_out = 0


class _LookupsTimeOut(routing.NotOwnerInterceptor):
    def __init__(self, owners: routing.Owners, outage: _Outage) -> None:
        super().__init__(owners)
        self.outage = outage

    def _denial(self, request: Any) -> grpc.Status | None:
        if self.outage.lookups_time_out and request.DESCRIPTOR.name == "DescribeChannelsRequest":
            self.outage.timed_out += 1
            return to_grpc_status(DeadlineExceededError("DescribeChannels: the shared log did not answer in time"))
        return super()._denial(request)


class _Cluster(Cluster):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.outage = _Outage()

    def start(self, name: str) -> str:
        interceptor = _LookupsTimeOut(self.owners, self.outage)
        real = grpc.aio.server

        def server(*args: Any, interceptors: Any = None, **kwargs: Any) -> Any:
            return real(*args, interceptors=[*(interceptors or ()), interceptor], **kwargs)

        with mock.patch.object(grpc.aio, "server", server):
            srv = ServerThread(node_config(self.root / name)).start()
        interceptor.address = srv.address
        self.nodes[name] = (srv, interceptor)
        return srv.address


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[_Cluster]:
    c = _Cluster(tmp_path)
    try:
        for name in ("a", "b"):
            c.start(name)
        with ServerThreadClient(c.address("b")) as create:
            create("pb")
        c.owners.of["pb"] = c.address("b")
        yield c
    finally:
        c.close()


async def test_a_producer_keeps_looking_for_its_owner_while_lookups_time_out(cluster: _Cluster) -> None:
    a, old_b = cluster.address("a"), cluster.address("b")
    async with AsyncClient([a, old_b], timeout=5.0, reconnect_timeout=120.0) as client:
        producer = client.producer("pb", producer_id="lookups", linger=0)
        before = [await producer.send("v", f"m{i}".encode()) for i in range(5)]
        assert len(before) == 5
        cluster.outage.lookups_time_out = True
        cluster.owners.of.pop("pb")
        cluster.stop("b")  # the owner is gone; a answers every lookup DEADLINE_EXCEEDED
        during = [producer.send_nowait("v", f"m{i}".encode()) for i in range(5, 25)]
        await until(lambda: cluster.outage.timed_out >= 3 or any(f.done() for f in during),
                    "several lookups answered DEADLINE_EXCEEDED", timeout=60)
        failed = [f.exception() for f in during if f.done()]
        assert failed == [], f"sends failed while the lookups timed out: {failed[:2]}"
        new_b = cluster.start("b")
        cluster.owners.of["pb"] = new_b
        cluster.outage.lookups_time_out = False
        async with asyncio.timeout(60):
            results = await asyncio.gather(*during)
        assert [r.message_id for r in results] == sorted(r.message_id for r in results)
        assert client.router.cached_owner("pb") == new_b
        await client.producer("pb").send("v", b"END")
        assert await _payloads(client, "pb", 26) == [f"m{i}".encode() for i in range(25)] + [b"END"]
