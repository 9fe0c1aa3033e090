"""Parallel processing of a consumer's messages (``Consumer.process``).

A handler runs on ``workers`` workers.  Every message goes to the worker its key picks (by default the
vchannel), so messages of one key are handled one at a time, in delivery order, and different keys run
side by side.  A coroutine function runs as that many tasks on the client's loop; a plain function
runs on that many threads (so blocking work runs in parallel too).

Commits: a pack is *done* when every one of its messages was handled.  The group's position moves to
the end of a pack only once that pack and every pack before it are done, i.e. never past the first
message not yet handled: after a crash the group resumes at or before it, so no work is skipped (some
may be done twice: at least once, per pack).  Acks are coalesced: one in flight at a time, for the
furthest done pack.

Backpressure: at most ``max_in_flight`` messages are taken from the consumer and not yet handled;
reading stops meanwhile, which slows the node's scanner through the stream's flow control.

A handler that raises stops the processing: nothing more is handed to the workers, handlers already
running finish, the position is committed up to the done frontier (before the failed message's pack),
and ``process`` raises that error.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from wal.errors import InvalidArgumentError, OnShutdownError
from wal.message import Message, Position

if TYPE_CHECKING:
    from streamingnode.client._consumer import Consumer

Handler = Callable[[Message], Awaitable[object] | object]
KeyFunction = Callable[[Message], object]


def _by_vchannel(m: Message) -> object:
    return m.vchannel


class _Pack:
    """A pack being handled: messages left, and where the group resumes once it is done."""

    __slots__ = ("end", "left")

    def __init__(self, left: int, end: Position) -> None:
        self.left = left
        self.end = end


class _Run:
    def __init__(self, consumer: Consumer, handler: Handler, workers: int, key: KeyFunction,
                 max_in_flight: int) -> None:
        self.consumer = consumer
        self.key = key
        self.workers = workers
        self.slots = asyncio.Semaphore(max_in_flight)
        # Per key, its messages not handled yet (the head is being handled when the key is not in
        # ``ready``).  ``ready`` holds each key with messages and no worker, once: a free worker
        # takes any ready key, so one slow key never holds up another.
        self.pending: dict[object, collections.deque[tuple[Message, _Pack]]] = {}
        self.ready: asyncio.Queue[object] = asyncio.Queue()
        self.idle = asyncio.Event()
        self.idle.set()
        self.packs: collections.deque[_Pack] = collections.deque()
        self.frontier: Position | None = None  # end of the last pack done with all before it
        self.acked: Position | None = None
        self.failure: BaseException | None = None
        self.stopping = False
        self.failed = asyncio.Event()
        self.moved = asyncio.Event()
        self.handled = 0
        self._threads: ThreadPoolExecutor | None = None
        if inspect.iscoroutinefunction(handler):
            self.call: Callable[[Message], Awaitable[object]] = handler
        else:
            self._threads = ThreadPoolExecutor(workers, thread_name_prefix="consumer-process")
            loop = asyncio.get_running_loop()
            threads = self._threads

            async def in_thread(m: Message) -> object:
                result = await loop.run_in_executor(threads, handler, m)
                if inspect.isawaitable(result):  # a plain function that returned a coroutine
                    return await result
                return result

            self.call = in_thread

    # --- the frontier ----------------------------------------------------------------------------
    def _advance(self) -> None:
        moved = False
        while self.packs and self.packs[0].left == 0:
            self.frontier = self.packs.popleft().end
            moved = True
        if moved:
            self.moved.set()

    async def _committer(self) -> None:
        """Acks the frontier whenever it moved, one ack at a time (a later one covers the earlier)."""
        while True:
            await self.moved.wait()
            self.moved.clear()
            await self._ack()

    async def _ack(self) -> None:
        frontier = self.frontier
        if frontier is None or frontier == self.acked or self.consumer.group is None:
            return
        await self.consumer.ack(frontier)
        self.acked = frontier

    # --- workers ---------------------------------------------------------------------------------
    def _dispatch(self, m: Message, pack: _Pack) -> None:
        k = self.key(m)
        queue = self.pending.get(k)
        if queue is None:
            self.pending[k] = collections.deque([(m, pack)])
            self.idle.clear()
            self.ready.put_nowait(k)
        else:
            queue.append((m, pack))  # behind the key's earlier messages: handled after them

    async def _work(self) -> None:
        while (k := await self.ready.get()) is not _STOP:
            queue = self.pending[k]
            m, pack = queue[0]
            try:
                # Once stopping, nothing more is handled, nor marked done: the frontier stays before it.
                if not self.stopping:
                    await self.call(m)
                    self.handled += 1
                    pack.left -= 1
                    self._advance()
            except Exception as exc:  # noqa: BLE001  (whatever the handler raised ends the run, below)
                if self.failure is None:
                    self.failure = exc
                    self.stopping = True
                    self.failed.set()
            finally:
                queue.popleft()
                self.consumer.in_process -= 1
                self.slots.release()
                if queue:
                    self.ready.put_nowait(k)
                else:
                    del self.pending[k]
                    if not self.pending:
                        self.idle.set()

    async def _read(self) -> None:
        async for msgpack in self.consumer:
            pack = _Pack(len(msgpack.messages), msgpack.end_position)
            self.packs.append(pack)
            for m in msgpack.messages:
                await self.slots.acquire()
                self.consumer.in_process += 1
                self._dispatch(m, pack)
            if not msgpack.messages:
                self._advance()  # an empty pack: time moved, nothing to handle

    async def run(self) -> int:
        workers = [asyncio.ensure_future(self._work()) for _ in range(self.workers)]
        committer = asyncio.ensure_future(self._committer())
        reader = asyncio.ensure_future(self._read())
        failed = asyncio.ensure_future(self.failed.wait())
        try:
            await asyncio.wait({reader, failed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # However the run ends (the read ended, a handler failed, the caller cancelled): stop
            # reading and handing out, let the handlers already running finish, commit what is done.
            self.stopping = True
            reader.cancel()
            failed.cancel()
            await asyncio.gather(reader, failed, return_exceptions=True)
            await asyncio.shield(self.idle.wait())
            for _ in workers:
                self.ready.put_nowait(_STOP)
            await asyncio.shield(asyncio.gather(*workers, return_exceptions=True))
            committer.cancel()
            await asyncio.gather(committer, return_exceptions=True)
            if self._threads is not None:
                self._threads.shutdown(wait=False)
            with contextlib.suppress(OnShutdownError):  # closed consumer: the next run redoes the rest
                await asyncio.shield(self._ack())
        if self.failure is not None:
            raise self.failure
        if not reader.cancelled() and (exc := reader.exception()) is not None:
            raise exc
        return self.handled


_STOP = object()


async def process(consumer: Consumer, handler: Handler, *, workers: int, key: KeyFunction | None,
                  max_in_flight: int) -> int:
    if workers < 1:
        raise InvalidArgumentError(f"workers must be at least 1, not {workers}", field="workers")
    if max_in_flight < 1:
        raise InvalidArgumentError(f"max_in_flight must be at least 1, not {max_in_flight}", field="max_in_flight")
    return await _Run(consumer, handler, workers, key or _by_vchannel, max_in_flight).run()


__all__ = ["Handler", "KeyFunction", "process"]
