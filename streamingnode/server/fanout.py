"""Fan-out: what Consume streams share, so that many readers of one vchannel cost little each.

* ``EncodedPacks``: recently encoded responses, keyed by everything that decides their bytes
  (``pack_key``).  Readers at the same position with the same options get the very bytes the first
  one encoded; catch-up readers that reach the tail meet the others' keys and share from then on.
  Bounded in bytes (least recently used goes first); ``consume_cache_bytes = 0`` turns it off.
* ``Fanout``: one per node (``fanout_of``), holding the cache, the open streams (each with the bytes
  it holds for its client, which tests and the ``consume_held_bytes`` gauge read) and the per-turn
  delivery budget that keeps appends first (``DeliveryTurns``).
"""

from __future__ import annotations

import asyncio
import weakref
from collections import OrderedDict
from collections.abc import Hashable
from typing import TYPE_CHECKING, NamedTuple, Protocol

from wal.message import Position

if TYPE_CHECKING:
    from streamingnode.metrics import NodeMetrics
    from streamingnode.node import Node
    from wal.scanner import MsgPack

Responses = tuple[tuple[tuple[bytes, ...], int, int], ...]
"""The responses one pack went out as, per part of it: (the wire bytes of its responses, several when
``continued``; its messages; its payload bytes)."""

DELIVERIES_PER_TURN = 32
"""Responses written per event-loop turn by all Consume streams together before the rest wait for
the next turn: between turns the loop takes in what arrived meanwhile (appends, acks), so however
many readers wake on a commit, a produce request waits for at most this much delivery work."""


class HeldBytes(Protocol):
    """A Consume stream as the fan-out sees it: the bytes it holds for its client, and their peak."""

    @property
    def held_bytes(self) -> int: ...

    @property
    def held_peak(self) -> int: ...


def pack_key(prefix: tuple[Hashable, ...], pack: MsgPack, min_ts: int) -> tuple[Hashable, ...]:
    """The cache key of a response starting where ``pack`` starts, read with the options ``prefix``
    stands for (pchannel, term, vchannel, columns, the size limits, the type filter).

    From one start position, readers with the same options are handed the same packs (the rule of
    ``Position``); how many of them one response joins is the first reader's choice, recorded in
    the entry's ``pack_check`` for the others to follow.  The time filter matters only until the
    scanner has passed it: a pack that begins below ``min_ts`` is keyed with it.
    """
    return (*prefix, min_ts if pack.begin_ts < min_ts else 0, pack.start_position)


class PackCheck(NamedTuple):
    """What must match for a cached response to be a pack's: where it ends, its count and its first
    and last ids (cheap, and two packs from one start that differ would differ there)."""

    begin_ts: int
    end_ts: int
    end_position: Position
    n_messages: int
    first: int | None
    last: int | None


def pack_check(pack: MsgPack) -> PackCheck:
    msgs = pack.messages
    first = msgs[0]._id if msgs else None
    last = msgs[-1]._id if msgs else None
    return PackCheck(pack.begin_ts, pack.end_ts, pack.end_position, len(msgs), first, last)


class EncodedPacks:
    """A byte-bounded LRU cache of encoded responses (see the module's docstring), by ``pack_key``,
    each with its ``pack_check``."""

    def __init__(self, max_bytes: int, metrics: NodeMetrics | None = None) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[tuple[Hashable, ...], tuple[PackCheck, Responses, int]] = OrderedDict()
        self._metrics = metrics

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: tuple[Hashable, ...]) -> tuple[PackCheck, Responses] | None:
        """(check, responses) of the entry at ``key``, if any."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0], entry[1]

    def hit(self) -> None:
        if self._metrics is not None:
            self._metrics.consume_cache_hits.inc()

    def miss(self) -> None:
        if self._metrics is not None:
            self._metrics.consume_cache_misses.inc()

    def put(self, key: tuple[Hashable, ...], check: PackCheck, responses: Responses) -> None:
        """Keep ``responses`` unless an entry is there already (the first reader's choice stands)."""
        size = sum(len(data) for datas, _, _ in responses for data in datas)
        if size > self.max_bytes // 2 or key in self._entries:
            return  # one entry may not sweep the whole cache
        self._entries[key] = (check, responses, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, _, dropped) = self._entries.popitem(last=False)
            self.bytes -= dropped
        if self._metrics is not None:
            self._metrics.consume_cache_bytes.set(self.bytes)


class DeliveryTurns:
    """At most ``per_turn`` deliveries per event-loop turn; the others wait for a later turn.

    ``take`` is awaited before each response: it returns at once while this turn's budget lasts.  The
    budget is renewed by a callback scheduled when it is first used, which runs on the next turn,
    after the I/O callbacks the loop collected in between (a produce request among them).
    """

    def __init__(self, per_turn: int = DELIVERIES_PER_TURN) -> None:
        self.per_turn = per_turn
        self._used = 0
        self._renewal: asyncio.Handle | None = None
        self._waiting: list[asyncio.Future[None]] = []

    async def take(self) -> None:
        if self._used < self.per_turn and not self._waiting:
            self._used += 1
            if self._renewal is None:
                self._renewal = asyncio.get_running_loop().call_soon(self._renew)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(fut)
        if self._renewal is None:
            self._renewal = asyncio.get_running_loop().call_soon(self._renew)
        await fut

    def _renew(self) -> None:
        self._renewal = None
        self._used = 0
        waiting = self._waiting
        while waiting and self._used < self.per_turn:
            fut = waiting.pop(0)
            if not fut.done():  # a cancelled waiter gave up its place
                self._used += 1
                fut.set_result(None)
        if self._used:
            self._renewal = asyncio.get_running_loop().call_soon(self._renew)


class Fanout:
    """What the Consume streams of one node share."""

    def __init__(self, node: Node) -> None:
        config = node.config
        metrics = node.metrics
        self.cache = EncodedPacks(config.consume_cache_bytes, metrics) if config.consume_cache_bytes > 0 else None
        self.turns = DeliveryTurns()
        self.streams: dict[int, HeldBytes] = {}
        """Open Consume streams by consumer id."""
        self._metrics = metrics
        if metrics is not None:
            metrics.consume_held_bytes.set_function(self.held_bytes)

    def held_bytes(self) -> int:
        """Bytes the node holds for its consumers, not yet taken by them (all streams)."""
        return sum(s.held_bytes for s in self.streams.values())


_FANOUTS: weakref.WeakKeyDictionary[Node, Fanout] = weakref.WeakKeyDictionary()


def fanout_of(node: Node) -> Fanout:
    """The node's ``Fanout``, made on first use."""
    found = _FANOUTS.get(node)
    if found is None:
        found = _FANOUTS[node] = Fanout(node)
    return found


__all__ = [
    "DELIVERIES_PER_TURN",
    "DeliveryTurns",
    "EncodedPacks",
    "Fanout",
    "PackCheck",
    "Responses",
    "fanout_of",
    "pack_check",
    "pack_key",
]
