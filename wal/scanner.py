"""Scanner: reads a pchannel in timestamp order and hands out MsgPacks, one per TimeTick.

Reading happens in two modes.  *Catch-up* reads blocks from storage in bounded batches on a reader
thread.  *Tailing* reads the WAL's in-memory tail buffer, woken by commits (no polling); a scanner
that falls behind the buffer drops back to catch-up.  Either way the scanner pulls only when its
consumer asks for the next pack, so a slow consumer slows only itself.

Ordering: messages wait until a TimeTick barrier at ``T`` releases every waiting message with
``ts <= T`` as one MsgPack sorted by ``(ts, id)``.  Transactions are held apart from BeginTxn to
CommitTxn and released whole at the commit's timestamp; a rollback, an expiry (measured on message
timestamps), or a transaction whose BeginTxn the scanner never saw (it started in the middle) is
never delivered.  Memory per scanner is one storage batch plus what waits for the next barrier.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from wal._codec import block_count
from wal.clock import txn_expired
from wal.errors import OutOfRangeError
from wal.message import BROADCAST_VCHANNEL, Message, MessageID, MessageType, Position
from wal.options import PolicyKind, ReadOption

if TYPE_CHECKING:
    from wal.wal import WAL

_TIME_TICK = MessageType.TIME_TICK
_BEGIN = MessageType.BEGIN_TXN
_COMMIT = MessageType.COMMIT_TXN
_ROLLBACK = MessageType.ROLLBACK_TXN
_TXN_FRAMING = frozenset({_BEGIN, _COMMIT, _ROLLBACK})
_TAIL_READ = 4096


@dataclass(slots=True)
class MsgPack:
    """Messages released by one TimeTick: the seed's MsgPack.

    ``end_position`` is where to resume after this pack (see ``Position``).
    """

    begin_ts: int
    end_ts: int
    messages: list[Message]
    start_position: Position
    end_position: Position

    @property
    def start_positions(self) -> list[Position]:
        return [self.start_position]

    @property
    def end_positions(self) -> list[Position]:
        return [self.end_position]


class _OpenTxn:
    __slots__ = ("begin_id", "keepalive_ms", "last_ts", "messages")

    def __init__(self, begin: Message, keepalive_ms: int) -> None:
        assert begin._id is not None
        self.begin_id: MessageID = begin._id
        self.messages = [begin]
        self.last_ts = begin._timetick
        self.keepalive_ms = keepalive_ms


def _retrieve(fut: asyncio.Future[list[tuple[MessageID, bytes, bool]]]) -> None:
    # A read-ahead nobody awaits any more (scanner closed, channel gone) must not log its error.
    if not fut.cancelled():
        fut.exception()


def _ts(m: Message) -> int:
    return m._timetick


class Scanner:
    """An async iterator of MsgPacks.  Obtain from ``WAL.read``; close with ``aclose``."""

    def __init__(self, wal: WAL, option: ReadOption) -> None:
        self._wal = wal
        self._opt = option
        self._vchannel = option.vchannel
        self._min_ts, inclusive = option.min_timetick()
        # Normalise the bound to "ts >= _min_ts".
        if not inclusive:
            self._min_ts += 1
        self._types = option.message_types()
        self.lazy = option.lazy
        self._closed = False
        self._start_time: int | None = None
        self._fetch_id = self._resolve_start(option)  # next id to read from tail or storage
        self._cursor = self._fetch_id  # next id to process
        self._batch: list[Message] = []
        self._batch_pos = 0
        self._run: list[Message] = []  # non-decreasing ts, increasing ids: the common, cheap path
        self._heap: list[tuple[int, MessageID, Message | list[Message]]] = []  # out-of-order units
        self._txns: dict[int, _OpenTxn] = {}
        self._last_tick = max(self._min_ts - 1, 0)
        self._position = Position(wal.pchannel, self._fetch_id, self._last_tick)
        self.tailing = False
        """True while reading from the tail buffer rather than storage."""
        self.caught_up = False
        """True once this scanner has waited for a commit: it has read everything there was once."""
        self._read_ahead: tuple[MessageID, asyncio.Future[list[tuple[MessageID, bytes, bool]]]] | None = None
        self._marks: list[int] | None = None  # for a batch from storage: see decode_block
        self._mark_i = 0

    def _resolve_start(self, option: ReadOption) -> MessageID:
        wal = self._wal
        policy = option.deliver_policy
        kind = policy.kind
        if kind is PolicyKind.ALL:
            return wal.first_id
        if kind is PolicyKind.LATEST:
            return wal.next_id
        if kind is PolicyKind.START_AT_TIME:
            assert policy.timetick is not None
            self._start_time = policy.timetick
            self._min_ts = max(self._min_ts, policy.timetick)
            return wal.first_id  # refined by the time index on the first read
        assert policy.message_id is not None
        start = policy.message_id + (1 if kind is PolicyKind.START_AFTER else 0)
        if start < wal.first_id or start > wal.next_id:
            raise OutOfRangeError(
                f"{kind.value}({policy.message_id}) is outside pchannel {wal.pchannel!r}: "
                f"retained ids are [{wal.first_id}, {wal.next_id})",
                channel=wal.pchannel, message_id=policy.message_id,
            )
        return start

    # --- iteration -------------------------------------------------------------------------------
    def __aiter__(self) -> Scanner:
        return self

    async def __anext__(self) -> MsgPack:
        if self._closed:
            raise StopAsyncIteration
        if self._start_time is not None:
            self._fetch_id = self._cursor = await self._wal._seek_time(self._start_time)
            self._position = self._position._replace(message_id=self._fetch_id)
            self._start_time = None
        while True:
            pack = self._scan()
            if pack is not None:
                return pack
            if not self._refill_from_memory():
                await self._refill()

    def poll(self) -> MsgPack | None:
        """The next pack if it can be made from what is already in memory (the batch, the tail
        buffer, a not-persisted tick) without waiting; None otherwise (then iterate to wait).

        A consumer behind by several ticks takes them in one go this way (see the Consume stream's
        merging), and nothing here ever awaits: it runs only after the first ``__anext__``.
        """
        if self._closed or self._start_time is not None:
            return None
        while True:
            pack = self._scan()
            if pack is not None:
                return pack
            if not self._refill_from_memory():
                return None

    def _scan(self) -> MsgPack | None:
        """Process the current batch up to the first pack it releases; None once the batch is used up."""
        vch = self._vchannel
        types = self._types
        min_ts = self._min_ts
        run = self._run
        # Plain runs between marks (see decode_block) can be taken as slices when nothing filters them.
        sliceable = vch is None and types is None
        batch = self._batch
        pos = self._batch_pos
        n = len(batch)
        marks = self._marks if sliceable else None
        while pos < n:
            if marks is not None:
                mi = self._mark_i
                while mi < len(marks) and marks[mi] < pos:
                    mi += 1
                self._mark_i = mi
                nxt = marks[mi] if mi < len(marks) and marks[mi] < n else n
                if nxt > pos:
                    first_ts = batch[pos]._timetick
                    if first_ts >= min_ts and (not run or run[-1]._timetick <= first_ts):
                        run.extend(batch[pos:nxt])
                        pos = nxt
                        continue
            msg = batch[pos]
            pos += 1
            t = msg._type
            if t is _TIME_TICK:
                self._batch_pos = pos
                if msg._id is not None:
                    self._cursor = msg._id + 1
                pack = self._release(msg._timetick)
                if pack is not None:
                    return pack
                run = self._run
                continue
            if vch is not None and msg._vchannel not in (vch, BROADCAST_VCHANNEL):
                continue
            if msg._txn is not None or t in _TXN_FRAMING:
                self._on_txn(msg)
                continue
            ts = msg._timetick
            if ts < min_ts or (types is not None and t not in types and not t.is_system):
                continue
            if not run or run[-1]._timetick <= ts:
                run.append(msg)
            else:
                heapq.heappush(self._heap, (ts, cast(MessageID, msg._id), msg))
        self._batch_pos = pos
        if n:
            self._cursor = self._fetch_id
        return None

    def _on_txn(self, msg: Message) -> None:
        txn = msg._txn
        if txn is None:
            return  # framing without a context cannot be matched to anything
        t = msg._type
        tid = txn.txn_id
        if t is _BEGIN:
            self._txns[tid] = _OpenTxn(msg, txn.keepalive_ms)
            return
        open_txn = self._txns.get(tid)
        if open_txn is None:
            return  # began before this scanner started: deliver it whole or not at all -> not at all
        if t is _ROLLBACK:
            del self._txns[tid]
        elif t is _COMMIT:
            del self._txns[tid]
            open_txn.messages.append(msg)
            if msg._timetick >= self._min_ts:
                heapq.heappush(self._heap, (msg._timetick, open_txn.begin_id, open_txn.messages))
        else:
            open_txn.last_ts = max(open_txn.last_ts, msg._timetick)  # bodies may land out of ts order
            types = self._types
            if types is None or t in types:
                open_txn.messages.append(msg)

    def _release(self, tick_ts: int) -> MsgPack | None:
        """Everything waiting with ts <= tick_ts, as one pack; None if the pack is filtered out."""
        run = self._run
        if run and run[-1]._timetick <= tick_ts:
            out, self._run = run, []
        elif run:
            cut = bisect.bisect_right(run, tick_ts, key=_ts)
            out = run[:cut]
            del run[:cut]
        else:
            out = []
        heap = self._heap
        if heap and heap[0][0] <= tick_ts:
            units: list[tuple[int, MessageID, Message | list[Message]]] = [(m._timetick, m._id, m) for m in out]  # type: ignore[misc]
            while heap and heap[0][0] <= tick_ts:
                units.append(heapq.heappop(heap))
            units.sort(key=lambda u: (u[0], u[1]))
            out = []
            for _, _, item in units:
                if isinstance(item, list):
                    out.extend(item)
                else:
                    out.append(item)
        if self._txns:
            self._expire(tick_ts)
        begin = self._last_tick
        if tick_ts > begin:
            self._last_tick = tick_ts
        start = self._position
        self._position = Position(self._wal.pchannel, self._resume_id(), self._last_tick)
        if tick_ts < self._min_ts and not out:
            return None
        return MsgPack(begin, tick_ts, out, start, self._position)

    def _expire(self, tick_ts: int) -> None:
        # The writer's rule (wal.clock.txn_expired): a reader drops exactly what the writer expired.
        expired = [tid for tid, t in self._txns.items() if txn_expired(t.keepalive_ms, t.last_ts, tick_ts)]
        for tid in expired:
            del self._txns[tid]

    def _resume_id(self) -> MessageID:
        """The smallest id whose message is not yet delivered (see Position)."""
        rid = self._cursor
        if self._run:
            rid = min(rid, cast(MessageID, self._run[0]._id))
        if self._heap:
            rid = min(rid, *(u[1] for u in self._heap))
        if self._txns:
            rid = min(rid, *(t.begin_id for t in self._txns.values()))
        return rid

    def _refill_from_memory(self) -> bool:
        """Load the next batch from the tail buffer, or the not-persisted tick; False if neither has it."""
        wal = self._wal
        nid = self._fetch_id
        if nid < wal.next_id:
            got = wal._tail.read(nid, _TAIL_READ)
            if not got:
                return False
            self.tailing = True
            self._marks = None
            self._mark_i = 0
            self._batch = got
            self._batch_pos = 0
            self._fetch_id = nid + len(got)
            return True
        volatile = wal._volatile_tick
        if volatile is not None and volatile[0] == nid and volatile[1]._timetick > self._last_tick:
            # Caught up exactly to where the not-persisted tick was made: it may release.
            self._marks = None
            self._batch = [volatile[1]]
            self._batch_pos = 0
            return True
        return False

    async def _refill(self) -> None:
        """Load the next batch: from the tail buffer when it has it, else from storage, else wait."""
        wal = self._wal
        while True:
            if self._closed:
                raise StopAsyncIteration
            if self._refill_from_memory():
                return
            nid = self._fetch_id
            if nid < wal.next_id:
                self.tailing = False
                self._marks = None
                self._mark_i = 0
                got = await self._read_storage(nid)
                self._batch = got
                self._batch_pos = 0
                self._fetch_id = nid + len(got)
                return
            err = wal._write_refusal() or wal._read_refusal()
            if err is not None:
                raise err
            self.caught_up = True
            await wal._wait_change(self.lazy)

    async def _read_storage(self, nid: MessageID) -> list[Message]:
        """Read and decode from storage, reading the following batch ahead on a reader thread."""
        wal = self._wal
        ahead = self._read_ahead
        self._read_ahead = None
        if ahead is not None and ahead[0] == nid:
            blocks = await ahead[1]
        else:
            if ahead is not None:
                ahead[1].cancel()
            blocks = await wal._read_storage(nid, self._opt.read_batch_bytes)
        if blocks:
            last_first, last_block, _ = blocks[-1]
            following = last_first + block_count(last_block)
            if nid <= last_first and following < wal.next_id:
                # Catching up: the next read runs while this batch is decoded and consumed.  At most
                # one batch ahead, so a scanner holds no more than two batches.
                fut = asyncio.ensure_future(wal._read_storage(following, self._opt.read_batch_bytes))
                fut.add_done_callback(_retrieve)
                self._read_ahead = (following, fut)
                # A task only starts when the loop runs it, and nothing below yields until this batch is
                # used up: without one pass of the loop here the read would begin only when awaited.
                await asyncio.sleep(0)
        marks: list[int] = []
        out = wal._decode_stored(nid, blocks, marks)
        self._marks = marks
        self._mark_i = 0
        return out

    @property
    def position(self) -> Position:
        """Where to resume to get exactly what this scanner has not delivered yet."""
        return self._position

    @property
    def backlog(self) -> int:
        """Messages written to the WAL that this scanner has not processed yet."""
        return max(self._wal.next_id - self._cursor, 0)

    async def aclose(self) -> None:
        """Stop; later iteration ends.  Idempotent."""
        if not self._closed:
            self._wal._reader_closed(self.lazy)
        self._closed = True
        self._wal.scanners.discard(self)
        if self._read_ahead is not None:
            self._read_ahead[1].cancel()
            self._read_ahead = None
        self._batch = []
        self._run = []
        self._heap = []
        self._txns = {}

    async def __aenter__(self) -> Scanner:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


__all__ = ["MsgPack", "Scanner"]
