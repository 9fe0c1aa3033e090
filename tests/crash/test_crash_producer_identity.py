"""A producer's epoch and high-water mark survive a SIGKILL of the node: after the restart a new open
of the id gets a higher epoch than any handed out before (even one opened without writing), the
next sequence continues where the log ends, the zombie of an older epoch stays fenced, and a changed
resend is still refused while an identical one gets its original id."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from streamingnode.client import AsyncClient, DuplicateSequenceMismatchError, ProducerFencedError
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from streamingnode.wire.codes import from_rpc_error
from tests.crash.evidence import stderr_on_failure
from tests.node_process import NodeProcess
from wal.errors import ErrorCode
from wal.message import MessageType

pytestmark = pytest.mark.crash


async def _open(address: str, producer_id: str, epoch: int | None = None) -> spb.ProduceOpened:
    async with grpc.aio.insecure_channel(address) as channel:
        call = sgrpc.StreamingNodeStub(channel).Produce()
        await call.write(spb.ProduceRequest(open=spb.ProduceOpen(pchannel="ch", producer_id=producer_id,
                                                                 producer_epoch=epoch)))
        try:
            first = await call.read()
        finally:
            call.cancel()
        return first.opened


async def test_epoch_and_high_water_survive_a_sigkill_of_the_node(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path / "data", None, "--channels", "ch").start()
    try:
        with stderr_on_failure(lambda: node.stderr, "node"):
            async with (AsyncClient(node.address, reconnect_timeout=60.0, timeout=30.0) as client,
                        client.producer("ch", producer_id="durable") as producer):
                original = [await producer.send("v", b"m%d" % i) for i in range(10)]
                assert producer.epoch == 1
            opened = await _open(node.address, "durable")  # epoch 2, nothing written under it
            assert (opened.producer_epoch, opened.next_sequence) == (2, 10)

            node.kill()
            node.start()

            with pytest.raises(grpc.aio.AioRpcError) as zombie:
                await _open(node.address, "durable", epoch=1)
            assert from_rpc_error(zombie.value).code is ErrorCode.PRODUCER_FENCED
            assert (await _open(node.address, "durable", epoch=2)).next_sequence == 10
            async with AsyncClient(node.address, reconnect_timeout=60.0, timeout=30.0) as client:
                async with client.producer("ch", producer_id="durable", first_sequence=0) as resend:
                    with pytest.raises(DuplicateSequenceMismatchError):
                        await resend.send("v", b"changed")
                async with client.producer("ch", producer_id="durable", first_sequence=0) as resend:
                    assert await resend.send("v", b"m0") == original[0]
                    assert resend.epoch == 4, "epoch 2 was presented again (kept), 3 went to the open before"
                async with client.producer("ch", producer_id="durable") as after:
                    fresh = await after.send("v", b"m10")
                    assert after.epoch == 5 and after.next_sequence == 11
                    assert fresh.message_id > original[-1].message_id
                old = client.producer("ch", producer_id="durable", linger=0)
                await old.send("v", b"m11")
                async with client.producer("ch", producer_id="durable") as newer:
                    await newer.send("v", b"m12")
                    # Both streams break with the node; each reconnects presenting its epoch, and the
                    # zombie's open is refused: it never takes the id back from its replacement.
                    node.kill()
                    node.start()
                    await newer.send("v", b"m13")
                    with pytest.raises(ProducerFencedError):
                        await old.send("v", b"zombie")
                    await newer.send("v", b"m14")
                await old.aclose()
                async with client.producer("ch") as tail:
                    await tail.send("v", b"end")
                async with client.consumer("ch", "v") as consumer:
                    got: list[bytes] = []
                    async with asyncio.timeout(30):
                        async for pack in consumer:
                            got += [m.payload for m in pack.messages if m.message_type is MessageType.DATA]
                            if got and got[-1] == b"end":
                                break
                assert got == [b"m%d" % i for i in range(15)] + [b"end"]
    finally:
        node.kill()
