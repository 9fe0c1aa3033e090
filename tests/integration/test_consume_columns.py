"""ConsumeOpen.columns through a real node and a raw stub: the same read, asked for in column form,
must give the same packs as in the messages form (transactions, properties, broadcast included)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from streamingnode.client import AsyncClient
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from streamingnode.wire import codec
from tests.integration.rpc_helpers import data, produce
from tests.waiting import until
from wal.message import Message

pytestmark = pytest.mark.integration


async def _read(stub: sgrpc.StreamingNodeStub, open_: spb.ConsumeOpen, *, last_id: int) -> list[pb.MsgPack]:
    """Packs up to the one holding the message ``last_id``; then cancel."""
    call = stub.Consume()
    await call.write(spb.ConsumeRequest(open=open_))
    packs: list[pb.MsgPack] = []
    try:
        async with asyncio.timeout(10):
            while not packs or all(m.message_id != last_id for m in codec.msgpack_from_pb(packs[-1]).messages):
                resp = await call.read()
                assert resp is not grpc.aio.EOF
                if resp.WhichOneof("response") == "pack":
                    packs.append(resp.pack)
    finally:
        call.cancel()
    return packs


async def test_column_packs_are_the_message_packs(stub: sgrpc.StreamingNodeStub) -> None:
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    await produce(stub, "p", [
        [data("v1", b"a", k="1"), data("v2", b"b"), data("", b"broadcast"), data("v1", b"c")],
        [data("v2", b"d", x="y", z="")] + [data("v1", bytes([i]) * 100) for i in range(40)],
    ])
    kept = await stub.BeginTxn(spb.BeginTxnRequest(pchannel="p", vchannel="v1", keepalive_ms=30_000))
    dropped = await stub.BeginTxn(spb.BeginTxnRequest(pchannel="p", vchannel="v2"))
    await produce(stub, "p", [[data("v1", b"t-a", in_txn="yes"), data("v1", b"t-b")]],
                  txn=pb.TxnContext(txn_id=kept.txn_id))
    await produce(stub, "p", [[data("v2", b"gone")]], txn=pb.TxnContext(txn_id=dropped.txn_id))
    await produce(stub, "p", [[data("v2", b"between")]])
    await stub.CommitTxn(spb.CommitTxnRequest(pchannel="p", vchannel="v1", txn_id=kept.txn_id))
    await stub.RollbackTxn(spb.RollbackTxnRequest(pchannel="p", vchannel="v2", txn_id=dropped.txn_id))
    _, (last,) = await produce(stub, "p", [[data("v1", b"last")]])
    last_id = int.from_bytes(last.appended.results[0].id.id, "big")
    # A persisted tick after the last message releases everything: both reads come from storage,
    # packed alike.  It is there once the pchannel's last stored id is past the last message.
    async def ticked() -> bool:
        (d,) = (await stub.DescribeChannels(spb.DescribeChannelsRequest(channel_names=["p"]))).descriptions
        return int.from_bytes(d.last_id.id, "big") > last_id

    await until(ticked, "a persisted tick after the last message")

    for vchannel, limit in (("", 0), ("v1", 0), ("", 7)):
        base = {"pchannel": "p", "vchannel": vchannel, "max_pack_messages": limit}
        want = await _read(stub, spb.ConsumeOpen(**base), last_id=last_id)
        got = await _read(stub, spb.ConsumeOpen(**base, columns=True), last_id=last_id)
        assert len(got) == len(want) > 1
        for g, w in zip(got, want, strict=True):
            assert not g.messages and g.HasField("columns") == bool(w.messages), "columns, not messages"
            assert (g.begin_ts, g.end_ts, g.start_positions, g.end_positions) == (
                w.begin_ts, w.end_ts, w.start_positions, w.end_positions)
            assert codec.msgpack_from_pb(g) == codec.msgpack_from_pb(w)
        messages = [m for p in got for m in codec.msgpack_from_pb(p).messages]
        in_txn = [m for m in messages if m.txn is not None]
        assert [m.payload for m in in_txn if m.message_type == pb.MESSAGE_TYPE_DATA] == [b"t-a", b"t-b"]
        assert all(m.txn is not None and m.txn.txn_id == kept.txn_id for m in in_txn)
        assert b"gone" not in [m.payload for m in messages]
        by_payload = {m.payload: m for m in messages if m.message_type == pb.MESSAGE_TYPE_DATA}
        assert by_payload[b"t-a"].properties == {"in_txn": "yes"}
        assert by_payload[b"broadcast"].vchannel == ""
        if vchannel == "":
            assert by_payload[b"d"].properties == {"x": "y", "z": ""}
        # Why column packs have an extras entry per message: every stored message carries one.
        assert all(m.last_confirmed is not None and m.message_id is not None for m in messages)



async def test_the_sdk_consumer_reads_column_packs(
    stub: sgrpc.StreamingNodeStub, server: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    decoded: list[int] = []
    real = codec.messages_from_columns

    def spy(c: pb.MessageColumns) -> list[Message]:
        decoded.append(len(c.types))
        return real(c)

    monkeypatch.setattr(codec, "messages_from_columns", spy)
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    _, (r,) = await produce(stub, "p", [[data("v", b"a", k="v"), data("", b"b"), data("v", b"c")]])
    last_id = int.from_bytes(r.appended.results[-1].id.id, "big")
    want = [m for p in await _read(stub, spb.ConsumeOpen(pchannel="p", vchannel="v"), last_id=last_id)
            for m in codec.msgpack_from_pb(p).messages]
    assert not decoded
    got: list[Message] = []
    async with AsyncClient(server, timeout=10.0) as client, client.consumer("p", "v") as consumer:
        async with asyncio.timeout(10):
            async for pack in consumer:
                got += pack.messages
                if any(m.message_id == last_id for m in pack.messages):
                    break
    assert got == want
    assert sum(decoded) == len(want) == 3
