"""A group's position moves only where its readers have been (``streamingnode.node.groups``,
``server/consume.py``): an ack commits only positions its stream delivered, of its own vchannel,
between the group's position and the end of the last pack sent; SeekConsumerGroup refuses a target
past the pchannel's end; a position stored out of range by an older version is reported by
DescribeConsumerGroups and ``verify``, and opening the group fails naming it, never silently."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.empty_pb2 import Empty

from streamingnode.client import AsyncClient, Consumer, MsgPack
from streamingnode.node.groups import META_KEY
from streamingnode.offline.verify import verify
from streamingnode.server import ServerThread
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc
from tests.factories import ins, tick
from tests.integration.conftest import node_config
from tests.integration.rpc_helpers import data, payloads, produce, status_of
from tests.integration.test_cli import cli
from tests.waiting import until
from wal import WALManager

pytestmark = pytest.mark.integration

TOP = 2**64 - 1


def _id(n: int) -> pb.MessageID:
    return pb.MessageID(id=n.to_bytes(8, "big"))


def _num(mid: pb.MessageID) -> int:
    return int.from_bytes(mid.id, "big")


class _Stream:
    """One raw Consume call with a group: open, read packs, ack and read the ack's answer."""

    def __init__(self, stub: streaming_pb2_grpc.StreamingNodeStub) -> None:
        self.call = stub.Consume()
        self.end: pb.Position | None = None
        self.messages: list[pb.Message] = []

    async def open(self, **fields: object) -> spb.ConsumeResponse:
        fields.setdefault("pchannel", "p")
        await self.call.write(spb.ConsumeRequest(open=spb.ConsumeOpen(**fields)))  # type: ignore[arg-type]
        resp: spb.ConsumeResponse = await self.call.read()
        return resp

    def _take(self, resp: spb.ConsumeResponse) -> None:
        if resp.WhichOneof("response") == "pack":
            self.end = resp.pack.end_positions[0]
            self.messages.extend(m for m in resp.pack.messages if m.type == pb.MESSAGE_TYPE_DATA)

    async def delivered(self, payload: bytes) -> pb.Position:
        """Read until ``payload`` arrived; the end of the pack that held it."""
        while not any(m.payload == payload for m in self.messages):
            self._take(await self.call.read())
        assert self.end is not None
        return self.end

    async def ack(self, *positions: pb.Position) -> spb.ConsumeResponse:
        await self.call.write(spb.ConsumeRequest(ack=spb.ConsumeAck(positions=list(positions))))
        while True:
            resp: spb.ConsumeResponse = await self.call.read()
            if resp.WhichOneof("response") in ("acked", "error"):
                return resp
            self._take(resp)

    def cancel(self) -> None:
        self.call.cancel()


@pytest.fixture
async def group(stub: streaming_pb2_grpc.StreamingNodeStub) -> AsyncIterator[None]:
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    await stub.CreateConsumerGroup(spb.CreateConsumerGroupRequest(pchannel="p", group="g"))
    yield


async def _committed(stub: streaming_pb2_grpc.StreamingNodeStub, group: str = "g") -> dict[str, pb.Position]:
    described = await stub.DescribeConsumerGroups(spb.DescribeConsumerGroupsRequest(pchannel="p", groups=[group]))
    return {v.vchannel: v.committed for v in described.groups[0].vchannels}


def _refused(resp: spb.ConsumeResponse, code: int, *words: str) -> None:
    assert resp.WhichOneof("response") == "error", resp
    assert resp.error.code == code, resp.error
    for word in words:
        assert word in resp.error.message, (word, resp.error.message)


async def test_an_ack_of_another_vchannel_is_refused_and_commits_nothing(stub, group) -> None:
    await produce(stub, "p", [[data("v", b"a"), data("w", b"b")]])
    s = _Stream(stub)
    try:
        await s.open(vchannel="v", consumer_group="g")
        end = await s.delivered(b"a")
        other = pb.Position(pchannel="p", vchannel="w", message_id=end.message_id, timetick=end.timetick)
        _refused(await s.ack(other), pb.ERROR_CODE_INVALID_ARGUMENT, "ack.positions[0].vchannel", "'w'")
        # Whole or nothing: the valid position beside it is not committed either.
        _refused(await s.ack(end, other), pb.ERROR_CODE_INVALID_ARGUMENT, "ack.positions[1].vchannel")
        assert await _committed(stub) == {}
        assert (await s.ack(end)).WhichOneof("response") == "acked"
    finally:
        s.cancel()
    assert await _committed(stub) == {"v": end}


async def test_an_ack_past_the_newest_message_is_refused_and_commits_nothing(stub, group) -> None:
    await produce(stub, "p", [[data("v", b"a")]])
    s = _Stream(stub)
    try:
        await s.open(vchannel="v", consumer_group="g")
        end = await s.delivered(b"a")
        assert (await s.ack(end)).WhichOneof("response") == "acked"
        beyond = _num(end.message_id) + 1000
        for mid in (beyond, TOP):
            past = pb.Position(pchannel="p", vchannel="v", message_id=_id(mid), timetick=end.timetick)
            _refused(await s.ack(past), pb.ERROR_CODE_OUT_OF_RANGE, "ack.positions[0]", f"message_id {mid}",
                     "nothing was committed")
        assert await _committed(stub) == {"v": end}
    finally:
        s.cancel()


