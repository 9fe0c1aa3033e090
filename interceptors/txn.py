"""txn: transaction sessions — validate every transactional message before anything is written.

A transaction is framed in the log by BeginTxn, bodies (ordinary messages carrying a ``TxnContext``)
and CommitTxn or RollbackTxn.  Readers hold it apart and deliver it whole at the commit's timestamp,
or never.  This step makes the writer side keep the promises readers rely on:

* **Ids.**  ``TxnManager.begin`` allocates the id (increasing per pchannel; after reopen it resumes at
  one above the largest id found in replay) and the caller builds the BeginTxn with the returned
  context (``TxnManager.begin_message`` does both).  A BeginTxn whose id was not allocated here, or
  was already begun, is refused.  The service should hand the id to a client only after the BeginTxn
  is durable: an id allocated but never written is not seen by replay and may be allocated again
  after a restart.
* **Clock.**  Time is the messages' own timestamps (the timetick step stamped them before this step),
  never wall time, so expiry is deterministic and replayable: a session is expired at ``ts`` when
  ``physical(ts) > physical(last_ts) + keepalive_ms``, where ``last_ts`` is the largest timestamp of
  its BeginTxn and written bodies.  Readers apply the same rule at their TimeTick barriers (and must
  take the largest timestamp too, not the last one read: bodies may land out of order).  Because a
  barrier at ``T`` is written only after every allocation below ``T`` finished, a message accepted
  here (not expired at its own timestamp) is never behind a barrier that expired its transaction.
* **Commit after every body.**  A commit must carry a timestamp larger than every body accepted
  for its transaction (including bodies still being written) — otherwise readers would deliver, at
  the commit's timestamp, a body stamped after it.  Once a commit is accepted the session is
  ON_COMMIT and refuses further bodies, so nothing can slip in with a larger timestamp; the commit
  then waits until the bodies in flight are written, so every body precedes the commit in the log.
  A commit that fails to be written (or whose wait ends with a body that failed) puts the session
  back IN_FLIGHT: the client learns the outcome and may retry.  The timestamp rule keeps a retry
  with the same timestamp (the redo step) safe.
* **All or nothing.**  A batch is validated as a whole, in order — it may begin, fill and commit a
  transaction, and mix several transactions with plain messages — and on the first invalid message
  the step raises and passes nothing down.  Claims (bodies in flight, commit or rollback in progress)
  are taken synchronously after validation and released if the write fails, so redo may run the
  same batch again.
* **Closing.**  RollbackTxn is accepted for a session that is IN_FLIGHT, and also, once, for one
  that will never commit (expired, or failed by an exclusive message): writing the record lets
  readers forget it at once, which matters when it has no keepalive.  Bodies and commits of such a
  session fail with TxnExpiredError or InvalidTxnStateError.
* **Recovery.**  Replay rebuilds the sessions from the log.  A transaction still open after replay
  can never be completed (its client lost its session with the old term), so it is expired and
  reported by ``take_orphans``; the owner writes ``rollback_message(session)`` for each.  It is
  never delivered, never half delivered.
"""

from __future__ import annotations

import asyncio
import enum
import heapq
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from interceptors.base import AppendNext
from wal.clock import txn_expired
from wal.errors import InvalidArgumentError, InvalidTxnStateError, TxnExpiredError, TxnNotFoundError
from wal.message import BROADCAST_VCHANNEL, AppendResult, Message, MessageID, MessageType, TxnContext

_BEGIN = MessageType.BEGIN_TXN
_COMMIT = MessageType.COMMIT_TXN
_ROLLBACK = MessageType.ROLLBACK_TXN
_TIME_TICK = MessageType.TIME_TICK
_FRAMING = frozenset({_BEGIN, _COMMIT, _ROLLBACK})


class TxnState(enum.Enum):
    """Where a session is in its life.  Only IN_FLIGHT accepts bodies."""

    IN_FLIGHT = "in_flight"
    ON_COMMIT = "on_commit"
    """A commit was accepted and waits for the bodies in flight or is being written."""
    COMMITTED = "committed"
    ON_ROLLBACK = "on_rollback"
    ROLLED_BACK = "rolled_back"
    """Rolled back by a RollbackTxn, or failed by an exclusive message (``failure`` says which)."""
    EXPIRED = "expired"

    @property
    def is_open(self) -> bool:
        """True while the transaction may still commit."""
        return self in _OPEN_STATES


