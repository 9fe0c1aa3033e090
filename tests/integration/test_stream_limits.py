"""Caps on open streams: ``max_streams`` per node and ``max_streams_per_connection`` per client
connection.  One over a cap is refused RESOURCE_EXHAUSTED with ErrorInfo naming the cap; a stream that
ends frees its slot at once; the SDK backs off and gets in once a slot frees."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from streamingnode.client import AsyncClient
from streamingnode.server import ServerThread
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from streamingnode.wire.codes import from_rpc_error
from tests.integration.conftest import node_config
from tests.waiting import until
from wal.errors import ErrorCode

pytestmark = pytest.mark.integration


@pytest.fixture
def small(tmp_path: Path) -> Iterator[ServerThread]:
    """A node that takes 3 streams in all, 2 per connection."""
    srv = ServerThread(node_config(tmp_path / "data", max_streams=3, max_streams_per_connection=2, channels=("p",)))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@contextlib.asynccontextmanager
async def connection(address: str) -> AsyncIterator[sgrpc.StreamingNodeStub]:
    """A stub on a connection of its own (channels with equal options would share one socket)."""
    async with grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        yield sgrpc.StreamingNodeStub(channel)


async def open_produce(stub: sgrpc.StreamingNodeStub) -> Any:
    """A Produce stream the node answered 'opened' on (it holds a slot until cancelled)."""
    call = stub.Produce()
    await call.write(spb.ProduceRequest(open=spb.ProduceOpen(pchannel="p")))
    first = await call.read()
    assert first is not grpc.aio.EOF and first.WhichOneof("response") == "opened"
    return call


async def open_consume(stub: sgrpc.StreamingNodeStub) -> Any:
    call = stub.Consume()
    await call.write(spb.ConsumeRequest(open=spb.ConsumeOpen(pchannel="p")))
    first = await call.read()
    assert first is not grpc.aio.EOF and first.WhichOneof("response") == "opened"
    return call


async def refused(stub: sgrpc.StreamingNodeStub) -> dict[str, str]:
    """Open one more Produce stream and expect it refused: the ErrorInfo metadata."""
    call = stub.Produce()
    # The status is read from the call, not from the write: a write racing with the refusal fails
    # locally (INTERNAL) whatever status the node sent.
    with contextlib.suppress(grpc.aio.AioRpcError):
        await call.write(spb.ProduceRequest(open=spb.ProduceOpen(pchannel="p")))
        assert await call.read() is grpc.aio.EOF
    code = await call.code()
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
    exc = from_rpc_error(grpc.aio.AioRpcError(code, await call.initial_metadata(), await call.trailing_metadata(),
                                              await call.details()))
    assert exc.code is ErrorCode.RESOURCE_EXHAUSTED and exc.retriable
    return {k: str(v) for k, v in exc.fields.items()} | {"message": str(exc)}


def gauge(srv: ServerThread) -> float:
    """Streams open on the node, as its metric shows them."""
    return srv.node.metrics.open_streams._value.get()  # type: ignore[no-any-return]


def refusals(srv: ServerThread, cap: str) -> float:
    return srv.node.metrics.streams_refused.labels(cap)._value.get()  # type: ignore[no-any-return]


async def test_the_per_connection_cap_refuses_one_more_and_frees_a_slot_on_close(small: ServerThread) -> None:
    async with connection(small.address) as a, connection(small.address) as b:
        held = [await open_produce(a), await open_consume(a)]
        info = await refused(a)
        assert info["limit"] == "max_streams_per_connection" and info["max_streams_per_connection"] == "2"
        assert "max_streams_per_connection=2" in info["message"]
        assert refusals(small, "connection") == 1
        # The cap of connection a does not hold back connection b.
        other = await open_produce(b)
        held[0].cancel()
        await until(lambda: gauge(small) == 2, "the cancelled stream's slot to be freed")
        held[0] = await open_produce(a)
        for call in (*held, other):
            call.cancel()
        await until(lambda: gauge(small) == 0, "every slot freed")


async def test_the_node_cap_counts_every_connection(small: ServerThread) -> None:
    async with connection(small.address) as a, connection(small.address) as b:
        held = [await open_produce(a), await open_produce(a), await open_consume(b)]
        info = await refused(b)  # b has one stream, under its cap of 2: the node's cap of 3 refuses
        assert info["limit"] == "max_streams" and info["max_streams"] == "3"
        assert "max_streams=3" in info["message"]
        assert refusals(small, "node") == 1
        # A stream that ends on its own (the client closes it) frees its slot too.
        await held[2].write(spb.ConsumeRequest(close=spb.ConsumeClose()))
        while await held[2].read() is not grpc.aio.EOF:
            pass
        await until(lambda: gauge(small) == 2, "the closed stream's slot to be freed")
        held[2] = await open_produce(b)
        for call in held:
            call.cancel()
        await until(lambda: gauge(small) == 0, "every slot freed")


async def test_the_sdk_backs_off_on_a_full_node_and_gets_in_once_a_slot_frees(tmp_path: Path) -> None:
    srv = ServerThread(node_config(tmp_path / "data", max_streams=1, channels=("p",)))
    srv.start()
    try:
        async with connection(srv.address) as raw, AsyncClient(srv.address, timeout=10.0,
                                                               reconnect_timeout=20.0) as client:
            blocker = await open_produce(raw)
            producer = client.producer("p")
            started = time.monotonic()
            sending = asyncio.ensure_future(producer.send("v", b"x"))
            await until(lambda: refusals(srv, "node") >= 4, "the SDK to be refused four times")
            # Backing off, not spinning: 50, 100 and 200 ms (plus jitter) lie between four attempts.
            assert time.monotonic() - started >= 0.3
            assert not sending.done()
            blocker.cancel()
            result = await asyncio.wait_for(sending, 10)
            assert result.message_id > 0
            await producer.aclose()
    finally:
        srv.stop()
