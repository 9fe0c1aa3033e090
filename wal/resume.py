"""The rule of ``Position``: how a read resumes after a position, in one place.

A position's ``message_id`` is the smallest id not yet fully delivered (messages are released in
timestamp order, not id order), so resuming reads from that id (``StartFrom``, inclusive) and lets
through only what has a timetick above the position's (``TimeTickGT``): exactly what came after it,
nothing twice.  Every reader that resumes (a consumer group, a reconnecting consumer, the flusher from
its checkpoint, the Spark source) builds its read here.
"""

from __future__ import annotations

from collections.abc import Iterable

from wal.message import MessageID
from wal.options import DeliverFilter, DeliverPolicy


def resume_after(
    message_id: MessageID, timetick: int, filters: Iterable[DeliverFilter] = (),
) -> tuple[DeliverPolicy, tuple[DeliverFilter, ...]]:
    """The policy and filters (``filters`` plus the timetick cut) that deliver exactly what comes after
    the position ``(message_id, timetick)``."""
    return DeliverPolicy.start_from(message_id), (*filters, DeliverFilter.timetick_gt(timetick))


__all__ = ["resume_after"]
