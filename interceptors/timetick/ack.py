"""The ack manager: which allocated timestamps are still being appended.

Timestamps are allocated in order and registered here in that order; appends finish in any order.
``confirmed_ts`` is the largest ts below which every allocation is finished (acked or failed): a
TimeTick at or below it is a safe barrier.  ``last_confirmed_id`` is the smallest id from which a
reader finds every message with ts > ``confirmed_ts``: finished-but-unconfirmed appends can sit at
lower ids than the WAL's next id, and open transactions must be read from their BeginTxn.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from wal.message import MessageID


class Pending:
    """One in-flight append (a batch): its last ts, and its first id once written."""

    __slots__ = ("done", "first_id", "last_ts")

    def __init__(self, last_ts: int) -> None:
        self.last_ts = last_ts
        self.done = False
        self.first_id: MessageID | None = None


class AckManager:
    def __init__(self, next_id: Callable[[], MessageID], confirmed_ts: int = 0,
                 min_open_txn_id: Callable[[], MessageID | None] | None = None) -> None:
        self._pending: deque[Pending] = deque()
        self._next_id = next_id
        self._min_open_txn_id = min_open_txn_id
        self.confirmed_ts = confirmed_ts
        self._advanced = asyncio.Event()

    @property
    def inflight(self) -> int:
        return len(self._pending)

    def register(self, last_ts: int) -> Pending:
        """Register an allocation; call in allocation order (synchronously after allocating)."""
        p = Pending(last_ts)
        self._pending.append(p)
        return p

    def finish(self, p: Pending, first_id: MessageID | None) -> None:
        """The append of ``p`` is acknowledged at ``first_id`` (or failed: None)."""
        p.done = True
        p.first_id = first_id
        q = self._pending
        advanced = False
        while q and q[0].done:
            self.confirmed_ts = q.popleft().last_ts
            advanced = True
        if advanced:
            self._advanced.set()
            self._advanced = asyncio.Event()

    def last_confirmed_id(self) -> MessageID:
        lc = self._next_id()
        for p in self._pending:
            if p.done and p.first_id is not None and p.first_id < lc:
                lc = p.first_id
        if self._min_open_txn_id is not None:
            begin = self._min_open_txn_id()
            if begin is not None and begin < lc:
                lc = begin
        return lc

    async def wait_first(self, p: Pending) -> None:
        """Wait until every allocation registered before ``p`` is finished."""
        while self._pending and self._pending[0] is not p:
            await self._advanced.wait()
