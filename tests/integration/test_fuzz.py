"""Fuzz every RPC with random, garbled and truncated requests; the node must answer each precisely and
keep every stored byte.

Requests are generated from the request types' descriptors (any field, any value, unknown enum
numbers, nested messages), plus raw garbage bytes and truncated valid requests sent to each of the 14
methods.  Every call must end in success or a precise status, never UNKNOWN or INTERNAL (which would
mean an error the node did not handle, or a request gRPC failed to parse before the node saw it).
Each call has a deadline, and so has the whole run.  Afterwards the node still reports SERVING, a
normal produce/consume works and the messages stored before the fuzzing are byte-identical.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamingnode.server import ServerThread
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from tests.integration.conftest import node_config

pytestmark = pytest.mark.integration

SERVICE = spb.DESCRIPTOR.services_by_name["StreamingNode"]
METHODS = {m.name: m for m in SERVICE.methods}
STRINGS = st.one_of(
    st.sampled_from(["p", "v", "g", "", "missing", "x" * 300, "\x00", "p\x00", "producer_id", "collection"]),
    st.text(max_size=4),
)
INTS = st.one_of(st.integers(-3, 3), st.integers(-(2**63), 2**63 - 1), st.just(2**32 - 1))
UINTS = st.one_of(st.integers(0, 3), st.integers(0, 2**64 - 1))
BYTES = st.one_of(st.binary(max_size=16), st.sampled_from([b"", (5).to_bytes(8, "big"), b"\xff" * 8]))
SENT = {"requests": 0}


def _value(draw: st.DrawFn, field: FieldDescriptor, depth: int) -> Any:
    t = field.type
    if t == FieldDescriptor.TYPE_MESSAGE:
        return _message(draw, field.message_type, depth + 1)
    if t == FieldDescriptor.TYPE_ENUM:
        return draw(st.one_of(st.sampled_from([v.number for v in field.enum_type.values]), st.integers(0, 2000)))
    if t == FieldDescriptor.TYPE_STRING:
        return draw(STRINGS)
    if t == FieldDescriptor.TYPE_BYTES:
        return draw(BYTES)
    if t == FieldDescriptor.TYPE_BOOL:
        return draw(st.booleans())
    if t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return draw(st.integers(0, 2**32 - 1))
    if t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return draw(UINTS)
    if t in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32):
        return draw(st.integers(-(2**31), 2**31 - 1))
    return draw(INTS)


def _message(draw: st.DrawFn, desc: Descriptor, depth: int = 0) -> Message:
    """A message of type ``desc`` with a random subset of its fields set to random values."""
    from google.protobuf import message_factory  # noqa: PLC0415

    msg = message_factory.GetMessageClass(desc)()
    if depth > 3:
        return msg
    for field in desc.fields:
        if not draw(st.booleans()):
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            for _ in range(draw(st.integers(0, 2))):
                getattr(msg, field.name)[draw(STRINGS)] = draw(STRINGS)
        elif field.is_repeated:
            container = getattr(msg, field.name)
            for _ in range(draw(st.integers(0, 3))):
                if field.type == FieldDescriptor.TYPE_MESSAGE:
                    container.add().CopyFrom(_value(draw, field, depth))
                else:
                    container.append(_value(draw, field, depth))
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            getattr(msg, field.name).CopyFrom(_value(draw, field, depth))
        else:
            setattr(msg, field.name, _value(draw, field, depth))
    return msg


@st.composite
def calls(draw: st.DrawFn) -> tuple[str, list[bytes], bool]:
    """(method, serialized requests, garbled)."""
    name = draw(st.sampled_from(sorted(METHODS)))
    method = METHODS[name]
    count = draw(st.integers(1, 6)) if method.client_streaming else 1
    garble = draw(st.integers(0, 9))
    if garble == 0:
        return name, [draw(st.binary(min_size=1, max_size=64)) for _ in range(count)], True
    if garble <= 2:
        # A valid request cut short (a length-delimited field or varint left open), or one with
        # garbage appended: mostly undecodable, sometimes a valid prefix.
        out = []
        for _ in range(count):
            whole = _message(draw, method.input_type).SerializeToString() or b"\x0a\x05"
            cut = draw(st.integers(0, max(len(whole) - 1, 0)))
            out.append(whole[:cut] + draw(st.sampled_from([b"", b"\xff", b"\x0a\xff\xff", b"\x80"])))
        return name, out, True
    requests = []
    for i in range(count):
        msg = _message(draw, method.input_type)
        if method.client_streaming and i == 0 and draw(st.booleans()):
            # Mostly start a stream properly, so the fuzz reaches past the first request.
            opening = msg.__class__()
            opening.open.CopyFrom(_message(draw, opening.DESCRIPTOR.fields_by_name["open"].message_type))
            opening.open.pchannel = draw(st.sampled_from(["p", "missing", ""]))
            msg = opening
        if name == "DestroyChannels":
            # Keep the channel whose bytes are checked afterwards.
            msg.channel_names[:] = [n for n in msg.channel_names if n != "p"]
        requests.append(msg.SerializeToString())
    return name, requests, False


def _parses(name: str, raw: list[bytes]) -> bool:
    cls = spb.__dict__[METHODS[name].input_type.name]
    try:
        for r in raw:
            cls.FromString(r)
    except DecodeError:
        return False
    return True


CALL_SECONDS = 2.0
"""Each call's deadline: a stream the fuzz leaves open ends with DEADLINE_EXCEEDED, a precise code."""
RUN_SECONDS = 200.0
"""The whole fuzz run's deadline, under pytest's 300 s: the run takes 15-40 s here on a loaded host
(each Consume that opens a read waits out its call deadline), and longer on a slower machine."""


