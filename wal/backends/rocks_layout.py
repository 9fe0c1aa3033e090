"""Helpers shared by backends that recover channel state from stored blocks, and the binary parts of
the RocksDB key layout (``wal.backends.rocks``'s docstring), which the offline verify and salvage
tools read and write too: one definition, so the three cannot drift apart."""

from __future__ import annotations

import struct

from wal._codec import decode_block
from wal.backend import ChannelInfo
from wal.errors import CodecError, CorruptedError
from wal.message import MessageID

U32 = struct.Struct(">I")
"""A channel key (after the one-byte kind of a key)."""
KEY_ID = struct.Struct(">IQ")
"""A channel key and a message id or timetick: D and T keys."""
TICK_VALUE = struct.Struct(">QQ")
"""A T key's value: the tick's message id and its resume id."""
U64 = struct.Struct(">Q")
"""An H key's value: the largest timetick acknowledged."""

DAMAGED = "damaged"
"""The field of a channel record (a C key's JSON) that marks a pchannel whose journal records were
damaged when the database opened: ``{"file", "offset", "reason", "first_id"}``, where ``first_id`` is
the first id of the pchannel the database does not hold (what came from it on is lost, or only in
kept journal files).  Opening such a pchannel fails with CORRUPTED; ``salvage`` removes the mark."""

TRUNCATED_META = "wal.truncated_before"
"""The per-channel value (an X key, u64) below which a truncation deleted every block: journal
replay skips older blocks, so truncating needs no journal checkpoint."""


def tail_state(
    info: ChannelInfo, last_block: tuple[MessageID, bytes] | None, where: str, max_timetick: int
) -> ChannelInfo:
    """Fill ``next_id`` and ``last_timetick`` of ``info`` from the last stored block and the stored
    high-water timestamp (``max_timetick``, written with every block)."""
    info.last_timetick = max_timetick
    if last_block is None:
        return info
    first_id, block = last_block
    try:
        messages = decode_block(block, first_id)
    except CodecError as exc:
        raise CorruptedError(
            f"last block of pchannel {info.name!r} at id {first_id} in {where} is damaged: {exc}",
            channel=info.name, message_id=first_id, path=where,
        ) from exc
    info.next_id = first_id + len(messages)
    info.last_timetick = max([max_timetick, *(m.timetick for m in messages)])
    return info
