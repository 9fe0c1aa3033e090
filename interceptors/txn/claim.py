"""The transaction batch protocol: validate a batch, claim what it does, then settle or abort.

``claim_batch`` validates a whole batch in order against the sessions (as earlier messages of the
same batch leave them) and, only when every message passes, takes the batch's claims synchronously:
bodies in flight, a commit or rollback in progress, BeginTxn ids being written.  Other batches see
the claims at once, so nothing can slip between validation and writing.  The caller then:

1. ``await claim.wait()`` — commits wait for their sessions' bodies in flight in other batches;
2. writes the batch;
3. ``claim.settle(results)`` once it is durable, or ``claim.abort()`` when waiting or writing
   failed (the claims are released, so redo may run the same batch again).

Exactly one of ``settle`` and ``abort`` is called, once.
"""

from __future__ import annotations

import asyncio

from interceptors.txn.session import FRAMING, SessionTable, TxnSession, TxnState, message_bytes
from wal.clock import txn_expired
from wal.errors import (
    InvalidArgumentError,
    InvalidTxnStateError,
    TxnExpiredError,
    TxnNotFoundError,
    TxnTooLargeError,
)
from wal.message import AppendResult, Message, MessageType

_BEGIN = MessageType.BEGIN_TXN
_COMMIT = MessageType.COMMIT_TXN
_ROLLBACK = MessageType.ROLLBACK_TXN
_TIME_TICK = MessageType.TIME_TICK


class TxnView:
    """A session's state as seen from inside one batch (earlier messages of the batch applied)."""

    __slots__ = ("bodies", "closing", "last_ts", "max_body_ts", "nbytes", "prev_state", "session", "state")

    def __init__(self, session: TxnSession) -> None:
        self.session = session
        self.state = session.state
        self.prev_state = session.state
        self.last_ts = session.last_ts
        self.max_body_ts = session.max_body_ts
        self.bodies = 0
        self.nbytes = 0  # message_bytes of those bodies
        self.closing = False  # the batch holds a RollbackTxn for this expired or failed session


class TxnClaim:
    """What one batch does to the sessions: claimed before writing, settled or aborted after."""

    __slots__ = ("begins", "commits", "new", "rollbacks", "table", "views")

    def __init__(self, table: SessionTable) -> None:
        self.table = table
        self.views: dict[int, TxnView] = {}
        self.new: dict[int, TxnSession] = {}  # begun by this batch: invisible to others until written
        self.begins: list[tuple[int, int]] = []  # (batch index, txn id)
        self.commits: list[tuple[TxnView, int]] = []  # (view, commit ts) of sessions begun earlier
        self.rollbacks: list[TxnView] = []

    def _take(self) -> None:
        """Make the batch's intent visible to other batches (synchronously after validation)."""
        allocated = self.table.allocated
        for _, tid in self.begins:
            allocated[tid].claimed = True
        for tid, v in self.views.items():
            if tid in self.new:
                continue
            s = v.session
            if v.bodies:
                s.inflight += v.bodies
                s.messages += v.bodies
                s.nbytes += v.nbytes
                s.max_body_ts = max(s.max_body_ts, v.max_body_ts)
        for v, _ in self.commits:
            s = v.session
            s.state = TxnState.ON_COMMIT
            s._own_bodies = v.bodies
            s._body_failed = False
        for v in self.rollbacks:
            s = v.session
            if v.prev_state is TxnState.IN_FLIGHT:
                s.state = TxnState.ON_ROLLBACK
            else:
                s._closing = True

    async def wait(self) -> None:
        """Commits wait for their sessions' bodies in flight in other batches, then are rechecked.

        Returns at once when the batch commits no session begun before it.  Raises (and the caller
        aborts) when a waited-for body failed, an exclusive message failed the session meanwhile, or
        the session expired before the commit's timestamp.
        """
        loop: asyncio.AbstractEventLoop | None = None
        for v, ts in self.commits:
            s = v.session
            while s.state is TxnState.ON_COMMIT and s.inflight > s._own_bodies:
                if loop is None:
                    loop = asyncio.get_running_loop()
                s._waiter = loop.create_future()
                try:
                    await s._waiter
                finally:
                    s._waiter = None
            tid = s.txn_id
            if s.state is not TxnState.ON_COMMIT:  # failed by an exclusive message while waiting
                why = s.failure or s.state.words
                raise InvalidTxnStateError(f"CommitTxn refused: transaction {tid} was failed: {why}",
                                           txn_id=tid, reason=why)
            if s._body_failed:
                raise InvalidTxnStateError(
                    f"CommitTxn refused: a body of transaction {tid} failed while the commit waited for it",
                    txn_id=tid,
                )
            if txn_expired(s.keepalive_ms, max(s.last_ts, v.last_ts), ts):
                raise TxnExpiredError(f"transaction {tid} expired before its commit at ts {ts}", txn_id=tid)
        for v, _ in self.commits:
            v.session._commit_writing = True

    def settle(self, results: list[AppendResult]) -> None:
        """The batch is durable (``results`` one per message, in order): apply it."""
        table = self.table
        for i, tid in self.begins:
            table.allocated.pop(tid, None)
            s = self.new[tid]
            s.begin_id = results[i].message_id
        for tid, v in self.views.items():
            s = v.session
            if tid in self.new:
                s.last_ts = v.last_ts
                s.max_body_ts = v.max_body_ts
                s.messages = v.bodies
                s.nbytes = v.nbytes
                s.state = {TxnState.ON_COMMIT: TxnState.COMMITTED, TxnState.ON_ROLLBACK: TxnState.ROLLED_BACK}.get(
                    v.state, v.state
                )
                s.rollback_written = s.state is TxnState.ROLLED_BACK
                table.register(s)
                continue
            if v.bodies:
                s.inflight -= v.bodies
                s.last_ts = max(s.last_ts, v.last_ts)
                s._wake()
        for v, _ in self.commits:
            s = v.session
            s._commit_writing = False
            s.state = TxnState.COMMITTED
            table.finish(s)
        for v in self.rollbacks:
            s = v.session
            s.rollback_written = True
            s._closing = False
            if s.state is TxnState.ON_ROLLBACK:
                s.state = TxnState.ROLLED_BACK
            table.finish(s)

    def abort(self) -> None:
        """The batch was not written: release its claims so the same batch can be tried again."""
        for _, tid in self.begins:
            alloc = self.table.allocated.get(tid)
            if alloc is not None:
                alloc.claimed = False
        for v, _ in self.commits:
            s = v.session
            s._commit_writing = False
            if s.state is TxnState.ON_COMMIT:
                s.state = TxnState.IN_FLIGHT
                s._body_failed = False
        for v in self.rollbacks:
            s = v.session
            s._closing = False
            if s.state is TxnState.ON_ROLLBACK:
                s.state = TxnState.IN_FLIGHT
        for tid, v in self.views.items():
            if tid in self.new or not v.bodies:
                continue
            s = v.session
            s.inflight -= v.bodies
            s.messages -= v.bodies
            s.nbytes -= v.nbytes
            if s.state is TxnState.ON_COMMIT:
                s._body_failed = True  # the commit waiting for this body must not go ahead without it
            s._wake()


