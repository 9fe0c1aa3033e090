"""Delivery units of a MsgPack, and cutting a pack into parts at unit boundaries.

A *delivery unit* is what a reader must receive whole: one plain message, or one transaction from
its BeginTxn to its CommitTxn (or RollbackTxn).  ``delivery_units`` is the one statement of that
rule; the node cuts oversized packs with it (``split_pack``) and the CLI finds where it may ack a
pack it printed only in part.

A part of a pack ends at the timetick of its last unit (a transaction's is its commit), and its end
position resumes there: the pack's start id with ``timetick_gt`` = that timetick delivers exactly
the rest of the pack, by the resume rule of ``Position``.

A part that still does not fit one response (a unit larger than the limit: a big transaction) is
sent over consecutive responses (``MsgPack.continued``) that the client reassembles;
``continued_runs`` cuts it at message boundaries by ``wire_bound``, an upper bound of each message's
encoded size, so every response fits.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator, Sequence

from wal.message import Message, MessageType, Position
from wal.scanner import MsgPack

MESSAGE_OVERHEAD = 256
"""Bytes counted per message on top of its payload when sizing a part: headers, properties and
framing, roughly."""

WIRE_MESSAGE_OVERHEAD = 128
"""Most bytes a message's encoding adds to its payload, vchannel and properties (in MsgPack.messages
or MsgPack.columns): every fixed field with its tag, ids, the txn context, the length prefixes."""
WIRE_PROPERTY_OVERHEAD = 18
"""Most bytes one property's map entry adds to its key and value (tags and length prefixes)."""

_BEGIN = MessageType.BEGIN_TXN
_TXN_END = (MessageType.COMMIT_TXN, MessageType.ROLLBACK_TXN)


def delivery_units(messages: Sequence[Message]) -> Iterator[tuple[int, int]]:
    """The delivery units of ``messages`` (a pack's, in delivery order) as ``(start, stop)`` index
    pairs: unit ``k`` is ``messages[start:stop]``, and the units cover ``messages`` in order.

    A transaction runs from its BeginTxn to the next CommitTxn or RollbackTxn; every other message is
    a unit of its own.  A transaction still open at the end of ``messages`` is one last unit.
    """
    start = 0
    in_txn = False
    for i, m in enumerate(messages):  # private fields: this runs per message of a transactional pack
        t = m._type
        if t is _BEGIN:
            in_txn = True
        elif t in _TXN_END:
            in_txn = False
        if not in_txn:
            yield start, i + 1
            start = i + 1
    if start < len(messages):
        yield start, len(messages)


def split_pack(pack: MsgPack, limit: int, max_bytes: int) -> list[tuple[MsgPack, int]]:
    """Split a pack of more than ``limit`` messages or ``max_bytes`` (payload plus
    ``MESSAGE_OVERHEAD`` per message) at unit boundaries, so that every part fits a client's receive
    limit; each part comes with its payload bytes (for metrics).

    A part is closed as soon as its units reach ``limit`` messages or ``max_bytes``, so a part exceeds
    a limit only by its last unit (a transaction larger than the limits goes out whole, alone or at
    the end of a part).  Parts concatenate to the pack; the last one ends where the pack ends.
    """
    messages = pack.messages
    lens = list(map(len, [m._payload for m in messages]))
    payload = sum(lens)
    if len(messages) <= limit and payload + MESSAGE_OVERHEAD * len(messages) <= max_bytes:
        return [(pack, payload)]
    if _BEGIN not in [m._type for m in messages]:
        return _split_plain(pack, lens, limit, max_bytes)
    return _split_units(pack, lens, limit, max_bytes)


