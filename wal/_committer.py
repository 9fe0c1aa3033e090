"""Group commit: every append waiting while the previous write runs goes into the next one.

One committer per backend (so one RocksDB WriteBatch and one sync can carry many pchannels).  It owns
a queue of requests and a single writer thread.  Message ids are handed out on the event loop right
before a write, and handed back if the write fails, so ids stay dense.  A request's future resolves
only after its batch is on stable storage (in SYNC durability): an append is never acknowledged
before that.

The committer is three parts: this run loop (the queue, failures, holds and acknowledgements), the
planner ``wal._commit_plan`` (which requests a write takes, their ids, the write mode, the sealed
blocks; no I/O), and one strategy per write mode in ``wal._commit_modes``:

* pipelining (``syncer`` given, for backends whose sync runs without the GIL): the writer thread
  encodes and writes commit N+1 while a second thread fsyncs commit N.  Commits are acknowledged
  strictly in order, each after its own sync returned, and at most ``_MAX_IN_FLIGHT`` commits are
  outstanding (``Slots``).  A failed sync is fatal: nothing later is acknowledged and the WAL must be
  reopened (as databases treat a failed fsync);
* a backend that pipelines its own writes (``Backend.pipelined``: JetStream, whose store is a network
  round trip) is given each commit with ``start_write`` and acknowledged once that commit's own store
  is confirmed.  There a failure is not fatal: it is one pchannel's, whose appends of that commit and
  of every later commit in flight fail and get their ids back, while the other pchannels' appends are
  acknowledged;
* a lone small append (nothing else queued, no sync in flight, nothing else on the writer thread)
  gains nothing from either thread: it is written and synced on the event loop itself, as long as
  such writes stay fast (a moving average of their duration under ``_INLINE_MAX_SECONDS``), or fast
  enough (``_INLINE_IDLE_MAX_SECONDS``) when no other append came while the loop ran everything that
  was ready.  Two thread hand-offs cost more CPU and latency than a fast fsync; a slow disk would
  block the loop, so there the writer thread takes them again.

When the run task is parked (idle), ``submit`` does not wake it for a lone small append: it yields to
the callbacks ready on the loop (``loop.call_soon`` runs after every callback already scheduled) and
then, if that append is still the only one queued, writes it in that callback, without a wake-up of
the run task.  Appends of tasks that ran meanwhile wake the run task instead, and share a write.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import TYPE_CHECKING

import structlog

from wal import _commit_plan as plan
from wal._commit_modes import InlineWrite, Slots, strategies
from wal._commit_plan import Commit, InFlight, Poisoned, Request
from wal.backend import Backend
from wal.errors import (
    ChannelFencedError,
    ErrorCode,
    OnShutdownError,
    StreamingError,
    UnrecoverableError,
)
from wal.message import Message, MessageType

if TYPE_CHECKING:
    from wal.wal import WAL

log = structlog.get_logger(__name__)

# Appended even while appends are refused (``refusal``): a TimeTick keeps consumers' time moving and a
# manual flush lets the flusher write out its buffers, which is how space is made; both are tiny.
_ALWAYS_TAKEN = frozenset({MessageType.TIME_TICK, MessageType.MANUAL_FLUSH})
_MAX_IN_FLIGHT = 2
# Lone writes run on the event loop while their moving average stays under this.  The writer thread
# costs two hand-offs (about 0.1 ms of CPU here); a fsync longer than this would stall the loop.
_INLINE_MAX_SECONDS = 0.0005
# ... and up to this when the loop ran everything ready and no other append came: blocking it then
# delays no append, and a host under load makes an fsync take 0.5-2 ms for which the hand-offs would
# buy nothing.
_INLINE_IDLE_MAX_SECONDS = 0.005
# A NATS stream leader election takes a few seconds: held writes are tried again from 20 ms, doubling
# to 1 s, for up to 10 s (the redo step's own budget) before their appends fail.
_HOLD_UNAVAILABLE_SECONDS = 10.0
_HOLD_FIRST_DELAY = 0.02
_HOLD_MAX_DELAY = 1.0
# A pipelined backend bounds each store's waits itself (JetStream: a retry window per block); past
# this the backend is taken to have stopped answering at all.
_STORE_TIMEOUT_SECONDS = 120.0


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
        self._queue: list[Request] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._fatal: StreamingError | None = None
        self._slots = Slots(_MAX_IN_FLIGHT)
        self._last_ack: asyncio.Task[None] | None = None
        self._lone_seconds = 0.0  # moving average of a lone write's duration (see _INLINE_MAX_SECONDS)
        self.inline_max_seconds = inline_max_seconds
        """Lone writes run on the event loop while their moving average stays at or under this (a
        setting, not a measurement: tests fix it so that the disk's speed decides nothing)."""
        self.inline_idle_max_seconds = inline_idle_max_seconds
        """The same limit when the loop ran everything ready and no other append came meanwhile."""
        self._parked = False  # the run task waits for work: no write in progress anywhere
        self._lone_pending = False  # submit's deferred lone write (``_lone_after_ready``) is scheduled
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
        self._in_flight: list[InFlight] = []
        """Pipelined writes started and not yet acknowledged or failed, oldest first."""
        self.store_timeout = _STORE_TIMEOUT_SECONDS
        """How long a pipelined write may wait for its store's answer before its appends fail (a
        backend bounds its own waits; this is the net for one that stopped answering at all)."""
        self._modes = strategies(self)
        self._inline = InlineWrite(self)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="wal-group-commit")
        self._task.add_done_callback(self._on_task_done)

    def submit(self, wal: WAL, messages: list[Message], nbytes: int) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
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
        self._queue.append(Request(wal, messages, nbytes, fut))
        if self._lone_pending:
            return fut  # the deferred lone write finds this one queued too, and wakes the run task
        if (self._parked and len(self._queue) == 1 and nbytes <= plan.LONE_BYTES and not self._pipelined
                and not self._held and self._ack_settled() and self._inline_ok(idle=True)):
            # Not written here: appends of other tasks ready on the loop right now would each take a
            # write and a sync of their own.  The callback runs after all of them (call_soon keeps
            # the order callbacks were scheduled in); what they append joins this one.
            self._lone_pending = True
            loop.call_soon(self._lone_after_ready)
            return fut
        self._wake.set()
        return fut

    def _ack_settled(self) -> bool:
        """No acknowledgement of an earlier write is pending (a sync or a store in flight)."""
        return self._last_ack is None or self._last_ack.done()

    def _inline_ok(self, idle: bool) -> bool:
        """Whether a lone write may run on the loop: it has been fast, or fast enough while no other
        append is waiting for the loop (``idle``: see ``_INLINE_IDLE_MAX_SECONDS``), and nothing runs
        on the writer thread."""
        if self.writer_jobs:
            return False
        avg = self._lone_seconds
        return avg <= self.inline_max_seconds or (idle and avg <= self.inline_idle_max_seconds)

    def _lone_after_ready(self) -> None:
        """``submit``'s lone append, after the loop ran every callback that was ready then: still the
        only one queued, with the run task parked, it is written here (its caller's future is done
        without a wake-up of the run task); otherwise the run task groups what is queued."""
        self._lone_pending = False
        if not self._queue:
            return
        if not (self._parked and len(self._queue) == 1 and not self._held and self._ack_settled()
                and not self._closing and self._fatal is None and self._inline_ok(idle=True)):
            self._wake.set()
            return
        reqs = self._take()
        if not reqs:
            return
        try:
            self._inline.now(reqs)
        except Poisoned as exc:
            self._isolate(reqs, exc.errors)
            self._wake.set()
        except BaseException as exc:
            if self._hold(reqs, exc):
                self._wake.set()  # the run task writes it again (the first retry without a pause)
                return
            self._fail(reqs, exc)
            if not isinstance(exc, Exception):
                raise

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
        while True:
            if not self._queue or self._lone_pending:
                if self._closing and not self._queue:
                    return
                self._wake.clear()
                self._parked = True
                try:
                    await self._wake.wait()
                finally:
                    self._parked = False
                continue
            slot = await self._slots.acquire()
            try:
                if await self._maybe_idle_lone():
                    continue
                reqs = self._take()
                if not reqs:
                    continue
                lone = plan.is_lone(reqs, len(self._queue), not self._ack_settled())
                mode = plan.choose_mode(lone=lone, inline_ok=lone and self._inline_ok(idle=False),
                                        pipelined=self._pipelined, split_sync=self._syncer is not None)
                try:
                    await self._modes[mode].write(reqs, slot)
                except Poisoned as exc:
                    slot.release()
                    self._isolate(reqs, exc.errors)
                except BaseException as exc:
                    slot.release()
                    if self._hold(reqs, exc):
                        await asyncio.sleep(self._hold_delay)
                        continue
                    self._fail(reqs, exc)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
            finally:
                slot.release()  # a no-op for a slot handed to the write's acknowledging task

    async def _maybe_idle_lone(self) -> bool:
        """For a lone small append that the disk's recent speed keeps off the loop, unless nothing
        else wants the loop: yield once to every ready callback, and write it on the loop if no other
        append arrived meanwhile.  True when it was written (or failed) here."""
        queue = self._queue
        if (len(queue) != 1 or self._held or queue[0].nbytes > plan.LONE_BYTES or self._pipelined
                or not self._ack_settled() or self._inline_ok(idle=False) or not self._inline_ok(idle=True)):
            return False
        await asyncio.sleep(0)
        if len(self._queue) != 1 or not self._inline_ok(idle=True) or not self._ack_settled():
            return False
        reqs = self._take()
        if not reqs:
            return True
        try:
            self._inline.now(reqs)
        except Poisoned as exc:
            self._isolate(reqs, exc.errors)
        except BaseException as exc:
            if not self._hold(reqs, exc):
                self._fail(reqs, exc)
                if not isinstance(exc, Exception):
                    raise
        return True

    def _written(self) -> None:
        """A write went out (strategies call it before acknowledging or handing off)."""
        self._unavailable_since = None
        self.commits += 1

    def _fail_stored(self, bad: list[Request], failed: dict[int, BaseException]) -> None:
        """Fail the appends of a pipelined write whose pchannel's store failed (``plan.prune_failed``
        chose them and gave their ids back)."""
        for r in bad:
            if not r.future.done():
                r.future.set_exception(_store_error(failed[r.wal._channel_key], r.wal.pchannel))

    def _ack(self, reqs: list[Request], commits: list[Commit]) -> None:
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

    def _take(self) -> list[Request]:
        """Pop up to max_commit_bytes of requests (at least one) and hand out their ids."""
        held, self._held = self._held, 0
        taken, self._queue = plan.take(self._queue, held, self._max_commit_bytes)
        reqs, refused = plan.assign_ids(taken, bool(held))
        for req, err in refused:
            req.future.set_exception(err)
        return reqs

    def _hold(self, reqs: list[Request], exc: BaseException) -> bool:
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
            self._fail_queued_behind(reqs, exc)
            return False
        else:
            self._hold_delay = min(self._hold_delay * 2, _HOLD_MAX_DELAY)
        plan.give_back(reqs)
        self._queue[:0] = reqs
        self._held = len(reqs)
        self.held_writes += 1
        log.warning("wal write held: the backend is unavailable for now; written again in order",
                    requests=len(reqs), retry_in_seconds=self._hold_delay, error=str(exc)[:300])
        return True

    def _fail_queued_behind(self, given_up: list[Request], exc: StreamingError) -> None:
        """Fail, with ``exc``, every queued append of a pchannel whose held write is being given up:
        written once the backend is back, they would be stored after an append of theirs that failed,
        and a producer's pipelined batches would land out of order, with a gap.  Other pchannels'
        appends stay queued (each is held in its own turn)."""
        wals = {id(r.wal) for r in given_up}
        behind = [r for r in self._queue if id(r.wal) in wals]
        if not behind:
            return
        self._queue = [r for r in self._queue if id(r.wal) not in wals]
        for req in behind:
            if not req.future.done():
                req.future.set_exception(exc)
        log.warning("wal write given up: the appends queued behind it fail too, so none overtakes it",
                    requests=len(behind), error=str(exc)[:300])

    def _fail(self, reqs: list[Request], exc: BaseException) -> None:
        plan.give_back(reqs)
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

    def _isolate(self, reqs: list[Request], errors: dict[int, StreamingError]) -> None:
        """Nothing was written: fail the requests that cannot be encoded, and queue the others again,
        first, to be written as the next commit with ids handed out anew (so ids stay dense)."""
        plan.give_back(reqs)
        again: list[Request] = []
        for i, req in enumerate(reqs):
            err = errors.get(i)
            if err is None:
                again.append(req)
            elif not req.future.done():
                req.future.set_exception(err)
        self._queue[:0] = again

    # --- run by the strategies, on the writer thread (or on the loop for a lone append) ----------
    def _start(
        self, reqs: list[Request],
    ) -> tuple[list[Commit], concurrent.futures.Future[dict[int, BaseException]]]:
        """Seal and encode one batch and start its write (pipelined backends), on the writer thread."""
        commits, groups = plan.seal_checked(reqs)
        return commits, self._backend.start_write(groups)

    def _write_lone(self, reqs: list[Request]) -> list[Commit]:
        """Write and sync a lone append; keep the moving average of how long that takes."""
        started = time.perf_counter()
        commits = self._write(reqs, self._durable)
        self._lone_seconds += (time.perf_counter() - started - self._lone_seconds) / 8
        return commits

    def _write(self, reqs: list[Request], durable: bool) -> list[Commit]:
        """Seal, encode and write one batch for every request: on the writer thread, or on the loop
        for a lone append (never both at once: the committer awaits each write before the next)."""
        commits, groups = plan.seal_checked(reqs)
        self._backend.write(groups, durable)
        return commits


def _store_error(exc: BaseException, pchannel: str) -> StreamingError:
    """What an append whose pipelined store failed fails with."""
    if not isinstance(exc, StreamingError):
        return UnrecoverableError(f"WAL write failed: {exc!r}", channel=pchannel)
    if exc.code is ErrorCode.UNAVAILABLE and exc.held_seconds is None:
        # The backend already asked again for as long as its window allows (a NATS election): the
        # redo step must not retry these appends one by one, out of order with the rest of the write.
        exc.held_seconds = 0.0
    return exc


def fenced_error(wal: WAL) -> ChannelFencedError:
    return ChannelFencedError(
        f"pchannel {wal.pchannel!r} term {wal.term} is fenced by a newer owner",
        channel=wal.pchannel, term=wal.term,
    )