def claim_batch(table: SessionTable, batch: list[Message]) -> TxnClaim | None:
    """Validate ``batch`` and take its claims; None when it holds nothing transactional.

    Raises on the first invalid message, having claimed nothing.
    """
    claim: TxnClaim | None = None
    for i, m in enumerate(batch):
        txn = m._txn
        t = m._type
        if txn is None:
            if t in FRAMING:
                raise InvalidArgumentError(f"{t.name} without a transaction context")
            continue
        if claim is None:
            claim = TxnClaim(table)
        tid = txn.txn_id
        if t is _BEGIN:
            _check_begin(claim, m, tid, txn.keepalive_ms)
            s = TxnSession(tid, m._vchannel, txn.keepalive_ms, -1, m._timetick)
            claim.new[tid] = s
            claim.views[tid] = TxnView(s)
            claim.begins.append((i, tid))
            continue
        if t is _TIME_TICK or t.is_exclusive:
            raise InvalidArgumentError(f"a {t.name} message cannot be part of transaction {tid}", txn_id=tid)
        v = _view(claim, tid)
        ts = m._timetick
        if t is _COMMIT:
            _refuse(table, v, m, "CommitTxn")
            if ts <= v.max_body_ts:
                raise InvalidTxnStateError(
                    f"CommitTxn of transaction {tid} at ts {ts} is not after its body or BeginTxn at ts "
                    f"{v.max_body_ts} (a body was appended concurrently with the commit); commit again",
                    txn_id=tid,
                )
            v.state = TxnState.ON_COMMIT
            if tid not in claim.new:
                claim.commits.append((v, ts))
        elif t is _ROLLBACK:
            _check_rollback(v, m)
            if v.state is TxnState.IN_FLIGHT:
                v.state = TxnState.ON_ROLLBACK
            if tid not in claim.new:
                claim.rollbacks.append(v)
        else:
            _refuse(table, v, m, "body")
            size = message_bytes(m)
            _check_bounds(table, v, size)
            v.bodies += 1
            v.nbytes += size
            v.last_ts = max(v.last_ts, ts)
            v.max_body_ts = max(v.max_body_ts, ts)
    if claim is not None:
        claim._take()
    return claim


def _view(claim: TxnClaim, tid: int) -> TxnView:
    v = claim.views.get(tid)
    if v is not None:
        return v
    table = claim.table
    s = table.open.get(tid) or table.finished.get(tid)
    if s is None:
        if tid in table.allocated:
            raise TxnNotFoundError(f"transaction {tid} has not begun: its BeginTxn is not written", txn_id=tid)
        raise TxnNotFoundError(f"transaction {tid} does not exist on this pchannel", txn_id=tid)
    v = claim.views[tid] = TxnView(s)
    return v