def _split_units(pack: MsgPack, lens: list[int], limit: int, max_bytes: int) -> list[tuple[MsgPack, int]]:
    """``split_pack`` unit by unit, for packs that hold transactions."""
    messages = pack.messages
    pchannel, start_id = pack.start_position.pchannel, pack.start_position.message_id
    parts: list[tuple[MsgPack, int]] = []
    begin_ts, start = pack.begin_ts, pack.start_position
    first = 0  # index of the first message of the open part
    size = payload = 0
    for i, stop in delivery_units(messages):
        n = sum(lens[i:stop])
        payload += n
        size += n + MESSAGE_OVERHEAD * (stop - i)
        if size >= max_bytes or stop - first >= limit:
            boundary = messages[stop - 1]._timetick
            end = Position(pchannel, start_id, boundary)
            parts.append((MsgPack(begin_ts, boundary, messages[first:stop], start, end), payload))
            begin_ts, start, first, size, payload = boundary, end, stop, 0, 0
    if first < len(messages) or not parts:
        parts.append((MsgPack(begin_ts, pack.end_ts, messages[first:], start, pack.end_position), payload))
    else:
        # The last unit ended exactly at a cut: that part closes the pack.
        last, nbytes = parts[-1]
        parts[-1] = (MsgPack(last.begin_ts, pack.end_ts, last.messages, last.start_position, pack.end_position),
                     nbytes)
    return parts


def _split_plain(pack: MsgPack, lens: list[int], limit: int, max_bytes: int) -> list[tuple[MsgPack, int]]:
    """``split_pack`` for a pack without transactions (every message is a unit of its own): the same
    cuts, found by bisecting the running size instead of a Python step per message (this runs for
    every message of a catch-up read)."""
    messages = pack.messages
    n = len(messages)
    cum = list(itertools.accumulate(x + MESSAGE_OVERHEAD for x in lens))
    pchannel, start_id = pack.start_position.pchannel, pack.start_position.message_id
    parts: list[tuple[MsgPack, int]] = []
    begin_ts, start = pack.begin_ts, pack.start_position
    i = 0
    base = 0
    while i < n:
        # The part ends at the first message that brings it to max_bytes, or at `limit` messages.
        end = min(i + limit, bisect.bisect_left(cum, base + max_bytes, i) + 1, n)
        chunk = messages[i:end]
        nbytes = cum[end - 1] - base - MESSAGE_OVERHEAD * (end - i)
        if end == n:
            parts.append((MsgPack(begin_ts, pack.end_ts, chunk, start, pack.end_position), nbytes))
        else:
            boundary = chunk[-1]._timetick
            pos = Position(pchannel, start_id, boundary)
            parts.append((MsgPack(begin_ts, boundary, chunk, start, pos), nbytes))
            begin_ts, start = boundary, pos
        base = cum[end - 1]
        i = end
    return parts


def wire_bound(m: Message) -> int:
    """An upper bound of ``m``'s encoded size in a ConsumeResponse (either form)."""
    n = len(m._payload) + len(m._vchannel.encode()) + WIRE_MESSAGE_OVERHEAD
    for k, v in m._properties.items():
        n += len(k.encode()) + len(v.encode()) + WIRE_PROPERTY_OVERHEAD
    return n


def continued_runs(messages: Sequence[Message], budget: int) -> list[tuple[int, int]]:
    """Cut ``messages`` into consecutive runs, as ``(start, stop)`` index pairs, whose ``wire_bound``
    sums stay within ``budget`` bytes; a message larger than that alone is a run of its own (a single
    message is never cut).  Runs cover ``messages`` in order; there is at least one."""
    runs: list[tuple[int, int]] = []
    start = size = 0
    for i, m in enumerate(messages):
        n = wire_bound(m)
        if i > start and size + n > budget:
            runs.append((start, i))
            start, size = i, 0
        size += n
    runs.append((start, len(messages)))
    return runs


__all__ = [
    "MESSAGE_OVERHEAD",
    "WIRE_MESSAGE_OVERHEAD",
    "WIRE_PROPERTY_OVERHEAD",
    "continued_runs",
    "delivery_units",
    "split_pack",
    "wire_bound",
]
