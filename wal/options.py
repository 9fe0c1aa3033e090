"""How a reader asks for messages: a deliver policy (where to start) and filters (what to skip)."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from wal.errors import InvalidArgumentError
from wal.message import MessageID, MessageType


class PolicyKind(enum.Enum):
    ALL = "all"
    LATEST = "latest"
    START_FROM = "start_from"
    START_AFTER = "start_after"
    START_AT_TIME = "start_at_time"


@dataclass(frozen=True, slots=True)
class DeliverPolicy:
    """Where a scanner starts.  Build one with the class methods."""

    kind: PolicyKind
    message_id: MessageID | None = None
    timetick: int | None = None

    @classmethod
    def all(cls) -> DeliverPolicy:
        """From the first retained message."""
        return cls(PolicyKind.ALL)

    @classmethod
    def latest(cls) -> DeliverPolicy:
        """Only messages appended after the scanner opens."""
        return cls(PolicyKind.LATEST)

    @classmethod
    def start_from(cls, message_id: MessageID) -> DeliverPolicy:
        """From ``message_id``, inclusive."""
        _check_id(message_id)
        return cls(PolicyKind.START_FROM, message_id=message_id)

    @classmethod
    def start_after(cls, message_id: MessageID) -> DeliverPolicy:
        """From just after ``message_id``, exclusive."""
        _check_id(message_id)
        return cls(PolicyKind.START_AFTER, message_id=message_id)

    @classmethod
    def start_at_time(cls, timetick: int) -> DeliverPolicy:
        """Messages with a timestamp >= ``timetick``, found through the time index."""
        if timetick < 0:
            raise InvalidArgumentError(f"timetick must be >= 0, got {timetick}")
        return cls(PolicyKind.START_AT_TIME, timetick=timetick)


def _check_id(message_id: MessageID) -> None:
    if not isinstance(message_id, int) or isinstance(message_id, bool) or message_id < 0:
        raise InvalidArgumentError(f"message id must be a non-negative int, got {message_id!r}")


class FilterKind(enum.Enum):
    TIMETICK_GT = "timetick_gt"
    TIMETICK_GTE = "timetick_gte"
    MESSAGE_TYPE = "message_type"


@dataclass(frozen=True, slots=True)
class DeliverFilter:
    """A condition every delivered message meets.  System messages always pass type filters."""

    kind: FilterKind
    timetick: int = 0
    types: frozenset[MessageType] = field(default_factory=frozenset)

    @classmethod
    def timetick_gt(cls, ts: int) -> DeliverFilter:
        return cls(FilterKind.TIMETICK_GT, timetick=ts)

    @classmethod
    def timetick_gte(cls, ts: int) -> DeliverFilter:
        return cls(FilterKind.TIMETICK_GTE, timetick=ts)

    @classmethod
    def message_type(cls, types: Iterable[MessageType]) -> DeliverFilter:
        chosen = frozenset(MessageType(t) for t in types)
        if not chosen:
            raise InvalidArgumentError("a message type filter needs at least one type")
        return cls(FilterKind.MESSAGE_TYPE, types=chosen)


@dataclass(frozen=True, slots=True)
class ReadOption:
    """What a scanner reads.

    ``vchannel`` None reads every vchannel of the pchannel; a name reads that vchannel plus broadcast
    messages.  ``read_batch_bytes`` bounds each catch-up read from storage.

    ``lazy`` is for a reader that needs every message but not within milliseconds (the flusher): once
    caught up it wakes only when a TimeTick arrives (every tick interval while data is written, or
    when asked for with ``WAL.want_tick``), not after every commit, and it does not keep the node
    emitting a tick after every append, which only readers that wait on the tail need.
    """

    vchannel: str | None = None
    deliver_policy: DeliverPolicy = field(default_factory=DeliverPolicy.all)
    deliver_filters: tuple[DeliverFilter, ...] = ()
    read_batch_bytes: int = 1 << 20
    lazy: bool = False

    def min_timetick(self) -> tuple[int, bool]:
        """The tightest timestamp lower bound of the filters: (ts, inclusive)."""
        ts, inclusive = 0, True
        for f in self.deliver_filters:
            if f.kind is FilterKind.TIMETICK_GT and (f.timetick > ts or (f.timetick == ts and inclusive)):
                ts, inclusive = f.timetick, False
            elif f.kind is FilterKind.TIMETICK_GTE and f.timetick > ts:
                ts, inclusive = f.timetick, True
        return ts, inclusive

    def message_types(self) -> frozenset[MessageType] | None:
        """Types allowed by every type filter (their intersection), or None for no type filter."""
        allowed: frozenset[MessageType] | None = None
        for f in self.deliver_filters:
            if f.kind is FilterKind.MESSAGE_TYPE:
                allowed = f.types if allowed is None else allowed & f.types
        return allowed


__all__ = ["DeliverFilter", "DeliverPolicy", "FilterKind", "PolicyKind", "ReadOption"]
