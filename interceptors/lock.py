"""lock: a read/write lock per vchannel, so DDL never interleaves with the DML it changes.

DML (INSERT, UPSERT, DELETE) and transaction bodies take their vchannel's lock shared; CreateCollection, DropCollection,
CreatePartition, DropPartition and ManualFlush take it exclusive, and so do broadcasts (an empty
vchannel), which lock the whole pchannel.  An exclusive message fails the transactions open on its
vchannel (their snapshot of the schema would be stale), through ``on_exclusive``.

Waiters are served first come, first served, so a stream of shared holders cannot starve DDL, and a
later arrival never overtakes a waiter that was just granted the lock: batches leave this step in
the order they reached it, so a producer's pipelined batches get their timestamps in order.  The
uncontended path — the common one — takes no await.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from interceptors.base import AppendNext
from wal.message import BROADCAST_VCHANNEL, AppendResult, Message, MessageType

_ALL = "\x00all"  # the pchannel-wide lock that broadcasts take exclusively and everyone else shares
_MAX_IDLE_LOCKS = 4096
_EXCLUSIVE = frozenset(t for t in MessageType if t.is_exclusive)
_SYSTEM = frozenset(t for t in MessageType if t.is_system)


class RWLock:
    """A fair asyncio read/write lock."""

    __slots__ = ("_readers", "_resuming", "_waiters", "_writer")

    def __init__(self) -> None:
        self._readers = 0
        self._writer = False
        self._waiters: deque[tuple[bool, asyncio.Future[None]]] = deque()
        self._resuming = 0  # waiters granted the lock that have not run since

    @property
    def idle(self) -> bool:
        return not self._readers and not self._writer and not self._waiters

    async def acquire(self, exclusive: bool) -> None:
        if not self._waiters and not self._writer and (not exclusive or not self._readers):
            self._grant(exclusive)
            if self._resuming:
                # Shared holders granted before this call have not run yet.  Going on now would let
                # this later arrival reach the clock first, and a producer's pipelined batches would
                # get timestamps out of order; one pass of the loop lets them go first.
                try:
                    await asyncio.sleep(0)
                except asyncio.CancelledError:
                    self.release(exclusive)
                    raise
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((exclusive, fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._resuming -= 1
                self.release(exclusive)  # granted just as we were cancelled: give it back
            else:
                self._waiters.remove((exclusive, fut))
                self._wake()
            raise
        self._resuming -= 1

    def _grant(self, exclusive: bool) -> None:
        if exclusive:
            self._writer = True
        else:
            self._readers += 1

    def release(self, exclusive: bool) -> None:
        if exclusive:
            self._writer = False
        else:
            self._readers -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and not self._writer:
            exclusive, fut = self._waiters[0]
            if exclusive and self._readers:
                return
            self._waiters.popleft()
            if fut.done():
                continue
            self._grant(exclusive)
            self._resuming += 1
            fut.set_result(None)
            if exclusive:
                return


class LockInterceptor:
    name = "lock"

    def __init__(self, on_exclusive: Callable[[str, Message], None] | None = None) -> None:
        self._locks: dict[str, RWLock] = {}
        self._on_exclusive = on_exclusive

    @staticmethod
    def _plan(batch: list[Message]) -> tuple[list[tuple[str, bool]], list[Message]]:
        """(lock name, exclusive) to take, sorted by name so that batches never deadlock, and the
        messages that need exclusivity."""
        modes: dict[str, bool] = {}
        exclusive: list[Message] = []
        for m in batch:
            vch = m._vchannel
            t = m._type
            if vch == BROADCAST_VCHANNEL:
                modes[_ALL] = True
                if t not in _SYSTEM:
                    exclusive.append(m)
            elif t in _EXCLUSIVE:
                modes[vch] = True
                exclusive.append(m)
            elif vch not in modes:
                modes[vch] = False
        if _ALL not in modes:
            modes[_ALL] = False
        return sorted(modes.items()), exclusive

    async def do_append(self, batch: list[Message], append_next: AppendNext) -> list[AppendResult]:
        plan, exclusive_messages = self._plan(batch)
        taken: list[tuple[RWLock, bool]] = []
        try:
            for name, exclusive in plan:
                lock = self._locks.get(name)
                if lock is None:
                    lock = self._locks[name] = RWLock()
                await lock.acquire(exclusive)
                taken.append((lock, exclusive))
            if self._on_exclusive is not None:
                for m in exclusive_messages:
                    self._on_exclusive(m._vchannel, m)
            return await append_next(batch)
        finally:
            for lock, exclusive in reversed(taken):
                lock.release(exclusive)
            if len(self._locks) > _MAX_IDLE_LOCKS:  # vchannels come and go: forget the idle ones
                for name in [n for n, lock in self._locks.items() if lock.idle]:
                    del self._locks[name]

    async def close(self) -> None:
        self._locks.clear()


__all__ = ["LockInterceptor", "RWLock"]
