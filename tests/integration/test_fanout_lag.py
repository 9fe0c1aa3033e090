"""Appends first: while appends go on, delivery to many readers takes at most its share of the
node's event loop; readers fall behind during the burst and catch up after it, each getting every
message exactly once, in order."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from streamingnode.server import ServerThread
from streamingnode.server.fanout import fanout_of
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from tests.integration.rpc_helpers import data, produce
from tests.integration.test_fanout import CONSUME, _ids
from tests.waiting import until

pytestmark = pytest.mark.integration

READERS = 12
BATCHES = 60
PER_BATCH = 50


async def test_readers_lag_behind_a_burst_of_appends_then_get_every_message_once_in_order(
    server_thread: ServerThread,
) -> None:
    node = server_thread.node
    turns = fanout_of(node).turns
    # A small share: the readers fall well behind during the burst, and catch up after it.
    turns.share = 0.02
    async with grpc.aio.insecure_channel(server_thread.address) as channel:
        stub = sgrpc.StreamingNodeStub(channel)
        await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
        got: list[list[int]] = [[] for _ in range(READERS)]
        opened = 0

        async def tail(k: int) -> None:
            nonlocal opened
            call = channel.stream_stream(CONSUME)()
            await call.write(spb.ConsumeRequest(open=spb.ConsumeOpen(pchannel="p", vchannel="v")).SerializeToString())
            try:
                await call.read()  # 'opened'
                opened += 1
                while True:
                    raw = await call.read()
                    assert raw is not grpc.aio.EOF
                    got[k].extend(_ids(raw)[0])
            finally:
                call.cancel()

        readers = [asyncio.ensure_future(tail(k)) for k in range(READERS)]
        try:
            await until(lambda: opened == READERS, "every reader open")
            held_before = turns.held_back
            _, results = await produce(stub, "p", [[data("v", bytes([b]) * 1024) for _ in range(PER_BATCH)]
                                                   for b in range(BATCHES)])
            produced = [int.from_bytes(r.id.id, "big") for res in results for r in res.appended.results]
            assert len(produced) == BATCHES * PER_BATCH
            # Delivery waited for the appends.  (How far the readers fell behind depends on the
            # machine's speed, so it is not asserted; the accounting is tested in tests/unit.)
            assert turns.held_back > held_before
            # After the burst the readers catch up: each gets every message once, in order.
            await until(lambda: all(len(g) >= len(produced) for g in got), "every reader caught up", timeout=120)
            for k, g in enumerate(got):
                assert g == produced, f"reader {k}"
        finally:
            for r in readers:
                r.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
