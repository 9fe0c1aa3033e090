"""The gRPC status code of a failed call, as a client without our SDK reads it: ``rpc_error.code()``.

The expected codes are written out by hand (see tests/unit/test_status.py): clients retry on the code,
so a fenced channel answered with UNAVAILABLE would be retried forever.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import pytest

from streamingnode.server import ServerThread
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from tests.integration.rpc_helpers import consume, data, produce

pytestmark = pytest.mark.integration


async def _code_of(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    return err.value.code()


async def test_unary_calls_fail_with_the_expected_status_code(stub) -> None:
    assert await _code_of(stub.DescribeChannels(spb.DescribeChannelsRequest(channel_names=["nope"]))) \
        is grpc.StatusCode.NOT_FOUND
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    assert await _code_of(stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))) \
        is grpc.StatusCode.ALREADY_EXISTS
    assert await _code_of(stub.CreateChannels(spb.CreateChannelsRequest(channel_names=[""]))) \
        is grpc.StatusCode.INVALID_ARGUMENT
    assert await _code_of(stub.CommitTxn(spb.CommitTxnRequest(pchannel="p", vchannel="v", txn_id=12345))) \
        is grpc.StatusCode.NOT_FOUND
    begun = await stub.BeginTxn(spb.BeginTxnRequest(pchannel="p", vchannel="v", keepalive_ms=60_000))
    await stub.CommitTxn(spb.CommitTxnRequest(pchannel="p", vchannel="v", txn_id=begun.txn_id))
    assert await _code_of(stub.CommitTxn(spb.CommitTxnRequest(pchannel="p", vchannel="v", txn_id=begun.txn_id))) \
        is grpc.StatusCode.FAILED_PRECONDITION


async def test_a_read_outside_the_log_fails_out_of_range(stub) -> None:
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    await produce(stub, "p", [[data("v", b"x")]])
    beyond = pb.MessageID(id=(1 << 40).to_bytes(8, "big"))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await consume(stub, spb.ConsumeOpen(pchannel="p", policy=pb.DeliverPolicy(start_from=beyond)), until=1)
    assert err.value.code() is grpc.StatusCode.OUT_OF_RANGE


async def test_a_fenced_channel_fails_with_failed_precondition_never_unavailable(
    stub, server_thread: ServerThread
) -> None:
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    await produce(stub, "p", [[data("v", b"before")]])
    # A newer owner opens the pchannel (a second handle on the node's own database): the node's handle
    # is fenced, and every write through it must say so with a code clients do not retry.
    node = server_thread.node
    await asyncio.to_thread(server_thread.run, node.manager.open("p"))
    assert await _code_of(stub.BeginTxn(spb.BeginTxnRequest(pchannel="p", vchannel="v"))) \
        is grpc.StatusCode.FAILED_PRECONDITION
    # A produce stream ends with that status.  Read it from the call, not from a write: a write that
    # races with the end of the call fails locally (INTERNAL), whatever status the node sent.
    call = stub.Produce()
    with contextlib.suppress(grpc.aio.AioRpcError):
        await call.write(spb.ProduceRequest(open=spb.ProduceOpen(pchannel="p")))
        if await call.read() is not grpc.aio.EOF:
            await call.write(spb.ProduceRequest(batch=spb.ProduceBatch(request_id=1, messages=[data("v", b"x")])))
            while await call.read() is not grpc.aio.EOF:
                pass
    assert await call.code() is grpc.StatusCode.FAILED_PRECONDITION
