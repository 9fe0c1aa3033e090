"""The MsgStream facade against a real node: repack, broadcast, merged time-tick packs, ack, seek."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence

import pytest

from streamingnode.client import HASH_KEY_PROPERTY, AsyncClient, MsgStream, MsgStreamPack, hash_key
from wal.errors import InvalidArgumentError
from wal.message import Message, MessageType

pytestmark = pytest.mark.integration

CHANNELS = ["ch0", "ch1", "ch2"]


@pytest.fixture
async def client(server: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server, timeout=10.0) as c:
        await c.create_channels(CHANNELS)
        yield c


def msg(key: str, payload: bytes) -> Message:
    return Message(MessageType.DATA, "v", payload, {HASH_KEY_PROPERTY: key})


async def consume_until(stream: MsgStream, marker: bytes, *, timeout: float = 10.0) -> list[MsgStreamPack]:
    """Packs up to the one holding ``marker`` (on every channel, when it was broadcast)."""
    packs: list[MsgStreamPack] = []
    seen = 0
    async with asyncio.timeout(timeout):
        while True:
            pack = await stream.consume()
            packs.append(pack)
            seen += sum(1 for m in pack.messages if m.payload == marker)
            if seen >= len(CHANNELS):
                return packs


def payloads(packs: Sequence[MsgStreamPack]) -> list[bytes]:
    return [m.payload for p in packs for m in p.messages if m.message_type is MessageType.DATA]


async def test_produce_repacks_by_hash_and_consume_merges_by_time_tick(client: AsyncClient) -> None:
    producer = client.msgstream()
    producer.as_producer(CHANNELS)
    messages = [msg(f"key-{i % 7}", b"m%03d" % i) for i in range(60)]
    results = await producer.produce(messages)
    assert len(results) == len(messages)
    marker = await producer.broadcast(Message(MessageType.DATA, "", b"end"))
    assert len(marker) == len(CHANNELS)

    consumer = client.msgstream()
    await consumer.as_consumer(CHANNELS, "g")
    packs = await consume_until(consumer, b"end")
    await producer.aclose()

    got = payloads(packs)
    assert sorted(got) == sorted([m.payload for m in messages] + [b"end"] * len(CHANNELS))
    # Each message went to the channel its key hashes to, and a channel keeps the send order.
    where = {m.payload: m for p in packs for m in p.messages}
    for channel_index, name in enumerate(CHANNELS):
        expected = [m.payload for m in messages if hash_key(m) % len(CHANNELS) == channel_index]
        assert expected, "every channel gets some keys"
        ids = [where[p].message_id for p in expected]
        assert ids == sorted(ids), name
    # One pack per time tick across channels: ticks advance, and each pack holds its tick's messages.
    for a, b in itertools.pairwise(packs):
        assert a.end_ts < b.end_ts and b.begin_ts == a.end_ts
    for p in packs:
        assert all(p.begin_ts < m.timetick <= p.end_ts for m in p.messages), "merged in time order"
        assert [m.timetick for m in p.messages] == sorted(m.timetick for m in p.messages)
        assert [pos.pchannel for pos in p.end_positions] == CHANNELS
    await consumer.aclose()


async def test_custom_repack_and_its_mistakes(client: AsyncClient) -> None:
    stream = client.msgstream()
    stream.as_producer(CHANNELS)
    everything_to_last = await stream.produce([msg("a", b"x"), msg("b", b"y")],
                                              repack=lambda ms, n: {n - 1: list(ms)})
    assert everything_to_last[0].message_id < everything_to_last[1].message_id
    with pytest.raises(InvalidArgumentError):
        await stream.produce([msg("a", b"x")], repack=lambda ms, n: {n: list(ms)})
    with pytest.raises(InvalidArgumentError):
        await stream.produce([msg("a", b"x")], repack=lambda ms, n: {})
    await stream.aclose()


async def test_ack_then_a_new_consumer_of_the_group_resumes_after_it(client: AsyncClient) -> None:
    producer = client.msgstream()
    producer.as_producer(CHANNELS)
    first = [msg(f"k{i}", b"first-%02d" % i) for i in range(20)]
    await producer.produce(first)
    await producer.broadcast(Message(MessageType.DATA, "", b"end"))

    consumer = client.msgstream()
    await consumer.as_consumer(CHANNELS, "g")
    packs = await consume_until(consumer, b"end")
    assert sorted(payloads(packs)) == sorted([m.payload for m in first] + [b"end"] * 3)
    await consumer.ack(packs[-1])
    await consumer.aclose()

    second = [msg(f"k{i}", b"second-%02d" % i) for i in range(20)]
    await producer.produce(second)
    await producer.broadcast(Message(MessageType.DATA, "", b"end"))
    again = client.msgstream()
    await again.as_consumer(CHANNELS, "g", position="earliest")
    later = await consume_until(again, b"end")
    assert sorted(payloads(later)) == sorted([m.payload for m in second] + [b"end"] * 3), "no repeat, no gap"

    # Seek back to where the first round ended: the second round again, exactly.
    await again.seek(packs[-1].end_positions)
    replay = await consume_until(again, b"end")
    assert sorted(payloads(replay)) == sorted([m.payload for m in second] + [b"end"] * 3)
    await again.aclose()
    await producer.aclose()


async def test_mid_pack_positions_resume_exactly(client: AsyncClient) -> None:
    """Merged packs cut the channels' own packs at the slowest channel's tick; the positions of such a
    cut must still resume with nothing lost or repeated."""
    producer = client.msgstream()
    producer.as_producer(CHANNELS)
    sent: list[bytes] = []
    consumer = client.msgstream()
    await consumer.as_consumer(CHANNELS, "g", position="latest")
    for round_ in range(5):
        batch = [msg(f"k{i}", b"r%d-%02d" % (round_, i)) for i in range(15)]
        sent += [m.payload for m in batch]
        await producer.produce(batch)
    await producer.broadcast(Message(MessageType.DATA, "", b"end"))
    packs = await consume_until(consumer, b"end")
    assert sorted(payloads(packs)) == sorted([*sent, b"end", b"end", b"end"])

    # Resume from every pack boundary in turn: what follows must be exactly the rest.
    for cut in range(0, len(packs) - 1, max(1, len(packs) // 4)):
        await consumer.seek(packs[cut].end_positions)
        rest = await consume_until(consumer, b"end")
        expected = payloads(packs[cut + 1:])
        assert sorted(payloads(rest)) == sorted(expected), f"resume after pack {cut}"
    await consumer.aclose()
    await producer.aclose()


async def test_latest_position_skips_old_messages(client: AsyncClient) -> None:
    producer = client.msgstream()
    producer.as_producer(CHANNELS)
    await producer.produce([msg(f"k{i}", b"old") for i in range(10)])
    consumer = client.msgstream()
    await consumer.as_consumer(CHANNELS, "fresh", position="latest")
    await producer.produce([msg(f"k{i}", b"new-%d" % i) for i in range(10)])
    await producer.broadcast(Message(MessageType.DATA, "", b"end"))
    packs = await consume_until(consumer, b"end")
    assert b"old" not in payloads(packs)
    assert sorted(payloads(packs)) == sorted([b"new-%d" % i for i in range(10)] + [b"end"] * 3)
    await consumer.aclose()
    await producer.aclose()
