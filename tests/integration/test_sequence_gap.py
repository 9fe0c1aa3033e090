"""An idempotent producer's sequence may not skip ahead: the node refuses the batch that would leave a
hole (OUT_OF_ORDER_SEQUENCE, nothing of it written), over raw gRPC and through the SDK."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from streamingnode.client import AsyncClient
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.wire.codes import GRPC_CODE, from_error_detail
from tests.integration.rpc_helpers import consume, data, payloads, produce, produce_batches
from wal.errors import ChannelNotExistError, ErrorCode, OutOfOrderSequenceError
from wal.message import MessageType

pytestmark = pytest.mark.integration


def _error(result: spb.ProduceBatchResult) -> pb.ErrorDetail:
    assert result.WhichOneof("outcome") == "error", result
    return result.error


async def test_a_skipped_sequence_is_refused_and_nothing_of_its_batch_is_written(stub) -> None:
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    _, first = await produce(stub, "p", [[data("v", b"a"), data("v", b"b")]], producer_id="g")
    assert first[0].HasField("appended")
    # Sequences 0 and 1 are written; a batch starting at 5 skips 2..4.
    _, gap = await produce(stub, "p", [[data("v", b"lost-5"), data("v", b"lost-6")]], producer_id="g",
                           first_sequence=5)
    err = _error(gap[0])
    assert err.code == pb.ERROR_CODE_OUT_OF_ORDER_SEQUENCE and not err.retriable
    assert dict(err.metadata) == {"producer_id": "g", "expected": "2", "got": "5"}
    assert "g" in err.message and "2" in err.message and "5" in err.message
    assert isinstance(from_error_detail(err), OutOfOrderSequenceError)
    assert GRPC_CODE[ErrorCode.OUT_OF_ORDER_SEQUENCE] is grpc.StatusCode.FAILED_PRECONDITION
    # Duplicates are still answered from the table, and the next sequence in line is taken.
    _, again = await produce(stub, "p", [[data("v", b"a"), data("v", b"b")]], producer_id="g")
    assert again[0].appended == first[0].appended
    _, more = await produce(stub, "p", [[data("v", b"c")]], producer_id="g", first_sequence=2)
    assert more[0].HasField("appended")
    got = payloads(await consume(stub, spb.ConsumeOpen(pchannel="p"), until=3))
    assert got == [b"a", b"b", b"c"]


async def test_a_gap_inside_a_pipelined_stream_refuses_only_that_batch(stub) -> None:
    """Batches in flight together count: the second follows the first, still unwritten when it
    arrives; the third skips one and is refused; the fourth follows the second and is written."""
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    batches = [
        spb.ProduceBatch(request_id=1, first_sequence=10, messages=[data("v", b"s10"), data("v", b"s11")]),
        spb.ProduceBatch(request_id=2, first_sequence=12, messages=[data("v", b"s12")]),
        spb.ProduceBatch(request_id=3, first_sequence=14, messages=[data("v", b"s14")]),
        spb.ProduceBatch(request_id=4, first_sequence=13, messages=[data("v", b"s13")]),
    ]
    _, results = await produce_batches(stub, "p", batches, producer_id="pipe")
    assert [r.WhichOneof("outcome") for r in results] == ["appended", "appended", "error", "appended"]
    assert dict(results[2].error.metadata) == {"producer_id": "pipe", "expected": "13", "got": "14"}
    assert payloads(await consume(stub, spb.ConsumeOpen(pchannel="p"), until=4)) == [b"s10", b"s11", b"s12", b"s13"]


async def test_a_refused_batch_is_no_gap(stub) -> None:
    """A batch the node refused (before the chain or inside it) was answered: its producer goes on
    after it, and that is not a hole."""
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    await produce(stub, "p", [[data("v", b"a")]], producer_id="r")
    # Sequence 1: a reserved property, refused before the chain.
    _, bad = await produce(stub, "p", [[data("v", b"bad", producer_seq="7")]], producer_id="r", first_sequence=1)
    assert _error(bad[0]).code == pb.ERROR_CODE_INVALID_ARGUMENT
    # Sequence 2: a transaction the node does not know, refused inside the chain.
    _, unknown = await produce(stub, "p", [[data("v", b"txn")]], producer_id="r", first_sequence=2,
                               txn=pb.TxnContext(txn_id=987654321))
    assert _error(unknown[0]).code == pb.ERROR_CODE_TXN_NOT_FOUND
    _, ok = await produce(stub, "p", [[data("v", b"b")]], producer_id="r", first_sequence=3)
    assert ok[0].HasField("appended"), ok[0]
    assert payloads(await consume(stub, spb.ConsumeOpen(pchannel="p"), until=2)) == [b"a", b"b"]


@pytest.fixture
async def client(server: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server, timeout=10.0, reconnect_timeout=10.0) as c:
        yield c


async def test_the_sdk_surfaces_a_gap_and_does_not_retry_it(client: AsyncClient) -> None:
    await client.create_channels(["p"])
    async with client.producer("p", producer_id="sdk") as first:
        await first.send("v", b"a")
        await first.send("v", b"b")
    async with client.producer("p", producer_id="sdk", first_sequence=10) as skipping:
        with pytest.raises(OutOfOrderSequenceError) as err:
            await skipping.send("v", b"lost")
        assert err.value.fields == {"producer_id": "sdk", "expected": "2", "got": "10"}
        assert not err.value.retriable
        assert skipping.batches_written == 1 and skipping.reconnects == 0  # answered once, not resent
    async with client.producer("p", producer_id="sdk", first_sequence=2) as going_on:
        await going_on.send("v", b"end")
    async with client.consumer("p", "v") as consumer:
        got: list[bytes] = []
        async with asyncio.timeout(10):
            async for pack in consumer:
                got += [m.payload for m in pack.messages if m.message_type is MessageType.DATA]
                if b"end" in got:
                    break
    assert got == [b"a", b"b", b"end"]


async def test_the_sdk_gives_back_the_sequences_of_batches_never_written(client: AsyncClient) -> None:
    """A batch failed before any stream took it (the channel does not exist) leaves no hole: the
    producer's next sequence is where it was."""
    async with client.producer("missing", producer_id="back", first_sequence=7) as producer:
        with pytest.raises(ChannelNotExistError):
            await producer.send("v", b"x")
        assert producer.next_sequence == 7
