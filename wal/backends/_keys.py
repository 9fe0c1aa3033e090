"""Helpers shared by backends that recover channel state from stored blocks."""

from __future__ import annotations

from wal._codec import decode_block
from wal.backend import ChannelInfo
from wal.errors import CodecError, CorruptedError
from wal.message import MessageID


def tail_state(
    info: ChannelInfo, last_block: tuple[MessageID, bytes] | None, where: str
) -> ChannelInfo:
    """Fill ``next_id`` and ``last_timetick`` of ``info`` from the channel's last stored block."""
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
    info.last_timetick = max((m.timetick for m in messages), default=0)
    return info
