"""The SDK in front of several nodes: routing to owners, NOT_OWNER, failover, the producer's buffer and spool.

Real nodes (ServerThread on RocksDB, one pchannel each) behind a test-only interceptor that plays the
cluster's ownership: a call on a pchannel another node owns is refused with NOT_OWNER naming it, as a
cluster node does.  ``Owners.of`` is the ownership the test changes (a missing pchannel: nobody owns it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import grpc
import pytest
from google.protobuf import message_factory

from streamingnode.client import AsyncClient
from streamingnode.server import ServerThread
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.wire.codes import to_grpc_status
from tests.integration.conftest import node_config
from tests.waiting import until
from wal.errors import NotOwnerError, ResourceExhaustedError
from wal.options import DeliverPolicy

pytestmark = pytest.mark.integration

_SERVICE = spb.DESCRIPTOR.services_by_name["StreamingNode"]
_PREFIX = f"/{_SERVICE.full_name}/"


class Owners:
    """Which node owns which pchannel, as every interceptor sees it."""

    def __init__(self) -> None:
        self.of: dict[str, str] = {}


def _pchannel(request: Any) -> str:
    if request.DESCRIPTOR.name == "CreateChannelsRequest":
        return ""  # placement is the cluster's: any node creates
    if request.DESCRIPTOR.name in ("ProduceRequest", "ConsumeRequest"):
        return str(request.open.pchannel) if request.WhichOneof("request") == "open" else ""
    fields = request.DESCRIPTOR.fields_by_name
    if "pchannel" in fields:
        return str(request.pchannel)
    if "channel_names" in fields and len(request.channel_names) == 1:
        return str(request.channel_names[0])
    return ""


class NotOwnerInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, owners: Owners) -> None:
        self.owners = owners
        self.address = ""
        self.refused = 0

    def _denial(self, request: Any) -> grpc.Status | None:
        p = _pchannel(request)
        if not p or self.owners.of.get(p, "") == self.address:
            return None
        self.refused += 1
        owner = self.owners.of.get(p, "")
        return to_grpc_status(NotOwnerError(f"pchannel {p!r} is owned by {owner or 'nobody'}", channel=p,
                                            owner=owner, term=1))

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or not details.method.startswith(_PREFIX):
            return handler
        name = details.method[len(_PREFIX):]
        cls = message_factory.GetMessageClass(_SERVICE.methods_by_name[name].input_type)
        denial = self._denial
        if handler.request_streaming:
            behaviour = handler.stream_stream

            async def streamed(request_iterator: Any, context: Any) -> Any:
                return await behaviour(request_iterator, _FirstReadChecked(context, denial))

            return grpc.stream_stream_rpc_method_handler(
                streamed, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        unary = handler.unary_unary

        async def checked(request: Any, context: Any) -> Any:
            parsed = cls.FromString(bytes(request)) if isinstance(request, bytes | bytearray) else request
            status = denial(parsed)
            if status is not None:
                await context.abort_with_status(status)
            return await unary(request, context)

        return grpc.unary_unary_rpc_method_handler(
            checked, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)


class _FirstReadChecked:
    def __init__(self, context: Any, denial: Callable[[Any], grpc.Status | None]) -> None:
        self._context = context
        self._denial = denial
        self._checked = False

    async def read(self) -> Any:
        request = await self._context.read()
        if not self._checked and request is not grpc.aio.EOF:
            self._checked = True
            status = self._denial(request)
            if status is not None:
                await self._context.abort_with_status(status)
        return request

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


class Cluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.owners = Owners()
        self.nodes: dict[str, tuple[ServerThread, NotOwnerInterceptor]] = {}

    def start(self, name: str) -> str:
        """Start node ``name`` (its data dir is kept across restarts); returns its new address."""
        interceptor = NotOwnerInterceptor(self.owners)
        real = grpc.aio.server

        def server(*args: Any, interceptors: Any = None, **kwargs: Any) -> Any:
            return real(*args, interceptors=[*(interceptors or ()), interceptor], **kwargs)

        with mock.patch.object(grpc.aio, "server", server):
            srv = ServerThread(node_config(self.root / name)).start()
        interceptor.address = srv.address
        self.nodes[name] = (srv, interceptor)
        return srv.address

    def stop(self, name: str) -> None:
        srv, _ = self.nodes.pop(name)
        srv.stop()

    def address(self, name: str) -> str:
        return self.nodes[name][0].address

    def refused(self, name: str) -> int:
        return self.nodes[name][1].refused

    def close(self) -> None:
        for name in list(self.nodes):
            self.stop(name)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        for name in ("a", "b"):
            c.start(name)
            with ServerThreadClient(c.address(name)) as create:
                create(f"p{name}")
            c.owners.of[f"p{name}"] = c.address(name)
        yield c
    finally:
        c.close()


class ServerThreadClient:
    """Creates a pchannel on one node before the interceptor knows it (a sync helper for fixtures)."""

    def __init__(self, addr: str) -> None:
        self.addr = addr

    def __enter__(self) -> Callable[[str], None]:
        return self.create

    def __exit__(self, *exc: object) -> None:
        return None

    def create(self, name: str) -> None:
        async def go() -> None:
            async with AsyncClient(self.addr) as c:
                await c.create_channels([name])
        asyncio.run(go())


async def _payloads(client: AsyncClient, pchannel: str, n: int) -> list[bytes]:
    """The first ``n`` payloads of ``pchannel``'s vchannel "v", read through ``client``."""
    out: list[bytes] = []
    consumer = client.consumer(pchannel, "v", policy=DeliverPolicy.all())
    try:
        async with asyncio.timeout(30):
            async for pack in consumer:
                out.extend(m.payload for m in pack.messages if m.vchannel == "v")
                if len(out) >= n:
                    break
    finally:
        await consumer.aclose()
    return out


