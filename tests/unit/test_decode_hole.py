"""A read whose blocks skip ids (a hole inside one read: a log that lost messages, as a replicated
store can after damage on a majority of its servers) hands out what precedes the hole and stops
there; the read that starts at the hole fails with OUT_OF_RANGE naming it.  Nothing after a hole is
ever handed out as if the hole were not there.  Checked for every place the hole can fall."""

from __future__ import annotations

import pytest

from tests.conftest import ManagerFactory
from tests.factories import ins
from wal import WAL
from wal.errors import CorruptedError, OutOfRangeError


async def _log(open_manager: ManagerFactory) -> WAL:
    manager = await open_manager()
    await manager.create_channel("p")
    wal = await manager.open("p")
    for b in range(8):  # eight blocks of three messages: ids 0..23
        await wal.append_batch([ins("v", 100 + 3 * b + i, bytes([b]) * 50) for i in range(3)])
    return wal


async def test_a_hole_inside_a_read_ends_the_read_before_it(open_manager: ManagerFactory) -> None:
    wal = await _log(open_manager)
    blocks = await wal.read_blocks(0, 1 << 20)
    assert [b[0] for b in blocks] == [0, 3, 6, 9, 12, 15, 18, 21]
    for gap in range(1, len(blocks)):
        holed = blocks[:gap] + blocks[gap + 1:]
        got = [m.message_id for m in wal.decode_blocks(0, holed)]
        assert got == list(range(blocks[gap][0])), (gap, got)
        # The next read starts at the hole and says so: OUT_OF_RANGE when blocks follow it, and when
        # the hole is the end of what is stored, that acknowledged messages are missing below the end.
        with pytest.raises(OutOfRangeError if holed[gap:] else CorruptedError, match=f"message {blocks[gap][0]} "):
            wal.decode_blocks(blocks[gap][0], holed[gap:])
