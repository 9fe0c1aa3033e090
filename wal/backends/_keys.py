"""Helpers shared by backends that recover channel state from stored blocks."""

from __future__ import annotations

from wal._codec import decode_block
from wal.backend import ChannelInfo
from wal.errors import CodecError, CorruptedError
from wal.message import MessageID


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
