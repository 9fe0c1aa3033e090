"""The contract as another language meets it: a client built from proto/ alone, with no SDK.

What the .proto comments promise is checked here against a real node: refusals of DDL and DML
messages name the property or the format that is wrong, a request_id reused while its batch is
pending is refused without making two answers carry one id, a ConsumeAck may commit any vchannel of
the group's pchannel (and no other pchannel), GetLatestPosition answers for a vchannel never written,
BEGIN and COMMIT framing messages are delivered, and reflection answers both v1 and v1alpha.
"""

from __future__ import annotations

import asyncio
import io
import threading

import grpc
import pyarrow as pa
import pytest
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2 as rpb

from streamingnode.server import ServerThread
from streamingnode.server import produce as produce_module
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from streamingnode.wire.codes import from_rpc_error
from tests.integration.rpc_helpers import consume, data, produce
from wal.message import AppendResult

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("name", pa.string())])
ROWS = pa.record_batch([pa.array([1, 2], pa.int64()), pa.array(["a", "b"])], schema=SCHEMA)


def _stream(batch: pa.RecordBatch) -> bytes:
    out = io.BytesIO()
    with pa.ipc.new_stream(out, batch.schema) as writer:
        writer.write_batch(batch)
    return out.getvalue()


def _file(batch: pa.RecordBatch) -> bytes:
    out = io.BytesIO()
    with pa.ipc.new_file(out, batch.schema) as writer:
        writer.write_batch(batch)
    return out.getvalue()


def _msg(kind: int, payload: bytes = b"", **props: str) -> pb.Message:
    return pb.Message(type=kind, vchannel="v", payload=payload, properties=props)


async def _refusal(stub: sgrpc.StreamingNodeStub, message: pb.Message) -> pb.ErrorDetail:
    _, results = await produce(stub, "p", [[message]])
    assert results[0].WhichOneof("outcome") == "error", results[0]
    return results[0].error


async def _with_collection(stub: sgrpc.StreamingNodeStub) -> None:
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    _, results = await produce(stub, "p", [[_msg(pb.MESSAGE_TYPE_CREATE_COLLECTION, SCHEMA.serialize().to_pybytes(),
                                                 collection="c", primary_key="pk")]])
    assert results[0].WhichOneof("outcome") == "appended", results[0]


@pytest.mark.parametrize(("kind", "props", "missing"), [
    (pb.MESSAGE_TYPE_CREATE_COLLECTION, {"primary_key": "pk"}, "collection"),
    (pb.MESSAGE_TYPE_CREATE_COLLECTION, {"collection": "d"}, "primary_key"),
    (pb.MESSAGE_TYPE_INSERT, {}, "collection"),
    (pb.MESSAGE_TYPE_UPSERT, {}, "collection"),
    (pb.MESSAGE_TYPE_DELETE, {}, "collection"),
    (pb.MESSAGE_TYPE_CREATE_PARTITION, {"collection": "c"}, "partition"),
])
async def test_a_missing_property_is_named(stub, kind: int, props: dict[str, str], missing: str) -> None:
    await _with_collection(stub)
    payload = SCHEMA.serialize().to_pybytes() if kind == pb.MESSAGE_TYPE_CREATE_COLLECTION else (
        _stream(pa.record_batch([pa.array([1], pa.int64())], names=["pk"])) if kind == pb.MESSAGE_TYPE_DELETE
        else b"" if kind == pb.MESSAGE_TYPE_CREATE_PARTITION else _stream(ROWS))
    error = await _refusal(stub, _msg(kind, payload, **props))
    name = pb.MessageType.Name(kind).removeprefix("MESSAGE_TYPE_")
    assert error.code == pb.ERROR_CODE_INVALID_ARGUMENT
    assert error.message == f"{name} needs the {missing!r} property", error.message
    assert error.metadata["property"] == missing
    assert "None" not in error.message


async def test_an_ipc_file_is_refused_as_such(stub) -> None:
    await _with_collection(stub)
    error = await _refusal(stub, _msg(pb.MESSAGE_TYPE_INSERT, _file(ROWS), collection="c"))
    assert error.code == pb.ERROR_CODE_INVALID_MESSAGE
    assert "Arrow IPC file" in error.message and "stream format" in error.message, error.message


