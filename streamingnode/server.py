"""The gRPC service: every RPC of ``streaming.proto`` over a ``Node``, plus health and reflection.

Error handling is the same on every RPC: a ``StreamingError`` becomes a gRPC status through the one
table in ``streamingnode.status`` (ErrorInfo in the details); anything else is a bug, logged with its
traceback and answered with UNKNOWN, and the node keeps serving.  Errors of one produce batch or one
consume ack travel in-band and leave their stream open.

Produce pipelines: the node keeps reading a stream while its batches are being appended, up to
``produce_max_in_flight`` pending batches; past that it stops reading, so gRPC flow control pushes back
on the client and memory stays bounded.  Results go out in the order the batches came in.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import signal
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import structlog
from google.protobuf import message_factory
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from interceptors.dedup import PROP_PRODUCER, PROP_SEQUENCE
from streamingnode import convert
from streamingnode.config import NodeConfig
from streamingnode.metrics import ChannelMetrics
from streamingnode.node import Channel, Node, Owner
from streamingnode.status import to_error_detail, to_grpc_status
from streamingnode.tracing import Tracing
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from wal.bodies import PROP_COLLECTION
from wal.errors import (
    DeadlineExceededError,
    ErrorCode,
    InvalidArgumentError,
    InvalidTxnStateError,
    OnShutdownError,
    StreamingError,
    UnavailableError,
)
from wal.message import (
    AppendResult,
    Message,
    MessageType,
    Position,
    TxnContext,
    bind_txn,
    first_property,
    stamp_sequence,
)
from wal.options import DeliverFilter, DeliverPolicy, ReadOption
from wal.packs import split_pack
from wal.scanner import MsgPack

log = structlog.get_logger(__name__)

SERVICE_NAME = spb.DESCRIPTOR.services_by_name["StreamingNode"].full_name
_RESERVED_PROPERTIES = (PROP_PRODUCER, PROP_SEQUENCE)
# Errors after which a produce stream cannot go on: the channel changed owner, went away, or the node
# is closing.  The stream ends with the status; the client reconnects (and, if idempotent, resends).
_STREAM_ENDING = frozenset({ErrorCode.CHANNEL_FENCED, ErrorCode.CHANNEL_NOT_EXIST, ErrorCode.ON_SHUTDOWN})

R = TypeVar("R")


def _internal(exc: BaseException) -> StreamingError:
    log.error("unexpected error in RPC", exc_info=exc)
    return StreamingError(f"internal error: {type(exc).__name__}: {exc}", code=ErrorCode.UNKNOWN)


def _unary(
    fn: Callable[[StreamingNodeService, Any, grpc.aio.ServicerContext], Awaitable[R]],
) -> Callable[[StreamingNodeService, Any, grpc.aio.ServicerContext], Awaitable[R]]:
    """Run a unary handler; turn its StreamingError (or a bug) into the status it fails with."""

    @functools.wraps(fn)
    async def wrapper(self: StreamingNodeService, request: Any, context: grpc.aio.ServicerContext) -> R:
        try:
            with structlog.contextvars.bound_contextvars(
                rpc=fn.__name__, request_id=_request_id(context), pchannel=getattr(request, "pchannel", None) or None,
            ):
                return await fn(self, request, context)
        except StreamingError as exc:
            err = exc
        except TimeoutError:
            # The caller's deadline (asyncio.timeout_at in a handler) ran out: say so, do not log a bug.
            err = DeadlineExceededError(f"{fn.__name__}: the call's deadline ran out; it may or may not have "
                                        "taken effect")
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:  # noqa: BLE001  (a bug must not take the node down; it is logged)
            err = _internal(exc)
        await context.abort_with_status(to_grpc_status(err))
        raise AssertionError("abort_with_status returns only by raising")  # pragma: no cover

    return wrapper


_call_ids = itertools.count(1)


def _request_id(context: grpc.aio.ServicerContext) -> str:
    """The caller's ``x-request-id`` metadata when it sent one (to follow a call across services),
    else a number unique in this process; bound to every log line of the call."""
    for key, value in context.invocation_metadata() or ():
        if key == "x-request-id" and isinstance(value, str):
            return value[:128]
    return str(next(_call_ids))


def _deadline(context: grpc.aio.ServicerContext) -> float | None:
    remaining = context.time_remaining()
    return None if remaining is None else asyncio.get_running_loop().time() + remaining


def _require(value: str, field: str) -> str:
    if not value:
        raise InvalidArgumentError(f"{field} is required", field=field)
    return value


def _forget(seen: set[int], rid: int, _fut: object) -> None:
    seen.discard(rid)


class _ProduceStream:
    """One Produce call: reads batches, appends them pipelined, writes results in order."""

    def __init__(self, service: StreamingNodeService, context: grpc.aio.ServicerContext) -> None:
        self.node = service.node
        self.context = context
        self.slots = asyncio.Semaphore(self.node.config.produce_max_in_flight)
        # (request id, outcome, answer in column form)
        self.pending: collections.deque[tuple[int, asyncio.Future[list[AppendResult]], bool]] = collections.deque()
        self.wake = asyncio.Event()
        self.failed: StreamingError | None = None
        self.reader: asyncio.Task[None] | None = None

    async def run(self) -> None:
        ctx = self.context
        first = await ctx.read()
        if first is grpc.aio.EOF:
            return
        if first.WhichOneof("request") != "open":
            raise InvalidArgumentError("the first request of a Produce stream must be 'open'", field="open")
        opened = first.open
        channel = self.node.channel(_require(opened.pchannel, "open.pchannel"))
        producer_id = opened.producer_id if opened.HasField("producer_id") else None
        if producer_id == "":
            raise InvalidArgumentError("open.producer_id must not be empty when set", field="producer_id")
        structlog.contextvars.bind_contextvars(pchannel=channel.stream.pchannel, term=channel.stream.term,
                                               producer_id=producer_id)
        await ctx.write(spb.ProduceResponse(opened=spb.ProduceOpened(
            pchannel=channel.stream.pchannel, term=channel.stream.term, producer_id=producer_id or "")))
        loop = asyncio.get_running_loop()
        writer = loop.create_task(self._write_results())
        # The reader runs as its own task so that a stream-ending failure seen by the writer can stop
        # it: otherwise the call would hang in ctx.read() until the client happened to send again.
        self.reader = loop.create_task(self._read_batches(channel, producer_id))
        streams = self.node.metrics.channel(channel.stream.pchannel)
        if streams is not None:
            streams.producer_streams.inc()
        try:
            await self.reader
        except asyncio.CancelledError:
            if self.failed is None:  # the call itself was cancelled, not stopped by a failure
                raise
        finally:
            if streams is not None:
                streams.producer_streams.dec()
            self.reader.cancel()
            self.pending.append((-1, None, False))  # type: ignore[arg-type]  # end marker for the writer
            self.wake.set()
            await writer
        if self.failed is not None:
            raise self.failed
        await ctx.write(spb.ProduceResponse(closed=spb.ProduceClosed()))

    async def _read_batches(self, channel: Channel, producer_id: str | None) -> None:
        ctx = self.context
        loop = asyncio.get_running_loop()
        seen: set[int] = set()
        tracing = self.node.tracing  # decided once per node: off means not one extra call per batch
        while self.failed is None:
            await self.slots.acquire()  # backpressure: stop reading while too many batches are pending
            request = await ctx.read()
            if request is grpc.aio.EOF or request.WhichOneof("request") == "close":
                self.slots.release()
                return
            if request.WhichOneof("request") != "batch":
                self.slots.release()
                raise InvalidArgumentError("'open' may only be the first request of a Produce stream", field="open")
            batch = request.batch
            rid = batch.request_id
            fut: asyncio.Future[list[AppendResult]]
            if rid in seen:
                fut = loop.create_future()
                fut.set_exception(InvalidArgumentError(
                    f"request_id {rid} is already pending on this stream", request_id=rid))
            else:
                try:
                    messages = self._messages(channel, batch, producer_id)
                except StreamingError as exc:
                    fut = loop.create_future()
                    fut.set_exception(exc)
                else:
                    seen.add(rid)
                    if tracing is None:
                        fut = loop.create_task(channel.stream.append_batch(messages))
                    else:
                        fut = loop.create_task(tracing.produce(
                            channel.stream.pchannel, rid, messages, channel.stream.append_batch))
                    fut.add_done_callback(functools.partial(_forget, seen, rid))
            self.pending.append((rid, fut, batch.HasField("columns")))
            self.wake.set()

    def _messages(self, channel: Channel, batch: spb.ProduceBatch, producer_id: str | None) -> list[Message]:
        limit = self.node.config.max_message_bytes
        own: dict[int, pb.TxnContext]
        if batch.HasField("columns"):
            if len(batch.messages):
                raise InvalidArgumentError("a produce batch carries messages or columns, not both", field="columns")
            out, own = convert.produced_columns(batch.columns, limit)
        else:
            if not batch.messages:
                raise InvalidArgumentError("a produce batch needs at least one message", field="messages")
            out = [convert.produced_message(p, i, limit) for i, p in enumerate(batch.messages)]
            own = {i: p.txn for i, p in enumerate(batch.messages) if p.HasField("txn")}
        reserved = first_property(out, _RESERVED_PROPERTIES)
        if reserved is not None:
            i, key = reserved
            raise InvalidArgumentError(
                f"messages[{i}]: property {key!r} is reserved (set producer_id on open instead)", field=key)
        txns = channel.stream.txns
        if batch.HasField("txn"):
            session = txns.get(batch.txn.txn_id)
            txn = session.context if session is not None else TxnContext(batch.txn.txn_id, batch.txn.keepalive_ms)
            for i, t in own.items():
                if t.txn_id != txn.txn_id:
                    raise InvalidArgumentError(
                        f"messages[{i}] names transaction {t.txn_id} in a batch of transaction {txn.txn_id}",
                        txn_id=txn.txn_id)
            bind_txn(out, txn)
        else:
            for i, t in own.items():
                session = txns.get(t.txn_id)
                out[i].with_txn(session.context if session is not None else TxnContext(t.txn_id, t.keepalive_ms))
        if producer_id is not None:
            stamp_sequence(out, (PROP_PRODUCER, producer_id), PROP_SEQUENCE, batch.first_sequence)
        return out

    async def _write_results(self) -> None:
        ctx = self.context
        while True:
            while not self.pending:
                self.wake.clear()
                await self.wake.wait()
            rid, fut, columns = self.pending.popleft()
            if fut is None:
                return
            try:
                results = await fut
            except StreamingError as exc:
                response = spb.ProduceBatchResult(request_id=rid, error=to_error_detail(exc))
                if exc.code in _STREAM_ENDING and self.failed is None:
                    self.failed = exc
                    if self.reader is not None:
                        self.reader.cancel()
            except Exception as exc:  # noqa: BLE001  (a bug fails its batch, not the node)
                response = spb.ProduceBatchResult(request_id=rid, error=to_error_detail(_internal(exc)))
            else:
                response = spb.ProduceBatchResult(request_id=rid)
                if columns:
                    # Three packed arrays filled from lists in C: no per-result submessage.
                    appended = response.appended
                    appended.ids.extend([r[0] for r in results])
                    appended.timeticks.extend([r[1] for r in results])
                    txn_ids = [r[2] or 0 for r in results]
                    if any(txn_ids):
                        appended.txn_ids.extend(txn_ids)
                else:
                    add = response.appended.results.add
                    # Filled in place, field by field: about a third of the cost of building each
                    # result (and its MessageID) as a separate message first.
                    for mid, ts, txn_id in results:
                        out = add(timetick=ts)
                        out.id.id = mid.to_bytes(8, "big")
                        if txn_id:
                            out.txn_id = txn_id
            finally:
                self.slots.release()
            if self.failed is None or response.WhichOneof("outcome") == "appended":
                await ctx.write(spb.ProduceResponse(result=response))


class _ConsumeStream:
    """One Consume call: packs out as fast as the client reads; acks and close read concurrently."""

    _ids = itertools.count(1)

    def __init__(self, service: StreamingNodeService, context: grpc.aio.ServicerContext) -> None:
        self.node = service.node
        self.context = context
        self.write_lock = asyncio.Lock()
        self.consumer_id = next(self._ids)

    async def _write(self, response: spb.ConsumeResponse | bytes) -> None:
        # Shielded: a write cancelled half-way would leave gRPC's send operation pending, and the next
        # write (the closing answer) would then fail.  The lock makes that next write wait for it.
        await asyncio.shield(self._locked_write(response))

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
        channel = self.node.channel(_require(opened.pchannel, "open.pchannel"))
        vchannel = opened.vchannel
        policy = convert.policy_from_pb(opened.policy if opened.HasField("policy") else None)
        filters = convert.filters_from_pb(opened.filters)
        group = opened.consumer_group or None
        if group is not None:
            committed = channel.groups.committed(group, vchannel)
            if committed is not None:
                # Resume after the committed position (the rule of Position), like auto.offset.reset.
                policy = DeliverPolicy.start_from(committed.message_id)
                filters = (*filters, DeliverFilter.timetick_gt(committed.timetick))
        limit = opened.max_pack_messages or self.node.config.consume_max_pack_messages
        scanner = channel.stream.read(ReadOption(vchannel or None, policy, filters))
        structlog.contextvars.bind_contextvars(pchannel=channel.stream.pchannel, term=channel.stream.term,
                                               consumer_id=self.consumer_id)
        metrics = self.node.metrics.channel(channel.stream.pchannel)
        if metrics is not None:
            metrics.consumer_streams.inc()
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
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await task
            if draining in done:
                raise OnShutdownError("the node is shutting down; reconnect to resume",
                                      channel=channel.stream.pchannel)
            for finished in done:
                finished.result()  # a stream-ending error of either side ends the call with its status
            await self._write(spb.ConsumeResponse(closed=spb.ConsumeClosed()))
        finally:
            if metrics is not None:
                metrics.consumer_streams.dec()
            await scanner.aclose()

    async def _send_packs(
        self, scanner: Any, vchannel: str, limit: int, metrics: ChannelMetrics | None,
        encode: Callable[[MsgPack, str], bytes],
    ) -> None:
        max_bytes = self.node.config.consume_max_pack_bytes
        tracing = self.node.tracing
        async for pack in scanner:
            for part, nbytes in split_pack(pack, limit, max_bytes):
                # Written as bytes: encoded fragment by fragment, which upb does faster than one big tree.
                if tracing is not None and part.messages:  # a span per pack with messages, linked to producers
                    with tracing.consume_span(part.start_position.pchannel, vchannel, part.messages):
                        await self._write(encode(part, vchannel))
                else:
                    await self._write(encode(part, vchannel))
                if metrics is not None:
                    metrics.observe_pack(len(part.messages), nbytes)

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
                await self._write(spb.ConsumeResponse(error=to_error_detail(exc)))
            else:
                await self._write(spb.ConsumeResponse(acked=spb.ConsumeAcked(positions=request.ack.positions)))


def _stream_errors(
    fn: Callable[[StreamingNodeService, Any, grpc.aio.ServicerContext], Awaitable[None]],
) -> Callable[[StreamingNodeService, Any, grpc.aio.ServicerContext], Awaitable[None]]:
    @functools.wraps(fn)
    async def wrapper(self: StreamingNodeService, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        err: StreamingError | None = None
        # The handler runs in a task of its own: what it binds (pchannel and term, once open) stays
        # with this call and the tasks it starts.
        structlog.contextvars.bind_contextvars(rpc=fn.__name__, request_id=_request_id(context))
        try:
            await fn(self, request_iterator, context)
        except StreamingError as exc:
            err = exc
        except DecodeError as exc:
            err = InvalidArgumentError(f"request is not a valid {fn.__name__}Request: {exc}")
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:  # noqa: BLE001  (a bug ends the call, not the node)
            if context.done():
                return  # the client went away (cancelled, deadline) while we wrote: nobody to tell
            err = _internal(exc)
        if err is not None and not context.done():
            await context.abort_with_status(to_grpc_status(err))

    return wrapper


class StreamingNodeService(sgrpc.StreamingNodeServicer):  # type: ignore[misc]
    def __init__(self, node: Node) -> None:
        self.node = node

    # --- streams ---------------------------------------------------------------------------------
    @_stream_errors
    async def Produce(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        await _ProduceStream(self, context).run()

    @_stream_errors
    async def Consume(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        await _ConsumeStream(self, context).run()

    # --- transactions ----------------------------------------------------------------------------
    def _txn_channel(self, pchannel: str, vchannel: str, txn_id: int) -> Channel:
        channel = self.node.channel(_require(pchannel, "pchannel"))
        _require(vchannel, "vchannel")
        session = channel.stream.txns.get(txn_id)
        if session is not None and session.vchannel != vchannel:
            raise InvalidTxnStateError(
                f"transaction {txn_id} belongs to vchannel {session.vchannel!r}, not {vchannel!r}", txn_id=txn_id)
        return channel

    @_unary
    async def BeginTxn(self, request: spb.BeginTxnRequest, context: grpc.aio.ServicerContext) -> spb.BeginTxnResponse:
        channel = self.node.channel(_require(request.pchannel, "pchannel"))
        vchannel = _require(request.vchannel, "vchannel")
        if request.keepalive_ms < 0:
            raise InvalidArgumentError(f"keepalive_ms must be >= 0, got {request.keepalive_ms}", field="keepalive_ms")
        keepalive = request.keepalive_ms or self.node.config.txn_keepalive_ms
        txn, result = await channel.stream.begin_txn(vchannel, keepalive, deadline=_deadline(context))
        return spb.BeginTxnResponse(
            txn_id=txn.txn_id, begin_timetick=result.timetick, message_id=convert.message_id_to_pb(result.message_id),
            keepalive_ms=txn.keepalive_ms,
        )

    @_unary
    async def CommitTxn(
        self, request: spb.CommitTxnRequest, context: grpc.aio.ServicerContext
    ) -> spb.CommitTxnResponse:
        channel = self._txn_channel(request.pchannel, request.vchannel, request.txn_id)
        result = await channel.stream.commit_txn(request.txn_id, deadline=_deadline(context))
        return spb.CommitTxnResponse(
            commit_timetick=result.timetick, message_id=convert.message_id_to_pb(result.message_id))

    @_unary
    async def RollbackTxn(
        self, request: spb.RollbackTxnRequest, context: grpc.aio.ServicerContext
    ) -> spb.RollbackTxnResponse:
        channel = self._txn_channel(request.pchannel, request.vchannel, request.txn_id)
        result = await channel.stream.rollback_txn(request.txn_id, deadline=_deadline(context))
        return spb.RollbackTxnResponse(
            rollback_timetick=result.timetick, message_id=convert.message_id_to_pb(result.message_id))

    # --- channels --------------------------------------------------------------------------------
    @_unary
    async def CreateChannels(
        self, request: spb.CreateChannelsRequest, context: grpc.aio.ServicerContext
    ) -> spb.CreateChannelsResponse:
        owner = Owner(request.owner.role, request.owner.address, request.owner.description_text)
        names = await self.node.create_channels(list(request.channel_names), request.num_channels, owner)
        return spb.CreateChannelsResponse(channel_names=names)

    @_unary
    async def DestroyChannels(
        self, request: spb.DestroyChannelsRequest, context: grpc.aio.ServicerContext
    ) -> spb.DestroyChannelsResponse:
        await self.node.destroy_channels(list(request.channel_names))
        return spb.DestroyChannelsResponse()

    @_unary
    async def DescribeChannels(
        self, request: spb.DescribeChannelsRequest, context: grpc.aio.ServicerContext
    ) -> spb.DescribeChannelsResponse:
        infos = await self.node.describe_channels(list(request.channel_names))
        out = []
        for info in infos:
            owner = Owner.from_properties(info.properties)
            d = pb.ChannelDescription(
                channel_name=info.name, term=info.term, last_timetick=info.last_timetick,
                owner=pb.OwnerDescription(role=owner.role, address=owner.address,
                                          description_text=owner.description_text),
            )
            if info.last_id is not None:
                d.first_id.CopyFrom(convert.message_id_to_pb(info.first_id))
                d.last_id.CopyFrom(convert.message_id_to_pb(info.last_id))
            out.append(d)
        return spb.DescribeChannelsResponse(descriptions=out)

    # --- consumer groups -------------------------------------------------------------------------
    @_unary
    async def CreateConsumerGroup(
        self, request: spb.CreateConsumerGroupRequest, context: grpc.aio.ServicerContext
    ) -> spb.CreateConsumerGroupResponse:
        channel = self.node.channel(_require(request.pchannel, "pchannel"))
        await channel.groups.create(_require(request.group, "group"))
        return spb.CreateConsumerGroupResponse()

    @_unary
    async def DestroyConsumerGroup(
        self, request: spb.DestroyConsumerGroupRequest, context: grpc.aio.ServicerContext
    ) -> spb.DestroyConsumerGroupResponse:
        channel = self.node.channel(_require(request.pchannel, "pchannel"))
        await channel.groups.destroy(_require(request.group, "group"))
        return spb.DestroyConsumerGroupResponse()

    @_unary
    async def DescribeConsumerGroups(
        self, request: spb.DescribeConsumerGroupsRequest, context: grpc.aio.ServicerContext
    ) -> spb.DescribeConsumerGroupsResponse:
        names = [request.pchannel] if request.pchannel else self.node.channel_names()
        out = []
        for name in names:
            channel = self.node.channel(name)
            wanted = list(request.groups) or channel.groups.names()
            if not request.pchannel:  # across every pchannel: a named group is listed where it exists
                wanted = [g for g in wanted if channel.groups.exists(g)]
            now = channel.stream.mvcc_timetick()
            for group in wanted:
                progress = [
                    spb.ConsumerGroupProgress(
                        vchannel=p.vchannel, committed=convert.position_to_pb(p.committed, p.vchannel),
                        lag_messages=p.lag_messages, lag_ms=p.lag_ms,
                    )
                    for p in channel.groups.progress(group, now)
                ]
                out.append(spb.ConsumerGroupDescription(pchannel=name, group=group, vchannels=progress))
        return spb.DescribeConsumerGroupsResponse(groups=out)

    @_unary
    async def SeekConsumerGroup(
        self, request: spb.SeekConsumerGroupRequest, context: grpc.aio.ServicerContext
    ) -> spb.SeekConsumerGroupResponse:
        channel = self.node.channel(_require(request.pchannel, "pchannel"))
        group = _require(request.group, "group")
        channel.groups.require(group)
        vchannel = request.vchannel
        target = request.WhichOneof("target")
        if target == "position":
            pos, _ = convert.position_from_pb(request.position)
            if not pos.pchannel:
                pos = pos._replace(pchannel=channel.stream.pchannel)
        elif target == "policy":
            pos = await self._resolve(channel, convert.policy_from_pb(request.policy))
        else:
            raise InvalidArgumentError("seek needs a policy or a position", field="target")
        await channel.groups.commit(group, [(vchannel, pos)])
        return spb.SeekConsumerGroupResponse(position=convert.position_to_pb(pos, vchannel))

    async def _resolve(self, channel: Channel, policy: DeliverPolicy) -> Position:
        """The position a fresh scanner with ``policy`` would start from."""
        # Lazy: it is never iterated, so opening it need not ask for a tick.
        scanner = channel.stream.read(ReadOption(None, policy, lazy=True))
        try:
            return scanner.position
        finally:
            await scanner.aclose()

    # --- positions and flush ---------------------------------------------------------------------
    @_unary
    async def GetLatestPosition(
        self, request: spb.GetLatestPositionRequest, context: grpc.aio.ServicerContext
    ) -> spb.GetLatestPositionResponse:
        channel = self.node.channel(_require(request.pchannel, "pchannel"))
        out = spb.GetLatestPositionResponse(mvcc_timetick=channel.stream.mvcc_timetick())
        latest = channel.stream.latest_position()
        if latest is not None:
            out.last.CopyFrom(convert.position_to_pb(latest, request.vchannel))
        return out

    @_unary
    async def Flush(self, request: spb.FlushRequest, context: grpc.aio.ServicerContext) -> spb.FlushResponse:
        channel = self.node.channel(_require(request.pchannel, "pchannel"))
        vchannel = _require(request.vchannel, "vchannel")
        props = {PROP_COLLECTION: request.collection} if request.HasField("collection") else {}
        deadline = _deadline(context)
        result = await channel.stream.append(
            Message(MessageType.MANUAL_FLUSH, vchannel, b"", props), deadline=deadline)
        if channel.flusher is None:  # no flusher: the flush is done once the seal is durable in the log
            return spb.FlushResponse(files=[], flush_timetick=result.timetick)
        async with asyncio.timeout_at(deadline):
            files = await channel.flusher.wait_flushed(result.timetick)
        return spb.FlushResponse(files=files, flush_timetick=result.timetick)


# ---------------------------------------------------------------------------------------------------
class RunningServer:
    """A started node and its gRPC server.  ``address`` is the bound host:port."""

    def __init__(
        self, node: Node, server: grpc.aio.Server, health: health_aio.HealthServicer, address: str,
        metrics_address: str | None = None,
    ) -> None:
        self.node = node
        self.server = server
        self.health = health
        self.address = address
        self.metrics_address = metrics_address
        """host:port of ``/metrics``, or None when it is turned off."""
        self.owned_tracing: Tracing | None = None
        """The tracing made from ``trace_exporter``: shut down (its spans flushed) when the server stops."""
        self._stopped = asyncio.Event()

    async def stop(self, grace: float | None = None) -> None:
        """Drain: health NOT_SERVING, refuse new calls, let calls in flight finish for ``grace``
        seconds, then close every WAL cleanly."""
        if self._stopped.is_set():
            return
        grace = self.node.config.drain_seconds if grace is None else grace
        await self.health.enter_graceful_shutdown()
        self.node.draining.set()
        await self.server.stop(grace)
        await self.node.aclose()
        if self.owned_tracing is not None:
            await asyncio.to_thread(self.owned_tracing.shutdown)  # blocks while it exports what is left
        self._stopped.set()
        log.info("node stopped", address=self.address)


async def start_server(config: NodeConfig, *, tracing: Tracing | None = None) -> RunningServer:
    """Open the node, listen, recover every channel, then report SERVING.

    ``tracing`` (a provider of the caller's, who shuts it down) overrides ``config.trace_exporter``;
    otherwise the server makes that exporter's provider and shuts it down when it stops.
    """
    owned = Tracing.from_exporter(config.trace_exporter) if tracing is None else None
    try:
        node = await Node.start(config, tracing if tracing is not None else owned)
    except BaseException:
        if owned is not None:
            owned.shutdown()
        raise
    try:
        server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", config.max_request_bytes),
            ("grpc.max_send_message_length", config.max_request_bytes),
            ("grpc.so_reuseport", 0),
        ])
        _add_service(StreamingNodeService(node), server)
        health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            server,
        )
        for name in ("", SERVICE_NAME):
            await health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        address = _listen(server, config.listen)
        # Metrics come up before recovery, so a long recovery is visible while it runs.
        metrics_address = await node.metrics.serve(config.metrics_listen) if config.metrics_listen else None
        await server.start()
        running = RunningServer(node, server, health, address, metrics_address)
        running.owned_tracing = owned
        try:
            await node.open_all()
        except BaseException:
            await server.stop(0)
            raise
        for name in ("", SERVICE_NAME):
            await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    except BaseException:
        await node.aclose()
        if owned is not None:
            owned.shutdown()
        raise
    log.info("serving", address=address, metrics=metrics_address, data_dir=str(config.data_dir),
             durability=config.durability)
    return running


def _serialize_consume(response: spb.ConsumeResponse | bytes) -> bytes:
    return response if type(response) is bytes else response.SerializeToString()  # type: ignore[union-attr]


def _add_service(service: StreamingNodeService, server: grpc.aio.Server) -> None:
    """Register the service as the generated code does, except that Consume may write ready-made
    response bytes (packs are encoded by ``convert.consume_pack_response`` or
    ``convert.consume_columns_response``)."""
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in spb.DESCRIPTOR.services_by_name["StreamingNode"].methods:
        request = message_factory.GetMessageClass(method.input_type)
        response = message_factory.GetMessageClass(method.output_type)
        serialize = _serialize_consume if method.name == "Consume" else response.SerializeToString
        make = {
            (False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler,
        }[(method.client_streaming, method.server_streaming)]
        handlers[method.name] = make(getattr(service, method.name), request_deserializer=request.FromString,
                                     response_serializer=serialize)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


def _listen(server: grpc.aio.Server, listen: str) -> str:
    """Bind ``listen``; return a connectable host:port (the real port when 0 was asked for)."""
    try:
        port = server.add_insecure_port(listen)
    except RuntimeError:
        port = 0
    if port == 0:
        raise UnavailableError(f"cannot listen on {listen!r}: address in use or invalid", address=listen)
    host = listen.rsplit(":", 1)[0]
    host = "127.0.0.1" if host in ("0.0.0.0", "[::]", "") else host  # noqa: S104  (a connectable form)
    return f"{host}:{port}"


async def serve(config: NodeConfig, on_ready: Callable[[RunningServer], None] | None = None) -> None:
    """Run until SIGTERM or SIGINT, then drain and close (the process then exits 0)."""
    running = await start_server(config)
    if on_ready is not None:
        on_ready(running)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("draining", address=running.address)
    await running.stop()


class ServerThread:
    """A node served from a private event loop on a thread: for tests and embedding next to
    synchronous code.  ``with ServerThread(config) as srv: srv.address``."""

    def __init__(self, config: NodeConfig, *, tracing: Tracing | None = None) -> None:
        self.config = config
        self.tracing = tracing
        self.address = ""
        self.metrics_address: str | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="streamingnode-server", daemon=True)
        self._running: RunningServer | None = None

    def start(self) -> ServerThread:
        self._thread.start()
        started = start_server(self.config, tracing=self.tracing)
        self._running = asyncio.run_coroutine_threadsafe(started, self._loop).result()
        self.address = self._running.address
        self.metrics_address = self._running.metrics_address
        return self

    @property
    def node(self) -> Node:
        assert self._running is not None
        return self._running.node

    def run(self, coro: Awaitable[R]) -> R:
        """Run ``coro`` on the server's loop (to inspect the node from a test)."""
        async def _wrap() -> R:
            return await coro
        return asyncio.run_coroutine_threadsafe(_wrap(), self._loop).result()

    def stop(self, grace: float = 1.0) -> None:
        if self._running is not None:
            asyncio.run_coroutine_threadsafe(self._running.stop(grace), self._loop).result()
            self._running = None
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["RunningServer", "ServerThread", "StreamingNodeService", "serve", "start_server"]
