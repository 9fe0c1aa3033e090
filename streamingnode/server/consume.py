"""The Consume stream: MsgPacks out as fast as the client reads them; acks and close come in meanwhile.

A read starts from the open request's deliver policy and filters, or, for a consumer group with a
committed position, just after that position.  Packs too large for one response are split at
delivery units (``streamingnode.wire.packs``), so a transaction always arrives whole; a unit still too large (a big
transaction) goes over consecutive responses marked ``MsgPack.continued``, which the client joins.
Every response fits the client's receive limit (``ConsumeOpen.max_response_bytes``, 4 MiB unless it
says more); a single message that cannot ends the stream with MESSAGE_TOO_LARGE.  Packs are encoded
straight to bytes (``convert``), once for all readers at the same position with the same options
(the shared cache of ``fanout``); a reader behind by several ticks gets them merged into one pack,
up to its limits.  Responses go out within a node-wide budget per event-loop turn, so appends are
never starved however many readers wake on a commit; and each response is at most half of
``consume_buffer_bytes`` (the node's bytes and gRPC's copy of the one in flight), which bounds what
a client that stops reading costs.  Acks commit the group's position and are answered in-band, so a failed ack
leaves the stream open.  When the node drains, the stream ends with ON_SHUTDOWN at once.

An ack may commit only what this stream has delivered: positions of its own vchannel (any vchannel,
for a read of the whole pchannel), no further than the end of the last pack the stream has sent
(``ConsumeStream.ceiling``, where the read starts until then), and not behind the group's committed
position (``ConsumerGroups.commit``).  Anything else refuses the whole ack, naming the field, and
commits nothing.  A group whose stored position is out of range (left by an older version) cannot be
opened: the open fails with OUT_OF_RANGE naming the group, rather than read nothing in silence.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import grpc
import structlog

from streamingnode.node.channel import Channel
from streamingnode.node.groups import check_group_name
from streamingnode.node.node import Node
from streamingnode.observability.metrics import ChannelMetrics
from streamingnode.server.errors import refused, require
from streamingnode.server.fanout import (
    EncodedPacks,
    Fanout,
    PackCheck,
    Responses,
    fanout_of,
    governed,
    pack_check,
    pack_key,
    position_key,
)
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.wire import codec
from streamingnode.wire.codes import to_error_detail
from streamingnode.wire.defaults import RESPONSE_BYTES
from streamingnode.wire.packs import MESSAGE_OVERHEAD, continued_runs, split_pack
from wal.clock import physical_ms
from wal.errors import (
    InvalidArgumentError,
    MessageTooLargeError,
    OnShutdownError,
    OutOfRangeError,
    StreamingError,
)
from wal.message import Position, payload_bytes
from wal.names import VCHANNEL
from wal.options import ReadOption
from wal.resume import resume_after
from wal.scanner import MsgPack, Scanner
from wal.tasks import cancel_and_wait

log = structlog.get_logger(__name__)

DEFAULT_RESPONSE_BYTES = RESPONSE_BYTES
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
        """What one response may hold: the node's consume_max_pack_bytes within receive_limit and half
        of consume_buffer_bytes."""
        self.fanout: Fanout = fanout_of(node)
        self.held_bytes = 0
        """Bytes held for this client and not yet taken by it: the response being written, counted
        twice (the node's bytes and gRPC's copy).  At most consume_buffer_bytes, except for a single
        message larger than half of it, which goes alone."""
        self.held_peak = 0
        """The most ``held_bytes`` has been."""
        self.ceiling: tuple[int, int] = (0, 0)
        """(message id, timetick) of the end of the last pack sent (before the first: where the read
        starts): an ack may commit no further."""

    def _sending(self, end: Position) -> None:
        """A pack ending at ``end`` is about to go out: acks may commit up to it from now on (its
        responses are written next, and an ack of it can only follow them)."""
        mid, ts = self.ceiling
        self.ceiling = (max(mid, end.message_id), max(ts, end.timetick))

    async def _write(self, response: spb.ConsumeResponse | bytes) -> None:
        # Shielded: a write cancelled half-way would leave gRPC's send operation pending, and the next
        # write (the closing answer) would then fail.  The lock makes that next write wait for it.
        write = asyncio.ensure_future(governed(self._locked_write(response), self.fanout.turns))
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
            size = len(response) if isinstance(response, bytes) else 0
            self.fanout.turns.sent(size)
            held = 2 * size
            self.held_bytes += held
            self.held_peak = max(self.held_peak, self.held_bytes)
            try:
                await self.context.write(response)
            finally:
                self.held_bytes -= held

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
        policy = codec.policy_from_pb(opened.policy if opened.HasField("policy") else None)
        filters = codec.filters_from_pb(opened.filters)
        group = check_group_name(opened.consumer_group, "open.consumer_group") if opened.consumer_group else None
        if group is not None:
            committed = channel.groups.committed(group, vchannel)
            why = None if committed is None else channel.groups.problem(committed.message_id, committed.timetick)
            if why is not None:
                raise OutOfRangeError(
                    f"consumer group {group!r} cannot be read on pchannel {channel.stream.pchannel!r}, vchannel "
                    f"{vchannel!r}: its committed position is out of range ({why}); an administrator can move it "
                    "with SeekConsumerGroup", channel=channel.stream.pchannel, group=group,
                    field="open.consumer_group")
            if committed is not None:
                # Resume after the committed position (the rule of Position), like auto.offset.reset.
                policy, filters = resume_after(committed.message_id, committed.timetick, filters)
        limit = opened.max_pack_messages or self.node.config.consume_max_pack_messages
        self.receive_limit = opened.max_response_bytes or DEFAULT_RESPONSE_BYTES
        config = self.node.config
        # A response in flight exists twice (ours and gRPC's copy): half the cap each.
        half_cap = max(config.consume_buffer_bytes // 2, 1)
        self.max_bytes = min(config.consume_max_pack_bytes, self.receive_limit, half_cap)
        option = ReadOption(vchannel or None, policy, filters)
        self.scanner = channel.stream.read(option)
        start = self.scanner.position
        self.ceiling = (start.message_id, start.timetick)
        # What decides a response's bytes besides the pack itself (see fanout.pack_key).
        types = option.message_types()
        prefix: tuple[Hashable, ...] = (
            channel.stream.pchannel, channel.stream.term, id(channel.stream), vchannel, bool(opened.columns), limit,
            self.max_bytes, self.receive_limit, None if types is None else tuple(sorted(t.value for t in types)))
        min_ts, inclusive = option.min_timetick()
        min_ts += 0 if inclusive else 1
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
            encode = codec.consume_columns_response if opened.columns else codec.consume_pack_response
            self.fanout.streams[self.consumer_id] = self
            self.fanout.wals.add(channel.stream.wal)
            # The sender's steps on the loop are delivery's time (fanout.DeliveryTurns): its reads,
            # joins and encoding; the writes count theirs in _write.
            sender = loop.create_task(governed(self._send_packs(
                channel, option, limit, metrics, encode=encode, prefix=prefix, min_ts=min_ts), self.fanout.turns))
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
            self.fanout.streams.pop(self.consumer_id, None)
            if metrics is not None:
                metrics.consumer_streams.dec()
            await self.scanner.aclose()

    async def _send_packs(
        self, channel: Channel, option: ReadOption, limit: int, metrics: ChannelMetrics | None, *,
        encode: Callable[[MsgPack, str, bool], bytes], prefix: tuple[Hashable, ...], min_ts: int,
    ) -> None:
        max_bytes = self.max_bytes
        vchannel = option.vchannel or ""
        tracing = self.node.tracing
        # Spans are per consumer and per part: a traced node encodes for each consumer.
        cache = self.fanout.cache if tracing is None else None
        turns = self.fanout.turns
        # Cached responses of message packs can be joined into one without decoding (columns cannot:
        # their extras count from a pack's first message).
        joinable = encode is codec.consume_pack_response
        quiet_ms = round(self.node.config.consume_quiet_pack_seconds * 1000)
        pending: MsgPack | None = None
        position: Position | None = None  # where the next response starts, once known
        ahead = False  # position is past the scanner's: sent from the cache without reading
        joined = False  # has sent from the cache: joins ready packs like the readers it follows
        while True:
            took = False  # this response's turn is taken
            making: tuple[tuple[Hashable, ...], asyncio.Future[None]] | None = None
            if cache is not None and position is not None and pending is None:
                # Another reader has sent from here already: its responses, and no read of our own.
                key = position_key(prefix, position, min_ts)
                entry = cache.get(key)
                if entry is None and ahead:
                    # Following others' responses: wait for the turn before reading on our own.  The
                    # readers are served in turn, so the one ahead (that reads) has had its turn by
                    # then, and N readers that fell behind together read once, not N times.
                    await turns.take()
                    entry = cache.get(key)
                    # On a miss the read below may wait for a commit: its response takes a turn then.
                    took = entry is not None
                while entry is None and (other := cache.making(key)) is not None:
                    # Another reader is reading from here: wait for its response rather than read the
                    # same messages (at the head, every commit would wake every reader to scan it).
                    # Its own client cannot hold us: it caches the response before writing it.
                    await asyncio.shield(other)
                    entry = cache.get(key)
                if entry is not None:
                    if not took:
                        await turns.take()
                    cache.hit()
                    position = await self._send_following(
                        cache, entry, position, prefix=prefix, min_ts=min_ts, limit=limit, vchannel=vchannel,
                        metrics=metrics, join=joinable)
                    ahead, joined = True, True
                    continue
                making = (key, cache.start_making(key))  # the others at this key wait for ours
            try:
                if ahead:
                    assert position is not None
                    await self._reopen(channel, option, position)
                    ahead = False
                scanner = self.scanner
                try:
                    pack = await anext(scanner) if pending is None else pending
                    if not pack.messages and quiet_ms:
                        pack = await _quiet(pack, scanner, quiet_ms)
                except StopAsyncIteration:
                    return
                # The turn first, then whatever else is ready joins the pack: a reader kept waiting by a
                # busy loop sends more per response, and so fewer responses.
                if not took:
                    await turns.take()
                if cache is not None:
                    # The first reader to send from a position decides how far its response goes; the
                    # others at that position join the same packs, so that they can share its bytes.
                    key = pack_key(prefix, pack, min_ts)
                    entry = cache.get(key)
                    until = entry[0].end_position if entry else None
                    pack, pending = _merge(pack, scanner, limit, min(max_bytes, MERGE_BYTES), until, eager=joined)
                    position = pack.end_position
                    check = pack_check(pack)
                    if entry is not None and entry[0] == check:
                        cache.hit()
                        joined = True
                        self._sending(position)
                        if making is not None:
                            cache.made(*making)  # cached already: the others need not wait for our write
                        await self._send_cached(entry[1], metrics)
                        continue
                    cache.miss()
                    self._sending(pack.end_position)
                    responses, error = self._encode(pack, vchannel, limit, encode)
                    if error is None:
                        cache.put(key, check, responses)  # before writing: the others need not wait for this client
                    if making is not None:
                        cache.made(*making)  # the readers waiting for it go on now, not after our write
                    for k, (datas, n, nbytes) in enumerate(responses):
                        for data in datas:
                            await self._write(data)
                        # A part cut short by the error was not delivered whole: not counted.
                        if metrics is not None and (error is None or k < len(responses) - 1):
                            metrics.observe_pack(n, nbytes)
                    if error is not None:
                        raise error
                    continue
                pack, pending = _merge(pack, scanner, limit, min(max_bytes, MERGE_BYTES))
                for part, nbytes in split_pack(pack, limit, max_bytes):
                    self._sending(part.end_position)
                    if tracing is not None and part.messages:  # a span per pack with messages, linked to producers
                        with tracing.consume_span(part.start_position.pchannel, vchannel, part.messages):
                            for data in self._part_responses(part, nbytes, vchannel, encode):
                                await self._write(data)
                    else:
                        for data in self._part_responses(part, nbytes, vchannel, encode):
                            await self._write(data)
                    if metrics is not None:
                        metrics.observe_pack(len(part.messages), nbytes)
            finally:
                if making is not None and cache is not None:  # none cached from here: the others read on their own
                    cache.made(*making)

    async def _send_following(
        self, cache: EncodedPacks, entry: tuple[PackCheck, Responses], position: Position, *,
        prefix: tuple[Hashable, ...], min_ts: int, limit: int, vchannel: str, metrics: ChannelMetrics | None,
        join: bool,
    ) -> Position:
        """Send ``entry`` (the cached responses of the pack starting at ``position``) and, when the
        cache holds the packs after it too, those joined with it into one response, within the limits
        of one (messages, MERGE_BYTES): a reader that fell behind the one it follows sends many packs
        per write, however small the first reader's packs were.  Returns where the next response
        starts."""
        check, responses = entry
        single = _single(responses) if join else None
        if single is None:
            self._sending(check.end_position)
            await self._send_cached(responses, metrics)
            return check.end_position
        run, last, end = [single], check, check.end_position
        n, nbytes = check.n_messages, responses[0][2]
        size, budget = len(single), min(self.max_bytes, MERGE_BYTES)
        while True:
            nxt = cache.get(position_key(prefix, end, min_ts))
            following = _single(nxt[1]) if nxt is not None else None
            if nxt is None or following is None:
                break
            if n + nxt[0].n_messages > limit or size + len(following) > budget:
                break
            run.append(following)
            n, nbytes, size = n + nxt[0].n_messages, nbytes + nxt[1][0][2], size + len(following)
            last, end = nxt[0], nxt[0].end_position
        if len(run) == 1:
            self._sending(end)
            await self._send_cached(responses, metrics)
            return end
        # The readers following at one position join the same run (the same messages from ``position``
        # to ``end``, the same options: ``prefix``), so the first builds the response and the others
        # send its bytes rather than each copying up to MERGE_BYTES again.
        joined_key = (*position_key(prefix, position, min_ts), JOINED, end)
        built = cache.get(joined_key)
        data = _single(built[1]) if built is not None else None
        if data is None:
            data = codec.joined_pack_response(MsgPack(check.begin_ts, last.end_ts, [], position, end), vchannel, run)
            if data is None:  # not message packs after all: one at a time, as they were cached
                self._sending(check.end_position)
                await self._send_cached(responses, metrics)
                return check.end_position
            cache.put(joined_key, PackCheck(check.begin_ts, last.end_ts, end, n, check.first, last.last),
                      (((data,), n, nbytes),))
        for _ in run[1:]:  # the first was counted by the caller
            cache.hit()
        self._sending(end)
        await self._write(data)
        if metrics is not None:
            metrics.observe_pack(n, nbytes)
        return end

    async def _send_cached(self, responses: Responses, metrics: ChannelMetrics | None) -> None:
        for datas, n, nbytes in responses:
            for data in datas:
                await self._write(data)
            if metrics is not None:
                metrics.observe_pack(n, nbytes)

    async def _reopen(self, channel: Channel, option: ReadOption, position: Position) -> None:
        """Move the read to ``position`` (past what the scanner has read: the responses up to there
        came from the cache), by the rule of Position: from its id, only what is after its tick."""
        await self.scanner.aclose()
        policy, filters = resume_after(position.message_id, position.timetick, option.deliver_filters)
        self.scanner = channel.stream.read(dataclasses.replace(option, deliver_policy=policy, deliver_filters=filters))

    def _encode(
        self, pack: MsgPack, vchannel: str, limit: int, encode: Callable[[MsgPack, str, bool], bytes],
    ) -> tuple[Responses, MessageTooLargeError | None]:
        """The responses ``pack`` goes out as, part by part; on a message too large for this client,
        those before it (the last part's only in part) and the error, to raise once they are sent."""
        out = []
        for part, nbytes in split_pack(pack, limit, self.max_bytes):
            datas: list[bytes] = []
            try:
                for data in self._part_responses(part, nbytes, vchannel, encode):
                    datas.append(data)
            except MessageTooLargeError as exc:
                out.append((tuple(datas), len(part.messages), nbytes))
                return tuple(out), exc
            out.append((tuple(datas), len(part.messages), nbytes))
        return tuple(out), None

    def _part_responses(
        self, part: MsgPack, nbytes: int, vchannel: str, encode: Callable[[MsgPack, str, bool], bytes],
    ) -> Iterator[bytes]:
        """The responses ``part`` goes out as, one at a time: one, or consecutive ``continued`` ones for
        a unit larger than one response.  Raises MESSAGE_TOO_LARGE at a single message over the limit."""
        max_bytes, receive_limit = self.max_bytes, self.receive_limit
        n = len(part.messages)
        if n < 2 or nbytes + MESSAGE_OVERHEAD * n <= max_bytes:  # the common case: one response
            data = encode(part, vchannel, False)
            if len(data) <= receive_limit or not n:  # an empty pack is only a header: never refused
                yield data
                return
            if n < 2:
                raise _too_large(part, len(data), receive_limit)
        # A unit larger than one response (a big transaction, or properties the estimate leaves out):
        # consecutive responses, each within max_bytes by an upper bound of its messages' sizes.
        runs = continued_runs(part.messages, max_bytes - codec.pack_head_bytes(part, vchannel))
        for k, (start, stop) in enumerate(runs):
            last = k == len(runs) - 1
            piece = codec.continued_part(part, start, stop, last)
            data = encode(piece, vchannel, not last)
            if len(data) > receive_limit:  # a single message: runs fit max_bytes otherwise
                raise _too_large(piece, len(data), receive_limit)
            yield data

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
                fields = [f"ack.positions[{i}]" for i in range(len(request.ack.positions))]
                positions = [codec.position_from_pb(p, field)
                             for p, field in zip(request.ack.positions, fields, strict=True)]
                if not positions:
                    raise InvalidArgumentError("ack has no positions", field="positions")
                await channel.groups.commit(group, [(v, pos) for pos, v in positions], ceiling=self.ceiling,
                                            reads=vchannel, fields=fields)
            except StreamingError as exc:
                refused(self.servicer, "Consume", exc, self.context, in_band=True)
                await self._write(spb.ConsumeResponse(error=to_error_detail(exc)))
            else:
                await self._write(spb.ConsumeResponse(acked=spb.ConsumeAcked(positions=request.ack.positions)))


def _merge(
    pack: MsgPack, scanner: Scanner, limit: int, max_bytes: int, until: Position | None = None, *,
    eager: bool = False,
) -> tuple[MsgPack, MsgPack | None]:
    """``pack`` of a read that has caught up once, joined with the packs that follow it already in
    memory while together they stay within ``limit`` messages and ``max_bytes`` (as ``split_pack``
    counts): a reader that fell behind by several ticks takes them in one response, so a busy node
    writes fewer, larger responses.  Returns the pack and the one polled that did not fit (deliver it
    next), if any.

    Consecutive packs join into one: the first's start, the last's end, the messages in order (as if
    the ticks between had not been there).  Joining stops at a cut (``_cut``).  ``until``: join up
    to the pack that ends there and no further (where another reader's response from the same start
    ended; any read may follow it).
    """
    if until is None and not (eager or scanner.caught_up):
        # A catch-up read gets its packs one per tick, as they were made (unless it has sent from the
        # cache: then it joins packs as the readers ahead of it did, to keep meeting their keys).
        return pack, None
    msgs = pack.messages
    n = len(msgs)
    size = payload_bytes(msgs) + MESSAGE_OVERHEAD * n
    if n >= limit or size >= max_bytes or pack.end_position == until or (until is None and _cut(pack)):
        return pack, None
    joined: list[MsgPack] = []
    following = None
    while True:
        nxt = scanner.poll()
        if nxt is None:
            break
        k = len(nxt.messages)
        more = payload_bytes(nxt.messages) + MESSAGE_OVERHEAD * k
        if n + k > limit or size + more > max_bytes:
            following = nxt
            break
        joined.append(nxt)
        n += k
        size += more
        if nxt.end_position == until or (until is None and _cut(nxt)):
            break
    if not joined:
        return pack, following
    messages = list(msgs)
    for p in joined:
        messages.extend(p.messages)
    last = joined[-1]
    return MsgPack(pack.begin_ts, last.end_ts, messages, pack.start_position, last.end_position), following


MERGE_CUT = 4
"""On average, every this many ticks a pack ends at a *cut* that joining never passes (see ``_cut``)."""
MERGE_BYTES = 512 << 10
"""Most bytes (as ``split_pack`` counts) that joining packs makes one response: enough to make a
write's fixed cost small per message, and little in flight per stream (gRPC holds a copy of each
response until the client's window takes it)."""
JOINED = "joined"
"""Marks the cache key of a response that joins cached packs (from a position, to an end): longer
than a single pack's key, so the two never meet."""


async def _quiet(pack: MsgPack, scanner: Scanner, ms: int) -> MsgPack:
    """``pack`` (without messages) joined with the packs that follow it until one has messages or the
    joined span reaches a boundary of ``ms`` milliseconds of physical time: a reader of a quiet
    vchannel on a busy pchannel is sent one pack per ``ms``, not one per tick.  The rule depends only
    on the ticks, so readers at the same position still meet the same responses (fanout.pack_key)."""
    while not pack.messages and physical_ms(pack.begin_ts) // ms == physical_ms(pack.end_ts) // ms:
        nxt = await anext(scanner)
        pack = MsgPack(pack.begin_ts, nxt.end_ts, nxt.messages, pack.start_position, nxt.end_position)
    return pack


def _cut(pack: MsgPack) -> bool:
    """Whether joining stops after ``pack``: decided by its end tick alone, the same for every reader,
    so that readers whose responses started at different places (joined more or fewer packs) end one
    at the same tick again soon, and from there on share responses (``fanout.pack_key``)."""
    return (pack.end_ts * 0x9E3779B97F4A7C15 >> 32) % MERGE_CUT == 0


def _single(responses: Responses) -> bytes | None:
    """The one response a cached pack went out as, if it went out as one (not in continued parts)."""
    if len(responses) == 1 and len(responses[0][0]) == 1:
        return responses[0][0][0]
    return None


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
