"""MsgStream: the Milvus message-stream shape over producers and consumers of several pchannels.

``as_producer(channels)`` then ``produce(messages, repack)``: each message goes to one channel, picked
by the repack function (default: a stable hash of the message's key modulo the channel count);
``broadcast`` sends one message to every channel.

``as_consumer(channels, group)`` then ``consume()``: one pack per time tick across all the channels,
as Milvus's TtMsgStream does.  Each channel has its own clock, so a merged pack at ``T`` can only be
released once every channel has reported time ``>= T``; it then holds every message of every channel
with timetick ``<= T`` (a transaction counts at its commit timetick and is never split).  Its
``end_positions`` (one per channel) follow the resume rule of ``Position``, so ``ack(pack)`` or
``seek(pack.end_positions)`` continues exactly after it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from streamingnode.client._consumer import Consumer
from streamingnode.client._producer import Producer
from streamingnode.wire.packs import delivery_units
from wal.errors import ConsumerGroupExistError, InvalidArgumentError, OnShutdownError, StreamingError
from wal.message import AppendResult, Message, Position
from wal.options import DeliverPolicy
from wal.scanner import MsgPack
from wal.tasks import cancel_and_wait

if TYPE_CHECKING:
    from streamingnode.client._async import AsyncClient

HASH_KEY_PROPERTY = "hash_key"
"""A message property that, when present, is hashed instead of the vchannel to pick its channel."""

Repack = Callable[[Sequence[Message], int], Mapping[int, Sequence[Message]]]
"""(messages, number of channels) -> {channel index: messages for it, in order}."""


def hash_key(message: Message) -> int:
    """A stable hash of the message's key (CRC-32, so every process agrees; ``hash()`` is salted)."""
    key = message.properties.get(HASH_KEY_PROPERTY, message.vchannel)
    return zlib.crc32(key.encode())


def default_repack(messages: Sequence[Message], num_channels: int) -> dict[int, list[Message]]:
    """Each message to channel ``hash_key(message) % num_channels``."""
    out: dict[int, list[Message]] = {}
    for m in messages:
        out.setdefault(hash_key(m) % num_channels, []).append(m)
    return out


@dataclass(frozen=True, slots=True)
class MsgStreamPack:
    """Messages of one time tick across the consumer's channels (Milvus's MsgPack)."""

    begin_ts: int
    end_ts: int
    messages: list[Message]
    start_positions: list[Position] = field(default_factory=list)
    end_positions: list[Position] = field(default_factory=list)


@dataclass(slots=True)
class _Unit:
    """A message, or a whole transaction, with the timetick it is delivered at."""

    ts: int
    messages: list[Message]


def _units(messages: list[Message]) -> list[_Unit]:
    """The pack's delivery units (streamingnode.wire.packs states the rule), each at its last message's timetick."""
    return [_Unit(messages[stop - 1].timetick, messages[start:stop]) for start, stop in delivery_units(messages)]


