"""The SDK consumer across a reconnect, against a scripted stub: an ack not answered when the stream
broke goes again on the new stream only once that stream has delivered up to it (the node commits
only what the stream an ack arrives on delivered), and acks after it wait behind it; an ack of a
position never received is sent at once, for the node to refuse."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from streamingnode.client import Consumer
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.wire import codec
from streamingnode.wire.codes import to_error_detail
from tests.waiting import until
from wal.errors import OnShutdownError
from wal.message import Position
from wal.scanner import MsgPack


class _Call:
    """One Consume call: what the consumer wrote, and the responses the test feeds it."""

    def __init__(self) -> None:
        self.written: list[spb.ConsumeRequest] = []
        self.responses: asyncio.Queue[Any] = asyncio.Queue()

    async def write(self, request: spb.ConsumeRequest) -> None:
        self.written.append(request)

    async def read(self) -> Any:
        return await self.responses.get()

    def cancel(self) -> None:
        self.responses.put_nowait(grpc.aio.EOF)

    def acks(self) -> list[tuple[int, int]]:
        return [(int.from_bytes(p.message_id.id, "big"), p.timetick)
                for r in self.written if r.WhichOneof("request") == "ack" for p in r.ack.positions]

    def feed_pack(self, start: tuple[int, int], end: tuple[int, int]) -> None:
        pack = MsgPack(start[1], end[1], [], Position("p", *start), Position("p", *end))
        self.responses.put_nowait(spb.ConsumeResponse(pack=codec.msgpack_to_pb(pack, "v")))

    def feed_acked(self) -> None:
        self.responses.put_nowait(spb.ConsumeResponse(acked=spb.ConsumeAcked()))


class _Stub:
    def __init__(self) -> None:
        self.calls: list[_Call] = []

    def Consume(self) -> _Call:  # the generated stub's name
        call = _Call()
        self.calls.append(call)
        return call


def _opened() -> spb.ConsumeResponse:
    return spb.ConsumeResponse(opened=spb.ConsumeOpened(consumer_id=1, term=1))


async def test_an_unanswered_ack_waits_for_the_new_stream_to_deliver_it() -> None:
    stub = _Stub()
    consumer = Consumer(stub, "p", "v", group="g", reconnect_timeout=10.0)  # type: ignore[arg-type]
    consumer.start()
    try:
        await until(lambda: len(stub.calls) == 1, "the first open")
        first = stub.calls[0]
        first.responses.put_nowait(_opened())
        first.feed_pack((0, 0), (10, 100))
        first.feed_pack((10, 100), (20, 200))
        one = await asyncio.wait_for(anext(consumer), 10)
        two = await asyncio.wait_for(anext(consumer), 10)
        acked = asyncio.ensure_future(consumer.ack(one))
        await until(lambda: first.acks() == [(10, 100)], "the ack written at once: this stream delivered it")
        first.feed_acked()
        await asyncio.wait_for(acked, 10)

        first.responses.put_nowait(grpc.aio.EOF)  # the stream breaks
        await until(lambda: len(stub.calls) == 2, "the reopen")
        second = stub.calls[1]
        pending = asyncio.ensure_future(consumer.ack(two))  # nobody to send it to yet
        behind = asyncio.ensure_future(consumer.ack(Position("p", 12, 120)))  # after it: waits behind it
        await until(lambda: len(consumer._acks) == 2, "both acks registered")
        second.responses.put_nowait(_opened())
        await until(lambda: consumer.connected, "the new stream open")
        # The node starts the new stream at the group's position (10, 100): until a pack of it reaches
        # (20, 200) it would refuse the ack, so nothing is sent.
        second.feed_pack((10, 200), (15, 210))
        three = await asyncio.wait_for(anext(consumer), 10)
        assert three.end_position == Position("p", 15, 210)
        assert second.acks() == [], "an ack the new stream has not delivered yet waits"
        second.feed_pack((15, 210), (25, 300))
        await until(lambda: second.acks() == [(20, 200), (12, 120)], "both sent, in order, once delivered")
        second.feed_acked()
        second.feed_acked()
        await asyncio.wait_for(asyncio.gather(pending, behind), 10)

        # A position this consumer never received is not held back: the node's answer decides.
        never = asyncio.ensure_future(consumer.ack(Position("p", 10_000, 10_000)))
        await until(lambda: (10_000, 10_000) in second.acks(), "sent at once")
        second.feed_acked()
        await asyncio.wait_for(never, 10)
        second.responses.put_nowait(spb.ConsumeResponse(closed=spb.ConsumeClosed()))
    finally:
        await consumer.aclose()


async def test_an_ack_answered_on_shutdown_goes_again_on_the_next_stream() -> None:
    # The pchannel closed under the commit (its owner going away): the ack is not failed but resent.
    stub = _Stub()
    consumer = Consumer(stub, "p", "v", group="g", reconnect_timeout=10.0)  # type: ignore[arg-type]
    consumer.start()
    try:
        await until(lambda: len(stub.calls) == 1, "the first open")
        first = stub.calls[0]
        first.responses.put_nowait(_opened())
        first.feed_pack((0, 0), (10, 100))
        pack = await asyncio.wait_for(anext(consumer), 10)
        acked = asyncio.ensure_future(consumer.ack(pack))
        await until(lambda: first.acks() == [(10, 100)], "the ack written")
        first.responses.put_nowait(spb.ConsumeResponse(error=to_error_detail(
            OnShutdownError("WAL of pchannel 'p' is closed", channel="p"))))
        await until(lambda: len(stub.calls) == 2, "the reopen")
        second = stub.calls[1]
        second.responses.put_nowait(_opened())
        second.feed_pack((10, 100), (12, 150))
        await until(lambda: second.acks() == [(10, 100)], "the ack sent again")
        assert not acked.done()
        second.feed_acked()
        await asyncio.wait_for(acked, 10)
        second.responses.put_nowait(spb.ConsumeResponse(closed=spb.ConsumeClosed()))
    finally:
        await consumer.aclose()
