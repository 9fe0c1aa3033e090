"""Raw-stub helpers for the RPC tests: what a client generated from proto/ in any language would do."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence

import grpc

from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc


def data(vchannel: str, payload: bytes, **props: str) -> pb.Message:
    return pb.Message(type=pb.MESSAGE_TYPE_DATA, vchannel=vchannel, payload=payload, properties=props)


async def produce(
    stub: sgrpc.StreamingNodeStub,
    pchannel: str,
    batches: Sequence[Sequence[pb.Message]],
    *,
    producer_id: str | None = None,
    first_sequence: int = 0,
    txn: pb.TxnContext | None = None,
    as_columns: bool = False,
) -> tuple[spb.ProduceOpened, list[spb.ProduceBatchResult]]:
    """One Produce stream: open, the batches (pipelined), close; the opened answer and every result.
    ``as_columns`` sends each batch as MessageColumns instead of repeated Message."""
    out: list[spb.ProduceBatch] = []
    seq = first_sequence
    for i, msgs in enumerate(batches):
        batch = spb.ProduceBatch(request_id=i + 1, txn=txn, first_sequence=seq)
        if as_columns:
            batch.columns.CopyFrom(columns(msgs))
        else:
            batch.messages.extend(msgs)
        out.append(batch)
        seq += len(msgs)
    return await produce_batches(stub, pchannel, out, producer_id=producer_id)


def columns(msgs: Sequence[pb.Message]) -> pb.MessageColumns:
    """The produce-side column form of ``msgs`` (what the node assigns is left out)."""
    out = pb.MessageColumns(types=[m.type for m in msgs], vchannels=[m.vchannel for m in msgs],
                            payloads=[m.payload for m in msgs])
    for i, m in enumerate(msgs):
        if m.properties or m.HasField("txn"):
            extra = out.extras.add(index=i, properties=dict(m.properties))
            if m.HasField("txn"):
                extra.txn.CopyFrom(m.txn)
    return out


async def produce_batches(
    stub: sgrpc.StreamingNodeStub,
    pchannel: str,
    batches: Sequence[spb.ProduceBatch],
    *,
    producer_id: str | None = None,
) -> tuple[spb.ProduceOpened, list[spb.ProduceBatchResult]]:
    """``produce`` with the batches as given (request ids included)."""
    reqs = [spb.ProduceRequest(open=spb.ProduceOpen(pchannel=pchannel, producer_id=producer_id))]
    reqs += [spb.ProduceRequest(batch=b) for b in batches]
    reqs.append(spb.ProduceRequest(close=spb.ProduceClose()))
    # Wait for 'opened' before sending batches, as a real client does: if the open fails, the node ends
    # the call, and a write racing with that end fails locally with INTERNAL, hiding the real status.
    call = stub.Produce()
    await call.write(reqs[0])
    first = await call.read()
    if first is grpc.aio.EOF:
        raise AssertionError(f"stream ended without answering open: {await call.code()}")
    for req in reqs[1:]:
        await call.write(req)
    await call.done_writing()
    opened: spb.ProduceOpened | None = first.opened if first.WhichOneof("response") == "opened" else None
    results: list[spb.ProduceBatchResult] = []
    closed = False
    while (resp := await call.read()) is not grpc.aio.EOF:
        kind = resp.WhichOneof("response")
        if kind == "opened":
            opened = resp.opened
        elif kind == "result":
            results.append(resp.result)
        else:
            closed = True
    assert opened is not None and closed
    return opened, results


async def consume(
    stub: sgrpc.StreamingNodeStub,
    open_: spb.ConsumeOpen,
    *,
    until: int,
    timeout: float = 10.0,
    opened: asyncio.Event | None = None,
) -> list[pb.MsgPack]:
    """Read packs until ``until`` non-tick messages arrived (or fail after ``timeout``), then close.
    ``opened`` is set when the node answered the open (its reader exists from then on)."""
    queue: asyncio.Queue[spb.ConsumeRequest | None] = asyncio.Queue()
    await queue.put(spb.ConsumeRequest(open=open_))

    async def reqs() -> AsyncIterator[spb.ConsumeRequest]:
        while (item := await queue.get()) is not None:
            yield item

    call = stub.Consume(reqs())
    packs: list[pb.MsgPack] = []
    seen = 0
    async with asyncio.timeout(timeout):
        async for resp in call:
            kind = resp.WhichOneof("response")
            if kind == "opened" and opened is not None:
                opened.set()
            elif kind == "pack":
                packs.append(resp.pack)
                seen += sum(1 for m in resp.pack.messages if m.type != pb.MESSAGE_TYPE_TIME_TICK)
                if seen >= until:
                    await queue.put(spb.ConsumeRequest(close=spb.ConsumeClose()))
            elif kind == "closed":
                break
    await queue.put(None)
    return packs


def payloads(packs: Iterable[pb.MsgPack], types: tuple[int, ...] = (pb.MESSAGE_TYPE_DATA,)) -> list[bytes]:
    return [m.payload for p in packs for m in p.messages if m.type in types]


def status_of(exc: grpc.aio.AioRpcError) -> tuple[grpc.StatusCode, str]:
    """(gRPC code, ErrorInfo reason) of a failed call."""
    from streamingnode.wire.codes import from_rpc_error  # noqa: PLC0415

    return exc.code(), from_rpc_error(exc).code.name