async def test_an_ack_of_a_future_timetick_is_refused_and_commits_nothing(stub, group) -> None:
    await produce(stub, "p", [[data("v", b"a")]])
    s = _Stream(stub)
    try:
        await s.open(vchannel="v", consumer_group="g")
        end = await s.delivered(b"a")
        for ts in (end.timetick + (1 << 30), TOP):
            future = pb.Position(pchannel="p", vchannel="v", message_id=end.message_id, timetick=ts)
            _refused(await s.ack(future), pb.ERROR_CODE_OUT_OF_RANGE, "ack.positions[0]", f"timetick {ts}")
        assert await _committed(stub) == {}
    finally:
        s.cancel()


async def test_an_ack_of_an_id_this_stream_never_delivered_is_refused(stub, group) -> None:
    # Stored but not delivered: the body of a transaction still open.  Ids from its BeginTxn on stay
    # behind the stream's end until it commits.
    await produce(stub, "p", [[data("v", b"before")]])
    txn = await stub.BeginTxn(spb.BeginTxnRequest(pchannel="p", vchannel="v", keepalive_ms=60_000))
    _, bodies = await produce(stub, "p", [[data("v", b"body")]], txn=pb.TxnContext(txn_id=txn.txn_id))
    body = bodies[0].appended.results[0]
    await produce(stub, "p", [[data("v", b"after")]])
    s = _Stream(stub)
    try:
        await s.open(vchannel="v", consumer_group="g")
        first = await s.delivered(b"after")
        unseen = pb.Position(pchannel="p", vchannel="v", message_id=_id(_num(body.id) + 1), timetick=body.timetick)
        _refused(await s.ack(unseen), pb.ERROR_CODE_OUT_OF_RANGE, "ack.positions[0]",
                 "the end of what this stream has delivered")
        assert await _committed(stub) == {}
        assert (await s.ack(first)).WhichOneof("response") == "acked"
        # Behind the group's position: what a stream opened there never delivered.
        behind = pb.Position(pchannel="p", vchannel="v", message_id=_id(0), timetick=first.timetick)
        _refused(await s.ack(behind), pb.ERROR_CODE_INVALID_ARGUMENT, "ack.positions[0]",
                 "behind consumer group 'g'")
        assert await _committed(stub) == {"v": first}
    finally:
        s.cancel()
        await stub.RollbackTxn(spb.RollbackTxnRequest(pchannel="p", vchannel="v", txn_id=txn.txn_id))


async def test_another_team_s_ack_at_timetick_2_64_minus_1_cannot_stop_the_group(stub) -> None:
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    await stub.CreateConsumerGroup(spb.CreateConsumerGroupRequest(pchannel="p", group="billing"))
    await produce(stub, "p", [[data("v", b"one")]])
    hostile = _Stream(stub)
    try:
        await hostile.open(vchannel="v", consumer_group="billing")
        for position in (pb.Position(pchannel="p", vchannel="v", message_id=_id(0), timetick=TOP),
                         pb.Position(pchannel="p", vchannel="v", message_id=_id(TOP), timetick=0)):
            _refused(await hostile.ack(position), pb.ERROR_CODE_OUT_OF_RANGE, "ack.positions[0]")
    finally:
        hostile.cancel()
    assert await _committed(stub, "billing") == {}
    await produce(stub, "p", [[data("v", b"two")]])
    reader = _Stream(stub)
    try:
        opened = await reader.open(vchannel="v", consumer_group="billing")
        assert opened.WhichOneof("response") == "opened"
        await reader.delivered(b"two")
    finally:
        reader.cancel()
    assert [m.payload for m in reader.messages] == [b"one", b"two"]