def _call(channel: grpc.Channel, name: str, raw: list[bytes], timeout: float) -> grpc.StatusCode:
    path = f"/{SERVICE.full_name}/{name}"
    method = METHODS[name]
    try:
        if method.client_streaming:
            call = channel.stream_stream(path, request_serializer=None, response_deserializer=None)
            for _ in call(iter(raw), timeout=timeout):
                pass
        else:
            channel.unary_unary(path, request_serializer=None, response_deserializer=None)(raw[0], timeout=timeout)
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def _serving(channel: grpc.Channel) -> bool:
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5.0)
    return reply.status == health_pb2.HealthCheckResponse.SERVING  # type: ignore[no-any-return]


def _stored(stub: sgrpc.StreamingNodeStub, count: int) -> list[bytes]:
    """The first ``count`` DATA messages of pchannel p, serialized (ids, timeticks, payloads...)."""
    done = threading.Event()

    def reqs():
        yield spb.ConsumeRequest(open=spb.ConsumeOpen(pchannel="p"))
        done.wait(10)  # half-closing would end the read: keep the request side open until we have all

    out: list[bytes] = []
    call = stub.Consume(reqs(), timeout=10)
    try:
        for resp in call:
            out += [m.SerializeToString() for m in resp.pack.messages if m.type == pb.MESSAGE_TYPE_DATA]
            if len(out) >= count:
                break
    finally:
        done.set()
        call.cancel()
    return out[:count]


def test_fuzz_every_rpc_keeps_the_node_serving_and_the_log_intact(tmp_path: Path) -> None:
    with ServerThread(node_config(tmp_path / "data", tick_interval=0.2, channels=("p",))) as srv, \
            grpc.insecure_channel(srv.address) as channel:
        stub = sgrpc.StreamingNodeStub(channel)
        produce_open = spb.ProduceRequest(open=spb.ProduceOpen(pchannel="p"))
        batch = spb.ProduceRequest(batch=spb.ProduceBatch(request_id=1, messages=[
            pb.Message(type=pb.MESSAGE_TYPE_DATA, vchannel=f"v{i % 3}", payload=bytes([i]) * 64,
                       properties={"k": str(i)}) for i in range(20)]))
        list(stub.Produce(iter([produce_open, batch])))
        before = _stored(stub, 20)
        assert len(before) == 20

        deadline = time.monotonic() + RUN_SECONDS
        seen: set[str] = set()
        garbage = {"sent": 0, "undecodable": 0}

        @settings(max_examples=1400, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(calls())
        def one(call: tuple[str, list[bytes], bool]) -> None:
            name, raw, garbled = call
            left = deadline - time.monotonic()
            assert left > 0, f"the fuzz run took over {RUN_SECONDS} s ({SENT['requests']} requests sent)"
            code = _call(channel, name, raw, min(CALL_SECONDS, left))
            SENT["requests"] += len(raw)
            seen.add(name)
            if garbled:
                garbage["sent"] += 1
                garbage["undecodable"] += not _parses(name, raw)
            # The code and method first: a failure's message is cut short in a CI log, the bytes are last.
            assert code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), (code, name, garbled, raw)

        one()
        assert SENT["requests"] >= 2000, SENT
        assert seen == set(METHODS), set(METHODS) - seen
        assert garbage["undecodable"] >= 100, garbage  # the undecodable case was exercised, on every kind
        assert _serving(channel)

        # The node still serves a normal round trip, and the old messages did not change.
        done = list(stub.Produce(iter([produce_open, spb.ProduceRequest(batch=spb.ProduceBatch(
            request_id=9, messages=[pb.Message(type=pb.MESSAGE_TYPE_DATA, vchannel="v0", payload=b"after")]))])))
        (result,) = [r.result for r in done if r.WhichOneof("response") == "result"]
        assert result.HasField("appended"), result
        assert _stored(stub, 20) == before


UNARY = sorted(n for n, m in METHODS.items() if not (m.client_streaming or m.server_streaming))
UNDECODABLE = (b"\xff", b"\x0a\x05ab", b"\x0a\xff\xff", b"\x08")
"""Bytes no request type parses: a bad wire type, a field cut short, a length cut short, no value."""


def test_an_undecodable_request_is_invalid_argument_with_error_info_on_every_rpc(tmp_path: Path) -> None:
    assert len(UNARY) == 12
    with ServerThread(node_config(tmp_path / "data", channels=("p",))) as srv, \
            grpc.insecure_channel(srv.address) as channel:
        for name in [*UNARY, "Produce", "Consume", "Backup"]:
            for raw in UNDECODABLE:
                path = f"/{SERVICE.full_name}/{name}"
                with pytest.raises(grpc.RpcError) as caught:
                    if name in UNARY:
                        channel.unary_unary(path, request_serializer=None, response_deserializer=None)(raw, timeout=5)
                    elif name == "Backup":  # one request, a stream of answers
                        list(channel.unary_stream(path, request_serializer=None, response_deserializer=None)(
                            raw, timeout=5))
                    else:
                        call = channel.stream_stream(path, request_serializer=None, response_deserializer=None)
                        list(call(iter([raw]), timeout=5))
                exc = caught.value
                assert exc.code() is grpc.StatusCode.INVALID_ARGUMENT, (name, raw, exc.code(), exc.details())
                status = rpc_status.from_call(exc)  # type: ignore[arg-type]
                assert status is not None, (name, raw)
                infos = [d for d in status.details if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR)]
                assert len(infos) == 1, status
                info = error_details_pb2.ErrorInfo()
                infos[0].Unpack(info)
                assert (info.reason, info.domain) == ("INVALID_ARGUMENT", "streamingnode"), info
                assert METHODS[name].input_type.name in status.message, status.message
        assert _serving(channel)
