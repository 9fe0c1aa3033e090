"""The adaptor that runs an append chain in front of a WAL: lifetime, fencing, readiness, deadline.

``WALAdaptor.append_batch`` refuses work once closing (ON_SHUTDOWN) or fenced (CHANNEL_FENCED, nothing
written), waits until the chain is ready (recovered), sets the caller's deadline where the redo step
can see it, and hands the batch to the chain.  ``start_append`` is the same hand-off without the wait
(None until ready), for a caller that already runs in a task of its own.  Closing drains appends in
flight, then closes the chain (innermost first) and the WAL.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from wal._committer import fenced_error
from wal.errors import InvalidArgumentError, OnShutdownError, StreamingError
from wal.message import AppendResult, Message
from wal.options import ReadOption
from wal.scanner import Scanner
from wal.wal import WAL, WALState

append_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("append_deadline", default=None)
"""Loop time (``asyncio.get_running_loop().time()``) by which the current append needs an answer."""


class AppendChain(Protocol):
    """What the adaptor needs of a built interceptor chain."""

    async def ready(self) -> None: ...

    async def close(self) -> None: ...

    async def __call__(self, batch: list[Message]) -> list[AppendResult]: ...


AppendObserver = Callable[[list[Message], float, BaseException | None, int | None], None]
"""Told of every batch that entered the chain: the batch, seconds until it ended, its error, and its
summed payload lengths when the caller gave them to ``start_append`` (None: the observer sums them)."""


class WALAdaptor:
    """A WAL with its interceptor chain.  Reads go straight to the WAL's scanners."""

    def __init__(self, wal: WAL, chain: AppendChain) -> None:
        self.wal = wal
        self._chain = chain
        self.observer: AppendObserver | None = None
        self._closing = False
        self._running: set[asyncio.Future[list[AppendResult]]] = set()  # batches inside the chain
        self._ready_task: asyncio.Future[None] | None = None

    def start(self) -> None:
        """Start waiting for the chain to be ready (recovered); appends wait for it.  Idempotent;
        appends before ``start`` are refused."""
        if self._ready_task is None:
            self._ready_task = asyncio.ensure_future(self._chain.ready())

    @property
    def pchannel(self) -> str:
        return self.wal.pchannel

    @property
    def term(self) -> int:
        return self.wal.term

    def _refusal(self) -> StreamingError | None:
        if self._closing:
            return OnShutdownError(f"WAL of pchannel {self.pchannel!r} is shutting down", channel=self.pchannel)
        state = self.wal.state
        if state is WALState.FENCED:
            return fenced_error(self.wal)
        if state is not WALState.RUNNING:
            return self.wal._write_refusal() or OnShutdownError("WAL is closing", channel=self.pchannel)
        return None

    async def append(self, message: Message, *, deadline: float | None = None) -> AppendResult:
        return (await self.append_batch((message,), deadline=deadline))[0]

    async def append_batch(self, messages: Sequence[Message], *, deadline: float | None = None) -> list[AppendResult]:
        """Run ``messages`` through the chain; all-or-nothing, acknowledged once durable.

        ``deadline`` (loop time) bounds the wait for readiness and the redo step's retries.  Once the
        batch entered the chain it runs to its end even if the caller is cancelled: an append cut in
        half could leave a timestamp allocated but unwritten behind a barrier.  The caller then does not
        know the outcome; idempotent producers (producer id + sequence) make the retry safe.
        """
        ready = self._ready_task
        if ready is not None and not ready.done() and messages:
            err = self._refusal()
            if err is not None:
                raise err
            # Waiting for recovery is not being in the chain: a caller cancelled here appends nothing.
            async with asyncio.timeout_at(deadline):
                await asyncio.shield(ready)
        inner = self.start_append(messages, deadline=deadline)
        if inner is None:  # refused an instant ago: the state decides the error
            raise self._refusal() or OnShutdownError(
                f"WAL of pchannel {self.pchannel!r} is not started", channel=self.pchannel)
        return await asyncio.shield(inner)

    def start_append(
        self, messages: Sequence[Message], *, deadline: float | None = None, nbytes: int | None = None
    ) -> asyncio.Future[list[AppendResult]] | None:
        """Hand ``messages`` to the chain at once and return the chain's own future of their results,
        or None while the chain is not ready yet (use ``append_batch``, which waits).

        The lean path of a caller that already runs in its own task (a produce stream): no task and
        no shield of the adaptor's own around the chain.  Refusals (closing, fenced, bad messages)
        raise here.  The future must never be cancelled (the batch would be cut in half): await it
        through ``asyncio.shield``, or only once it is done.

        ``nbytes``: the summed payload lengths of ``messages`` (``payload_bytes``) when the caller has
        already summed them; handed to the observer, so that a batch's payload is summed once.
        """
        err = self._refusal()
        if err is not None:
            raise err
        batch = list(messages)
        for m in batch:
            if not isinstance(m, Message):
                raise InvalidArgumentError(f"expected Message, got {type(m).__name__}")
            if m._id is not None:  # the slot, not the property: this runs once per message
                raise InvalidArgumentError(f"message {m._id} was already appended", message_id=m._id)
        if not batch:
            done: asyncio.Future[list[AppendResult]] = asyncio.get_running_loop().create_future()
            done.set_result([])
            return done
        ready = self._ready_task
        if ready is None:
            raise OnShutdownError(f"WAL of pchannel {self.pchannel!r} is not started", channel=self.pchannel)
        if not ready.done():
            return None
        ready.result()  # a failed recovery fails every append, with its cause
        # The chain's task copies the context now: the deadline is seen by the redo step inside it.
        token = append_deadline.set(deadline)
        try:
            inner = asyncio.ensure_future(self._chain(batch))
        finally:
            append_deadline.reset(token)
        self._running.add(inner)
        inner.add_done_callback(self._batch_done)
        observer = self.observer
        if observer is not None:
            # Observed when the batch ends, not when the caller returns: a caller that was
            # cancelled still has its batch run to the end, and that end is what happened.
            t0 = time.perf_counter()
            inner.add_done_callback(
                lambda f: observer(batch, time.perf_counter() - t0,
                                   asyncio.CancelledError() if f.cancelled() else f.exception(), nbytes))
        return inner

    def _batch_done(self, fut: asyncio.Future[list[AppendResult]]) -> None:
        self._running.discard(fut)
        if not fut.cancelled():
            fut.exception()  # retrieved here: a caller cancelled meanwhile no longer awaits it

    def read(self, option: ReadOption | None = None) -> Scanner:
        return self.wal.read(option)

    async def aclose(self) -> None:
        """Refuse new appends, drain those in flight, close the chain then the WAL.  Idempotent."""
        first = not self._closing
        self._closing = True
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        if not first:
            return
        if self._ready_task is not None and not self._ready_task.done():
            self._ready_task.cancel()
        await self._chain.close()
        await self.wal.aclose()


__all__ = ["AppendChain", "AppendObserver", "WALAdaptor", "append_deadline"]