async def test_calls_on_any_pchannel_through_any_seed_reach_its_owner(cluster: Cluster) -> None:
    a, b = cluster.address("a"), cluster.address("b")
    for seeds in ([a, b], f"{b},{a}"):
        async with AsyncClient(seeds) as client:
            for p in ("pa", "pb"):
                result = await client.producer(p).send("v", f"{p}-{seeds!s}".encode())
                last, _ = await client.latest_position(p, "v")
                # The newest confirmed message of the pchannel: the send, or a TimeTick persisted after it.
                assert last is not None and last.message_id >= result.message_id
                await client.create_group(p, f"g{len(str(seeds))}")
                assert [d.name for d in await client.describe_channels([p])] == [p]
            assert client.router.cached_owner("pa") == a
            assert client.router.cached_owner("pb") == b


async def test_not_owner_is_followed_and_the_owner_cached(cluster: Cluster) -> None:
    a, b = cluster.address("a"), cluster.address("b")
    async with AsyncClient(a) as client:  # one seed, which does not own pb
        await client.producer("pb").send("v", b"x")
        refused = cluster.refused("a")
        assert refused >= 1
        assert client.router.cached_owner("pb") == b
        for _ in range(3):
            await client.latest_position("pb", "v")
        await client.producer("pb").send("v", b"y")
        assert cluster.refused("a") == refused  # cached: a is not asked again
        assert await _payloads(client, "pb", 2) == [b"x", b"y"]


async def test_sends_during_a_failover_are_buffered_and_delivered_once_in_order(cluster: Cluster) -> None:
    a, old_b = cluster.address("a"), cluster.address("b")
    async with AsyncClient([a, old_b], reconnect_timeout=60.0) as client:
        producer = client.producer("pb", producer_id="failover", linger=0)
        before = [await producer.send("v", f"m{i}".encode()) for i in range(5)]
        assert len(before) == 5
        cluster.owners.of.pop("pb")  # nobody owns pb while its node is away
        cluster.stop("b")
        during = [producer.send_nowait("v", f"m{i}".encode()) for i in range(5, 25)]
        await until(lambda: not producer.connected and producer.buffered_bytes > 0, "the producer notices")
        assert not any(f.done() for f in during)
        new_b = cluster.start("b")  # same data dir, another port
        assert new_b != old_b
        cluster.owners.of["pb"] = new_b
        async with asyncio.timeout(30):
            results = await asyncio.gather(*during)
        assert [r.message_id for r in results] == sorted(r.message_id for r in results)
        assert client.router.cached_owner("pb") == new_b
        assert producer.buffered_bytes == 0
        # Exactly once: nothing between the 25 and a mark written after them (the newest position
        # would not tell: a TimeTick persisted after the last send moves it).
        await client.producer("pb").send("v", b"END")
        assert await _payloads(client, "pb", 26) == [f"m{i}".encode() for i in range(25)] + [b"END"]


