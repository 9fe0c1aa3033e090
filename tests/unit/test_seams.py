"""Seams where a message or a caller could be lost: an answer that does not fit its batch, a cancel of
a produce call or of Ownership.stop, one Spark query stopping another's client, a permanent JetStream
refusal retried forever, and an internal retry hint sent to clients."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace
from typing import Any

import grpc
import nats.js.errors
import pytest

from streamingnode.client._accumulator import Batch
from streamingnode.client._producer import Producer
from streamingnode.cluster.ownership import Ownership
from streamingnode.server.produce import ProduceStream
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.wire.codes import to_error_detail
from tests.waiting import until
from wal.backends.jetstream import JetStreamBackend
from wal.errors import ErrorCode, OnShutdownError, StreamingError, UnavailableError, UnrecoverableError


# --- the producer: an answer that does not fit its batch ------------------------------------------
class _Answers:
    """A produce call whose reads return the given responses."""

    def __init__(self, *responses: spb.ProduceResponse) -> None:
        self.responses = list(responses)

    async def read(self) -> Any:
        return self.responses.pop(0) if self.responses else grpc.aio.EOF


def _in_flight(producer: Producer, n: int) -> Batch:
    request = spb.ProduceRequest()
    request.batch.request_id = 1
    request.batch.columns.payloads.extend([b"x"] * n)
    loop = asyncio.get_running_loop()
    batch = Batch(request, [loop.create_future() for _ in range(n)], nbytes=n)
    batch.sent = True
    producer._sender.in_flight.append(batch)
    producer._accumulator.buffered += n
    return batch


@pytest.mark.parametrize("producer_id", [None, "idem"])
async def test_an_answer_that_does_not_fit_its_batch_leaves_the_batch_to_be_resent_or_failed(
        producer_id: str | None) -> None:
    producer = Producer(SimpleNamespace(), "p", producer_id=producer_id)  # type: ignore[arg-type]
    batch = _in_flight(producer, 2)
    wrong = spb.ProduceResponse()
    wrong.result.request_id = 1
    wrong.result.appended.ids.extend([7, 8, 9])  # three results for two messages
    wrong.result.appended.timeticks.extend([1, 2, 3])
    with pytest.raises(UnavailableError, match="answered a batch of 2 messages with 3 results"):
        await producer._sender.read(_Answers(wrong))
    assert list(producer._sender.in_flight) == [batch], "the batch stays in flight: the broken stream decides its fate"
    producer._sender.stream_broke(UnavailableError("the answer did not fit"))
    if producer_id is None:
        assert all(f.done() and isinstance(f.exception(), UnavailableError) for f in batch.futures)
        assert producer.buffered_bytes == 0
    else:
        assert list(producer._accumulator.sealed) == [batch], "resent on the next stream with its sequences"
    producer._state = producer._state.CLOSED
    producer._fail_all(OnShutdownError("test over"))


# --- the produce stream: a cancel of the call is never swallowed ----------------------------------
class _SlowToCancelContext:
    """A call whose second read (the reader's) takes a while to give up when cancelled, as a gRPC read
    can; the first read is the open."""

    def __init__(self) -> None:
        self.opened = False
        self.release = asyncio.Event()
        self.reading = asyncio.Event()
        self.responses: list[spb.ProduceResponse] = []

    async def read(self) -> Any:
        if not self.opened:
            self.opened = True
            return spb.ProduceRequest(open=spb.ProduceOpen(pchannel="p"))
        self.reading.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await self.release.wait()
            raise
        raise AssertionError("unreachable")

    async def write(self, response: spb.ProduceResponse) -> None:
        self.responses.append(response)


async def test_a_cancel_of_the_produce_call_is_not_swallowed_once_a_failure_is_recorded() -> None:
    config = SimpleNamespace(produce_max_in_flight=8, produce_max_in_flight_bytes=1 << 20, max_message_bytes=1 << 20)
    stream_of = SimpleNamespace(pchannel="p", term=1, txns={}, chain=SimpleNamespace(interceptors=[]))
    node = SimpleNamespace(config=config, tracing=None, ownership=None, fail_on=lambda *_: None,
                           draining=asyncio.Event(),
                           metrics=SimpleNamespace(channel=lambda _: None),
                           channel=lambda *_: SimpleNamespace(stream=stream_of))
    ctx = _SlowToCancelContext()
    call = asyncio.ensure_future(ProduceStream(node, ctx).run())  # type: ignore[arg-type]
    await asyncio.wait_for(ctx.reading.wait(), 10)
    node.draining.set()  # the stream records ON_SHUTDOWN and cancels its reader, which is slow to end
    for _ in range(5):
        await asyncio.sleep(0)
    call.cancel()  # meanwhile the call itself is cancelled (the client went away)
    ctx.release.set()
    with contextlib.suppress(asyncio.CancelledError, StreamingError):
        await asyncio.wait_for(call, 10)
    assert call.cancelled(), f"the call's cancel was swallowed: it ended with {call.exception()!r}"


# --- Ownership.stop: a cancel of stop() itself goes on -------------------------------------------
async def test_a_cancel_of_ownership_stop_is_not_swallowed() -> None:
    left: list[bool] = []

    async def leave() -> None:
        left.append(True)

    membership = SimpleNamespace(node_id="n1", leave=leave)
    leases = SimpleNamespace(ttl=1.0)

    async def names() -> list[str]:
        return []

    async def on_take(*_: Any) -> None:
        return None

    ownership = Ownership(membership, leases, names, on_take, on_take)  # type: ignore[arg-type]
    release = asyncio.Event()

    async def slow_loop() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await release.wait()  # the loop takes a while to finish its cancellation
            raise

    ownership._task = asyncio.ensure_future(slow_loop())
    await asyncio.sleep(0)
    stopping = asyncio.ensure_future(ownership.stop())
    for _ in range(5):
        await asyncio.sleep(0)
    stopping.cancel()
    for _ in range(5):
        await asyncio.sleep(0)
    release.set()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(stopping, 10)
    assert stopping.cancelled(), "stop() swallowed its own cancellation and went on"
    assert left == [], "stop() went on to leave the membership after it was cancelled"
    await until(lambda: ownership._task is None or ownership._task.done(), "the loop ended")


# --- the Spark source: one query's stop() keeps the others' client -------------------------------
def test_one_stream_readers_stop_does_not_close_the_client_another_reader_uses(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pyspark")
    from streamingnode.spark import _source  # noqa: PLC0415
    from streamingnode.spark._options import Connection  # noqa: PLC0415

    made: list[SimpleNamespace] = []

    def client(self: Connection) -> SimpleNamespace:
        made.append(SimpleNamespace(closed=False))
        made[-1].close = lambda c=made[-1]: setattr(c, "closed", True)
        return made[-1]

    monkeypatch.setattr(Connection, "client", client)
    conn = Connection(("127.0.0.1:1",), None, None, None, None, 5.0)
    opts = SimpleNamespace(conn=conn, pchannel="p")
    first = _source.StreamReader(opts, None, None)  # type: ignore[arg-type]
    second = _source.StreamReader(opts, None, None)  # type: ignore[arg-type]
    shared = _source._driver_client(conn, first._user)
    assert _source._driver_client(conn, second._user) is shared
    first.stop()
    assert not shared.closed, "the first query's stop closed the client the second still uses"
    assert _source._driver_client(conn, second._user) is shared
    second.stop()
    assert shared.closed and len(made) == 1
    first.stop()  # a second stop is harmless


# --- JetStream: permanent refusals are not retriable ---------------------------------------------
@pytest.mark.parametrize(("code", "err_code", "retriable"), [
    (400, 10058, False),  # a stream name in use with another configuration
    (400, 10077, False),  # maximum messages per subject exceeded
    (500, 10047, False),  # insufficient storage resources
    (404, 10059, False),  # stream not found
    (503, 10008, True),  # JetStream temporarily unavailable
    (500, 10009, True),  # the cluster cannot handle the request: a leader election
    (500, 10007, True),  # not assigned to this server yet
    (429, 0, True),
])
async def test_a_jetstream_refusal_is_retriable_only_while_the_cluster_is_between_states(
        code: int, err_code: int, retriable: bool) -> None:
    backend = JetStreamBackend.__new__(JetStreamBackend)
    backend.path = "nats:test/sn"

    async def refused() -> None:
        raise nats.js.errors.APIError(code=code, err_code=err_code, description="refused")

    with pytest.raises(StreamingError) as caught:
        await backend._guard(refused(), "writing")
    assert caught.value.retriable is retriable
    assert type(caught.value) is (UnavailableError if retriable else UnrecoverableError)
    assert caught.value.fields["err_code"] == err_code


# --- the committer's retry hint stays inside the node --------------------------------------------
def test_the_retry_hint_is_an_attribute_never_serialised() -> None:
    exc = UnavailableError("the write was held", channel="p")
    exc.held_seconds = 1.5
    detail = to_error_detail(exc)
    assert dict(detail.metadata) == {"channel": "p"} and exc.code is ErrorCode.UNAVAILABLE
