"""Readers behind the tail share what is decoded from storage (``wal._tail.StoredBlocks``): each block
is decoded once, and every read, from any id (inside a block too), gets exactly what a read that
decodes for itself gets: the same messages, and the same packs from a scanner (whose slicing follows
the decoder's marks)."""

from __future__ import annotations

import random

from tests.conftest import ManagerFactory
from tests.factories import begin, body, commit, ins, packs_until, rollback, tick
from wal import WAL, DeliverPolicy, Message, MsgPack, ReadOption
from wal._codec import decode_block
from wal._tail import StoredBlocks

TAIL = 128 << 10  # the tail keeps the newest ~100 KiB; the cache a quarter of that


def _shape(m: Message) -> tuple[object, ...]:
    return (m.message_id, m.timetick, m.message_type, m.vchannel, m.payload, dict(m.properties),
            m.txn.txn_id if m.txn else None)


def _packs(packs: list[MsgPack]) -> list[tuple[object, ...]]:
    return [(p.start_position, p.end_position, [_shape(m) for m in p.messages]) for p in packs]


async def _log(open_manager: ManagerFactory, seed: int) -> tuple[WAL, int]:
    """A pchannel whose older blocks are out of the tail: plain rows, ticks, transactions committed and
    rolled back, a timestamp lower than its predecessor's; ~8 KiB per block.  Returns its last tick."""
    manager = await open_manager(tail_buffer_bytes=TAIL)
    await manager.create_channel("p")
    wal = await manager.open("p")
    rnd = random.Random(seed)
    ts = 100
    txn = 0
    for _ in range(60):
        batch: list[Message] = []
        for _ in range(rnd.randint(5, 15)):
            ts += 1
            kind = rnd.random()
            if kind < 0.1:
                txn += 1
                end = commit if rnd.random() < 0.7 else rollback
                batch += [begin("v1", ts, txn), body("v1", ts + 1, txn, b"t" * 300), end("v1", ts + 2, txn)]
                ts += 2
            elif kind < 0.15:
                batch.append(ins("v2", ts - 50, b"late" * 100))  # lower than its predecessor's
            else:
                batch.append(ins(rnd.choice(["v1", "v2"]), ts, bytes([rnd.randrange(256)]) * 600, k=str(ts)))
        ts += 1
        batch.append(tick(ts))
        await wal.append_batch(batch)
    return wal, ts


async def _read_all(wal: WAL, start: int, last_ts: int) -> list[MsgPack]:
    scanner = wal.read(ReadOption(deliver_policy=DeliverPolicy.start_from(start), read_batch_bytes=16 << 10))
    try:
        return await packs_until(scanner, last_ts, timeout=60)
    finally:
        await scanner.aclose()


async def test_every_read_from_the_shared_decoding_equals_a_read_that_decodes_for_itself(
    open_manager: ManagerFactory, seed: int,
) -> None:
    wal, last_ts = await _log(open_manager, seed)
    assert wal._tail.base > wal.first_id + 100  # most of the log is read back from storage
    cache = wal._stored
    assert cache.max_bytes == TAIL // 4
    rnd = random.Random(seed)
    starts = sorted({wal.first_id, *(rnd.randrange(wal.first_id, wal._tail.base) for _ in range(12))})
    for start in starts:
        limit, cache.max_bytes = cache.max_bytes, 0  # the reference: decoded by this read alone
        try:
            alone_msgs = await wal.read_stored(start, 64 << 10)
            alone_packs = await _read_all(wal, start, last_ts)
        finally:
            cache.max_bytes = limit
        # Twice: the first read fills the cache, the second takes from it.
        for _ in range(2):
            assert [_shape(m) for m in await wal.read_stored(start, 64 << 10)] == [_shape(m) for m in alone_msgs]
            assert _packs(await _read_all(wal, start, last_ts)) == _packs(alone_packs), f"from {start}"
    assert 0 < cache.bytes <= cache.max_bytes


async def test_readers_behind_the_tail_together_decode_each_block_once(open_manager: ManagerFactory) -> None:
    wal, last_ts = await _log(open_manager, 7)
    cache = wal._stored
    cache.max_bytes = 1 << 20  # every stored block fits: the count below is exact
    blocks = await wal._read_storage(wal.first_id, 1 << 30)
    stored = [b for b in blocks if b[0] < wal._tail.base]
    before = cache.decodes
    readers = [await _read_all(wal, wal.first_id, last_ts) for _ in range(5)]
    assert all(_packs(r) == _packs(readers[0]) for r in readers)
    # Each block read back from storage was decoded once for the five readers (the newest ones
    # came from the tail, without a decode).
    assert cache.decodes - before <= len(blocks)
    assert cache.decodes - before >= len(stored)


def test_a_different_block_at_the_same_id_is_decoded_not_taken_for_the_cached_one() -> None:
    from wal._codec import BLOCK_HEADER_SIZE, encode_block  # noqa: PLC0415

    def block(payload: bytes) -> bytes:
        m = ins("v", 5, payload)
        m._id = 10
        return encode_block([m])

    cache = StoredBlocks(1 << 20)
    calls: list[bytes] = []

    def decoder(b: bytes):  # type: ignore[no-untyped-def]
        def run(marks: list[int]) -> list[Message]:
            calls.append(b)
            return decode_block(b, 10, marks=marks)
        return run

    a, b = block(b"a"), block(b"bb")
    first, _ = cache.decoded(a, 10, a[:BLOCK_HEADER_SIZE], decoder(a))
    again, _ = cache.decoded(a, 10, a[:BLOCK_HEADER_SIZE], decoder(a))
    other, _ = cache.decoded(b, 10, b[:BLOCK_HEADER_SIZE], decoder(b))
    assert again is first and calls == [a, b]
    assert [m.payload for m in other] == [b"bb"]
    # Bounded: a block larger than the cache is decoded and not kept.
    small = StoredBlocks(len(a) - 1)
    small.decoded(a, 10, a[:BLOCK_HEADER_SIZE], decoder(a))
    assert small.bytes == 0