async def test_seek_to_id_2_64_minus_1_or_a_future_timetick_is_refused_and_latest_moves_to_the_end(
    stub, group,
) -> None:
    _, results = await produce(stub, "p", [[data("v", b"a")]])
    a = results[0].appended.results[0]
    for position, words in (
        (pb.Position(pchannel="p", message_id=_id(TOP)), (f"message_id {TOP}", "past the pchannel's newest")),
        (pb.Position(pchannel="p", message_id=_id(TOP), timetick=5), (f"message_id {TOP}",)),
        (pb.Position(pchannel="p", message_id=a.id, timetick=TOP), (f"timetick {TOP}", "in the future")),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.SeekConsumerGroup(spb.SeekConsumerGroupRequest(pchannel="p", group="g", vchannel="v",
                                                                      position=position))
        assert status_of(err.value) == (grpc.StatusCode.OUT_OF_RANGE, "OUT_OF_RANGE"), err.value
        for word in words:
            assert word in (err.value.details() or ""), (word, err.value.details())
    assert await _committed(stub) == {}
    latest = await stub.SeekConsumerGroup(spb.SeekConsumerGroupRequest(
        pchannel="p", group="g", vchannel="v", policy=pb.DeliverPolicy(latest=Empty())))
    assert _num(latest.position.message_id) > _num(a.id) and latest.position.timetick >= a.timetick
    assert await _committed(stub) == {"v": latest.position}


async def test_a_position_stored_out_of_range_is_reported_and_refuses_the_open(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    # What an older version could store: a timetick no clock reaches, an id past the end.
    manager = await WALManager.start_rocksdb(data_dir)
    try:
        await manager.create_channel("p")
        wal = await manager.open("p")
        await wal.append_batch([ins("v", 10), tick(11)])
        stored = {"stuck": {"v": [0, TOP]}, "gone": {"v": [TOP, 5]}, "fine": {"v": [0, 0]}}
        await wal.put_meta(META_KEY, json.dumps(stored).encode())
    finally:
        await manager.aclose()
    server = ServerThread(node_config(data_dir))
    server.start()
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = streaming_pb2_grpc.StreamingNodeStub(channel)
            described = await stub.DescribeConsumerGroups(spb.DescribeConsumerGroupsRequest(pchannel="p"))
            problems = {g.group: [v.problem for v in g.vchannels] for g in described.groups}
            assert problems["fine"] == [""]
            assert "in the future" in problems["stuck"][0] and f"timetick {TOP}" in problems["stuck"][0]
            assert "past the pchannel's newest message" in problems["gone"][0]
            # The CLI and the SDK show it too, with the way out.
            shown = await asyncio.to_thread(cli, server.address, "groups", "describe", "--channel", "p")
            assert shown.returncode == 0, shown.stderr
            assert "problem: group 'stuck' of pchannel 'p', vchannel 'v'" in shown.stderr, shown.stderr
            assert "groups seek --channel p" in shown.stderr and "'fine'" not in shown.stderr
            async with AsyncClient(server.address) as client:
                by_group = {d.group: d.vchannels[0].problem for d in await client.describe_groups("p")}
            assert by_group["fine"] == "" and "past the pchannel's newest message" in by_group["gone"]
            for name in ("stuck", "gone"):
                s = _Stream(stub)
                try:
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await s.open(vchannel="v", consumer_group=name)
                finally:
                    s.cancel()
                assert status_of(err.value) == (grpc.StatusCode.OUT_OF_RANGE, "OUT_OF_RANGE")
                assert f"consumer group {name!r}" in (err.value.details() or "")
                assert "SeekConsumerGroup" in (err.value.details() or "")
            # The way out: an administrator's seek.
            await stub.SeekConsumerGroup(spb.SeekConsumerGroupRequest(
                pchannel="p", group="stuck", vchannel="v", policy=pb.DeliverPolicy(all=Empty())))
            _, _ = await produce(stub, "p", [[data("v", b"new")]])
            s = _Stream(stub)
            try:
                await s.open(vchannel="v", consumer_group="stuck")
                await s.delivered(b"new")
            finally:
                s.cancel()
            assert payloads([pb.MsgPack(messages=s.messages)]) == [b"new"]
    finally:
        server.stop()
    report = verify(str(data_dir))
    found = [f.problem for f in report.findings]
    assert len(found) == 1 and "consumer group 'gone'" in found[0] and "out of range" in found[0], found


async def _pack_with(consumer: Consumer, payload: bytes) -> MsgPack:
    async with asyncio.timeout(10):
        async for pack in consumer:
            if any(m.payload == payload for m in pack.messages):
                return pack
    raise AssertionError(f"the read ended before {payload!r}")


async def test_an_ack_pending_at_a_reconnect_lands_once_the_new_stream_delivered_it(tmp_path: Path) -> None:
    # The new stream starts at the group's position (before the pending ack), so the node would
    # refuse the ack until that stream has delivered up to it: the SDK holds it back until then.
    thread = ServerThread(node_config(tmp_path / "data")).start()
    address = thread.address
    try:
        async with AsyncClient(address, reconnect_timeout=20.0) as client:
            await client.create_channels(["p"])
            await client.create_group("p", "g")
            consumer = client.consumer("p", "v", group="g")
            await consumer.wait_opened()
            async with client.producer("p") as producer:
                await producer.send("v", b"one")
            await consumer.ack(await _pack_with(consumer, b"one"))
            async with client.producer("p") as producer:
                await producer.send("v", b"two")
            second = await _pack_with(consumer, b"two")
            config = dataclasses.replace(thread.config, listen=address)
            thread.stop(grace=0.2)
            await until(lambda: not consumer.connected, "the consumer to see the node gone")
            acked = asyncio.ensure_future(consumer.ack(second))  # unanswered: nobody is there
            thread = ServerThread(config).start()
            await asyncio.wait_for(acked, 30)
            assert consumer.reconnects >= 1
            (described,) = await client.describe_groups("p", ["g"])
            assert described.committed("v") == second.end_position
            await consumer.aclose()
    finally:
        thread.stop()
