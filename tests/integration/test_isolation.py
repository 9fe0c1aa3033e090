"""One request never fails another: a request whose fields do not fit the block codec's fixed widths is
refused alone, precisely, before it joins a group commit shared with other pchannels' producers.

Through a real node: an innocent producer pipelines batches on pchannel ``a`` while poisoned requests
(a keepalive of 2**32 ms, a 65,536-byte vchannel, 65,536 properties) hit pchannel ``b``.  Before the
fix the poisoned message failed the whole group commit, and the innocent producer lost the batches
that shared it (INVALID_MESSAGE, not retriable).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from streamingnode.server import ServerThread
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from streamingnode.wire.codes import from_rpc_error
from tests.integration.conftest import node_config
from tests.integration.rpc_helpers import columns, data, produce_batches
from wal.errors import ErrorCode

pytestmark = pytest.mark.integration

ROUNDS = 12
INNOCENT_BATCHES = 300


def _many_properties() -> dict[str, str]:
    return {f"k{i}": "" for i in range(1 << 16)}


async def _poisoned_produce(stub: sgrpc.StreamingNodeStub, batch: spb.ProduceBatch) -> pb.ErrorDetail:
    _, results = await produce_batches(stub, "b", [batch])
    (result,) = results
    assert result.WhichOneof("outcome") == "error", result
    return result.error


async def _poison(stub: sgrpc.StreamingNodeStub, innocent: asyncio.Task[object]) -> list[str]:
    """Send every kind of poisoned request, round after round, while the innocent producer runs;
    return the errors' messages."""
    seen: list[str] = []
    props = _many_properties()
    for _ in range(ROUNDS):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.BeginTxn(spb.BeginTxnRequest(pchannel="b", vchannel="v", keepalive_ms=1 << 32))
        err = from_rpc_error(caught.value)
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT and err.code is ErrorCode.INVALID_ARGUMENT
        # Refused at the RPC boundary, naming the request's own field (the WAL's check would name the
        # message's, after a transaction id was allocated).
        assert err.fields.get("field") == "keepalive_ms" and str((1 << 32) - 1) in str(err), err
        seen.append(str(err))

        detail = await _poisoned_produce(stub, spb.ProduceBatch(request_id=1, messages=[data("x" * (1 << 16), b"p")]))
        assert detail.code == pb.ERROR_CODE_INVALID_ARGUMENT and "vchannel" in detail.message, detail
        seen.append(detail.message)

        many = data("v", b"p", **props)
        detail = await _poisoned_produce(stub, spb.ProduceBatch(request_id=1, messages=[many]))
        assert detail.code == pb.ERROR_CODE_INVALID_ARGUMENT, detail
        assert "properties" in detail.message and "65535" in detail.message, detail
        seen.append(detail.message)

        batch = spb.ProduceBatch(request_id=1)
        batch.columns.CopyFrom(columns([many]))
        detail = await _poisoned_produce(stub, batch)
        assert detail.code == pb.ERROR_CODE_INVALID_ARGUMENT, detail
        assert "properties" in detail.message and "65535" in detail.message, detail
        seen.append(detail.message)
        if innocent.done():
            break
    return seen


def test_a_poisoned_request_fails_alone_and_the_innocent_producer_loses_nothing(tmp_path: Path) -> None:
    async def run(address: str) -> None:
        async with grpc.aio.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
            stub = sgrpc.StreamingNodeStub(ch)
            batches = [spb.ProduceBatch(request_id=i + 1, messages=[data("v", bytes([i % 256]) * 32) for _ in range(8)])
                       for i in range(INNOCENT_BATCHES)]
            innocent = asyncio.ensure_future(produce_batches(stub, "a", batches))
            try:
                async with asyncio.timeout(120):
                    seen = await _poison(stub, innocent)
                    _, results = await innocent
            finally:
                innocent.cancel()
            lost = [r for r in results if r.WhichOneof("outcome") != "appended"]
            assert not lost, f"{len(lost)} of {len(results)} innocent batches failed, e.g. {lost[0]}"
            assert len(results) == INNOCENT_BATCHES
            assert seen

    with ServerThread(node_config(tmp_path / "data", channels=("a", "b"), max_request_bytes=64 << 20)) as srv:
        asyncio.run(run(srv.address))