class _Channel:
    """One consumed channel: what it delivered and the merger has not released yet."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.pending: collections.deque[MsgPack] = collections.deque()
        self.latest_end = -1
        self.position: Position | None = None
        self.next: asyncio.Task[MsgPack] | None = None

    def take(self, ts: int) -> tuple[Position, list[_Unit], Position]:
        """Release everything up to ``ts``: (start position, units, end position)."""
        start = self.position or self.pending[0].start_position
        units: list[_Unit] = []
        while self.pending:
            pack = self.pending[0]
            if pack.end_ts <= ts:
                units.extend(_units(pack.messages))
                self.position = pack.end_position
                self.pending.popleft()
                continue
            if pack.begin_ts < ts:
                # Part of this pack is due.  By the resume rule the rest starts at (the pack's start id,
                # timetick > ts): everything of the pack up to ts is then behind the reader.
                all_units = _units(pack.messages)
                units.extend(u for u in all_units if u.ts <= ts)
                rest = [m for u in all_units if u.ts > ts for m in u.messages]
                mid = Position(pack.start_position.pchannel, pack.start_position.message_id, ts)
                self.pending[0] = MsgPack(ts, pack.end_ts, rest, mid, pack.end_position)
                self.position = mid
            break
        if self.position is None:
            self.position = start
        return start, units, self.position


class MsgStream:
    """Producer and consumer sides over several pchannels.  Make one with ``AsyncClient.msgstream``."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client
        self._producers: list[Producer] = []
        self._channels: list[_Channel] = []
        self._group: str | None = None
        self._emitted = -1
        self.closed = False

    # --- producing -------------------------------------------------------------------------------
    def as_producer(self, channels: Sequence[str], *, producer_id: str | None = None) -> None:
        """Produce to ``channels`` (pchannels), in this order (repack indexes into it).  With
        ``producer_id``, every channel's producer is idempotent under that id."""
        if not channels:
            raise InvalidArgumentError("as_producer needs at least one channel", field="channels")
        self._producers.extend(self._client.producer(c, producer_id=producer_id) for c in channels)

    async def produce(self, messages: Sequence[Message], repack: Repack | None = None) -> list[AppendResult]:
        """Send each message to the channel ``repack`` picks; results in the order of ``messages``."""
        self._check_open()
        if not self._producers:
            raise InvalidArgumentError("produce needs as_producer first", field="channels")
        plan = (repack or default_repack)(messages, len(self._producers))
        futures: dict[int, asyncio.Future[AppendResult]] = {}
        for index, batch in plan.items():
            if not 0 <= index < len(self._producers):
                raise InvalidArgumentError(f"repack chose channel {index} of {len(self._producers)}", field="repack")
            producer = self._producers[index]
            for m in batch:
                futures[id(m)] = producer.send_nowait(
                    m.vchannel, m.payload, properties=m.properties, type=m.message_type)
        missing = [m for m in messages if id(m) not in futures]
        if missing:
            raise InvalidArgumentError(f"repack left out {len(missing)} of {len(messages)} messages", field="repack")
        return list(await asyncio.gather(*(futures[id(m)] for m in messages)))

    async def broadcast(self, message: Message) -> list[AppendResult]:
        """Send ``message`` to every producer channel; one result per channel, in channel order."""
        self._check_open()
        if not self._producers:
            raise InvalidArgumentError("broadcast needs as_producer first", field="channels")
        return list(await asyncio.gather(*(
            p.send_nowait(message.vchannel, message.payload, properties=message.properties, type=message.message_type)
            for p in self._producers)))

    # --- consuming -------------------------------------------------------------------------------
    async def as_consumer(
        self, channels: Sequence[str], group: str, position: Literal["earliest", "latest"] = "earliest",
    ) -> None:
        """Consume ``channels`` (whole pchannels) as consumer group ``group``, created when missing.
        ``position`` applies where the group has no committed position yet (like Kafka's
        auto.offset.reset); otherwise reading resumes after the committed one."""
        if not channels or not group:
            raise InvalidArgumentError("as_consumer needs channels and a group", field="channels")
        if position not in ("earliest", "latest"):
            raise InvalidArgumentError(f"position must be 'earliest' or 'latest', got {position!r}", field="position")
        policy = DeliverPolicy.all() if position == "earliest" else DeliverPolicy.latest()
        self._group = group
        for name in channels:
            with contextlib.suppress(ConsumerGroupExistError):
                await self._client.create_group(name, group)
            consumer = self._client.consumer(name, group=group, policy=policy)
            self._channels.append(_Channel(consumer))
        await asyncio.gather(*(c.consumer.wait_opened() for c in self._channels))

    async def consume(self) -> MsgStreamPack:
        """The next pack: one time tick across all channels.  Safe to cancel (``asyncio.timeout``):
        nothing read is lost, the next call continues."""
        self._check_open()
        if not self._channels:
            raise InvalidArgumentError("consume needs as_consumer first", field="channels")
        while True:
            ts = min(c.latest_end for c in self._channels)
            if ts > self._emitted:
                return self._release(ts)
            await self._pull([c for c in self._channels if c.latest_end == ts])

    async def _pull(self, lagging: list[_Channel]) -> None:
        # Only the channels holding time back are read, so one that runs ahead is not buffered
        # without bound (its consumer's buffer and gRPC flow control push back on it instead).
        for c in lagging:
            if c.next is None:
                c.next = asyncio.ensure_future(anext(c.consumer))
        done, _ = await asyncio.wait([c.next for c in lagging if c.next is not None],
                                     return_when=asyncio.FIRST_COMPLETED)
        for c in lagging:
            if c.next in done:
                task, c.next = c.next, None
                pack = task.result()  # a consumer that failed for good raises its error here
                c.pending.append(pack)
                c.latest_end = pack.end_ts

    def _release(self, ts: int) -> MsgStreamPack:
        starts: list[Position] = []
        ends: list[Position] = []
        units: list[tuple[int, int, _Unit]] = []
        for index, c in enumerate(self._channels):
            start, taken, end = c.take(ts)
            starts.append(start)
            ends.append(end)
            units.extend((u.ts, index, u) for u in taken)
        units.sort(key=lambda x: (x[0], x[1]))
        begin, self._emitted = self._emitted, ts
        return MsgStreamPack(max(begin, 0), ts, [m for _, _, u in units for m in u.messages], starts, ends)

    async def ack(self, pack: MsgStreamPack) -> None:
        """Commit the pack's end positions to the group, each on its channel."""
        by_name = {c.consumer.pchannel: c for c in self._channels}
        await asyncio.gather(*(by_name[p.pchannel].consumer.ack(p) for p in pack.end_positions
                               if p.pchannel in by_name))

    async def seek(self, positions: Sequence[Position]) -> None:
        """Move the group on each position's channel to it and read on from there (channels without a
        position resume from the group's committed position)."""
        if self._group is None:
            raise InvalidArgumentError("seek needs as_consumer first", field="channels")
        names = [c.consumer.pchannel for c in self._channels]
        for p in positions:
            if p.pchannel not in names:
                raise InvalidArgumentError(f"seek to channel {p.pchannel!r}, which is not consumed", field="positions")
        await self._close_consumers()
        for p in positions:
            await self._client.seek_group(p.pchannel, self._group, position=p)
        self._channels = [_Channel(self._client.consumer(n, group=self._group)) for n in names]
        self._emitted = -1
        await asyncio.gather(*(c.consumer.wait_opened() for c in self._channels))

    async def _close_consumers(self) -> None:
        for c in self._channels:
            if c.next is not None:
                with contextlib.suppress(StopAsyncIteration, StreamingError):
                    await cancel_and_wait(c.next)
            await c.consumer.aclose()

    async def aclose(self) -> None:
        """Close every consumer and drain every producer.  Idempotent."""
        if self.closed:
            return
        self.closed = True
        await self._close_consumers()
        for p in self._producers:
            await p.aclose()
        self._channels, self._producers = [], []

    def _check_open(self) -> None:
        if self.closed:
            raise OnShutdownError("msgstream is closed")


__all__ = ["HASH_KEY_PROPERTY", "MsgStream", "MsgStreamPack", "Repack", "default_repack", "hash_key"]