_OPEN_STATES = frozenset({TxnState.IN_FLIGHT, TxnState.ON_COMMIT, TxnState.ON_ROLLBACK})
_WORDS = {
    TxnState.IN_FLIGHT: "in flight",
    TxnState.ON_COMMIT: "being committed",
    TxnState.COMMITTED: "committed",
    TxnState.ON_ROLLBACK: "being rolled back",
    TxnState.ROLLED_BACK: "rolled back",
    TxnState.EXPIRED: "expired",
}


class TxnSession:
    """One transaction as this pchannel's writer knows it (created when its BeginTxn is written)."""

    __slots__ = (
        "_body_failed",
        "_closing",
        "_commit_writing",
        "_own_bodies",
        "_waiter",
        "begin_id",
        "begin_ts",
        "failure",
        "inflight",
        "keepalive_ms",
        "last_ts",
        "max_body_ts",
        "rollback_written",
        "state",
        "txn_id",
        "vchannel",
    )

    def __init__(self, txn_id: int, vchannel: str, keepalive_ms: int, begin_id: MessageID, begin_ts: int) -> None:
        self.txn_id = txn_id
        self.vchannel = vchannel
        self.keepalive_ms = keepalive_ms
        self.state = TxnState.IN_FLIGHT
        self.begin_id = begin_id
        """Message id of the BeginTxn: a reader that must see this transaction whole starts there."""
        self.begin_ts = begin_ts
        self.last_ts = begin_ts
        """Largest timestamp of the BeginTxn and the bodies written so far (the expiry clock)."""
        self.max_body_ts = begin_ts
        """Largest timestamp of the bodies accepted so far, written or still in flight."""
        self.inflight = 0
        """Bodies accepted but not yet written (or failed)."""
        self.failure: str | None = None
        """Why an exclusive message failed the session, when it did."""
        self.rollback_written = False
        self._closing = False  # a RollbackTxn for an expired or failed session is being written
        self._own_bodies = 0  # bodies in the committing batch itself: the commit does not wait for them
        self._waiter: asyncio.Future[None] | None = None  # a commit waiting for the bodies in flight
        self._body_failed = False  # a body failed while a commit waited for it
        self._commit_writing = False  # the commit finished waiting and is being written

    def expired_at(self, ts: int) -> bool:
        """True when the session has been idle longer than its keepalive at timestamp ``ts``."""
        return txn_expired(self.keepalive_ms, self.last_ts, ts)

    @property
    def context(self) -> TxnContext:
        """The context its messages carry."""
        return TxnContext(self.txn_id, self.keepalive_ms)

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def __repr__(self) -> str:
        return (
            f"TxnSession(id={self.txn_id}, vchannel={self.vchannel!r}, state={self.state.name}, "
            f"begin_id={self.begin_id}, last_ts={self.last_ts}, inflight={self.inflight})"
        )


def rollback_message(session: TxnSession) -> Message:
    """A RollbackTxn for ``session`` (timestamp left to the timetick step)."""
    return Message(_ROLLBACK, session.vchannel, txn=session.context)


def commit_message(session: TxnSession) -> Message:
    """A CommitTxn for ``session`` (timestamp left to the timetick step)."""
    return Message(_COMMIT, session.vchannel, txn=session.context)


class _Allocation:
    """An id handed out by ``begin`` whose BeginTxn is not written yet."""

    __slots__ = ("claimed", "keepalive_ms", "vchannel")

    def __init__(self, vchannel: str, keepalive_ms: int) -> None:
        self.vchannel = vchannel
        self.keepalive_ms = keepalive_ms
        self.claimed = False  # a batch holding its BeginTxn is being written


class _View:
    """A session's state as seen from inside one batch (earlier messages of the batch applied)."""

    __slots__ = ("bodies", "closing", "last_ts", "max_body_ts", "prev_state", "session", "state")

    def __init__(self, session: TxnSession) -> None:
        self.session = session
        self.state = session.state
        self.prev_state = session.state
        self.last_ts = session.last_ts
        self.max_body_ts = session.max_body_ts
        self.bodies = 0
        self.closing = False  # the batch holds a RollbackTxn for this expired or failed session