async def test_a_dictionary_encoded_column_is_refused_by_name(stub) -> None:
    await _with_collection(stub)
    rows = pa.record_batch([pa.array([1, 2], pa.int64()), pa.array(["a", "b"]).dictionary_encode()],
                           names=["pk", "name"])
    error = await _refusal(stub, _msg(pb.MESSAGE_TYPE_INSERT, _stream(rows), collection="c"))
    assert error.code == pb.ERROR_CODE_INVALID_MESSAGE
    assert "column 'name' is dictionary-encoded" in error.message, error.message
    schema_error = await _refusal(stub, _msg(pb.MESSAGE_TYPE_CREATE_COLLECTION, rows.schema.serialize().to_pybytes(),
                                             collection="d", primary_key="pk"))
    assert schema_error.code == pb.ERROR_CODE_INVALID_ARGUMENT
    assert "'name'" in schema_error.message and "dictionary" in schema_error.message, schema_error.message


async def test_a_payload_that_is_not_arrow_is_invalid_message(stub) -> None:
    await _with_collection(stub)
    error = await _refusal(stub, _msg(pb.MESSAGE_TYPE_INSERT, b"not arrow", collection="c"))
    assert error.code == pb.ERROR_CODE_INVALID_MESSAGE
    assert error.message.startswith("INSERT payload is not an Arrow IPC stream"), error.message


def _hold_until_refused(monkeypatch: pytest.MonkeyPatch, server_thread: ServerThread,
                        done_at_once: bytes | None = None) -> threading.Event:
    """Hold the batches with payload ``b"held"`` (through either append path) until the node refuses
    a reused request id: the gate is opened by the refusal itself, so the duplicate is always read while
    the held batch is pending, however fast the machine.  A batch with payload ``done_at_once`` is
    done when the chain's call returns (as a lone append written inside it is), answered behind the
    held one.  Without a refusal the gate opens after 10 s and the test sees two answers."""
    stream = server_thread.node.channel("p").stream
    gate = threading.Event()
    append = stream.append_batch

    class Refusal(produce_module._DuplicateRequestId):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)
            gate.set()

    async def held(messages, **kwargs):  # type: ignore[no-untyped-def]
        if messages[0].payload == b"held":
            await asyncio.to_thread(gate.wait, 10)
        return await append(messages, **kwargs)

    def start(messages, **_kwargs):  # type: ignore[no-untyped-def]
        if messages[0].payload == done_at_once:
            fut = asyncio.get_running_loop().create_future()
            fut.set_result([AppendResult(1 << 40, 1, None)])
            return fut
        return asyncio.ensure_future(held(messages))

    monkeypatch.setattr(produce_module, "_DuplicateRequestId", Refusal)
    monkeypatch.setattr(stream, "append_batch", held)
    monkeypatch.setattr(stream, "start_append", start)
    return gate


async def _produce_refused(
    stub, payloads: list[tuple[int, bytes]],  # type: ignore[no-untyped-def]
) -> tuple[list[tuple[int, str]], grpc.aio.AioRpcError]:
    call = stub.Produce()
    results = []
    try:
        await call.write(spb.ProduceRequest(open=spb.ProduceOpen(pchannel="p")))
        assert (await call.read()).WhichOneof("response") == "opened"
        for rid, payload in payloads:
            await call.write(spb.ProduceRequest(batch=spb.ProduceBatch(request_id=rid, messages=[data("v", payload)])))
        await call.done_writing()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            while (resp := await call.read()) is not grpc.aio.EOF:
                results.append(resp.result)
    finally:
        call.cancel()
    return [(r.request_id, r.WhichOneof("outcome")) for r in results], err.value


