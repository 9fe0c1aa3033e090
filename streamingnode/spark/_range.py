"""Reading one range of the log, ``(start, end]`` by position, and finding where ranges end.

A message lies before an offset iff its *visible* timetick is <= the offset's: a plain message's own
timetick, a transaction body's commit timetick (the node delivers a committed body whole, in the pack
of its commit, with each message keeping the timetick it was appended at).  That is what the resume
rule of ``Position`` skips when reading after the offset, so ``read_range(a, b)`` followed by
``read_range(b, c)`` delivers every message once, and a transaction falls wholly on one side: never
split.  Rolled-back bodies are never delivered by the node at all.

A range is read by a consumer that resumes after ``start`` and takes packs until one ends at or after
``end``'s timetick: every message visible by then has been delivered (packs come in timetick order and
the node ticks, so that pack comes within a tick interval even when nothing is written).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from streamingnode.spark._options import Offset
from wal.message import Message, MessageType, Position
from wal.options import DeliverFilter, DeliverPolicy
from wal.resume import resume_after

_FRAMING = frozenset({MessageType.TIME_TICK, MessageType.BEGIN_TXN, MessageType.COMMIT_TXN,
                      MessageType.ROLLBACK_TXN})


class ReadStalledError(TimeoutError):
    """No pack came for the read's timeout: the node stopped ticking or cannot be reached."""


def read_policy(start: Offset, types: tuple[int, ...]) -> tuple[DeliverPolicy, list[DeliverFilter]]:
    """The policy and filters that deliver exactly what comes after ``start``."""
    filters: list[DeliverFilter] = []
    if types:
        filters.append(DeliverFilter.message_type([MessageType(t) for t in types]))
    if start.message_id >= 0:
        policy, resumed = resume_after(start.message_id, start.timetick, filters)
        return policy, list(resumed)
    if start.timetick <= 0:
        return DeliverPolicy.all(), filters
    # A time without an id (startingOffsets as a time): the time index finds the first id, the cut is the same.
    return DeliverPolicy.start_at_time(start.timetick + 1), [*filters, DeliverFilter.timetick_gt(start.timetick)]


def visible_messages(messages: list[Message]) -> Iterator[tuple[Message, int]]:
    """The data messages of a pack, each with the timetick it became visible at (framing dropped)."""
    commits = {m.txn.txn_id: m.timetick for m in messages
               if m.message_type is MessageType.COMMIT_TXN and m.txn is not None}
    for m in messages:
        if m.message_type in _FRAMING:
            continue
        txn = m.txn
        yield m, m.timetick if txn is None else commits.get(txn.txn_id, m.timetick)


def read_range(client: Any, start: Offset, end: Offset, vchannel: str, types: tuple[int, ...], *,
               timeout: float) -> Iterator[tuple[Message, int]]:
    """Every data message of ``vchannel`` ("" = the whole pchannel) visible after ``start`` and at or
    before ``end``, in delivery order, with its visible timetick.  ``client`` is a sync ``Client``."""
    if end.timetick <= start.timetick:
        return
    policy, filters = read_policy(start, types)
    consumer = client.consumer(start.pchannel, vchannel, policy=policy, filters=filters)
    try:
        consumer.wait_opened()
        while True:
            pack = consumer.next(timeout=timeout)
            if pack is None:
                raise ReadStalledError(
                    f"no pack from {start.pchannel!r}/{vchannel!r} within {timeout} s while reading up to "
                    f"timetick {end.timetick}")
            for m, visible in visible_messages(pack.messages):
                if visible <= end.timetick:
                    yield m, visible
            if pack.end_ts >= end.timetick:
                return
    finally:
        consumer.close()


def offset_of(position: Position | None, pchannel: str, fallback: Offset) -> Offset:
    if position is None:
        return fallback
    return Offset(pchannel, position.message_id, position.timetick)


def latest(client: Any, pchannel: str, fallback: Offset) -> Offset:
    """The node's latest position: everything written so far lies before it (``fallback``: empty log)."""
    position, _ = client.latest_position(pchannel)
    return offset_of(position, pchannel, fallback)


def end_after(client: Any, start: Offset, limit: Offset, *, vchannels: tuple[str, ...], types: tuple[int, ...],
              max_messages: int, timeout: float) -> Offset:
    """The end of the first whole packs after ``start`` holding >= ``max_messages`` data messages of
    ``vchannels`` (all when empty), or ``limit`` when fewer lie before it.  A pack is never cut: a
    transaction larger than the limit makes a larger range."""
    if limit.timetick <= start.timetick:
        return start
    policy, filters = read_policy(start, types)
    # The node splits a tick's release into parts of at most this many messages, each ending at a
    # position that resumes exactly after it (a transaction is never split): so a range can end
    # inside a tick when one tick released more than the limit.
    consumer = client.consumer(start.pchannel, "", policy=policy, filters=filters,
                               max_pack_messages=min(max_messages, 65536))
    count = 0
    try:
        consumer.wait_opened()
        while True:
            pack = consumer.next(timeout=timeout)
            if pack is None:
                raise ReadStalledError(f"no pack from {start.pchannel!r} within {timeout} s")
            if pack.end_ts >= limit.timetick:
                return limit
            count += sum(1 for m, _ in visible_messages(pack.messages)
                         if not vchannels or m.vchannel in vchannels or m.vchannel == "")
            if count >= max_messages:
                pos = pack.end_position
                return Offset(start.pchannel, pos.message_id, pos.timetick)
    finally:
        consumer.close()


__all__ = ["ReadStalledError", "end_after", "latest", "offset_of", "read_policy", "read_range", "visible_messages"]
