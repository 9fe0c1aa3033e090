"""Every RPC of the StreamingNode service against a real node, through a raw generated stub."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.protobuf.empty_pb2 import Empty
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from tests.integration.rpc_helpers import consume, data, payloads, produce, status_of

pytestmark = pytest.mark.integration


async def _create(stub, *names: str) -> None:
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=list(names)))


# --- channels --------------------------------------------------------------------------------------
async def test_channels_create_describe_destroy(stub) -> None:
    owner = pb.OwnerDescription(role="ingest", address="10.0.0.1:1", description_text="orders")
    made = await stub.CreateChannels(spb.CreateChannelsRequest(owner=owner, channel_names=["a", "b"]))
    assert list(made.channel_names) == ["a", "b"]
    generated = await stub.CreateChannels(spb.CreateChannelsRequest(num_channels=2))
    assert len(generated.channel_names) == 2 and not {"a", "b"} & set(generated.channel_names)

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["c", "a"]))
    assert status_of(err.value) == (grpc.StatusCode.ALREADY_EXISTS, "CHANNEL_EXIST")
    described = await stub.DescribeChannels(spb.DescribeChannelsRequest())
    names = [d.channel_name for d in described.descriptions]
    assert "c" not in names, "a failed create must create nothing"
    assert sorted(names) == sorted(["a", "b", *generated.channel_names])

    await produce(stub, "a", [[data("v", b"x")]])
    (a,) = (await stub.DescribeChannels(spb.DescribeChannelsRequest(channel_names=["a"]))).descriptions
    assert a.owner == owner and a.term >= 1 and a.last_timetick > 0
    assert a.HasField("last_id") and a.last_id.id >= a.first_id.id

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.DestroyChannels(spb.DestroyChannelsRequest(channel_names=["b", "nope"]))
    assert status_of(err.value) == (grpc.StatusCode.NOT_FOUND, "CHANNEL_NOT_EXIST")
    await stub.DestroyChannels(spb.DestroyChannelsRequest(channel_names=["b"]))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.DescribeChannels(spb.DescribeChannelsRequest(channel_names=["b"]))
    assert status_of(err.value) == (grpc.StatusCode.NOT_FOUND, "CHANNEL_NOT_EXIST")


async def test_create_channels_checks_its_arguments(stub) -> None:
    for req in (
        spb.CreateChannelsRequest(),
        spb.CreateChannelsRequest(num_channels=3, channel_names=["x"]),
        spb.CreateChannelsRequest(channel_names=["x", "x"]),
        spb.CreateChannelsRequest(channel_names=[""]),
        spb.CreateChannelsRequest(num_channels=2**31 - 1),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.CreateChannels(req)
        assert status_of(err.value) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    assert not (await stub.DescribeChannels(spb.DescribeChannelsRequest())).descriptions


# --- produce / consume -----------------------------------------------------------------------------
async def test_produce_then_consume_whole_pchannel_and_one_vchannel(stub) -> None:
    await _create(stub, "p")
    batches = [[data(f"v{j % 2}", f"{i}-{j}".encode()) for j in range(10)] for i in range(3)]
    opened, results = await produce(stub, "p", batches)
    assert opened.pchannel == "p" and opened.term >= 1
    assert [r.request_id for r in results] == [1, 2, 3]
    ids = [int.from_bytes(a.id.id, "big") for r in results for a in r.appended.results]
    assert len(ids) == 30 and len(set(ids)) == 30
    ticks = [a.timetick for r in results for a in r.appended.results]
    assert ticks == sorted(ticks) and len(set(ticks)) == 30

    everything = await consume(stub, spb.ConsumeOpen(pchannel="p"), until=30)
    assert payloads(everything) == [m.payload for b in batches for m in b]
    one = await consume(stub, spb.ConsumeOpen(pchannel="p", vchannel="v1"), until=15)
    assert payloads(one) == [m.payload for b in batches for m in b if m.vchannel == "v1"]
    for p in everything:
        assert all(p.begin_ts < m.timetick <= p.end_ts for m in p.messages)
        assert p.start_positions[0].pchannel == "p" and p.end_positions[0].timetick == p.end_ts


async def test_consume_policies_and_filters(stub) -> None:
    await _create(stub, "p")
    _, results = await produce(stub, "p", [[data("v", f"m{i}".encode()) for i in range(6)]])
    appended = results[0].appended.results
    third = appended[2]
    start_from = await consume(stub, spb.ConsumeOpen(
        pchannel="p", policy=pb.DeliverPolicy(start_from=third.id)), until=4)
    assert payloads(start_from) == [b"m2", b"m3", b"m4", b"m5"]
    start_after = await consume(stub, spb.ConsumeOpen(
        pchannel="p", policy=pb.DeliverPolicy(start_after=third.id)), until=3)
    assert payloads(start_after) == [b"m3", b"m4", b"m5"]
    at_time = await consume(stub, spb.ConsumeOpen(
        pchannel="p", policy=pb.DeliverPolicy(start_at_time=appended[4].timetick)), until=2)
    assert payloads(at_time)[-2:] == [b"m4", b"m5"] and b"m0" not in payloads(at_time)
    gt = await consume(stub, spb.ConsumeOpen(
        pchannel="p", filters=[pb.DeliverFilter(timetick_gt=appended[3].timetick)]), until=2)
    assert payloads(gt) == [b"m4", b"m5"]
    typed = await consume(stub, spb.ConsumeOpen(pchannel="p", filters=[pb.DeliverFilter(
        message_types=pb.MessageTypeSet(types=[pb.MESSAGE_TYPE_INSERT]))]), until=0, timeout=5)
    assert payloads(typed) == []

    # latest: only what is appended after the read opened
    opened = asyncio.Event()
    task = asyncio.ensure_future(consume(stub, spb.ConsumeOpen(
        pchannel="p", policy=pb.DeliverPolicy(latest=Empty())), until=1, opened=opened))
    await asyncio.wait_for(opened.wait(), 10)
    await produce(stub, "p", [[data("v", b"late")]])
    assert payloads(await task) == [b"late"]


async def test_max_pack_messages_splits_and_positions_resume_exactly(stub) -> None:
    await _create(stub, "p")
    await produce(stub, "p", [[data("v", f"{i:03}".encode()) for i in range(50)]])
    packs = await consume(stub, spb.ConsumeOpen(pchannel="p", max_pack_messages=7), until=50)
    assert all(len(p.messages) <= 7 for p in packs)
    assert payloads(packs) == [f"{i:03}".encode() for i in range(50)]
    # Resuming from any part's end position delivers exactly the rest.
    cut = next(p for p in packs if p.messages and len(p.messages) == 7)
    end = cut.end_positions[0]
    rest = await consume(stub, spb.ConsumeOpen(
        pchannel="p", policy=pb.DeliverPolicy(start_from=end.message_id),
        filters=[pb.DeliverFilter(timetick_gt=end.timetick)]), until=1)
    got = payloads(rest)
    first_after = payloads(packs).index(cut.messages[-1].payload) + 1
    assert got[0] == f"{first_after:03}".encode()


async def test_big_ticks_are_split_under_the_default_receive_limit(stub) -> None:
    # 6,000 x 1 KiB arrive in very few ticks; a client with gRPC's default 4 MiB receive limit (the
    # stub fixture) must still get every pack.
    await _create(stub, "p")
    batches = [[data("v", bytes([i % 256]) * 1024) for i in range(j, j + 1000)] for j in range(0, 6000, 1000)]
    await produce(stub, "p", batches)
    packs = await consume(stub, spb.ConsumeOpen(pchannel="p"), until=6000)
    assert len(payloads(packs)) == 6000
    assert max(p.ByteSize() for p in packs) <= 3 << 20


async def test_produce_errors_stay_in_band_and_the_stream_goes_on(stub) -> None:
    await _create(stub, "p")
    bad_type = pb.Message(type=pb.MESSAGE_TYPE_TIME_TICK, vchannel="v")
    unknown_type = pb.Message(type=777, vchannel="v")
    huge = data("v", b"x" * ((4 << 20) + 1))
    reserved = data("v", b"r", producer_id="me")
    _, results = await produce(stub, "p", [
        [data("v", b"ok1")], [bad_type], [data("v", b"no"), unknown_type], [huge], [], [reserved], [data("v", b"ok2")],
    ])
    outcomes = [r.WhichOneof("outcome") for r in results]
    assert outcomes == ["appended", "error", "error", "error", "error", "error", "appended"]
    codes = [pb.ErrorCode.Name(r.error.code) for r in results if r.HasField("error")]
    assert codes == ["ERROR_CODE_INVALID_ARGUMENT", "ERROR_CODE_INVALID_ARGUMENT", "ERROR_CODE_MESSAGE_TOO_LARGE",
                     "ERROR_CODE_INVALID_ARGUMENT", "ERROR_CODE_INVALID_ARGUMENT"]
    assert "TIME_TICK" in results[1].error.message and "777" in results[2].error.message
    assert "over the limit" in results[3].error.message
    got = payloads(await consume(stub, spb.ConsumeOpen(pchannel="p"), until=2))
    assert got == [b"ok1", b"ok2"], "a failed batch writes nothing, not even its valid messages"


async def test_produce_stream_ending_errors(stub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await produce(stub, "missing", [[data("v", b"x")]])
    assert status_of(err.value) == (grpc.StatusCode.NOT_FOUND, "CHANNEL_NOT_EXIST")

    async def no_open():
        yield spb.ProduceRequest(batch=spb.ProduceBatch(request_id=1, messages=[data("v", b"x")]))

    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in stub.Produce(no_open()):
            pass
    assert status_of(err.value) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    assert "first request" in err.value.details()


async def test_a_destroyed_channel_ends_an_open_produce_stream(stub) -> None:
    # The stream is idle on the client side: the node must end it on its own, with the status.
    await _create(stub, "p")
    call = stub.Produce()
    await call.write(spb.ProduceRequest(open=spb.ProduceOpen(pchannel="p")))
    assert (await call.read()).WhichOneof("response") == "opened"
    await call.write(spb.ProduceRequest(batch=spb.ProduceBatch(request_id=1, messages=[data("v", b"a")])))
    assert (await call.read()).result.HasField("appended")
    await stub.DestroyChannels(spb.DestroyChannelsRequest(channel_names=["p"]))
    await call.write(spb.ProduceRequest(batch=spb.ProduceBatch(request_id=2, messages=[data("v", b"b")])))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async with asyncio.timeout(10):
            while await call.read() is not grpc.aio.EOF:
                pass
    assert status_of(err.value)[0] in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND)


async def test_idempotent_produce_never_duplicates(stub) -> None:
    await _create(stub, "p")
    batch = [[data("v", b"a"), data("v", b"b")], [data("v", b"c")]]
    _, first = await produce(stub, "p", batch, producer_id="prod-1", first_sequence=100)
    _, again = await produce(stub, "p", batch, producer_id="prod-1", first_sequence=100)
    assert [r.appended for r in first] == [r.appended for r in again]
    _, more = await produce(stub, "p", [[data("v", b"d")]], producer_id="prod-1", first_sequence=103)
    assert more[0].HasField("appended")
    got = payloads(await consume(stub, spb.ConsumeOpen(pchannel="p"), until=4))
    assert got == [b"a", b"b", b"c", b"d"]
    assert all(m.properties["producer_id"] == "prod-1"
               for p in await consume(stub, spb.ConsumeOpen(pchannel="p"), until=4) for m in p.messages
               if m.type == pb.MESSAGE_TYPE_DATA)


# --- transactions ----------------------------------------------------------------------------------
async def test_transactions_commit_whole_and_rollback_never(stub) -> None:
    await _create(stub, "p")
    t1 = await stub.BeginTxn(spb.BeginTxnRequest(pchannel="p", vchannel="v", keepalive_ms=30_000))
    assert t1.txn_id > 0 and t1.keepalive_ms == 30_000 and t1.begin_timetick > 0
    t2 = await stub.BeginTxn(spb.BeginTxnRequest(pchannel="p", vchannel="v"))
    assert t2.keepalive_ms == 60_000, "0 asks for the node default"
    _, r1 = await produce(stub, "p", [[data("v", b"t1-a"), data("v", b"t1-b")]],
                          txn=pb.TxnContext(txn_id=t1.txn_id))
    _, r2 = await produce(stub, "p", [[data("v", b"t2-a")]], txn=pb.TxnContext(txn_id=t2.txn_id))
    assert r2[0].appended.results[0].txn_id == t2.txn_id
    assert all(a.txn_id == t1.txn_id for a in r1[0].appended.results)
    await produce(stub, "p", [[data("v", b"plain")]])
    committed = await stub.CommitTxn(spb.CommitTxnRequest(pchannel="p", vchannel="v", txn_id=t1.txn_id))
    assert committed.commit_timetick > t1.begin_timetick
    rolled = await stub.RollbackTxn(spb.RollbackTxnRequest(pchannel="p", vchannel="v", txn_id=t2.txn_id))
    assert rolled.rollback_timetick > 0
    await produce(stub, "p", [[data("v", b"after")]])
    packs = await consume(stub, spb.ConsumeOpen(pchannel="p", vchannel="v"), until=4 + 2)  # + Begin, Commit
    got = payloads(packs)
    assert got == [b"plain", b"t1-a", b"t1-b", b"after"]
    (pack,) = [p for p in packs if any(m.payload == b"t1-a" for m in p.messages)]
    assert pack.end_ts >= committed.commit_timetick

    for call, req, expect in (
        (stub.CommitTxn, spb.CommitTxnRequest(pchannel="p", vchannel="v", txn_id=t2.txn_id),
         (grpc.StatusCode.FAILED_PRECONDITION, "INVALID_TXN_STATE")),
        (stub.RollbackTxn, spb.RollbackTxnRequest(pchannel="p", vchannel="v", txn_id=t1.txn_id),
         (grpc.StatusCode.FAILED_PRECONDITION, "INVALID_TXN_STATE")),
        (stub.CommitTxn, spb.CommitTxnRequest(pchannel="p", vchannel="v", txn_id=999_999),
         (grpc.StatusCode.NOT_FOUND, "TXN_NOT_FOUND")),
        (stub.CommitTxn, spb.CommitTxnRequest(pchannel="p", vchannel="", txn_id=t1.txn_id),
         (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")),
        (stub.BeginTxn, spb.BeginTxnRequest(pchannel="nope", vchannel="v"),
         (grpc.StatusCode.NOT_FOUND, "CHANNEL_NOT_EXIST")),
        (stub.BeginTxn, spb.BeginTxnRequest(pchannel="p", vchannel="v", keepalive_ms=-1),
         (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(req)
        assert status_of(err.value) == expect, req
    # A body for a closed transaction fails its batch in-band.
    _, late = await produce(stub, "p", [[data("v", b"late")]], txn=pb.TxnContext(txn_id=t1.txn_id))
    assert late[0].HasField("error")


# --- consumer groups -------------------------------------------------------------------------------
async def test_consumer_group_commit_resume_describe_seek(stub) -> None:
    await _create(stub, "p")
    await stub.CreateConsumerGroup(spb.CreateConsumerGroupRequest(pchannel="p", group="g"))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.CreateConsumerGroup(spb.CreateConsumerGroupRequest(pchannel="p", group="g"))
    assert status_of(err.value) == (grpc.StatusCode.ALREADY_EXISTS, "CONSUMER_GROUP_EXIST")
    await produce(stub, "p", [[data("v", f"m{i}".encode()) for i in range(5)]])

    # Read with the group, commit the end of the last pack, close.
    import asyncio  # noqa: PLC0415

    queue: asyncio.Queue = asyncio.Queue()
    await queue.put(spb.ConsumeRequest(open=spb.ConsumeOpen(pchannel="p", vchannel="v", consumer_group="g")))

    async def reqs():
        while (item := await queue.get()) is not None:
            yield item

    seen: list[bytes] = []
    acked = None
    async for resp in stub.Consume(reqs()):
        kind = resp.WhichOneof("response")
        if kind == "pack":
            seen += [m.payload for m in resp.pack.messages if m.type == pb.MESSAGE_TYPE_DATA]
            if len(seen) == 5:
                await queue.put(spb.ConsumeRequest(ack=spb.ConsumeAck(positions=resp.pack.end_positions)))
        elif kind == "acked":
            acked = resp.acked
            await queue.put(spb.ConsumeRequest(close=spb.ConsumeClose()))
        elif kind == "closed":
            break
    await queue.put(None)
    assert seen == [f"m{i}".encode() for i in range(5)] and acked is not None

    await produce(stub, "p", [[data("v", b"m5"), data("v", b"m6")]])
    resumed = await consume(stub, spb.ConsumeOpen(pchannel="p", vchannel="v", consumer_group="g"), until=2)
    assert payloads(resumed) == [b"m5", b"m6"], "the group resumes after its committed position"

    await _create(stub, "other")  # a pchannel without the group: asking across all must not fail on it
    everywhere = await stub.DescribeConsumerGroups(spb.DescribeConsumerGroupsRequest(groups=["g"]))
    assert [(d.pchannel, d.group) for d in everywhere.groups] == [("p", "g")]
    described = await stub.DescribeConsumerGroups(spb.DescribeConsumerGroupsRequest(pchannel="p"))
    (g,) = described.groups
    (progress,) = g.vchannels
    assert g.group == "g" and progress.vchannel == "v" and progress.lag_messages >= 2
    assert progress.committed == acked.positions[0]

    sought = await stub.SeekConsumerGroup(spb.SeekConsumerGroupRequest(
        pchannel="p", group="g", vchannel="v", policy=pb.DeliverPolicy(all=Empty())))
    assert sought.position.pchannel == "p"
    again = await consume(stub, spb.ConsumeOpen(pchannel="p", vchannel="v", consumer_group="g"), until=7)
    assert payloads(again) == [f"m{i}".encode() for i in range(7)]

    await stub.DestroyConsumerGroup(spb.DestroyConsumerGroupRequest(pchannel="p", group="g"))
    for call, req in (
        (stub.DestroyConsumerGroup, spb.DestroyConsumerGroupRequest(pchannel="p", group="g")),
        (stub.SeekConsumerGroup, spb.SeekConsumerGroupRequest(pchannel="p", group="g", vchannel="v")),
        (stub.DescribeConsumerGroups, spb.DescribeConsumerGroupsRequest(pchannel="p", groups=["g"])),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(req)
        assert status_of(err.value) == (grpc.StatusCode.NOT_FOUND, "CONSUMER_GROUP_NOT_EXIST")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await consume(stub, spb.ConsumeOpen(pchannel="p", consumer_group="g"), until=1)
    assert status_of(err.value) == (grpc.StatusCode.NOT_FOUND, "CONSUMER_GROUP_NOT_EXIST")


async def test_ack_without_group_is_refused_in_band(stub) -> None:
    await _create(stub, "p")
    import asyncio  # noqa: PLC0415

    queue: asyncio.Queue = asyncio.Queue()
    await queue.put(spb.ConsumeRequest(open=spb.ConsumeOpen(pchannel="p")))
    await queue.put(spb.ConsumeRequest(ack=spb.ConsumeAck(positions=[pb.Position(pchannel="p")])))

    async def reqs():
        while (item := await queue.get()) is not None:
            yield item

    kinds = []
    async for resp in stub.Consume(reqs()):
        kinds.append(resp.WhichOneof("response"))
        if kinds[-1] == "error":
            assert "consumer_group" in resp.error.message
            await queue.put(spb.ConsumeRequest(close=spb.ConsumeClose()))
    await queue.put(None)
    assert kinds[0] == "opened" and "error" in kinds and kinds[-1] == "closed"


# --- positions, flush, health, reflection ----------------------------------------------------------
async def test_latest_position_resumes_after_everything_so_far(stub) -> None:
    await _create(stub, "p")
    empty = await stub.GetLatestPosition(spb.GetLatestPositionRequest(pchannel="p"))
    await produce(stub, "p", [[data("v", b"old1"), data("v", b"old2")]])
    latest = await stub.GetLatestPosition(spb.GetLatestPositionRequest(pchannel="p", vchannel="v"))
    assert latest.HasField("last") and latest.mvcc_timetick >= latest.last.timetick > 0
    assert latest.mvcc_timetick >= empty.mvcc_timetick
    await produce(stub, "p", [[data("v", b"new")]])
    got = await consume(stub, spb.ConsumeOpen(
        pchannel="p", policy=pb.DeliverPolicy(start_from=latest.last.message_id),
        filters=[pb.DeliverFilter(timetick_gt=latest.last.timetick)]), until=1)
    assert payloads(got) == [b"new"]


async def test_flush_returns_a_durable_timetick(stub) -> None:
    await _create(stub, "p")
    _, results = await produce(stub, "p", [[data("v", b"x")]])
    flushed = await stub.Flush(spb.FlushRequest(pchannel="p", vchannel="v"))
    assert flushed.flush_timetick > results[0].appended.results[0].timetick and list(flushed.files) == []
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Flush(spb.FlushRequest(pchannel="p"))
    assert status_of(err.value) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")


async def test_health_and_reflection(server) -> None:
    async with grpc.aio.insecure_channel(server) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "streamingnode.v1.StreamingNode"):
            resp = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(channel)

        async def ask():
            yield reflection_pb2.ServerReflectionRequest(list_services="")

        async for resp in refl.ServerReflectionInfo(ask()):
            names = {s.name for s in resp.list_services_response.service}
            assert "streamingnode.v1.StreamingNode" in names
            break
