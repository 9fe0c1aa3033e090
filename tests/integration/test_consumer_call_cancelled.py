"""A consumer's gRPC call cancelled under it (grpc.aio cancels the call whose write a caller's
cancellation interrupts, as when a task is cancelled inside ``ack``): the consumer opens the stream
again, loses and repeats nothing, and its acks still land; its reader task never ends cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from streamingnode.client import AsyncClient
from tests.waiting import until


@pytest.fixture
async def client(server: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server, timeout=10.0, reconnect_timeout=10.0) as c:
        yield c


async def test_a_consumer_whose_call_is_cancelled_opens_again_and_loses_nothing(client: AsyncClient) -> None:
    await client.create_channels(["p"])
    await client.create_group("p", "g")
    async with client.producer("p") as producer:
        for i in range(5):
            await producer.send("v", b"a%d" % i)
    got: list[bytes] = []
    async with asyncio.timeout(60):
        consumer = client.consumer("p", "v", group="g")
        try:
            async for pack in consumer:
                got.extend(m.payload for m in pack.messages if m.vchannel == "v")
                await consumer.ack(pack)
                if len(got) >= 5:
                    break
            call = consumer._call
            assert call is not None
            call.cancel()  # what a cancelled write does to the call it was writing to

            async def reopened() -> bool:
                return consumer.reconnects >= 1

            await until(reopened, "the consumer to open its stream again", timeout=30)
            async with client.producer("p") as producer:
                for i in range(5, 8):
                    await producer.send("v", b"a%d" % i)
            async for pack in consumer:
                got.extend(m.payload for m in pack.messages if m.vchannel == "v")
                await consumer.ack(pack)
                if len(got) >= 8:
                    break
        finally:
            await consumer.aclose()
    assert got == [b"a%d" % i for i in range(8)]
    assert consumer._task is not None and not consumer._task.cancelled()
