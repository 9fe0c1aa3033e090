"""The WAL's public seam for replaying stored blocks (``read_cached``, ``read_blocks``,
``decode_blocks``): what the recovery snapshot replays is exactly what ``read_stored`` returns, from
any id, in memory or from storage, and a truncated id is refused."""

from __future__ import annotations

import random

import pytest

from tests.conftest import ManagerFactory
from tests.factories import ins, tick
from wal import WAL, Message, OutOfRangeError

TAIL = 16 << 10  # small: most of the log is out of memory


def _shape(m: Message) -> tuple[object, ...]:
    return (m.message_id, m.timetick, m.message_type, m.vchannel, m.payload, dict(m.properties), m.is_immutable)


async def _log(open_manager: ManagerFactory, rnd: random.Random) -> WAL:
    manager = await open_manager(tail_buffer_bytes=TAIL)
    await manager.create_channel("p")
    wal = await manager.open("p")
    ts = 100
    for _ in range(30):
        batch: list[Message] = []
        for _ in range(rnd.randint(1, 12)):
            ts += 1
            batch.append(ins(rnd.choice(["v1", "v2"]), ts, bytes([rnd.randrange(256)]) * rnd.randint(1, 900)))
        ts += 1
        batch.append(tick(ts))
        await wal.append_batch(batch)
    return wal


async def test_blocks_decode_to_what_read_stored_returns(open_manager: ManagerFactory, seed: int) -> None:
    rnd = random.Random(seed)
    wal = await _log(open_manager, rnd)
    for _ in range(20):
        start = rnd.randrange(wal.next_id)
        blocks = await wal.read_blocks(start, rnd.choice([1, 4096, 1 << 20]))
        assert blocks and blocks[0][0] <= start
        got = wal.decode_blocks(start, blocks)
        want = await wal.read_stored(start, 1 << 30)
        assert got and got[0].message_id == start
        assert [_shape(m) for m in got] == [_shape(m) for m in want[:len(got)]]
        cached = wal.read_cached(start, 50)
        if cached is not None:  # still in memory: the same messages, no I/O
            assert [_shape(m) for m in cached] == [_shape(m) for m in want[:len(cached)]]
    assert wal.read_cached(wal.next_id, 10) == []


async def test_a_truncated_id_is_refused(open_manager: ManagerFactory, seed: int) -> None:
    wal = await _log(open_manager, random.Random(seed))
    first = await wal.truncate(wal.next_id // 2)
    if first == 0:
        pytest.fail("truncation kept everything: the log is too small for this test")
    with pytest.raises(OutOfRangeError):
        await wal.read_blocks(first - 1, 4096)