def _refuse(table: SessionTable, v: TxnView, m: Message, what: str) -> None:
    """Raise unless the session accepts a body or commit at ``m``'s timestamp."""
    s = v.session
    tid = s.txn_id
    if m._vchannel != s.vchannel:
        raise InvalidArgumentError(
            f"{what} of transaction {tid} is on vchannel {m._vchannel!r}, the transaction on {s.vchannel!r}",
            txn_id=tid,
        )
    state = v.state
    if state is TxnState.IN_FLIGHT:
        if txn_expired(s.keepalive_ms, v.last_ts, m._timetick):
            if table.open.get(tid) is s and not s.inflight and not v.bodies:
                # A fact about time, kept though nothing is written.  Not while bodies are in flight:
                # once written they move last_ts, and a message stamped earlier may still be valid.
                s.state = TxnState.EXPIRED
                table.finish(s)
            raise TxnExpiredError(
                f"transaction {tid} expired: idle more than {s.keepalive_ms} ms at ts {m._timetick}", txn_id=tid
            )
        return
    if state is TxnState.EXPIRED:
        raise TxnExpiredError(f"transaction {tid} expired", txn_id=tid)
    if state is TxnState.ROLLED_BACK and s.failure is not None:
        raise InvalidTxnStateError(f"transaction {tid} was failed: {s.failure}", txn_id=tid, reason=s.failure)
    raise InvalidTxnStateError(f"{what} refused: transaction {tid} is {state.words}", txn_id=tid)


def _check_bounds(table: SessionTable, v: TxnView, size: int) -> None:
    """Raise TxnTooLargeError when one more body of ``size`` bytes takes the transaction over a bound
    of the table; a transaction already written is then failed, for good (its owner writes the
    RollbackTxn: ``StreamingWAL`` does), so that its later bodies and commit are refused with why.

    The bounds keep every committed transaction deliverable: a reader holds one whole in memory and
    the node sends it as one unit, whatever its size."""
    s = v.session
    tid = s.txn_id
    if table.max_messages is not None and s.messages + v.bodies >= table.max_messages:
        bound, limit, what = "txn_max_messages", table.max_messages, f"{s.messages + v.bodies + 1} messages"
    elif table.max_bytes is not None and s.nbytes + v.nbytes + size > table.max_bytes:
        bound, limit, what = "txn_max_bytes", table.max_bytes, f"{s.nbytes + v.nbytes + size} bytes"
    else:
        return
    reason = f"transaction {tid} would hold {what}, over {bound} = {limit}"
    written = table.open.get(tid) is s
    if written:
        s.state = TxnState.ROLLED_BACK
        s.failure = reason
        table.finish(s)
        s._wake()
    raise TxnTooLargeError(
        f"{reason}; it is rolled back" if written else f"{reason}; nothing of it was written",
        txn_id=tid, bound=bound, limit=limit)


def _check_begin(claim: TxnClaim, m: Message, tid: int, keepalive_ms: int) -> None:
    table = claim.table
    if tid in claim.views or tid in table.open or tid in table.finished:
        raise InvalidTxnStateError(f"transaction {tid} has already begun", txn_id=tid)
    alloc = table.allocated.get(tid)
    if alloc is None:
        raise TxnNotFoundError(
            f"transaction id {tid} was not allocated by this pchannel's TxnManager.begin", txn_id=tid
        )
    if alloc.claimed:
        raise InvalidTxnStateError(f"the BeginTxn of transaction {tid} is already being written", txn_id=tid)
    if m._vchannel != alloc.vchannel or keepalive_ms != alloc.keepalive_ms:
        raise InvalidArgumentError(
            f"BeginTxn of transaction {tid} on vchannel {m._vchannel!r} with keepalive {keepalive_ms} ms "
            f"does not match its allocation ({alloc.vchannel!r}, {alloc.keepalive_ms} ms)",
            txn_id=tid,
        )


def _check_rollback(v: TxnView, m: Message) -> None:
    s = v.session
    tid = s.txn_id
    if m._vchannel != s.vchannel:
        raise InvalidArgumentError(
            f"RollbackTxn of transaction {tid} is on vchannel {m._vchannel!r}, the transaction on {s.vchannel!r}",
            txn_id=tid,
        )
    state = v.state
    if state is TxnState.IN_FLIGHT:
        return
    closable = state is TxnState.EXPIRED or (state is TxnState.ROLLED_BACK and s.failure is not None)
    if closable and not s.rollback_written and not s._closing and not v.closing:
        v.closing = True
        return
    raise InvalidTxnStateError(
        f"RollbackTxn refused: transaction {tid} is {state.words}"
        + (" and its rollback is written or being written" if closable else ""),
        txn_id=tid,
    )


__all__ = ["TxnClaim", "TxnView", "claim_batch"]
