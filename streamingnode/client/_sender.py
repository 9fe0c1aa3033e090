"""The producer's sender: the task that owns the Produce stream of one pchannel.

It opens a stream whenever the accumulator holds sealed batches, writes them while fewer than
``max_in_flight`` are unanswered (*in flight*), and matches the node's answers, which come in order,
to the batches in flight.  When the stream breaks for a reason a new stream cures, an idempotent
producer's batches in flight go back to the front of the queue with their sequences; without a
``producer_id`` their fate is unknown and they fail (see ``Producer``).  The open presents the
producer's epoch and learns the node's next sequence for the id (``Accumulator.number``).

An outage is timed from its first failure to the next batch answered: the producer keeps its
batches and keeps reopening (backing off) for ``reconnect_timeout`` seconds of it, however many
streams open and break meanwhile, and only then fails what it holds.  An idempotent producer's batch
answered in band with a transient error (the node could not write it now: UNAVAILABLE, REDO,
RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, ...) is part of the outage too.  It is *held back*: nothing
more is written on the stream, the batches already written are answered, and when every one of them
failed the same way, the stream is left and they are all resent, in order, on a new one after a
pause (the node's dedup answers any it stored after all with its first result).  When one of them
was written after all (the node's log came back under it), or may have been (answered
DEADLINE_EXCEEDED, or unanswered when the stream broke for a reason other than the node ending it),
the held batches can no longer be written before it: they fail with their error rather than land out
of order.  Without a ``producer_id`` such a batch fails at once: a resend might store it twice.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
from collections.abc import Callable
from typing import Any

import grpc

from streamingnode.client._accumulator import Accumulator, Batch
from streamingnode.client._calls import done_writing, open_stream, reconnectable, translate, with_reconnect, write
from streamingnode.client._routing import Route
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from streamingnode.wire.codes import from_error_detail
from wal.error_codes import Behaviour, codes_with
from wal.errors import StreamingError, UnavailableError
from wal.message import AppendResult
from wal.tasks import cancel_and_wait

# In-band batch errors that the node sends just before it ends the stream (the channel was reopened,
# or the node is stopping): nothing of the batch was written, and a new stream can take it.
_ENDS_STREAM = codes_with(Behaviour.RESEND_ON_NEW_STREAM)
# In-band batch errors that say "not now" (the node could not write the batch, or does not know
# whether it did): an idempotent producer resends the batch on a new stream after a pause, as part of
# the outage ``reconnect_timeout`` bounds.  Only codes a reopened stream acts on (RECONNECT): a code
# such as STORAGE_FULL, which the caller is meant to see, still fails its batch.
_RESEND_LATER = codes_with(Behaviour.RECONNECT) & (codes_with(Behaviour.RETRIABLE)
                                                   | codes_with(Behaviour.OUTCOME_UNKNOWN))

# In-band batch errors after which the batch may have been stored (its deadline ran out first).
_FATE_UNKNOWN = codes_with(Behaviour.OUTCOME_UNKNOWN)

RESEND_PAUSE_MIN = 0.05
RESEND_PAUSE_MAX = 1.0
"""Seconds between resends of a batch the node answered with a transient error: 50 ms doubling to 1 s
(the node was reachable: reopening at once would only ask it again before anything changed)."""


def _resolve(futures: list[asyncio.Future[AppendResult]], appended: spb.AppendResults) -> None:
    """Give each message's future its result; the node answers a column batch in column form."""
    ids, txn_ids = appended.ids, appended.txn_ids
    n = len(futures)
    if len(ids) != n or len(appended.timeticks) != n or len(txn_ids) not in (0, n):
        raise UnavailableError(f"the node answered a batch of {n} messages with {len(ids)} results")
    if len(txn_ids):
        for fut, mid, ts, txn_id in zip(futures, ids, appended.timeticks, txn_ids, strict=True):
            if not fut.done():
                fut.set_result(AppendResult(mid, ts, txn_id or None))
        return
    for fut, mid, ts in zip(futures, ids, appended.timeticks, strict=True):
        if not fut.done():
            fut.set_result(AppendResult(mid, ts, None))


