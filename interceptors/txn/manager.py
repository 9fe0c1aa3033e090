"""TxnManager: the transaction sessions of one pchannel — ids, replay, expiry, and failing sessions
on exclusive messages.  The append path goes through ``claim`` (see ``claim.py``)."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from interceptors.txn.claim import TxnClaim, claim_batch
from interceptors.txn.session import Allocation, SessionTable, TxnSession, TxnState, message_bytes
from wal.errors import InvalidArgumentError
from wal.message import BROADCAST_VCHANNEL, Message, MessageID, MessageType, TxnContext
from wal.txn_keepalive import check_keepalive

_BEGIN = MessageType.BEGIN_TXN
_COMMIT = MessageType.COMMIT_TXN
_ROLLBACK = MessageType.ROLLBACK_TXN


class TxnManager:
    """The transaction sessions of one pchannel; shared by the txn step and the steps around it.

    ``max_finished`` bounds how many finished sessions are remembered (so a late message gets a
    precise error rather than TxnNotFoundError); ``max_allocated`` bounds ids handed out whose
    BeginTxn never came; ``max_messages`` and ``max_bytes`` bound one transaction's bodies (None:
    unbounded): the body that would go over fails with TxnTooLargeError and fails its transaction.
    """

    def __init__(
        self, *, max_finished: int = 16384, max_allocated: int = 65536, max_messages: int | None = None,
        max_bytes: int | None = None,
    ) -> None:
        self._next_id = 1
        self._table = SessionTable(max_finished, max_messages, max_bytes)
        self._orphans: list[TxnSession] = []
        self._max_allocated = max_allocated

    @property
    def on_finish(self) -> Callable[[TxnSession], None] | None:
        """Told of each open session as it ends (committed, rolled back or expired): for metrics."""
        return self._table.on_finish

    @on_finish.setter
    def on_finish(self, callback: Callable[[TxnSession], None] | None) -> None:
        self._table.on_finish = callback

    # --- sessions --------------------------------------------------------------------------------
    @property
    def next_txn_id(self) -> int:
        """The id the next ``begin`` will hand out."""
        return self._next_id

    def begin(self, vchannel: str, keepalive_ms: int) -> TxnContext:
        """Allocate a transaction id; the caller appends a BeginTxn carrying the returned context.

        ``keepalive_ms`` is the idle time (on message timestamps) after which the transaction
        expires; 0 means never.
        """
        if not isinstance(vchannel, str) or vchannel == BROADCAST_VCHANNEL:
            raise InvalidArgumentError("a transaction needs a vchannel (it cannot be a broadcast)")
        check_keepalive(keepalive_ms)
        tid = self._next_id
        self._next_id = tid + 1
        allocated = self._table.allocated
        allocated[tid] = Allocation(vchannel, keepalive_ms)
        if len(allocated) > self._max_allocated:
            # Forget the oldest ids whose BeginTxn never came (not those being written right now).
            for old in [k for k, a in allocated.items() if not a.claimed][: len(allocated) - self._max_allocated]:
                del allocated[old]
        return TxnContext(tid, keepalive_ms)

    def begin_message(self, vchannel: str, keepalive_ms: int, properties: dict[str, str] | None = None) -> Message:
        """``begin`` and the BeginTxn message that starts the transaction."""
        ctx = self.begin(vchannel, keepalive_ms)
        return Message(_BEGIN, vchannel, properties=properties, txn=ctx)

    def get(self, txn_id: int) -> TxnSession | None:
        """The session of ``txn_id`` (open or recently finished), or None."""
        return self._table.get(txn_id)

    def open_sessions(self) -> list[TxnSession]:
        """Sessions that may still commit (IN_FLIGHT, ON_COMMIT, ON_ROLLBACK)."""
        return list(self._table.open.values())

    def min_open_begin_id(self) -> MessageID | None:
        """Smallest BeginTxn id of an open transaction: a reader that needs every transaction whole
        must start there.  Sessions that can no longer commit do not hold it back."""
        heap = self._table.begin_heap
        open_ = self._table.open
        while heap and heap[0][1] not in open_:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def fail_vchannel(self, vchannel: str, reason: str) -> list[TxnSession]:
        """Fail every open session of ``vchannel`` (every vchannel for a broadcast): an exclusive
        message changes what they were written against.  Their later bodies and commit fail with
        InvalidTxnStateError naming ``reason``.  A commit already being written is left to finish."""
        table = self._table
        failed: list[TxnSession] = []
        for s in list(table.open.values()):
            if vchannel not in (BROADCAST_VCHANNEL, s.vchannel):
                continue
            if s._commit_writing:
                continue
            s.state = TxnState.ROLLED_BACK
            s.failure = reason
            table.finish(s)
            s._wake()
            failed.append(s)
        return failed

    def on_exclusive(self, vchannel: str, message: Message) -> None:
        """Callback for the lock step: an exclusive message is about to be written on ``vchannel``."""
        where = "every vchannel" if vchannel == BROADCAST_VCHANNEL else f"vchannel {vchannel!r}"
        self.fail_vchannel(vchannel, f"{message.message_type.name} on {where} failed the transaction")

    def expire(self, now_ts: int) -> list[TxnSession]:
        """Mark IN_FLIGHT sessions idle past their keepalive at ``now_ts`` as EXPIRED; return them.

        No message is needed: readers expire them by the same function (``wal.clock.txn_expired``).
        A session whose commit or rollback is in progress was checked against that message's own
        timestamp, and one with bodies in flight is not idle (once written they move ``last_ts``):
        both are left alone.
        """
        table = self._table
        out = [
            s for s in table.open.values()
            if s.state is TxnState.IN_FLIGHT and not s.inflight and s.expired_at(now_ts)
        ]
        for s in out:
            s.state = TxnState.EXPIRED
            table.finish(s)
        return out

    def take_orphans(self) -> list[TxnSession]:
        """Sessions found open by recovery and expired; each needs a ``rollback_message``.  Once."""
        out, self._orphans = self._orphans, []
        return out

    # --- the append path -------------------------------------------------------------------------
    def claim(self, batch: list[Message]) -> TxnClaim | None:
        """Validate ``batch`` as a whole and take its claims; None when it holds nothing
        transactional.  Raises on the first invalid message, having claimed nothing.  The caller
        waits, writes, then settles or aborts the claim (see ``claim.py``)."""
        return claim_batch(self._table, batch)

    # --- recovery --------------------------------------------------------------------------------
    def replay(self, batch: list[Message]) -> None:
        """Apply stored messages (in id order) to the sessions."""
        table = self._table
        for m in batch:
            txn = m._txn
            if txn is None:
                continue
            tid = txn.txn_id
            if tid >= self._next_id:
                self._next_id = tid + 1
            t = m._type
            ts = m._timetick
            if t is _BEGIN:
                assert m._id is not None
                table.allocated.pop(tid, None)
                table.register(TxnSession(tid, m._vchannel, txn.keepalive_ms, m._id, ts))
                continue
            s = table.open.get(tid)
            if s is None:
                if t is _ROLLBACK:  # the rollback written for an orphan of an earlier recovery
                    done = table.finished.get(tid)
                    if done is not None:
                        done.rollback_written = True
                continue  # began before the replayed range: nothing to rebuild
            if t is _COMMIT:
                s.state = TxnState.COMMITTED
                table.finish(s)
            elif t is _ROLLBACK:
                s.state = TxnState.ROLLED_BACK
                s.rollback_written = True
                table.finish(s)
            else:
                s.last_ts = max(s.last_ts, ts)
                s.max_body_ts = max(s.max_body_ts, ts)
                s.messages += 1
                s.nbytes += message_bytes(m)

    def export_state(self) -> dict[str, Any]:
        """What recovery needs that replay would rebuild: the next id (ids are never reused).

        Only at a point that no open transaction spans: a session's BeginTxn must stay replayable, so
        its state never has to be carried over (the retention step cuts below the oldest BeginTxn).
        """
        open_ = self._table.open
        if open_:
            raise InvalidArgumentError(
                f"cannot snapshot transaction state with {len(open_)} transaction(s) open",
                txn_id=min(open_),
            )
        return {"next_txn_id": self._next_id}

    def import_state(self, state: dict[str, Any]) -> None:
        """Take the next id from a recovery snapshot (never moving it back)."""
        self._next_id = max(self._next_id, int(state["next_txn_id"]))

    def finish_recovery(self) -> None:
        """Expire every session still open after replay and keep it for ``take_orphans``."""
        table = self._table
        for s in list(table.open.values()):
            s.state = TxnState.EXPIRED
            table.finish(s)
            self._orphans.append(s)


__all__ = ["TxnManager"]
