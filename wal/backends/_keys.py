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
