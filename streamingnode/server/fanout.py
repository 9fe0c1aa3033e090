"""Fan-out: what Consume streams share, so that many readers of one vchannel cost little each.

* ``EncodedPacks``: recently encoded responses, keyed by everything that decides their bytes
  (``pack_key``).  Readers at the same position with the same options get the very bytes the first
  one encoded; catch-up readers that reach the tail meet the others' keys and share from then on.
  While one reader reads from a key, the others at that key wait for its response (``making``)
  instead of reading and scanning the same messages.  Bounded in bytes (least recently used goes
  first); ``consume_cache_bytes = 0`` turns it off.
* ``Fanout``: one per node (``fanout_of``), holding the cache, the open streams (each with the bytes
  it holds for its client, which tests and the ``consume_held_bytes`` gauge read) and the delivery
  budget that keeps appends first (``DeliveryTurns``: a bound per loop turn, and while appends go on,
  a measured share of CPU time).
"""

from __future__ import annotations

import asyncio
import math
import os
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Coroutine, Generator, Hashable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

from wal.message import Position

if TYPE_CHECKING:
    from streamingnode.node.node import Node
    from streamingnode.observability.metrics import NodeMetrics
    from wal.scanner import MsgPack
    from wal.wal import WAL

T = TypeVar("T")

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
    return position_key(prefix, pack.start_position, min_ts)


def position_key(prefix: tuple[Hashable, ...], position: Position, min_ts: int) -> tuple[Hashable, ...]:
    """The key of a pack that starts at ``position``: where a reader that has sent up to ``position``
    looks for the next response.  A pack's start position carries its begin tick (the scanner makes
    them together, and joining keeps the first pack's both), so the position alone decides it."""
    return (*prefix, min_ts if position.timetick < min_ts else 0, position)


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
    first = msgs[0].message_id if msgs else None
    last = msgs[-1].message_id if msgs else None
    return PackCheck(pack.begin_ts, pack.end_ts, pack.end_position, len(msgs), first, last)


class EncodedPacks:
    """A byte-bounded LRU cache of encoded responses (see the module's docstring), by ``pack_key``,
    each with its ``pack_check``."""

    def __init__(self, max_bytes: int, metrics: NodeMetrics | None = None) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[tuple[Hashable, ...], tuple[PackCheck, Responses, int]] = OrderedDict()
        self._making: dict[tuple[Hashable, ...], asyncio.Future[None]] = {}
        """Keys a reader is reading from now (single flight: the others at that key wait for it)."""
        self._metrics = metrics

    def __len__(self) -> int:
        return len(self._entries)

    def making(self, key: tuple[Hashable, ...]) -> asyncio.Future[None] | None:
        """Done once the reader that is reading from ``key`` has cached its response there (or given
        up): None when no reader is."""
        return self._making.get(key)

    def start_making(self, key: tuple[Hashable, ...]) -> asyncio.Future[None]:
        """Note that the caller reads from ``key`` and will cache its response there (``made``)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._making[key] = fut
        return fut

    def made(self, key: tuple[Hashable, ...], fut: asyncio.Future[None]) -> None:
        """The response at ``key`` is cached, or will not be: wake the readers waiting for it."""
        if self._making.get(key) is fut:
            del self._making[key]
        if not fut.done():
            fut.set_result(None)

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


SHARE_WINDOW = 0.010
"""Seconds over which delivery's share is counted, and the longest a delivery waits for the next."""

SENDING_THREADS = ("event_engine", "grpc_global_tim")
"""The names (Linux's 15-character thread names) of gRPC's own threads: its event engine's pool, where
responses are framed and written to the sockets, and its timer thread."""