async def test_a_request_id_reused_while_pending_ends_the_stream_after_the_first_answer(
    server_thread: ServerThread, stub, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    _hold_until_refused(monkeypatch, server_thread)
    answers, err = await _produce_refused(stub, [(7, b"held"), (7, b"second"), (7, b"third")])
    monkeypatch.undo()
    # One answer for request_id 7 (the first batch's), then the stream ends: no second answer with the id.
    assert answers == [(7, "appended")]
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    error = from_rpc_error(err)
    assert error.code.name == "INVALID_ARGUMENT"
    assert error.fields["request_id"] == "7" and error.fields["field"] == "request_id"
    assert "request_id 7 is already pending" in str(error)
    got = await consume(stub, spb.ConsumeOpen(pchannel="p", vchannel="v"), until=1)
    assert [m.payload for p in got for m in p.messages if m.type == pb.MESSAGE_TYPE_DATA] == [b"held"]


async def test_a_request_id_is_pending_until_answered_even_when_its_batch_is_done_at_once(
    server_thread: ServerThread, stub, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    # Batch 7 is done as soon as it is read, but its answer waits behind batch 6: reusing 7 then is
    # reusing an id the client has no answer for.  (The node used to forget an id once its batch was
    # done, and answered 7 twice.)
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    _hold_until_refused(monkeypatch, server_thread, done_at_once=b"quick")
    answers, err = await _produce_refused(stub, [(6, b"held"), (7, b"quick"), (7, b"again")])
    monkeypatch.undo()
    assert answers == [(6, "appended"), (7, "appended")]
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "request_id 7 is already pending" in str(from_rpc_error(err))


async def test_a_request_id_may_be_reused_once_answered(stub) -> None:
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    call = stub.Produce()
    try:
        await call.write(spb.ProduceRequest(open=spb.ProduceOpen(pchannel="p")))
        assert (await call.read()).WhichOneof("response") == "opened"
        for payload in (b"a", b"b"):
            await call.write(spb.ProduceRequest(batch=spb.ProduceBatch(request_id=1, messages=[data("v", payload)])))
            answer = await call.read()
            assert answer.result.request_id == 1 and answer.result.HasField("appended")
        await call.write(spb.ProduceRequest(close=spb.ProduceClose()))
        assert (await call.read()).WhichOneof("response") == "closed"
    finally:
        call.cancel()


async def test_an_ack_commits_its_stream_s_vchannel_or_any_for_a_whole_pchannel_read_and_no_other_pchannel(
    stub,
) -> None:
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    await stub.CreateConsumerGroup(spb.CreateConsumerGroupRequest(pchannel="p", group="g"))
    _, results = await produce(stub, "p", [[data("v", b"a"), data("w", b"b")]])
    w = results[0].appended.results[1]
    other_vchannel = pb.Position(pchannel="p", vchannel="w", message_id=w.id, timetick=w.timetick)
    other_pchannel = pb.Position(pchannel="q", vchannel="", message_id=w.id, timetick=w.timetick)

    async def acks(vchannel: str, *positions: pb.Position) -> list[spb.ConsumeResponse]:
        call = stub.Consume()
        try:
            await call.write(spb.ConsumeRequest(open=spb.ConsumeOpen(pchannel="p", vchannel=vchannel,
                                                                     consumer_group="g")))
            assert (await call.read()).WhichOneof("response") == "opened"
            while True:  # until the stream has delivered w: then its position is this stream's to commit
                resp = await call.read()
                if resp.WhichOneof("response") == "pack" and resp.pack.end_positions[0].timetick >= w.timetick:
                    break
            for position in positions:
                await call.write(spb.ConsumeRequest(ack=spb.ConsumeAck(positions=[position])))
            answers = []
            while len(answers) < len(positions):
                resp = await call.read()
                if resp.WhichOneof("response") in ("acked", "error"):
                    answers.append(resp)
            return answers
        finally:
            call.cancel()

    refused = await acks("v", other_vchannel)
    assert refused[0].error.code == pb.ERROR_CODE_INVALID_ARGUMENT
    assert "ack.positions[0].vchannel" in refused[0].error.message and "'w'" in refused[0].error.message
    described = await stub.DescribeConsumerGroups(spb.DescribeConsumerGroupsRequest(pchannel="p", groups=["g"]))
    assert list(described.groups[0].vchannels) == [], "a refused ack commits nothing"
    answers = await acks("", other_vchannel, other_pchannel)
    assert answers[0].WhichOneof("response") == "acked", answers[0]
    assert answers[1].error.code == pb.ERROR_CODE_INVALID_ARGUMENT and "pchannel 'q'" in answers[1].error.message
    described = await stub.DescribeConsumerGroups(spb.DescribeConsumerGroupsRequest(pchannel="p", groups=["g"]))
    committed = {v.vchannel: v.committed for v in described.groups[0].vchannels}
    assert committed == {"w": other_vchannel}


async def test_latest_position_of_a_vchannel_never_written_is_the_pchannel_s(stub) -> None:
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    _, results = await produce(stub, "p", [[data("v", b"a")]])
    written = results[0].appended.results[0]
    latest = await stub.GetLatestPosition(spb.GetLatestPositionRequest(pchannel="p", vchannel="never"))
    assert latest.HasField("last")
    # At or after the write: the beat may persist a TimeTick in between, itself a newest position (the
    # exact position is checked on a node that cannot tick: tests/integration/test_latest_position.py).
    assert (latest.last.pchannel, latest.last.vchannel) == ("p", "never")
    at, sent = (int.from_bytes(m.id, "big") for m in (latest.last.message_id, written.id))
    assert at >= sent and latest.last.timetick >= written.timetick, (latest, written)
    assert latest.mvcc_timetick >= latest.last.timetick
    # Resuming there delivers exactly what the vchannel gets from now on.
    _, later = await produce(stub, "p", [[data("never", b"first of never")]])
    got = await consume(stub, spb.ConsumeOpen(pchannel="p", vchannel="never", policy=pb.DeliverPolicy(
        start_from=latest.last.message_id), filters=[pb.DeliverFilter(timetick_gt=latest.last.timetick)]), until=1)
    assert [m.payload for p in got for m in p.messages if m.type == pb.MESSAGE_TYPE_DATA] == [b"first of never"]
    assert later[0].WhichOneof("outcome") == "appended"


async def test_a_new_pchannel_has_a_latest_position(stub) -> None:
    # The node writes a message of its own when it opens a pchannel, so `last` is set from the start.
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    latest = await stub.GetLatestPosition(spb.GetLatestPositionRequest(pchannel="p", vchannel="v"))
    assert latest.HasField("last") and latest.last.timetick > 0


async def test_transaction_framing_messages_are_delivered(stub) -> None:
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    begun = await stub.BeginTxn(spb.BeginTxnRequest(pchannel="p", vchannel="v"))
    txn = pb.TxnContext(txn_id=begun.txn_id, keepalive_ms=begun.keepalive_ms)
    await produce(stub, "p", [[data("v", b"body")]], txn=txn)
    await stub.CommitTxn(spb.CommitTxnRequest(pchannel="p", vchannel="v", txn_id=begun.txn_id))
    got = await consume(stub, spb.ConsumeOpen(pchannel="p", vchannel="v", filters=[pb.DeliverFilter(
        message_types=pb.MessageTypeSet(types=[pb.MESSAGE_TYPE_DATA]))]), until=3)
    kinds = [(m.type, m.txn.txn_id) for p in got for m in p.messages if m.type != pb.MESSAGE_TYPE_TIME_TICK]
    assert kinds == [(pb.MESSAGE_TYPE_BEGIN_TXN, begun.txn_id), (pb.MESSAGE_TYPE_DATA, begun.txn_id),
                     (pb.MESSAGE_TYPE_COMMIT_TXN, begun.txn_id)]


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
async def test_reflection_lists_the_services(server: str, version: str) -> None:
    # The v1 and v1alpha messages are the same field for field, so one set of classes speaks both.
    async with grpc.aio.insecure_channel(server) as channel:
        info = channel.stream_stream(f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
                                     request_serializer=rpb.ServerReflectionRequest.SerializeToString,
                                     response_deserializer=rpb.ServerReflectionResponse.FromString)
        call = info(iter([rpb.ServerReflectionRequest(list_services=""),
                          rpb.ServerReflectionRequest(file_containing_symbol="streamingnode.v1.StreamingNode"),
                          rpb.ServerReflectionRequest(
                              file_containing_symbol=f"grpc.reflection.{version}.ServerReflection")]))
        answers = [answer async for answer in call]
    listed = {s.name for s in answers[0].list_services_response.service}
    assert {"streamingnode.v1.StreamingNode", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection"} <= listed
    assert answers[1].HasField("file_descriptor_response"), answers[1]
    assert answers[2].file_descriptor_response.file_descriptor_proto, f"{version} is listed but not described"
    own = descriptor_pb2.FileDescriptorProto.FromString(answers[2].file_descriptor_response.file_descriptor_proto[0])
    assert own.package == f"grpc.reflection.{version}" and own.service[0].name == "ServerReflection"


async def test_a_schema_may_come_as_an_ipc_stream_without_batches(stub) -> None:
    # What arrow-js tableToIPC(emptyTable, "stream") writes: the node reads its first message, the schema.
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    _, results = await produce(stub, "p", [[_msg(pb.MESSAGE_TYPE_CREATE_COLLECTION, _stream(ROWS.slice(0, 0)),
                                                 collection="c", primary_key="pk")]])
    assert results[0].WhichOneof("outcome") == "appended", results[0]
    _, inserted = await produce(stub, "p", [[_msg(pb.MESSAGE_TYPE_INSERT, _stream(ROWS), collection="c")]])
    assert inserted[0].WhichOneof("outcome") == "appended", inserted[0]
