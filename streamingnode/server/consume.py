"""The Consume stream: MsgPacks out as fast as the client reads them; acks and close come in meanwhile.

A read starts from the open request's deliver policy and filters, or, for a consumer group with a
committed position, just after that position.  Packs too large for one response are split at
delivery units (``wal.packs``), so a transaction always arrives whole; a unit still too large (a big
transaction) goes over consecutive responses marked ``MsgPack.continued``, which the client joins.
Every response fits the client's receive limit (``ConsumeOpen.max_response_bytes``, 4 MiB unless it
says more); a single message that cannot ends the stream with MESSAGE_TOO_LARGE.  Packs are encoded
straight to bytes (``convert``).  Acks commit the group's position and are answered in-band, so a failed ack
leaves the stream open.  When the node drains, the stream ends with ON_SHUTDOWN at once.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import grpc
import structlog

from streamingnode import convert
from streamingnode.groups import check_group_name
from streamingnode.metrics import ChannelMetrics
from streamingnode.node import Channel, Node
from streamingnode.server.errors import refused, require
from streamingnode.status import to_error_detail
from streamingnode.v1 import streaming_pb2 as spb
from wal.errors import InvalidArgumentError, MessageTooLargeError, OnShutdownError, StreamingError
from wal.lifecycle import cancel_and_wait
from wal.names import VCHANNEL
from wal.options import DeliverFilter, DeliverPolicy, ReadOption
from wal.packs import MESSAGE_OVERHEAD, continued_runs, split_pack
from wal.scanner import MsgPack

log = structlog.get_logger(__name__)

DEFAULT_RESPONSE_BYTES = 4 << 20
"""The receive limit assumed of a client that does not state one: gRPC's default in every language."""