class SendingThreads:
    """The CPU time gRPC's own threads have used since they were found, read from each thread's CPU
    clock (Linux: the clock id of a thread is derived from its id).  Where ``/proc`` cannot be read
    the answer stays 0, and delivery is charged only its time on the loop.

    Delivery's cost is mostly there: a write on the loop hands bytes over, and these threads send them.
    Their CPU time is measured, not their wall time: on a machine where every core is busy, a thread
    waiting for a core or for the GIL costs nobody anything, and charging that wait to delivery would
    hold readers back because the machine is loaded, not because delivery used it.
    """

    RESCAN_SECONDS = 1.0
    """How often the thread list is read again (the event engine's pool grows and shrinks)."""

    def __init__(self, task_dir: str = "/proc/self/task", names: tuple[str, ...] = SENDING_THREADS) -> None:
        self._dir = task_dir
        self._names = names
        self._clocks: dict[int, tuple[int, float]] = {}  # thread id -> (its CPU clock id, last reading)
        self._others: set[int] = set()  # threads that are not gRPC's, so that a rescan skips them
        self._scanned = -math.inf
        self.total = 0.0

    def cpu(self, now: float) -> float:
        """Seconds of CPU used by the threads found so far (``now``: a monotonic time, for rescans)."""
        if now - self._scanned >= self.RESCAN_SECONDS:
            self._scanned = now
            self._scan()
        total = self.total
        for tid, (clock, last) in list(self._clocks.items()):
            try:
                value = time.clock_gettime(clock)
            except OSError:  # the thread ended: what it used since the last reading is not counted
                del self._clocks[tid]
                continue
            if value < last:  # the clock went back: the id is another thread's now (reused)
                del self._clocks[tid]
                continue
            total += value - last
            self._clocks[tid] = (clock, value)
        self.total = total
        return total

    def _scan(self) -> None:
        try:
            tids = [int(name) for name in os.listdir(self._dir)]
        except (OSError, ValueError):
            return
        alive = set(tids)
        self._others &= alive
        for tid in tids:
            if tid in self._clocks or tid in self._others:
                continue
            try:
                with open(f"{self._dir}/{tid}/comm") as f:
                    name = f.read().strip()
                if not name.startswith(self._names):
                    self._others.add(tid)
                    continue
                clock = ((~tid) << 3) | 6  # the kernel's per-thread CPU clock (CPUCLOCK_SCHED | PERTHREAD)
                self._clocks[tid] = (clock, time.clock_gettime(clock))  # counted from now on
            except OSError:
                continue


class DeliveryTurns:
    """When Consume streams may deliver: at most ``per_turn`` responses per event-loop turn, and while
    appends go on, at most ``share`` of a core's CPU time; the others wait, in the order they came.

    ``take`` is awaited before each response: it returns at once while this turn's budget lasts.  The
    budget is renewed by a callback scheduled when it is first used, which runs on the next turn,
    after the I/O callbacks the loop collected in between (a produce request among them).

    The cost is measured in CPU time, not estimated: ``spent`` is told the loop thread's CPU time of
    each step of a delivery (``governed`` wraps the senders and the writes), and at each accounting
    the CPU time gRPC's threads used meanwhile (``sending``, a ``SendingThreads.cpu``) is charged in
    proportion to the bytes delivery wrote (``sent``) against the bytes appended (``appended_bytes``):
    those threads receive the appends too.  Delivery earns ``share`` of each second of wall time (the
    node's ``consume_delivery_share``; 1, the default here, bounds nothing); what it spends over that
    is a debt that makes the next deliveries wait for the loop clock (``call_at``) while the appends
    run.  Whether appends go on is ``appending``'s answer, a number that moves with every commit
    (checked once per ``window``); with none, only the per-turn bound holds, so a catch-up read of an
    idle log goes at full speed.
    """

    def __init__(self, per_turn: int = DELIVERIES_PER_TURN, *, share: float = 1.0,
                 window: float = SHARE_WINDOW, appending: Callable[[], int] | None = None,
                 appended_bytes: Callable[[], int] | None = None,
                 sending: Callable[[float], float] | None = None) -> None:
        self.per_turn = per_turn
        self.share = share
        self.window = window
        self._appending = appending
        self._appended_bytes = appended_bytes
        self._sending = sending
        self._appended_at = appended_bytes() if appended_bytes is not None else 0
        self._sending_at = sending(0.0) if sending is not None else 0.0
        self._sent = 0  # bytes delivery wrote since the last accounting
        self._used = 0
        self._renewal: asyncio.Handle | None = None
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._spent = 0.0
        """Delivery's CPU time (on the loop, and its part of gRPC's sending) not yet paid for by its
        share of the wall time."""
        self._since = -1.0  # loop time of the last accounting
        self._commits = appending() if appending is not None else 0  # its answer at the last accounting
        self._active = False
        self.held_back = 0
        """How many times deliveries had to wait for the clock (appends went first)."""

    def spent(self, seconds: float) -> None:
        self._spent += seconds

    def sent(self, nbytes: int) -> None:
        """Delivery wrote ``nbytes`` to a stream (its part of gRPC's sending is charged by them)."""
        if self._sending is not None:  # else nothing reads the count
            self._sent += nbytes

    def _charge_sending(self, now: float) -> None:
        if self._sending is None:
            return
        cpu = self._sending(now)
        used, self._sending_at = cpu - self._sending_at, cpu
        appended = self._appended_bytes() if self._appended_bytes is not None else 0
        received, self._appended_at = appended - self._appended_at, appended
        sent, self._sent = self._sent, 0
        if sent and used > 0:
            self._spent += used * sent / (sent + max(received, 0))

    def _over(self, now: float) -> bool:
        """Whether delivery has used up its share (and appends go on), as of loop time ``now``."""
        if now - self._since >= self.window:
            self._charge_sending(now)
            # The share earned since the last accounting pays off the time spent; what is left over is
            # not saved up (an idle spell must not buy a burst that starves the next appends).
            self._spent = max(self._spent - self.share * (now - self._since), 0.0)
            self._since = now
            commits = self._appending() if self._appending is not None else 0
            self._active = commits != self._commits
            self._commits = commits
            if not self._active:
                self._spent = 0.0  # no debt from a spell without appends: nobody waited for it
        return self._active and self._spent > 0.0 and self._spent >= self.share * self.window

    async def take(self) -> None:
        loop = asyncio.get_running_loop()
        if self._used < self.per_turn and not self._waiting and not self._over(loop.time()):
            self._used += 1
            if self._renewal is None:
                self._renewal = loop.call_soon(self._renew)
            return
        fut: asyncio.Future[None] = loop.create_future()
        self._waiting.append(fut)
        if self._renewal is None:
            self._schedule(loop)
        await fut

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        if self._over(now):
            # Paid off at the share's rate: the loop is the appends' meanwhile.
            self.held_back += 1
            wait = max((self._spent - self.share * self.window) / self.share, 0.0)
            self._renewal = loop.call_at(now + min(max(wait, self.window), 10 * self.window), self._renew)
        else:
            self._renewal = loop.call_soon(self._renew)

    def _renew(self) -> None:
        self._renewal = None
        self._used = 0
        loop = asyncio.get_running_loop()
        waiting = self._waiting
        while waiting and self._used < self.per_turn and not self._over(loop.time()):
            fut = waiting.popleft()
            if not fut.done():  # a cancelled waiter gave up its place
                self._used += 1
                fut.set_result(None)
        if self._used or waiting:
            self._schedule(loop)