class _Plan:
    """What one batch does to the sessions; claimed before writing, settled after."""

    __slots__ = ("begins", "commits", "new", "rollbacks", "views")

    def __init__(self) -> None:
        self.views: dict[int, _View] = {}
        self.new: dict[int, TxnSession] = {}  # begun by this batch: invisible to others until written
        self.begins: list[tuple[int, int]] = []  # (batch index, txn id)
        self.commits: list[tuple[_View, int]] = []  # (view, commit ts) of sessions begun earlier
        self.rollbacks: list[_View] = []


class TxnManager:
    """The transaction sessions of one pchannel; shared by the txn step and the steps around it.

    ``max_finished`` bounds how many finished sessions are remembered (so a late message gets a
    precise error rather than TxnNotFoundError); ``max_allocated`` bounds ids handed out whose
    BeginTxn never came.
    """

    def __init__(self, *, max_finished: int = 16384, max_allocated: int = 65536) -> None:
        self._next_id = 1
        self._allocated: OrderedDict[int, _Allocation] = OrderedDict()
        self._open: dict[int, TxnSession] = {}
        self._finished: OrderedDict[int, TxnSession] = OrderedDict()
        self._begin_heap: list[tuple[MessageID, int]] = []  # (begin id, txn id); stale entries popped lazily
        self._orphans: list[TxnSession] = []
        self._max_finished = max_finished
        self._max_allocated = max_allocated
        self.on_finish: Callable[[TxnSession], None] | None = None
        """Told of each open session as it ends (committed, rolled back or expired): for metrics."""

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
        if not isinstance(keepalive_ms, int) or isinstance(keepalive_ms, bool) or keepalive_ms < 0:
            raise InvalidArgumentError(f"keepalive_ms must be a non-negative int, got {keepalive_ms!r}")
        tid = self._next_id
        self._next_id = tid + 1
        allocated = self._allocated
        allocated[tid] = _Allocation(vchannel, keepalive_ms)
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
        return self._open.get(txn_id) or self._finished.get(txn_id)

    def open_sessions(self) -> list[TxnSession]:
        """Sessions that may still commit (IN_FLIGHT, ON_COMMIT, ON_ROLLBACK)."""
        return list(self._open.values())

    def min_open_begin_id(self) -> MessageID | None:
        """Smallest BeginTxn id of an open transaction: a reader that needs every transaction whole
        must start there.  Sessions that can no longer commit do not hold it back."""
        heap = self._begin_heap
        while heap and heap[0][1] not in self._open:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def fail_vchannel(self, vchannel: str, reason: str) -> list[TxnSession]:
        """Fail every open session of ``vchannel`` (every vchannel for a broadcast): an exclusive
        message changes what they were written against.  Their later bodies and commit fail with
        InvalidTxnStateError naming ``reason``.  A commit already being written is left to finish."""
        failed: list[TxnSession] = []
        for s in list(self._open.values()):
            if vchannel not in (BROADCAST_VCHANNEL, s.vchannel):
                continue
            if s._commit_writing:
                continue
            s.state = TxnState.ROLLED_BACK
            s.failure = reason
            self._finish(s)
            s._wake()
            failed.append(s)
        return failed

    def on_exclusive(self, vchannel: str, message: Message) -> None:
        """Callback for the lock step: an exclusive message is about to be written on ``vchannel``."""
        where = "every vchannel" if vchannel == BROADCAST_VCHANNEL else f"vchannel {vchannel!r}"
        self.fail_vchannel(vchannel, f"{message.message_type.name} on {where} failed the transaction")

    def expire(self, now_ts: int) -> list[TxnSession]:
        """Mark IN_FLIGHT sessions idle past their keepalive at ``now_ts`` as EXPIRED; return them.

        No message is needed: readers expire them by the same rule.  A session whose commit or
        rollback is in progress was checked against that message's own timestamp, and one with bodies
        in flight is not idle (once written they move ``last_ts``): both are left alone.
        """
        out = [
            s for s in self._open.values()
            if s.state is TxnState.IN_FLIGHT and not s.inflight and s.expired_at(now_ts)
        ]
        for s in out:
            s.state = TxnState.EXPIRED
            self._finish(s)
        return out

    def take_orphans(self) -> list[TxnSession]:
        """Sessions found open by recovery and expired; each needs a ``rollback_message``.  Once."""
        out, self._orphans = self._orphans, []
        return out

    def _finish(self, s: TxnSession) -> None:
        if self.on_finish is not None and s.txn_id in self._open:
            self.on_finish(s)
        self._open.pop(s.txn_id, None)
        fin = self._finished
        fin[s.txn_id] = s
        fin.move_to_end(s.txn_id)
        while len(fin) > self._max_finished:
            fin.popitem(last=False)

    def _register(self, s: TxnSession) -> None:
        if s.state.is_open:
            self._open[s.txn_id] = s
            heapq.heappush(self._begin_heap, (s.begin_id, s.txn_id))
        else:
            self._finish(s)

    # --- recovery --------------------------------------------------------------------------------
    def replay(self, batch: list[Message]) -> None:
        """Apply stored messages (in id order) to the sessions."""
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
                self._allocated.pop(tid, None)
                self._register(TxnSession(tid, m._vchannel, txn.keepalive_ms, m._id, ts))
                continue
            s = self._open.get(tid)
            if s is None:
                if t is _ROLLBACK:  # the rollback written for an orphan of an earlier recovery
                    done = self._finished.get(tid)
                    if done is not None:
                        done.rollback_written = True
                continue  # began before the replayed range: nothing to rebuild
            if t is _COMMIT:
                s.state = TxnState.COMMITTED
                self._finish(s)
            elif t is _ROLLBACK:
                s.state = TxnState.ROLLED_BACK
                s.rollback_written = True
                self._finish(s)
            else:
                s.last_ts = max(s.last_ts, ts)
                s.max_body_ts = max(s.max_body_ts, ts)

    def export_state(self) -> dict[str, Any]:
        """What recovery needs that replay would rebuild: the next id (ids are never reused).

        Only at a point that no open transaction spans: a session's BeginTxn must stay replayable, so
        its state never has to be carried over (the retention step cuts below the oldest BeginTxn).
        """
        if self._open:
            raise InvalidArgumentError(
                f"cannot snapshot transaction state with {len(self._open)} transaction(s) open",
                txn_id=min(self._open),
            )
        return {"next_txn_id": self._next_id}

    def import_state(self, state: dict[str, Any]) -> None:
        self._next_id = max(self._next_id, int(state["next_txn_id"]))

    def finish_recovery(self) -> None:
        """Expire every session still open after replay and keep it for ``take_orphans``."""
        for s in list(self._open.values()):
            s.state = TxnState.EXPIRED
            self._finish(s)
            self._orphans.append(s)

    # --- the append path -------------------------------------------------------------------------
    def _view(self, plan: _Plan, tid: int) -> _View:
        v = plan.views.get(tid)
        if v is not None:
            return v
        s = self._open.get(tid) or self._finished.get(tid)
        if s is None:
            if tid in self._allocated:
                raise TxnNotFoundError(f"transaction {tid} has not begun: its BeginTxn is not written", txn_id=tid)
            raise TxnNotFoundError(f"transaction {tid} does not exist on this pchannel", txn_id=tid)
        v = plan.views[tid] = _View(s)
        return v

    def _refuse(self, v: _View, m: Message, what: str) -> None:
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
                if self._open.get(tid) is s and not s.inflight and not v.bodies:
                    # A fact about time, kept though nothing is written.  Not while bodies are in flight:
                    # once written they move last_ts, and a message stamped earlier may still be valid.
                    s.state = TxnState.EXPIRED
                    self._finish(s)
                raise TxnExpiredError(
                    f"transaction {tid} expired: idle more than {s.keepalive_ms} ms at ts {m._timetick}", txn_id=tid
                )
            return
        if state is TxnState.EXPIRED:
            raise TxnExpiredError(f"transaction {tid} expired", txn_id=tid)
        if state is TxnState.ROLLED_BACK and s.failure is not None:
            raise InvalidTxnStateError(f"transaction {tid} was failed: {s.failure}", txn_id=tid, reason=s.failure)
        raise InvalidTxnStateError(f"{what} refused: transaction {tid} is {_WORDS[state]}", txn_id=tid)

    def _plan(self, batch: list[Message]) -> _Plan | None:
        """Validate the batch and take its claims; None when it holds nothing transactional."""
        plan: _Plan | None = None
        for i, m in enumerate(batch):
            txn = m._txn
            t = m._type
            if txn is None:
                if t in _FRAMING:
                    raise InvalidArgumentError(f"{t.name} without a transaction context")
                continue
            if plan is None:
                plan = _Plan()
            tid = txn.txn_id
            if t is _BEGIN:
                self._check_begin(plan, m, tid, txn.keepalive_ms)
                s = TxnSession(tid, m._vchannel, txn.keepalive_ms, -1, m._timetick)
                plan.new[tid] = s
                plan.views[tid] = _View(s)
                plan.begins.append((i, tid))
                continue
            if t is _TIME_TICK or t.is_exclusive:
                raise InvalidArgumentError(f"a {t.name} message cannot be part of transaction {tid}", txn_id=tid)
            v = self._view(plan, tid)
            ts = m._timetick
            if t is _COMMIT:
                self._refuse(v, m, "CommitTxn")
                if ts <= v.max_body_ts:
                    raise InvalidTxnStateError(
                        f"CommitTxn of transaction {tid} at ts {ts} is not after its body or BeginTxn at ts "
                        f"{v.max_body_ts} (a body was appended concurrently with the commit); commit again",
                        txn_id=tid,
                    )
                v.state = TxnState.ON_COMMIT
                if tid not in plan.new:
                    plan.commits.append((v, ts))
            elif t is _ROLLBACK:
                self._check_rollback(v, m)
                if v.state is TxnState.IN_FLIGHT:
                    v.state = TxnState.ON_ROLLBACK
                if tid not in plan.new:
                    plan.rollbacks.append(v)
            else:
                self._refuse(v, m, "body")
                v.bodies += 1
                v.last_ts = max(v.last_ts, ts)
                v.max_body_ts = max(v.max_body_ts, ts)
        if plan is not None:
            self._claim(plan)
        return plan

    def _check_begin(self, plan: _Plan, m: Message, tid: int, keepalive_ms: int) -> None:
        if tid in plan.views or tid in self._open or tid in self._finished:
            raise InvalidTxnStateError(f"transaction {tid} has already begun", txn_id=tid)
        alloc = self._allocated.get(tid)
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

    @staticmethod
    def _check_rollback(v: _View, m: Message) -> None:
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
            f"RollbackTxn refused: transaction {tid} is {_WORDS[state]}"
            + (" and its rollback is written or being written" if closable else ""),
            txn_id=tid,
        )

    def _claim(self, plan: _Plan) -> None:
        """Make the batch's intent visible to other batches (synchronously after validation)."""
        for _, tid in plan.begins:
            self._allocated[tid].claimed = True
        for tid, v in plan.views.items():
            if tid in plan.new:
                continue
            s = v.session
            if v.bodies:
                s.inflight += v.bodies
                s.max_body_ts = max(s.max_body_ts, v.max_body_ts)
        for v, _ in plan.commits:
            s = v.session
            s.state = TxnState.ON_COMMIT
            s._own_bodies = v.bodies
            s._body_failed = False
        for v in plan.rollbacks:
            s = v.session
            if v.prev_state is TxnState.IN_FLIGHT:
                s.state = TxnState.ON_ROLLBACK
            else:
                s._closing = True

    async def _wait(self, plan: _Plan) -> None:
        """Commits wait for their sessions' bodies in flight in other batches, then are rechecked."""
        loop: asyncio.AbstractEventLoop | None = None
        for v, ts in plan.commits:
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
                why = s.failure or _WORDS[s.state]
                raise InvalidTxnStateError(f"CommitTxn refused: transaction {tid} was failed: {why}",
                                           txn_id=tid, reason=why)
            if s._body_failed:
                raise InvalidTxnStateError(
                    f"CommitTxn refused: a body of transaction {tid} failed while the commit waited for it",
                    txn_id=tid,
                )
            if txn_expired(s.keepalive_ms, max(s.last_ts, v.last_ts), ts):
                raise TxnExpiredError(f"transaction {tid} expired before its commit at ts {ts}", txn_id=tid)
        for v, _ in plan.commits:
            v.session._commit_writing = True

    def _settle(self, plan: _Plan, results: list[AppendResult]) -> None:
        """The batch is durable: apply it."""
        for i, tid in plan.begins:
            self._allocated.pop(tid, None)
            s = plan.new[tid]
            s.begin_id = results[i].message_id
        for tid, v in plan.views.items():
            s = v.session
            if tid in plan.new:
                s.last_ts = v.last_ts
                s.max_body_ts = v.max_body_ts
                s.state = {TxnState.ON_COMMIT: TxnState.COMMITTED, TxnState.ON_ROLLBACK: TxnState.ROLLED_BACK}.get(
                    v.state, v.state
                )
                s.rollback_written = s.state is TxnState.ROLLED_BACK
                self._register(s)
                continue
            if v.bodies:
                s.inflight -= v.bodies
                s.last_ts = max(s.last_ts, v.last_ts)
                s._wake()
        for v, _ in plan.commits:
            s = v.session
            s._commit_writing = False
            s.state = TxnState.COMMITTED
            self._finish(s)
        for v in plan.rollbacks:
            s = v.session
            s.rollback_written = True
            s._closing = False
            if s.state is TxnState.ON_ROLLBACK:
                s.state = TxnState.ROLLED_BACK
            self._finish(s)

    def _abort(self, plan: _Plan) -> None:
        """The batch was not written: release its claims so the same batch can be tried again."""
        for _, tid in plan.begins:
            alloc = self._allocated.get(tid)
            if alloc is not None:
                alloc.claimed = False
        for v, _ in plan.commits:
            s = v.session
            s._commit_writing = False
            if s.state is TxnState.ON_COMMIT:
                s.state = TxnState.IN_FLIGHT
                s._body_failed = False
        for v in plan.rollbacks:
            s = v.session
            s._closing = False
            if s.state is TxnState.ON_ROLLBACK:
                s.state = TxnState.IN_FLIGHT
        for tid, v in plan.views.items():
            if tid in plan.new or not v.bodies:
                continue
            s = v.session
            s.inflight -= v.bodies
            if s.state is TxnState.ON_COMMIT:
                s._body_failed = True  # the commit waiting for this body must not go ahead without it
            s._wake()


