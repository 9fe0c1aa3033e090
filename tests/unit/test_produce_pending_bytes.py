"""A produce stream stops reading while its pending batches hold ``produce_max_in_flight_bytes``.

Appends commit in the order they reach the chain, so whatever a stream has read and handed on is
ahead of every other stream's next append: a bulk producer that could hand on 64 batches would make
a lone append of another producer wait for all of them.  Bounded by bytes, it waits for about two
commits.  A batch is always read when nothing is pending, however large.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace
from typing import Any

import grpc

from streamingnode.server.produce import ProduceStream
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from tests.waiting import until
from wal import AppendResult, Message
from wal.wal import COMMIT_OVERHEAD


class _Context:
    """The stream's side of a call: requests the test queues, responses it collects."""

    def __init__(self) -> None:
        self.requests: asyncio.Queue[Any] = asyncio.Queue()
        self.reads = 0
        self.responses: list[spb.ProduceResponse] = []

    async def read(self) -> Any:
        request = await self.requests.get()
        self.reads += 1
        return request

    async def write(self, response: spb.ProduceResponse) -> None:
        self.responses.append(response)


class _Channel:
    """A channel whose appends stay pending until the test completes them."""

    def __init__(self) -> None:
        self.started: list[tuple[list[Message], asyncio.Future[list[AppendResult]]]] = []
        self.stream = SimpleNamespace(pchannel="p", term=1, txns={}, start_append=self._start)

    def _start(self, messages: list[Message], *, nbytes: int | None = None) -> asyncio.Future[list[AppendResult]]:
        fut: asyncio.Future[list[AppendResult]] = asyncio.get_running_loop().create_future()
        self.started.append((messages, fut))
        return fut

    def finish(self, i: int) -> None:
        messages, fut = self.started[i]
        fut.set_result([AppendResult(j, 100 + j, None) for j in range(len(messages))])


def _batch(rid: int, *sizes: int) -> spb.ProduceRequest:
    request = spb.ProduceRequest()
    cols = request.batch.columns
    request.batch.request_id = rid
    for size in sizes:
        cols.types.append(pb.MESSAGE_TYPE_DATA)
        cols.vchannels.append("v")
        cols.payloads.append(b"x" * size)
    return request


async def _stop(writer: asyncio.Future[None]) -> None:
    """The writer waits for the stream's end, which these tests do not send: cancel it, and wait."""
    writer.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await writer


def _stream(max_bytes: int) -> tuple[ProduceStream, _Context]:
    config = SimpleNamespace(produce_max_in_flight=64, produce_max_in_flight_bytes=max_bytes,
                             max_message_bytes=1 << 20)
    node = SimpleNamespace(config=config, tracing=None, ownership=None, fail_on=lambda *_: None)
    ctx = _Context()
    return ProduceStream(node, ctx), ctx  # type: ignore[arg-type]


async def test_a_stream_stops_reading_while_its_pending_batches_hold_the_byte_limit() -> None:
    each = 1000 + 2 * COMMIT_OVERHEAD  # two messages of 600 and 400 bytes, weighed as a commit weighs them
    stream, ctx = _stream(3 * each)
    channel = _Channel()
    for rid in range(1, 6):
        ctx.requests.put_nowait(_batch(rid, 600, 400))
    reader = asyncio.ensure_future(stream._read_batches(channel, None))  # type: ignore[arg-type]
    writer = asyncio.ensure_future(stream._write_results())
    await until(lambda: len(channel.started) == 3, "three batches handed on")
    for _ in range(20):
        await asyncio.sleep(0)
    # The limit pending: the fourth batch is not even read (gRPC's flow control holds it back).
    assert (ctx.reads, len(channel.started), stream.pending_bytes) == (3, 3, 3 * each)

    channel.finish(0)  # the first is answered: two batches' bytes pending, so one more is read
    await until(lambda: len(channel.started) == 4, "a fourth batch handed on once the first was answered")
    for _ in range(20):
        await asyncio.sleep(0)
    assert (ctx.reads, stream.pending_bytes) == (4, 3 * each)
    assert [r.result.request_id for r in ctx.responses] == [1]

    for i in (1, 2, 3):
        channel.finish(i)
    await until(lambda: len(channel.started) == 5, "the fifth handed on")
    channel.finish(4)
    ctx.requests.put_nowait(grpc.aio.EOF)
    await reader
    await until(lambda: len(ctx.responses) == 5, "every batch answered")
    assert [r.result.request_id for r in ctx.responses] == [1, 2, 3, 4, 5]
    assert stream.pending_bytes == 0
    await _stop(writer)


async def test_a_batch_over_the_limit_is_read_when_nothing_is_pending_and_alone() -> None:
    stream, ctx = _stream(1000)
    channel = _Channel()
    ctx.requests.put_nowait(_batch(1, 5000))
    ctx.requests.put_nowait(_batch(2, 10))
    reader = asyncio.ensure_future(stream._read_batches(channel, None))  # type: ignore[arg-type]
    writer = asyncio.ensure_future(stream._write_results())
    await until(lambda: len(channel.started) == 1, "the large batch handed on")
    for _ in range(20):
        await asyncio.sleep(0)
    assert (ctx.reads, stream.pending_bytes) == (1, 5000 + COMMIT_OVERHEAD)  # nothing read behind it meanwhile
    channel.finish(0)
    await until(lambda: len(channel.started) == 2, "the next read once the large one was answered")
    channel.finish(1)
    ctx.requests.put_nowait(grpc.aio.EOF)
    await reader
    await until(lambda: len(ctx.responses) == 2, "both answered")
    await _stop(writer)