class _Governed:
    """Awaits a coroutine, telling ``turns`` how long each of its steps ran on the loop."""

    __slots__ = ("_coro", "_turns")

    def __init__(self, coro: Coroutine[Any, Any, T], turns: DeliveryTurns) -> None:
        self._coro = coro
        self._turns = turns

    def __await__(self) -> Generator[Any, Any, Any]:
        # The loop thread's CPU time, not the wall clock: on a loaded machine a step's wall time is
        # mostly waiting for a core or for the GIL, and charging that held readers back for whole
        # bursts (bench/fanout.py).  The sending that gRPC's threads do for these writes is charged
        # separately (DeliveryTurns.sent and SendingThreads).
        coro, spent, clock = self._coro, self._turns.spent, time.thread_time
        value: Any = None
        error: BaseException | None = None
        while True:
            t0 = clock()
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                return stop.value
            finally:  # the step ran on the loop whether it suspended, returned or raised
                spent(clock() - t0)
            value, error = None, None
            try:
                value = yield yielded
            except BaseException as exc:  # noqa: BLE001  (a cancel or close goes on into the coroutine)
                error = exc


async def governed(coro: Coroutine[Any, Any, T], turns: DeliveryTurns) -> T:
    """``coro``'s result; the time each of its steps runs on the loop counts as delivery's."""
    result: T = await _Governed(coro, turns)
    return result


class Fanout:
    """What the Consume streams of one node share."""

    def __init__(self, node: Node) -> None:
        config = node.config
        metrics = node.metrics
        self.cache = EncodedPacks(config.consume_cache_bytes, metrics) if config.consume_cache_bytes > 0 else None
        self.wals: weakref.WeakSet[WAL] = weakref.WeakSet()
        """The logs the streams read: their commits say whether appends go on (``DeliveryTurns``)."""
        # A share of 1 bounds nothing: no accounting then, only the per-turn bound.
        share = config.consume_delivery_share
        bounded = share < 1
        # The bytes committed move with every commit (each message counts at least 64), so they also
        # answer whether appends go on.
        self.turns = DeliveryTurns(share=share, appending=self._committed_bytes if bounded else None,
                                   appended_bytes=self._committed_bytes if bounded else None,
                                   sending=SendingThreads().cpu if bounded else None)
        self.streams: dict[int, HeldBytes] = {}
        """Open Consume streams by consumer id."""
        self._metrics = metrics
        if metrics is not None:
            metrics.consume_held_bytes.set_function(self.held_bytes)

    def _committed_bytes(self) -> int:
        return sum(wal.committed_bytes for wal in self.wals)

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
    "SENDING_THREADS",
    "SHARE_WINDOW",
    "DeliveryTurns",
    "EncodedPacks",
    "Fanout",
    "PackCheck",
    "Responses",
    "SendingThreads",
    "fanout_of",
    "governed",
    "pack_check",
    "pack_key",
    "position_key",
]