async def test_a_full_buffer_fails_or_blocks_as_configured(cluster: Cluster) -> None:
    a = cluster.address("a")
    cluster.owners.of.pop("pa")  # nobody answers for pa: everything stays buffered
    async with AsyncClient([a, cluster.address("b")]) as client:
        failing = client.producer("pa", producer_id="full-fail", buffer_bytes=1000, on_full="fail", linger=0)
        accepted = [failing.send_nowait("v", b"f" * 99) for _ in range(10)]  # 100 bytes each with "v"
        with pytest.raises(ResourceExhaustedError, match="buffer_bytes=1000"):
            failing.send_nowait("v", b"f" * 99)
        with pytest.raises(ResourceExhaustedError, match="buffer_bytes"):
            await failing.send("v", b"f" * 99)
        assert failing.buffered_bytes == 1000

        blocking = client.producer("pa", producer_id="full-block", buffer_bytes=1000, linger=0)
        queued = [blocking.send_nowait("v", b"b" * 99) for _ in range(10)]
        with pytest.raises(TimeoutError):
            await blocking.send("v", b"late" * 20, timeout=0.2)
        waiting = asyncio.ensure_future(blocking.send("v", b"b" * 99))
        await until(lambda: blocking.buffered_bytes == 1000 and not waiting.done(), "the sender waits for room")
        cluster.owners.of["pa"] = a
        async with asyncio.timeout(30):
            await asyncio.gather(*accepted, *queued, waiting)
        payloads = await _payloads(client, "pa", 21)
        # Two producers, each delivered whole (their relative order is whichever reconnected first).
        assert sorted(payloads) == [b"b" * 99] * 11 + [b"f" * 99] * 10


async def test_the_spool_survives_a_client_restart_and_is_delivered_once(cluster: Cluster, tmp_path: Path) -> None:
    a, b = cluster.address("a"), cluster.address("b")
    spool = tmp_path / "spool"
    async with AsyncClient([a, b]) as first:
        producer = first.producer("pb", producer_id="spooled", spool_dir=spool, linger=0)
        await producer.send("v", b"s0")  # answered: never sent again
        cluster.owners.of.pop("pb")
        cluster.stop("b")
        pending = [producer.send_nowait("v", f"s{i}".encode()) for i in range(1, 6)]
        await until(lambda: not producer.connected and any(os.path.getsize(p) for p in spool.iterdir()),
                    "the batch is spooled")
        # The client dies with its messages unanswered: close abandons the drain (cancelled).
        closing = asyncio.ensure_future(producer.aclose())
        await until(lambda: producer.draining, "closing")
        closing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await closing
        assert not any(f.done() and f.exception() is None for f in pending)
    cluster.owners.of["pb"] = new_b = cluster.start("b")
    async with AsyncClient([a, new_b]) as second:
        again = second.producer("pb", producer_id="spooled", spool_dir=spool, linger=0)
        assert len(again.recovered) == 5
        async with asyncio.timeout(30):
            await asyncio.gather(*again.recovered)
        await again.send("v", b"s6")
        await second.producer("pb").send("v", b"END")  # nothing between s6 and it: no duplicate
        assert await _payloads(second, "pb", 8) == [f"s{i}".encode() for i in range(7)] + [b"END"]
        await again.aclose()
        # Everything answered: the spool is empty, and a third producer has nothing to resend.
        third = second.producer("pb", producer_id="spooled", spool_dir=spool)
        assert third.recovered == []
        await third.aclose()


def test_the_cli_takes_several_addresses_and_reaches_the_owner(cluster: Cluster) -> None:
    a, b = cluster.address("a"), cluster.address("b")
    env = {k: v for k, v in os.environ.items() if k != "STREAMINGNODE_ADDR"}

    def cli(*args: str, stdin: str | None = None) -> str:
        proc = subprocess.run([sys.executable, "-m", "streamingnode", *args], input=stdin, capture_output=True,
                              text=True, timeout=120, env=env, check=False)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    dead = f"127.0.0.1:{_free_port()}"
    # Repeated --addr, and a comma list, each with a seed that is down: the others answer.
    cli("produce", "--channel", "pb", "--vchannel", "v", "--addr", b, "--addr", dead, stdin='{"payload": "one"}\n')
    out = cli("consume", "--quiet", "--channel", "pb", "--vchannel", "v", "--count", "1", "--addr", f"{dead},{a}")
    assert [json.loads(line)["payload"] for line in out.splitlines()] == ["one"]
    assert cluster.refused("b") == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