class ConsumeStream:
    """One Consume call: packs out as fast as the client reads; acks and close read concurrently.

    Made per call and driven by ``run``, which starts its sender, receiver and drain watch and
    returns once all have ended.
    """

    _ids = itertools.count(1)

    def __init__(self, node: Node, context: grpc.aio.ServicerContext, servicer: object = None) -> None:
        self.node = node
        self.context = context
        self.servicer = servicer
        """Whose ``refusals`` count and log the acks refused in-band (``errors.refused``)."""
        self.write_lock = asyncio.Lock()
        self.consumer_id = next(self._ids)
        self.receive_limit = DEFAULT_RESPONSE_BYTES
        """The largest response the client can receive (ConsumeOpen.max_response_bytes)."""
        self.max_bytes = node.config.consume_max_pack_bytes
        """What one response may hold: the node's consume_max_pack_bytes within receive_limit."""

    async def _write(self, response: spb.ConsumeResponse | bytes) -> None:
        # Shielded: a write cancelled half-way would leave gRPC's send operation pending, and the next
        # write (the closing answer) would then fail.  The lock makes that next write wait for it.
        write = asyncio.ensure_future(self._locked_write(response))
        try:
            await asyncio.shield(write)
        except asyncio.CancelledError:
            # Nobody awaits the write any more: when the client cancelled the call, it fails (gRPC's
            # ExecuteBatchError), which is normal and must not surface as "Task exception was never
            # retrieved" with a traceback.
            write.add_done_callback(_retrieve)
            raise

    async def _locked_write(self, response: spb.ConsumeResponse | bytes) -> None:
        async with self.write_lock:
            await self.context.write(response)

    async def run(self) -> None:
        ctx = self.context
        first = await ctx.read()
        if first is grpc.aio.EOF:
            return
        if first.WhichOneof("request") != "open":
            raise InvalidArgumentError("the first request of a Consume stream must be 'open'", field="open")
        opened = first.open
        channel = self.node.channel(require(opened.pchannel, "open.pchannel"), "open.pchannel")
        vchannel = VCHANNEL.check(opened.vchannel, "open.vchannel", allow_empty=True)
        policy = convert.policy_from_pb(opened.policy if opened.HasField("policy") else None)
        filters = convert.filters_from_pb(opened.filters)
        group = check_group_name(opened.consumer_group, "open.consumer_group") if opened.consumer_group else None
        if group is not None:
            committed = channel.groups.committed(group, vchannel)
            if committed is not None:
                # Resume after the committed position (the rule of Position), like auto.offset.reset.
                policy = DeliverPolicy.start_from(committed.message_id)
                filters = (*filters, DeliverFilter.timetick_gt(committed.timetick))
        limit = opened.max_pack_messages or self.node.config.consume_max_pack_messages
        self.receive_limit = opened.max_response_bytes or DEFAULT_RESPONSE_BYTES
        self.max_bytes = min(self.node.config.consume_max_pack_bytes, self.receive_limit)
        scanner = channel.stream.read(ReadOption(vchannel or None, policy, filters))
        structlog.contextvars.bind_contextvars(pchannel=channel.stream.pchannel, term=channel.stream.term,
                                               consumer_id=self.consumer_id)
        metrics = self.node.metrics.channel(channel.stream.pchannel)
        if metrics is not None:
            metrics.consumer_streams.inc()
        log.debug("consume stream opened", vchannel=vchannel, consumer_group=group)
        try:
            await self._write(spb.ConsumeResponse(opened=spb.ConsumeOpened(
                consumer_id=self.consumer_id, term=channel.stream.term)))
            loop = asyncio.get_running_loop()
            encode = convert.consume_columns_response if opened.columns else convert.consume_pack_response
            sender = loop.create_task(self._send_packs(scanner, vchannel, limit, metrics, encode))
            receiver = loop.create_task(self._receive(channel, group, vchannel))
            # A tailing read never ends by itself: when the node drains, end it at once with ON_SHUTDOWN
            # (clients reconnect and resume) rather than hold the shutdown for the whole grace period.
            draining = loop.create_task(self.node.draining.wait())
            tasks: tuple[asyncio.Task[Any], ...] = (sender, receiver, draining)
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    if not task.done():
                        await cancel_and_wait(task)
            if draining in done:
                raise OnShutdownError("the node is shutting down; reconnect to resume",
                                      channel=channel.stream.pchannel)
            for finished in done:
                try:
                    finished.result()  # a stream-ending error of either side ends the call with its status
                except StreamingError as exc:
                    self.node.fail_on(channel.stream.pchannel, exc)  # damaged storage: the pchannel fails
                    raise
            await self._write(spb.ConsumeResponse(closed=spb.ConsumeClosed()))
        finally:
            log.debug("consume stream closed")
            if metrics is not None:
                metrics.consumer_streams.dec()
            await scanner.aclose()

    async def _send_packs(
        self, scanner: Any, vchannel: str, limit: int, metrics: ChannelMetrics | None,
        encode: Callable[[MsgPack, str, bool], bytes],
    ) -> None:
        max_bytes = self.max_bytes
        tracing = self.node.tracing
        async for pack in scanner:
            for part, nbytes in split_pack(pack, limit, max_bytes):
                # Written as bytes: encoded fragment by fragment, which upb does faster than one big tree.
                if tracing is not None and part.messages:  # a span per pack with messages, linked to producers
                    with tracing.consume_span(part.start_position.pchannel, vchannel, part.messages):
                        await self._send_part(part, nbytes, vchannel, encode)
                else:
                    await self._send_part(part, nbytes, vchannel, encode)
                if metrics is not None:
                    metrics.observe_pack(len(part.messages), nbytes)

    async def _send_part(
        self, part: MsgPack, nbytes: int, vchannel: str, encode: Callable[[MsgPack, str, bool], bytes],
    ) -> None:
        max_bytes, receive_limit = self.max_bytes, self.receive_limit
        n = len(part.messages)
        if n < 2 or nbytes + MESSAGE_OVERHEAD * n <= max_bytes:  # the common case: one response
            data = encode(part, vchannel, False)
            if len(data) <= receive_limit or not n:  # an empty pack is only a header: never refused
                await self._write(data)
                return
            if n < 2:
                raise _too_large(part, len(data), receive_limit)
        # A unit larger than one response (a big transaction, or properties the estimate leaves out):
        # consecutive responses, each within max_bytes by an upper bound of its messages' sizes.
        runs = continued_runs(part.messages, max_bytes - convert.pack_head_bytes(part, vchannel))
        for k, (start, stop) in enumerate(runs):
            last = k == len(runs) - 1
            piece = convert.continued_part(part, start, stop, last)
            data = encode(piece, vchannel, not last)
            if len(data) > receive_limit:  # a single message: runs fit max_bytes otherwise
                raise _too_large(piece, len(data), receive_limit)
            await self._write(data)

    async def _receive(self, channel: Channel, group: str | None, vchannel: str) -> None:
        while True:
            request = await self.context.read()
            if request is grpc.aio.EOF:
                return
            kind = request.WhichOneof("request")
            if kind == "close":
                return
            try:
                if kind != "ack":
                    raise InvalidArgumentError("'open' may only be the first request of a Consume stream")
                if group is None:
                    raise InvalidArgumentError("ack needs a consumer_group on open", field="consumer_group")
                positions = [convert.position_from_pb(p, f"ack.positions[{i}]")
                             for i, p in enumerate(request.ack.positions)]
                if not positions:
                    raise InvalidArgumentError("ack has no positions", field="positions")
                await channel.groups.commit(group, [(v, pos) for pos, v in positions])
            except StreamingError as exc:
                refused(self.servicer, "Consume", exc, self.context, in_band=True)
                await self._write(spb.ConsumeResponse(error=to_error_detail(exc)))
            else:
                await self._write(spb.ConsumeResponse(acked=spb.ConsumeAcked(positions=request.ack.positions)))


def _retrieve(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()  # seen: a write the client's cancel cut short is no error of the node's


def _too_large(part: MsgPack, size: int, limit: int) -> MessageTooLargeError:
    """The refusal of a response holding one message (an empty pack is always sent: see _send_part)."""
    m = part.messages[0]
    return MessageTooLargeError(
        f"message {m.message_id} of pchannel {part.start_position.pchannel!r} needs a {size}-byte response, over "
        f"this consumer's receive limit of {limit} bytes (ConsumeOpen.max_response_bytes, 0 = 4 MiB): open "
        "the read with a larger max_response_bytes and a channel receive limit to match (SDK: "
        "max_receive_bytes=)", size=size, limit=limit, message_id=m.message_id, field="max_response_bytes")


__all__ = ["DEFAULT_RESPONSE_BYTES", "ConsumeStream"]