class Sender:
    """The stream task of one producer over ``accumulator``'s sealed batches.

    ``fail_all(exc)`` fails everything the producer holds (in flight, sealed, open); it is called when
    the channel is gone, the node stayed away too long, or the task itself died.  ``closing`` is set by
    the producer's ``aclose``: the stream is then ended once nothing is left.
    """

    def __init__(
        self,
        accumulator: Accumulator,
        stub: sgrpc.StreamingNodeStub | Route,
        pchannel: str,
        producer_id: str | None,
        *,
        max_in_flight: int,
        reconnect_timeout: float,
        fail_all: Callable[[BaseException], None],
    ) -> None:
        self._acc = accumulator
        self._route = stub if isinstance(stub, Route) else None
        self._stub = stub
        self.pchannel = pchannel
        self.producer_id = producer_id
        self.max_in_flight = max_in_flight
        self._reconnect_timeout = reconnect_timeout
        self._fail_all = fail_all
        self._loop = asyncio.get_running_loop()
        self._request_ids = itertools.count(1)
        self.in_flight: collections.deque[Batch] = collections.deque()
        """Batches written and not answered yet, in the order the node answers them."""
        self.held: collections.deque[Batch] = collections.deque()
        """Batches the node answered with a transient error, in order, to be resent (before anything
        in flight) once every batch written before the answer is answered too (idempotent only)."""
        self._held_error: StreamingError | None = None
        self.wake = asyncio.Event()
        """The stream task: something to write, or a slot freed."""
        self.task: asyncio.Task[None] | None = None
        self.closing = False
        self.connected = False
        """A stream to an owner is open now."""
        self.term: int | None = None
        """The WAL term of the current stream (None before the first open)."""
        self.epoch: int | None = None
        """The producer's epoch, handed out by the node on the first open (None before it, and
        without a producer_id); presented again on every reconnect."""
        self.batches_written = 0
        """Batches written to a stream, resends included (for tests and metrics)."""
        self.largest_batch = 0
        """Messages in the largest batch written so far."""
        self.reconnects = 0
        """How many times the stream was opened again after a failure (for tests and metrics)."""
        self.outage_since: float | None = None
        """Loop time of the first failure since the last batch answered (None: no outage)."""
        self._outage_error: StreamingError | None = None
        self._resend_pause = 0.0
        """Seconds to wait before the next open: set after a batch answered with a transient error."""
        self._resend_pause_wanted = False

    def start(self) -> None:
        """Wake the stream task, starting it when none runs."""
        self.wake.set()
        if self.task is None or self.task.done():
            self.task = self._loop.create_task(self.run(), name=f"producer:{self.pchannel}")
            self.task.add_done_callback(self._on_task_done)

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        # The stream task ends only when there is nothing left, or by a bug: then no caller may wait
        # forever on a future it will never answer.
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self._fail_all(exc if isinstance(exc, StreamingError) else UnavailableError(
                f"producer on {self.pchannel!r} failed: {exc!r}", channel=self.pchannel))

    async def run(self) -> None:
        """Open a stream whenever there is work; keep it while the producer lives."""
        acc = self._acc
        # A stream that broke while nothing was held ended the last run: no outage to go on timing.
        self._outage_ended()
        while acc.sealed or self.in_flight or self.held:
            try:
                call = await self._reopen()
            except StreamingError as exc:
                self._outage_ended()
                self._fail_all(exc)  # the channel is gone, or the node stayed away too long
                continue
            self.connected = True
            try:
                await self._serve(call)
            except StreamingError as exc:
                self.stream_broke(exc)
            finally:
                self.connected = False
                acc.space.set()  # senders held by the in-flight bound may now buffer
                call.cancel()
            if self.closing and not (acc.sealed or self.in_flight or self.held):
                return

    async def _reopen(self) -> Any:
        """Open a stream, within what is left of ``reconnect_timeout`` when an outage is under way."""
        budget = self._reconnect_timeout
        if self.outage_since is not None:
            budget -= self._loop.time() - self.outage_since
            if self._resend_pause:
                pause = min(self._resend_pause, max(budget, 0.0))
                await asyncio.sleep(pause)
                budget -= pause
            if budget <= 0 and self._outage_error is not None:
                raise self._outage_error  # the node kept failing the batches for reconnect_timeout
        return await with_reconnect(self._open, max(budget, 0.0))

    def _outage(self, exc: StreamingError, *, pause: bool) -> None:
        """A failure a new stream may cure: the outage starts now (unless under way)."""
        if self.outage_since is None:
            self.outage_since = self._loop.time()
        self._outage_error = exc
        if pause:
            self._resend_pause = min(max(self._resend_pause * 2, RESEND_PAUSE_MIN), RESEND_PAUSE_MAX)

    def _outage_ended(self) -> None:
        self.outage_since = None
        self._outage_error = None
        self._resend_pause = 0.0

    async def _open(self) -> Any:
        try:
            return await self._open_at(await self._route.stub() if self._route is not None else self._stub)
        except StreamingError as exc:
            if self._route is not None:
                self._route.failed(exc)  # NOT_OWNER names the owner; a gone node is forgotten
            raise

    async def _open_at(self, stub: Any) -> Any:
        call = stub.Produce()
        first = await open_stream(call, spb.ProduceRequest(open=spb.ProduceOpen(
            pchannel=self.pchannel, producer_id=self.producer_id, producer_epoch=self.epoch)),
            "produce", self.pchannel)
        opened = first.opened
        if self.term is not None:
            self.reconnects += 1
        self.term = opened.term
        if self.producer_id is not None:
            if opened.producer_epoch:  # (0 from a node that predates epochs)
                self.epoch = opened.producer_epoch
            if not self._acc.numbered:
                self._acc.number(opened.next_sequence)
        return call

    async def _serve(self, call: Any) -> None:
        """Write and read one stream until it ends (drained) or fails (raises StreamingError)."""
        reader = self._loop.create_task(self.read(call))
        # The writer sleeps on wake alone: the reader ending wakes it too (no task and no
        # asyncio.wait per wait, which a producer sending one message at a time pays every time).
        reader.add_done_callback(lambda _: self.wake.set())
        try:
            try:
                await self._write(call, reader)
            except StreamingError:
                # A refused write only says the stream ended; the status on the reading side says
                # why (fenced, shutdown, ...), and it is finished, so the reader returns at once.
                await reader
                raise
            await reader
        except grpc.RpcError as exc:
            raise translate(exc) from exc
        finally:
            # Retrieve its outcome too when the writer failed first: the writer's error is raised.
            with contextlib.suppress(grpc.RpcError, StreamingError):
                await cancel_and_wait(reader)

    async def _write(self, call: Any, reader: asyncio.Task[None]) -> None:
        sealed = self._acc.sealed
        while True:
            # Nothing more is written while batches are held back: they must go again before it.
            while not (sealed and len(self.in_flight) < self.max_in_flight and not self.held):
                if reader.done():
                    return  # the stream ended; the reader holds why
                if self.closing and not sealed and not self.in_flight and not self.held:
                    await write(call, spb.ProduceRequest(close=spb.ProduceClose()))
                    await done_writing(call)
                    return
                self.wake.clear()
                await self.wake.wait()
            batch = sealed.popleft()
            self._acc.space.set()
            batch.request.batch.request_id = next(self._request_ids)
            # In flight before the write: a write that fails half way leaves the batch's fate unknown.
            self.in_flight.append(batch)
            batch.sent = True
            self.batches_written += 1
            self.largest_batch = max(self.largest_batch, len(batch.futures))
            await write(call, batch.request)

    async def read(self, call: Any) -> None:
        """Read the node's answers on ``call`` and complete the batches in flight with them."""
        in_flight = self.in_flight
        while True:
            resp = await call.read()
            if resp is grpc.aio.EOF:
                if in_flight or self.held or self._acc.sealed:
                    raise UnavailableError(f"produce stream on {self.pchannel!r} ended with batches unanswered",
                                           channel=self.pchannel)
                return
            kind = resp.WhichOneof("response")
            if kind == "closed":
                return
            if kind != "result":
                continue
            result = resp.result
            if not in_flight or in_flight[0].request_id != result.request_id:
                raise UnavailableError(f"produce stream on {self.pchannel!r} answered request {result.request_id} "
                                       "out of order", channel=self.pchannel)
            batch = in_flight[0]
            if result.WhichOneof("outcome") == "error":
                exc = from_error_detail(result.error)
                if self.producer_id is not None and exc.code in _ENDS_STREAM:
                    # Nothing of the batch was written and the stream is ending: resend it on the next.
                    raise exc
                if self.producer_id is not None and exc.code in _RESEND_LATER:
                    # Not written now (or not known to be): held back, to be resent in order.  One
                    # that may have been stored after all would be overtaken by the held ones' resend.
                    if self.held and exc.code in _FATE_UNKNOWN:
                        self._give_up_held()
                    in_flight.popleft()
                    self.held.append(batch)
                    self._held_error = exc
                    if not in_flight:
                        # Everything written is answered, all of it held: a new stream, after a pause.
                        self._resend_pause_wanted = True
                        raise exc
                    continue
                batch.fail(exc)
            else:
                # Checked before the batch leaves the in-flight list: an answer that does not fit it
                # breaks the stream with the batch still there, so it is resent (idempotent) or failed
                # as of unknown fate, never left with futures that no one completes.
                _resolve(batch.futures, result.appended)
                if self.held:
                    self._give_up_held()
                if self.outage_since is not None:
                    self._outage_ended()
            in_flight.popleft()
            self.wake.set()
            self._acc.release(batch)
            if self.held and not in_flight:
                assert self._held_error is not None
                self._resend_pause_wanted = True
                raise self._held_error

    def _give_up_held(self) -> None:
        """A batch written after the held ones was stored, or may have been: resending them now could
        put them after it, out of the order they were sent in, so they fail with the error the node
        gave them."""
        held, self.held = self.held, collections.deque()
        for batch in held:
            batch.fail(self._held_error or UnavailableError("the node could not write the batch",
                                                            channel=self.pchannel))
            self._acc.release(batch)
        self.wake.set()

    def stream_broke(self, exc: StreamingError) -> None:
        """The stream ended with ``exc``: resend (idempotent) or fail the batches in flight, or, when a
        new stream cannot help, fail everything."""
        if self._route is not None:
            self._route.failed(exc)
        if not reconnectable(exc):
            self._outage_ended()
            self._fail_all(exc)
            return
        self._outage(exc, pause=self._resend_pause_wanted)
        self._resend_pause_wanted = False
        if self.producer_id is not None:
            if self.held and self.in_flight and exc.code not in _ENDS_STREAM:
                # Broken with batches after the held ones unanswered: any of them may be stored (the
                # node ends a stream with those codes only once it answered what it took).
                self._give_up_held()
            # Same batches, same sequences, new stream: the node's dedup makes the resend safe.  The
            # held ones first: they were written before everything still in flight.
            self._acc.sealed.extendleft(reversed((*self.held, *self.in_flight)))
            self.held.clear()
        else:
            lost = UnavailableError(
                f"produce stream on {self.pchannel!r} broke before the batch was answered; it may or may not "
                "have been appended (set producer_id to make resending safe)", channel=self.pchannel)
            lost.__cause__ = exc
            for batch in self.in_flight:
                batch.fail(lost)
                self._acc.release(batch)
        self.in_flight.clear()


__all__ = ["Sender"]
