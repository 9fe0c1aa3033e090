"""Group commit: every append waiting while the previous write runs goes into the next one.

One committer per backend (so one RocksDB WriteBatch and one sync can carry many pchannels).  It owns
a queue of requests and a single writer thread.  Message ids are handed out on the event loop right
before a write, and handed back if the write fails, so ids stay dense.  A request's future resolves
only after its batch is on stable storage (in SYNC durability): an append is never acknowledged
before that.

Pipelining (``syncer`` given, for backends whose sync runs without the GIL): the writer thread encodes
and writes commit N+1 while a second thread fsyncs commit N.  Commits are acknowledged strictly in
order, each after its own sync returned, and at most ``_MAX_IN_FLIGHT`` commits are outstanding.  A
failed sync is fatal: the written-but-unsynced data may or may not survive, so nothing later is
acknowledged and the WAL must be reopened (as databases treat a failed fsync).

A backend that pipelines its own writes (``Backend.pipelined``: JetStream, whose store is a network
round trip) is given each commit with ``start_write`` and acknowledged once that commit's own store is
confirmed, so commit N+1 is encoded and queued while N's round trip runs.  There a failure is not
fatal: it is one pchannel's, whose appends of that commit and of every later commit in flight fail
and get their ids back (the backend sends none of those later writes), while the other pchannels'
appends are acknowledged.

A lone small append (nothing else queued, no sync in flight, nothing else on the writer thread) gains
nothing from either thread: it is written and synced on the event loop itself, as long as such writes
stay fast (a moving average of their duration under ``_INLINE_MAX_SECONDS``), or fast enough
(``_INLINE_IDLE_MAX_SECONDS``) while nothing else is ready to run on the loop (blocking it then
delays nobody).  Two thread hand-offs cost more CPU and latency than a fast fsync; a slow disk would
block the loop, so there the writer thread takes them again.  When the run task is parked (idle) and
the loop has nothing else ready, ``submit`` writes such an append itself: the caller's ``await``
then finds its future done, without a wake-up of the run task and the loop turns around it.  Appends
of several tasks ready at once still go through the queue, and share a write.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import TYPE_CHECKING

import structlog

from wal._codec import encode_block
from wal._record import check_encodable
from wal.backend import Backend, TickEntry, WriteGroup
from wal.errors import (
    ChannelFencedError,
    CodecError,
    ErrorCode,
    InvalidArgumentError,
    OnShutdownError,
    StreamingError,
    UnrecoverableError,
)
from wal.message import Message, MessageID, MessageType

if TYPE_CHECKING:
    from wal.wal import WAL

log = structlog.get_logger(__name__)

_TIME_TICK = MessageType.TIME_TICK
# Appended even while appends are refused (``refusal``): a TimeTick keeps consumers' time moving and a
# manual flush lets the flusher write out its buffers, which is how space is made; both are tiny.
_ALWAYS_TAKEN = frozenset({MessageType.TIME_TICK, MessageType.MANUAL_FLUSH})
_BLOCK_TARGET_BYTES = 1 << 20
_MAX_IN_FLIGHT = 2
_LONE_BYTES = 64 << 10
# Lone writes run on the event loop while their moving average stays under this.  The writer thread
# costs two hand-offs (about 0.1 ms of CPU here); a fsync longer than this would stall the loop.
_INLINE_MAX_SECONDS = 0.0005
# ... and up to this while nothing else is ready to run on the loop: blocking it then delays nobody,
# and a host under load makes an fsync take 0.5-2 ms for which the hand-offs would buy nothing.
_INLINE_IDLE_MAX_SECONDS = 0.005
# "Nothing else": at most this many callbacks ready in the loop's queue (the caller's own wake-ups).
_IDLE_READY_CALLBACKS = 1
# A NATS stream leader election takes a few seconds: held writes are tried again from 20 ms, doubling
# to 1 s, for up to 10 s (the redo step's own budget) before their appends fail.
_HOLD_UNAVAILABLE_SECONDS = 10.0
_HOLD_FIRST_DELAY = 0.02
_HOLD_MAX_DELAY = 1.0
# A pipelined backend bounds each store's waits itself (JetStream: a retry window per block); past
# this the backend is taken to have stopped answering at all.
_STORE_TIMEOUT_SECONDS = 120.0


class _Request:
    __slots__ = ("first_id", "future", "messages", "nbytes", "wal")

    def __init__(self, wal: WAL, messages: list[Message], nbytes: int, future: asyncio.Future[None]) -> None:
        self.wal = wal
        self.messages = messages
        self.nbytes = nbytes
        self.future = future
        self.first_id: MessageID = 0


class _InFlight:
    """A pipelined write whose store is not confirmed yet: its requests and commits, both pruned of
    the pchannels whose store failed (``_fail_stored``)."""

    __slots__ = ("commits", "reqs")

    def __init__(self, reqs: list[_Request], commits: list[_Commit]) -> None:
        self.reqs = reqs
        self.commits = commits


class _Commit:
    """What one write produced for one WAL: consecutive ids, for the tail buffer."""

    __slots__ = ("first_id", "max_timetick", "messages", "nbytes", "ticked", "wal")

    def __init__(self, wal: WAL, first_id: MessageID, max_timetick: int) -> None:
        self.wal = wal
        self.first_id = first_id
        self.messages: list[Message] = []
        self.nbytes = 0
        self.max_timetick = max_timetick
        self.ticked = False  # holds a TimeTick (set with the write group, on the writer thread)


class GroupCommitter:
    def __init__(
        self,
        backend: Backend,
        executor: concurrent.futures.ThreadPoolExecutor,
        *,
        durable: bool,
        max_commit_bytes: int,
        syncer: concurrent.futures.ThreadPoolExecutor | None = None,
        inline_max_seconds: float = _INLINE_MAX_SECONDS,
        inline_idle_max_seconds: float = _INLINE_IDLE_MAX_SECONDS,
    ) -> None:
        self._backend = backend
        self._executor = executor
        self._durable = durable
        self._syncer = syncer if durable else None
        self._max_commit_bytes = max_commit_bytes
        self._queue: list[_Request] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._fatal: StreamingError | None = None
        self._slots = asyncio.Semaphore(_MAX_IN_FLIGHT)
        self._last_ack: asyncio.Task[None] | None = None
        self._lone_seconds = 0.0  # moving average of a lone write's duration (see _INLINE_MAX_SECONDS)
        self.inline_max_seconds = inline_max_seconds
        """Lone writes run on the event loop while their moving average stays at or under this (a
        setting, not a measurement: tests fix it so that the disk's speed decides nothing)."""
        self.inline_idle_max_seconds = inline_idle_max_seconds
        """The same limit while the loop has nothing else ready to run (``_loop_idle``)."""
        self._parked = False  # the run task waits for work: no write in progress anywhere
        self.writer_jobs = 0
        """Other work the manager runs on the writer thread right now: no write on the loop meanwhile."""
        self.commits = 0
        """Number of writes issued (for tests and metrics: requests / commits = coalescing factor)."""
        self.refusal: StreamingError | None = None
        """While set, every append but TimeTicks and manual flushes fails at once with a copy of it
        (the node's storage monitor sets it while free space is under its low-water mark)."""
        self.refused = 0
        """Appends (batches) refused because of ``refusal``."""
        self.hold_unavailable_seconds = _HOLD_UNAVAILABLE_SECONDS
        """How long a write the backend answers UNAVAILABLE is held and tried again (``_hold``)."""
        self.held_writes = 0
        """Writes put back after an UNAVAILABLE answer (for tests and metrics)."""
        self._unavailable_since: float | None = None
        self._hold_delay = _HOLD_FIRST_DELAY
        self._held = 0
        """How many requests at the front of the queue are a held write, to be taken exactly."""
        self._pipelined = backend.pipelined
        self._in_flight: list[_InFlight] = []
        """Pipelined writes started and not yet acknowledged or failed, oldest first."""
        self.store_timeout = _STORE_TIMEOUT_SECONDS
        """How long a pipelined write may wait for its store's answer before its appends fail (a
        backend bounds its own waits; this is the net for one that stopped answering at all)."""

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="wal-group-commit")
        self._task.add_done_callback(self._on_task_done)

    def submit(self, wal: WAL, messages: list[Message], nbytes: int) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._fatal is not None:
            fut.set_exception(self._fatal)
            return fut
        refusal = self.refusal
        if refusal is not None and any(m._type not in _ALWAYS_TAKEN for m in messages):
            self.refused += 1
            fut.set_exception(type(refusal)(str(refusal), code=refusal.code, channel=wal.pchannel, **refusal.fields))
            return fut
        if self._closing or self._task is None or self._task.done():
            fut.set_exception(OnShutdownError("WAL is shutting down", channel=wal.pchannel))
            return fut
        self._queue.append(_Request(wal, messages, nbytes, fut))
        if (self._parked and len(self._queue) == 1 and nbytes <= _LONE_BYTES and not self._pipelined
                and not self._held and (self._last_ack is None or self._last_ack.done()) and _loop_idle()
                and self._inline_ok()):
            # Only while nothing else is ready on the loop: appends of other tasks about to run would
            # each take a write and a sync of their own here, where the run task groups them.
            self._write_now()
            return fut
        self._wake.set()
        return fut

    def _inline_ok(self) -> bool:
        """Whether a lone write may run on the loop: it has been fast, or fast enough while the loop
        has nothing else to run (see ``_INLINE_IDLE_MAX_SECONDS``), and nothing runs on the writer
        thread."""
        if self.writer_jobs:
            return False
        avg = self._lone_seconds
        return avg <= self.inline_max_seconds or (avg <= self.inline_idle_max_seconds and _loop_idle())

    def _write_now(self) -> None:
        """Write the one queued request here, in the caller's own turn of the loop, while the run task
        is parked: its future is done when ``submit`` returns, so the caller's ``await`` does not
        yield, and no wake-up of the run task is spent on it.  Failures end as in ``_run``."""
        reqs = self._take()
        if not reqs:
            return
        try:
            commits = self._write_lone(reqs)
        except _Poisoned as exc:
            self._isolate(reqs, exc.errors)
            self._wake.set()
            return
        except BaseException as exc:
            if self._hold(reqs, exc):
                self._wake.set()  # the run task writes it again (the first retry without a pause)
                return
            self._fail(reqs, exc)
            if not isinstance(exc, Exception):
                raise
            return
        self._unavailable_since = None
        self.commits += 1
        self._ack(reqs, commits)

    async def aclose(self) -> None:
        """Write everything already queued, then stop.  Idempotent."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await asyncio.shield(self._task)
        if self._last_ack is not None:
            await asyncio.shield(self._last_ack)

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        # If the loop dies for any reason, nobody may wait forever on a queued append.
        exc = None if task.cancelled() else task.exception()
        err: StreamingError = (
            UnrecoverableError(f"group commit stopped: {exc!r}") if exc else OnShutdownError("WAL is closed")
        )
        for req in self._queue:
            if not req.future.done():
                req.future.set_exception(err)
        self._queue.clear()
        if exc is not None:
            log.error("group commit task died", error=repr(exc))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                if self._closing:
                    return
                self._wake.clear()
                self._parked = True
                try:
                    await self._wake.wait()
                finally:
                    self._parked = False
                continue
            await self._slots.acquire()
            reqs = self._take()
            if not reqs:
                self._slots.release()
                continue
            # A lone small append (nothing else queued, no sync in flight) gains nothing from the
            # pipeline: it is written and synced in one go, on the loop while that stays fast (see
            # the module's docstring), else on the writer thread.
            lone = (len(reqs) == 1 and not self._queue and reqs[0].nbytes <= _LONE_BYTES
                    and (self._last_ack is None or self._last_ack.done()))
            split = self._syncer is not None and not lone
            try:
                if lone and self._lone_seconds <= self.inline_max_seconds and not self.writer_jobs:
                    commits = self._write_lone(reqs)
                elif lone and not self._inline_ok():
                    commits = await loop.run_in_executor(self._executor, self._write_lone, reqs)
                elif lone:  # slower than the limit, but nothing else is ready to run on the loop
                    commits = self._write_lone(reqs)
                elif self._pipelined:
                    commits, stored = await loop.run_in_executor(self._executor, self._start, reqs)
                    self._unavailable_since = None
                    self.commits += 1
                    entry = _InFlight(reqs, commits)
                    self._in_flight.append(entry)
                    self._last_ack = loop.create_task(self._ack_after_store(stored, self._last_ack, entry))
                    continue
                else:
                    commits = await loop.run_in_executor(self._executor, self._write, reqs, self._durable and not split)
            except _Poisoned as exc:
                self._slots.release()
                self._isolate(reqs, exc.errors)
                continue
            except BaseException as exc:
                self._slots.release()
                if self._hold(reqs, exc):
                    await asyncio.sleep(self._hold_delay)
                    continue
                self._fail(reqs, exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            self._unavailable_since = None
            self.commits += 1
            if not split:
                self._ack(reqs, commits)
                self._slots.release()
            else:
                synced = loop.run_in_executor(self._syncer, self._backend.sync)
                self._last_ack = loop.create_task(self._ack_after_sync(synced, self._last_ack, reqs, commits))

    async def _ack_after_sync(
        self, synced: asyncio.Future[None], previous: asyncio.Task[None] | None,
        reqs: list[_Request], commits: list[_Commit],
    ) -> None:
        try:
            if previous is not None:
                await asyncio.wait([previous])  # acknowledge in commit order
            try:
                await synced
            except Exception as exc:
                self._fatal = UnrecoverableError(f"WAL sync failed, reopen the WAL: {exc!r}")
                log.exception("wal sync failed")
            if self._fatal is not None:
                for req in reqs:
                    if not req.future.done():
                        req.future.set_exception(self._fatal)
                return
            self._ack(reqs, commits)
        finally:
            self._slots.release()

    async def _ack_after_store(
        self, stored: concurrent.futures.Future[dict[int, BaseException]], previous: asyncio.Task[None] | None,
        entry: _InFlight,
    ) -> None:
        """Acknowledge a pipelined write once its store is confirmed, in commit order; fail the
        appends of the pchannels whose store failed (see the module docstring)."""
        try:
            if previous is not None:
                await asyncio.wait([previous])  # acknowledge in commit order
            failed: dict[int, BaseException]
            try:
                failed = await asyncio.wait_for(asyncio.wrap_future(stored), self.store_timeout)
            except Exception as exc:  # noqa: BLE001  (the store as a whole failed, for every pchannel of it)
                err: BaseException = exc
                if isinstance(exc, TimeoutError):
                    err = UnrecoverableError(f"the WAL backend did not answer a write in {self.store_timeout:.0f} s")
                failed = {c.wal._channel_key: err for c in entry.commits}
            if self._fatal is not None:
                failed = {c.wal._channel_key: self._fatal for c in entry.commits}
            if failed:
                self._fail_stored(entry, failed)
            self._in_flight.remove(entry)
            self._ack(entry.reqs, entry.commits)
        except asyncio.CancelledError:
            if entry in self._in_flight:
                self._in_flight.remove(entry)
            self._fail(entry.reqs, asyncio.CancelledError())
            raise
        finally:
            self._slots.release()

    def _fail_stored(self, entry: _InFlight, failed: dict[int, BaseException]) -> None:
        """Fail the appends of ``entry`` whose pchannel's store failed, and those of the same
        pchannels in every later write in flight: the backend sends none of those (each would follow
        a block that is not stored), and their ids are handed back now, once, from the oldest, before
        any new write of those pchannels takes ids.  A pchannel already pruned from ``entry`` (as a
        consequence of an earlier failure) is skipped: a write of it started after that one was handed
        its ids back again, and stands on its own."""
        keys = {r.wal._channel_key for r in entry.reqs if r.wal._channel_key in failed}
        for later in self._in_flight[self._in_flight.index(entry):]:
            bad = [r for r in later.reqs if r.wal._channel_key in keys]
            if not bad:
                continue
            later.reqs = [r for r in later.reqs if r.wal._channel_key not in keys]
            later.commits = [c for c in later.commits if c.wal._channel_key not in keys]
            if later is entry:
                _give_back(bad)
            else:
                for r in bad:  # ids after the ones handed back above: nothing to give back again
                    for m in r.messages:
                        m._id = None
            for r in bad:
                if not r.future.done():
                    r.future.set_exception(_store_error(failed[r.wal._channel_key], r.wal.pchannel))

    def _ack(self, reqs: list[_Request], commits: list[_Commit]) -> None:
        try:
            for c in commits:
                c.wal._on_committed(c.first_id, c.messages, c.nbytes, c.max_timetick, c.ticked)
        except Exception as exc:
            # Should never happen; but an appender must never be left waiting on a lost future, and
            # the in-memory state no longer matches storage: refuse every later append until reopen.
            log.exception("publishing a commit failed")
            self._fatal = UnrecoverableError(f"publishing a commit failed, reopen the WAL: {exc!r}")
            for req in reqs:
                if not req.future.done():
                    req.future.set_exception(self._fatal)
            return
        for req in reqs:
            if not req.future.done():
                req.future.set_result(None)

    def _take(self) -> list[_Request]:
        """Pop up to max_commit_bytes of requests (at least one) and hand out their ids."""
        queue = self._queue
        held, self._held = self._held, 0
        if held:
            # A held write (``_hold``) goes out again exactly as it was: the same requests, so the same
            # ids and blocks.  A backend that could not tell whether the refused attempt landed
            # (JetStream, after a lost answer) recognises a stored block by its bytes; merged with
            # newer appends it would look like another writer's.  A caller that gave up meanwhile is
            # written too, for the same reason (its append's fate was unknown to it anyway).
            n = min(held, len(queue))
        else:
            total = 0
            n = 0
            while n < len(queue) and (n == 0 or total + queue[n].nbytes <= self._max_commit_bytes):
                total += queue[n].nbytes
                n += 1
        taken, self._queue = queue[:n], queue[n:]
        reqs: list[_Request] = []
        for req in taken:
            if req.future.done() and not held:  # the caller was cancelled before the write: skip it
                continue
            wal = req.wal
            err = wal._write_refusal()
            if err is not None:
                req.future.set_exception(err)
                continue
            req.first_id = wal._next_alloc
            wal._next_alloc += len(req.messages)
            reqs.append(req)
        return reqs

    def _hold(self, reqs: list[_Request], exc: BaseException) -> bool:
        """True when a write the backend could not do *for now* (UNAVAILABLE: a NATS leader election,
        a connection being re-established) is to be written again: its requests go back to the front
        of the queue, ids handed back, and the loop writes them after a pause, ahead of everything
        queued behind them.  An append is then never overtaken by a later one of its pchannel, which
        retrying each failed append on its own (the redo step) could not promise: a producer's
        pipelined batches would land out of order.  Held for at most ``hold_unavailable_seconds``, and
        never while closing; then the requests fail as any failed write does."""
        if not (isinstance(exc, StreamingError) and exc.code is ErrorCode.UNAVAILABLE) or self._closing:
            return False
        now = time.monotonic()
        if self._unavailable_since is None:
            self._unavailable_since, self._hold_delay = now, _HOLD_FIRST_DELAY
        elif now - self._unavailable_since >= self.hold_unavailable_seconds:
            # Marked, so that the redo step does not try these appends again one by one (out of order).
            if exc.held_seconds is None:
                exc.held_seconds = round(now - self._unavailable_since, 1)
            self._unavailable_since = None
            return False
        else:
            self._hold_delay = min(self._hold_delay * 2, _HOLD_MAX_DELAY)
        _give_back(reqs)
        self._queue[:0] = reqs
        self._held = len(reqs)
        self.held_writes += 1
        log.warning("wal write held: the backend is unavailable for now; written again in order",
                    requests=len(reqs), retry_in_seconds=self._hold_delay, error=str(exc)[:300])
        return True

    def _fail(self, reqs: list[_Request], exc: BaseException) -> None:
        _give_back(reqs)
        err: BaseException
        if isinstance(exc, StreamingError):
            err = exc
        elif isinstance(exc, asyncio.CancelledError):
            err = OnShutdownError("WAL write cancelled by shutdown")
        else:
            err = UnrecoverableError(f"WAL write failed: {exc!r}")
        for req in reqs:
            if not req.future.done():
                req.future.set_exception(err)

    def _isolate(self, reqs: list[_Request], errors: dict[int, StreamingError]) -> None:
        """Nothing was written: fail the requests that cannot be encoded, and queue the others again,
        first, to be written as the next commit with ids handed out anew (so ids stay dense)."""
        _give_back(reqs)
        again: list[_Request] = []
        for i, req in enumerate(reqs):
            err = errors.get(i)
            if err is None:
                again.append(req)
            elif not req.future.done():
                req.future.set_exception(err)
        self._queue[:0] = again

    def _start(
        self, reqs: list[_Request],
    ) -> tuple[list[_Commit], concurrent.futures.Future[dict[int, BaseException]]]:
        """Seal and encode one batch and start its write (pipelined backends), on the writer thread."""
        commits, groups = self._encode_checked(reqs)
        return commits, self._backend.start_write(groups)

    def _write_lone(self, reqs: list[_Request]) -> list[_Commit]:
        """Write and sync a lone append; keep the moving average of how long that takes."""
        started = time.perf_counter()
        commits = self._write(reqs, self._durable)
        self._lone_seconds += (time.perf_counter() - started - self._lone_seconds) / 8
        return commits

    def _write(self, reqs: list[_Request], durable: bool) -> list[_Commit]:
        """Seal, encode and write one batch for every request: on the writer thread, or on the loop
        for a lone append (never both at once: the committer awaits each write before the next)."""
        commits, groups = self._encode_checked(reqs)
        self._backend.write(groups, durable)
        return commits

    def _encode_checked(self, reqs: list[_Request]) -> tuple[list[_Commit], list[WriteGroup]]:
        """``_encode``, with a request that cannot be encoded failing alone (``_Poisoned``)."""
        written_max_ts = {id(req.wal): (req.wal, req.wal._written_max_ts) for req in reqs}
        try:
            commits, groups = self._encode(reqs)
        except Exception as exc:
            # The appends' checks should keep every unencodable message out; should one get in anyway,
            # it fails alone instead of failing the commit of every pchannel it shares.
            for wal, ts in written_max_ts.values():
                wal._written_max_ts = ts
            errors = _unencodable(reqs)
            if not errors:
                raise
            raise _Poisoned(errors) from exc
        return commits, groups

    def _encode(self, reqs: list[_Request]) -> tuple[list[_Commit], list[WriteGroup]]:
        """Seal and encode: the commits for the tail buffer and the groups to write."""
        commits: list[_Commit] = []
        groups: list[WriteGroup] = []
        open_commit: dict[int, _Commit] = {}
        for req in reqs:
            wal = req.wal
            c = open_commit.get(id(wal))
            if c is None or c.nbytes >= _BLOCK_TARGET_BYTES:
                if c is not None:
                    groups.append(self._group(c))
                c = _Commit(wal, req.first_id, c.max_timetick if c is not None else wal._written_max_ts)
                open_commit[id(wal)] = c
                commits.append(c)
            term = wal.term
            mid = req.first_id
            max_ts = c.max_timetick
            for m in req.messages:
                m._id = mid
                m._term = term
                mid += 1
                if m._timetick > max_ts:  # noqa: PLR1730  (a comparison, not a call of max(), per message)
                    max_ts = m._timetick
            c.max_timetick = max_ts
            wal._written_max_ts = max_ts  # the writer only: with two commits in flight it runs ahead
            c.messages.extend(req.messages)
            c.nbytes += req.nbytes
        for c in open_commit.values():
            groups.append(self._group(c))
        return commits, groups

    @staticmethod
    def _group(c: _Commit) -> WriteGroup:
        ticks = [
            TickEntry(m._timetick, m._id, m._last_confirmed if m._last_confirmed is not None else m._id)
            for m in c.messages
            if m._type is _TIME_TICK and m._id is not None
        ]
        c.ticked = bool(ticks)
        return WriteGroup(c.wal._channel_key, c.first_id, encode_block(c.messages), ticks, c.max_timetick)


def _loop_idle() -> bool:
    """Whether the running loop has nothing else ready to run now (asyncio's ready queue; a loop
    without one counts as busy)."""
    ready = getattr(asyncio.get_running_loop(), "_ready", None)
    return ready is not None and len(ready) <= _IDLE_READY_CALLBACKS


def _store_error(exc: BaseException, pchannel: str) -> StreamingError:
    """What an append whose pipelined store failed fails with."""
    if not isinstance(exc, StreamingError):
        return UnrecoverableError(f"WAL write failed: {exc!r}", channel=pchannel)
    if exc.code is ErrorCode.UNAVAILABLE and exc.held_seconds is None:
        # The backend already asked again for as long as its window allows (a NATS election): the
        # redo step must not retry these appends one by one, out of order with the rest of the write.
        exc.held_seconds = 0.0
    return exc


def _give_back(reqs: list[_Request]) -> None:
    """The write is atomic and nothing of it was stored: give the ids back and unseal the messages."""
    for req in reversed(reqs):
        req.wal._next_alloc = min(req.wal._next_alloc, req.first_id)
        for m in req.messages:
            m._id = None


class _Poisoned(Exception):
    """A commit could not be encoded because of some of its requests (by index: the error each fails
    with); nothing was written."""

    def __init__(self, errors: dict[int, StreamingError]) -> None:
        super().__init__(f"{len(errors)} request(s) cannot be encoded")
        self.errors = errors


def _unencodable(reqs: list[_Request]) -> dict[int, StreamingError]:
    """The requests whose messages cannot be encoded alone, each with the most precise error known."""
    errors: dict[int, StreamingError] = {}
    for i, req in enumerate(reqs):
        try:
            encode_block(req.messages)
        except Exception as exc:  # noqa: BLE001  (whatever it is, it is this request's alone)
            err: StreamingError = CodecError(f"message cannot be encoded: {exc!r}")
            for j, m in enumerate(req.messages):
                try:
                    check_encodable(m, f"messages[{j}]")
                except InvalidArgumentError as precise:
                    err = precise
                    break
            errors[i] = err
    return errors


def fenced_error(wal: WAL) -> ChannelFencedError:
    return ChannelFencedError(
        f"pchannel {wal.pchannel!r} term {wal.term} is fenced by a newer owner",
        channel=wal.pchannel, term=wal.term,
    )
