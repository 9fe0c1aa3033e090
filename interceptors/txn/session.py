"""Transaction sessions: a session's state, the table of one pchannel's sessions, and the framing
messages that end a session.

Attributes of ``TxnSession`` and ``SessionTable`` with a leading underscore belong to this package
(the manager and the claims of batches being written); callers read the public ones.
"""

from __future__ import annotations

import asyncio
import enum
import heapq
from collections import OrderedDict
from collections.abc import Callable

from wal.clock import txn_expired
from wal.message import Message, MessageID, MessageType, TxnContext

FRAMING = frozenset({MessageType.BEGIN_TXN, MessageType.COMMIT_TXN, MessageType.ROLLBACK_TXN})
"""The message types that frame a transaction: each must carry a transaction context."""


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

    @property
    def words(self) -> str:
        """The state as error messages say it ("being committed")."""
        return _WORDS[self]


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
        "messages",
        "nbytes",
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
        self.messages = 0
        """Bodies accepted so far, written or still in flight: held to the table's ``max_messages``."""
        self.nbytes = 0
        """Their bytes (``message_bytes``), held to the table's ``max_bytes``."""
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
    return Message(MessageType.ROLLBACK_TXN, session.vchannel, txn=session.context)


def commit_message(session: TxnSession) -> Message:
    """A CommitTxn for ``session`` (timestamp left to the timetick step)."""
    return Message(MessageType.COMMIT_TXN, session.vchannel, txn=session.context)


def message_bytes(m: Message) -> int:
    """What a body counts toward its transaction's byte bound: payload, vchannel and properties, as
    the node's ``max_message_bytes`` counts a produced message."""
    n = len(m.payload) + len(m.vchannel)
    props = m.properties
    if props:
        for k, v in props.items():
            n += len(k) + len(v)
    return n


class Allocation:
    """An id handed out by ``TxnManager.begin`` whose BeginTxn is not written yet."""

    __slots__ = ("claimed", "keepalive_ms", "vchannel")

    def __init__(self, vchannel: str, keepalive_ms: int) -> None:
        self.vchannel = vchannel
        self.keepalive_ms = keepalive_ms
        self.claimed = False
        """A batch holding its BeginTxn is being written."""


class SessionTable:
    """The sessions of one pchannel by id: open, recently finished, and allocated ids whose BeginTxn
    is not written yet.  The manager and the claims of the batches being written share it.

    ``max_finished`` bounds how many finished sessions are remembered (so a late message gets a
    precise error rather than TxnNotFoundError).  ``max_messages`` and ``max_bytes`` bound the bodies
    of one transaction (see ``claim.py``): what the node must hold and deliver as one unit.
    """

    __slots__ = ("allocated", "begin_heap", "finished", "max_bytes", "max_finished", "max_messages", "on_finish",
                 "open")

    def __init__(self, max_finished: int, max_messages: int | None = None, max_bytes: int | None = None) -> None:
        self.max_messages = max_messages
        """Most bodies one transaction may hold (None: unbounded)."""
        self.max_bytes = max_bytes
        """Most ``message_bytes`` the bodies of one transaction may hold (None: unbounded)."""
        self.allocated: OrderedDict[int, Allocation] = OrderedDict()
        self.open: dict[int, TxnSession] = {}
        self.finished: OrderedDict[int, TxnSession] = OrderedDict()
        self.begin_heap: list[tuple[MessageID, int]] = []
        """(begin id, txn id) of sessions registered open; entries of ended sessions are popped lazily."""
        self.max_finished = max_finished
        self.on_finish: Callable[[TxnSession], None] | None = None
        """Told of each open session as it ends (committed, rolled back or expired)."""

    def get(self, txn_id: int) -> TxnSession | None:
        """The session of ``txn_id`` (open or recently finished), or None."""
        return self.open.get(txn_id) or self.finished.get(txn_id)

    def finish(self, s: TxnSession) -> None:
        """Move ``s`` (in its final state) from the open sessions to the finished ones."""
        if self.on_finish is not None and s.txn_id in self.open:
            self.on_finish(s)
        self.open.pop(s.txn_id, None)
        fin = self.finished
        fin[s.txn_id] = s
        fin.move_to_end(s.txn_id)
        while len(fin) > self.max_finished:
            fin.popitem(last=False)

    def register(self, s: TxnSession) -> None:
        """Record a session whose BeginTxn is written: open, or finished when its batch ended it."""
        if s.state.is_open:
            self.open[s.txn_id] = s
            heapq.heappush(self.begin_heap, (s.begin_id, s.txn_id))
        else:
            self.finish(s)


__all__ = [
    "FRAMING",
    "Allocation",
    "SessionTable",
    "TxnSession",
    "TxnState",
    "commit_message",
    "message_bytes",
    "rollback_message",
]