class TxnInterceptor:
    """The txn step: validates transactional messages against ``manager`` before they are written."""

    name = "txn"

    def __init__(self, manager: TxnManager) -> None:
        self.manager = manager

    async def do_append(self, batch: list[Message], append_next: AppendNext) -> list[AppendResult]:
        """Validate ``batch``, wait for what its commits need, write it, then apply it."""
        for m in batch:  # the common batch holds nothing transactional: one cheap pass, then through
            if m._txn is not None or m._type in _FRAMING:
                break
        else:
            return await append_next(batch)
        mgr = self.manager
        plan = mgr._plan(batch)
        if plan is None:
            return await append_next(batch)
        try:
            if plan.commits:
                await mgr._wait(plan)
            results = await append_next(batch)
        except BaseException:
            mgr._abort(plan)
            raise
        mgr._settle(plan, results)
        return results

    def replay(self, batch: list[Message]) -> None:
        """Rebuild sessions from stored messages (see ``TxnManager.replay``)."""
        self.manager.replay(batch)

    def export_state(self) -> dict[str, Any]:
        """See ``TxnManager.export_state``."""
        return self.manager.export_state()

    def import_state(self, state: dict[str, Any]) -> None:
        self.manager.import_state(state)

    async def recovered(self) -> None:
        """Expire what replay left open; the owner collects them with ``take_orphans``."""
        self.manager.finish_recovery()

    async def close(self) -> None:
        """Nothing to release: sessions live in the manager."""
        return None


__all__ = ["TxnInterceptor", "TxnManager", "TxnSession", "TxnState", "commit_message", "rollback_message"]
