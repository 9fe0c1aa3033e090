"""The AsyncClient against a real node: admin calls, producer, consumer, groups, transactions, errors."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence

import pytest

from interceptors.recovery.streaming_wal import ChainConfig
from streamingnode.client import AsyncClient, Consumer, Owner, Producer
from streamingnode.client._producer import NODE_DEDUP_WINDOW
from tests.waiting import until
from wal.errors import (
    ChannelExistError,
    ChannelNotExistError,
    ConsumerGroupExistError,
    ConsumerGroupNotExistError,
    InvalidArgumentError,
    InvalidTxnStateError,
    MessageTooLargeError,
    TxnNotFoundError,
)
from wal.message import Message, MessageType, Position
from wal.options import DeliverFilter, DeliverPolicy

pytestmark = pytest.mark.integration


@pytest.fixture
async def client(server: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server, timeout=10.0, reconnect_timeout=10.0) as c:
        yield c


def data_of(messages: Sequence[Message]) -> list[bytes]:
    return [m.payload for m in messages if m.message_type is MessageType.DATA]


async def read_until(consumer: Consumer, marker: bytes, *, timeout: float = 10.0) -> list[Message]:
    """Every DATA message up to and including the one whose payload is ``marker``.

    Producing a marker after the messages under test and reading up to it shows there is nothing
    extra (no duplicate) before it, without waiting for the stream to go quiet.
    """
    out: list[Message] = []
    async with asyncio.timeout(timeout):
        async for pack in consumer:
            for m in pack.messages:
                if m.message_type is MessageType.DATA:
                    out.append(m)
                    if m.payload == marker:
                        return out
    raise AssertionError(f"the read ended before {marker!r}")


async def send_all(producer: Producer, vchannel: str, payloads: Sequence[bytes]) -> None:
    await asyncio.gather(*(producer.send(vchannel, p) for p in payloads))


# --- admin ---------------------------------------------------------------------------------------
async def test_channels_create_describe_destroy(client: AsyncClient) -> None:
    owner = Owner("ingest", "10.0.0.1:1", "orders")
    assert await client.create_channels(["a", "b"], owner=owner) == ["a", "b"]
    picked = await client.create_channels(num=2)
    assert len(picked) == 2 and not {"a", "b"} & set(picked)
    with pytest.raises(ChannelExistError):
        await client.create_channels(["c", "a"])

    descriptions = {d.name: d for d in await client.describe_channels()}
    assert sorted(descriptions) == sorted(["a", "b", *picked]), "a failed create must create nothing"
    assert descriptions["a"].owner == owner

    async with client.producer("a") as producer:
        result = await producer.send("v", b"x")
    (a,) = await client.describe_channels(["a"])
    assert a.last_id is not None and a.last_id >= result.message_id and a.last_timetick >= result.timetick

    with pytest.raises(ChannelNotExistError):
        await client.destroy_channels(["b", "nope"])
    await client.destroy_channels(["b"])
    with pytest.raises(ChannelNotExistError):
        await client.describe_channels(["b"])


async def test_latest_position_and_flush(client: AsyncClient) -> None:
    await client.create_channels(["p"])
    async with client.producer("p") as producer:
        results = [await producer.send("v", b"%d" % i) for i in range(3)]
    last, mvcc = await client.latest_position("p", "v")
    # The newest confirmed position of the pchannel: the last send's, or a TimeTick the beat persisted
    # after it (every 50 ms here, so under load one can land before this call; the exact position on a
    # quiet log is tests/integration/test_latest_position.py's).
    assert last is not None and last.pchannel == "p"
    assert last.message_id >= results[-1].message_id and last.timetick >= results[-1].timetick, (last, results)
    assert mvcc >= results[-1].timetick

    # Resuming from the latest position delivers only what is appended later.
    policy, filters = DeliverPolicy.start_from(last.message_id), (DeliverFilter.timetick_gt(last.timetick),)
    async with client.consumer("p", "v", policy=policy, filters=filters) as consumer, client.producer("p") as producer:
        await producer.send("v", b"after")
        assert data_of(await read_until(consumer, b"after")) == [b"after"]

    files, flush_ts = await client.flush("p", "v")
    assert files == [] and flush_ts > results[-1].timetick


# --- producer ------------------------------------------------------------------------------------
async def test_producer_batches_concurrent_sends_and_keeps_order(client: AsyncClient) -> None:
    await client.create_channels(["p"])
    payloads = [b"m%04d" % i for i in range(300)]
    async with client.producer("p", linger=0.01, max_batch_messages=64) as producer:
        futures = [producer.send_nowait("v", p) for p in payloads]
        await producer.flush()
        results = [f.result() for f in futures]
        assert producer.batches_written < len(payloads) / 10, "concurrent sends must share batches"
        assert max(producer.largest_batch, 0) <= 64
    ids = [r.message_id for r in results]
    assert all(a.message_id < b.message_id and a.timetick < b.timetick
               for a, b in itertools.pairwise(results)), "the log keeps send order"

    async with client.consumer("p", "v") as consumer:
        got = await read_until(consumer, payloads[-1])
    assert data_of(got) == payloads
    assert [m.message_id for m in got] == ids


async def test_producer_defaults_batch_a_thousand_and_keep_an_idempotent_resend_in_the_dedup_window(
    client: AsyncClient,
) -> None:
    await client.create_channels(["p"])
    async with client.producer("p") as producer:
        assert producer.max_in_flight == 8
        futures = [producer.send_nowait("v", b"x") for _ in range(2500)]
        await producer.flush()
        ids = [f.result().message_id for f in futures]
        # Each batch is one group commit: its ids are consecutive.  Between batches the tick beat
        # may persist a TimeTick, which takes an id of its own.
        for first in (0, 1000, 2000):
            chunk = ids[first:first + 1000]
            assert chunk == list(range(chunk[0], chunk[0] + len(chunk)))
        assert ids == sorted(set(ids))
        assert producer.largest_batch == 1000 and producer.batches_written == 3
    async with client.producer("p", producer_id="idem") as idem:
        # A resend after a reconnect must find every unanswered sequence in the node's window.
        assert idem.max_in_flight * 1000 <= ChainConfig().dedup_window == NODE_DEDUP_WINDOW
        assert idem.max_in_flight == 4
    async with client.producer("p", producer_id="small", max_batch_messages=100) as small:
        assert small.max_in_flight == 8
    async with client.producer("p", producer_id="mine", max_in_flight=2) as mine:
        assert mine.max_in_flight == 2  # what the caller sets is kept


async def test_max_batch_bytes_splits_batches(client: AsyncClient) -> None:
    await client.create_channels(["p"])
    async with client.producer("p", linger=3600.0, max_batch_bytes=1000) as producer:
        futures = [producer.send_nowait("v", bytes(300)) for _ in range(9)]
        # linger is an hour, so only the byte limit can write these batches before the flush.
        await until(lambda: all(f.done() for f in futures[:6]), "two full batches written without a flush")
        await producer.flush()
        assert producer.batches_written == 3 and producer.largest_batch == 3


async def test_a_failed_batch_fails_only_its_own_messages(client: AsyncClient) -> None:
    await client.create_channels(["p"])
    async with client.producer("p", max_batch_messages=1) as producer:
        good1 = producer.send_nowait("v", b"ok1")
        bad_type = producer.send_nowait("v", b"", type=MessageType.TIME_TICK)
        too_big = producer.send_nowait("v", bytes(5 << 20))
        good2 = producer.send_nowait("v", b"ok2")
        await producer.flush()
        with pytest.raises(InvalidArgumentError) as err:
            bad_type.result()
        assert err.value.fields.get("field") == "type"
        with pytest.raises(MessageTooLargeError):
            too_big.result()
        assert good1.result().message_id < good2.result().message_id
        # The stream stays open after in-band errors.
        await producer.send("v", b"ok3")
    async with client.consumer("p", "v") as consumer:
        got = await read_until(consumer, b"ok3")
    assert data_of(got) == [b"ok1", b"ok2", b"ok3"], "a failed batch writes nothing"


async def test_a_message_of_the_wrong_type_is_refused_at_once_and_spoils_no_batch(client: AsyncClient) -> None:
    await client.create_channels(["p"])
    async with client.producer("p", linger=0.05) as producer:
        good1 = producer.send_nowait("v", b"ok1")
        for vchannel, payload, kind in (("v", "text", MessageType.DATA), (b"v", b"x", MessageType.DATA),
                                        ("v", bytearray(b"x"), MessageType.DATA), ("v", b"x", "DATA")):
            with pytest.raises(InvalidArgumentError, match="a str vchannel, a bytes payload and a MessageType"):
                producer.send_nowait(vchannel, payload, type=kind)  # type: ignore[arg-type]
        good2 = producer.send_nowait("v", b"ok2")
        await asyncio.wait_for(producer.flush(), 10)
        assert good1.result().message_id + 1 == good2.result().message_id, "one batch, nothing else in it"


async def test_producer_on_a_missing_channel_raises_channel_not_exist(client: AsyncClient) -> None:
    producer = client.producer("nope")
    async with asyncio.timeout(5):
        with pytest.raises(ChannelNotExistError):
            await producer.send("v", b"x")
    await producer.aclose()
    with pytest.raises(Exception, match="closed"):
        producer.send_nowait("v", b"x")


async def test_idempotent_producer_sequences_are_deduplicated_by_the_node(client: AsyncClient) -> None:
    """Two producers with the same id and the same sequences (the second given first_sequence=0): the
    second is answered with the first's results and writes nothing (what a resend relies on)."""
    await client.create_channels(["p"])
    async with client.producer("p", producer_id="writer-1") as first:
        original = [await first.send("v", b"a%d" % i) for i in range(5)]
        assert first.next_sequence == 5
    async with client.producer("p", producer_id="writer-1", first_sequence=0) as again:
        repeated = [await again.send("v", b"a%d" % i) for i in range(5)]
        fresh = await again.send("v", b"end")
    assert repeated == original
    assert fresh.message_id > original[-1].message_id
    async with client.consumer("p", "v") as consumer:
        assert data_of(await read_until(consumer, b"end")) == [b"a0", b"a1", b"a2", b"a3", b"a4", b"end"]


# --- consumer ------------------------------------------------------------------------------------
async def test_consumer_reads_one_vchannel_and_broadcasts(client: AsyncClient) -> None:
    await client.create_channels(["p"])
    async with client.producer("p") as producer:
        await producer.send("v1", b"one")
        await producer.send("v2", b"two")
        await producer.send("", b"everyone")
        await producer.send("v1", b"end")
    async with client.consumer("p", "v1") as consumer:
        assert data_of(await read_until(consumer, b"end")) == [b"one", b"everyone", b"end"]

    async with client.producer("p") as producer:
        cut = await producer.send("v1", b"before")
        await producer.send("v1", b"after")
    after_cut = DeliverFilter.timetick_gt(cut.timetick)
    async with client.consumer("p", "v1", filters=[after_cut]) as consumer:
        assert data_of(await read_until(consumer, b"after")) == [b"after"]


async def test_latest_policy_sees_only_messages_after_open(client: AsyncClient) -> None:
    await client.create_channels(["p"])
    async with client.producer("p") as producer:
        await send_all(producer, "v", [b"old1", b"old2"])
        async with client.consumer("p", "v", policy=DeliverPolicy.latest()) as consumer:
            await producer.send("v", b"new")
            assert data_of(await read_until(consumer, b"new")) == [b"new"]


async def test_group_ack_describe_and_resume(client: AsyncClient) -> None:
    await client.create_channels(["p"])
    await client.create_group("p", "g")
    with pytest.raises(ConsumerGroupExistError):
        await client.create_group("p", "g")
    async with client.producer("p") as producer:
        await send_all(producer, "v", [b"a", b"b"])
        await producer.send("v", b"c")

    async with client.consumer("p", "v", group="g") as consumer:
        got = await read_until(consumer, b"c")
        assert data_of(got) == [b"a", b"b", b"c"]
        assert consumer.position is not None
        await consumer.ack(consumer.position)
        acked = consumer.position

    (desc,) = await client.describe_groups("p", ["g"])
    progress = desc.committed("v")
    assert progress == acked
    assert desc.vchannels[0].lag_messages >= 0

    async with client.producer("p") as producer:
        await producer.send("v", b"d")
    async with client.consumer("p", "v", group="g") as consumer:
        assert data_of(await read_until(consumer, b"d")) == [b"d"], "a group resumes after its commit"

    # Seek back to the beginning: everything again.
    await client.seek_group("p", "g", "v", policy=DeliverPolicy.all())
    async with client.consumer("p", "v", group="g") as consumer:
        assert data_of(await read_until(consumer, b"d")) == [b"a", b"b", b"c", b"d"]
    # Seek to a stored position: what follows it.
    stored = await client.seek_group("p", "g", "v", position=acked)
    assert stored == acked
    async with client.consumer("p", "v", group="g") as consumer:
        assert data_of(await read_until(consumer, b"d")) == [b"d"]

    await client.destroy_group("p", "g")
    with pytest.raises(ConsumerGroupNotExistError):
        await client.destroy_group("p", "g")
    with pytest.raises(InvalidArgumentError):
        await client.seek_group("p", "g", "v")


async def test_a_group_position_wins_over_the_latest_policy(client: AsyncClient) -> None:
    await client.create_channels(["p"])
    await client.create_group("p", "g")
    async with client.producer("p") as producer:
        first = await producer.send("v", b"first")
        await client.seek_group("p", "g", "v", position=Position("p", first.message_id, first.timetick))
        await producer.send("v", b"while-away")
        async with client.consumer("p", "v", group="g", policy=DeliverPolicy.latest()) as consumer:
            await producer.send("v", b"now")
            assert data_of(await read_until(consumer, b"now")) == [b"while-away", b"now"]


async def test_ack_without_group_is_refused_and_missing_channel_fails_the_read(client: AsyncClient) -> None:
    await client.create_channels(["p"])
    async with client.consumer("p", "v") as consumer:
        pack = await anext(consumer)
        with pytest.raises(InvalidArgumentError):
            await consumer.ack(pack)
    missing = client.consumer("nope", "v")
    with pytest.raises(ChannelNotExistError):
        await missing.wait_opened()
    with pytest.raises(ChannelNotExistError):
        await anext(missing)
    await missing.aclose()


async def test_a_destroyed_channel_ends_the_read_with_its_error(client: AsyncClient) -> None:
    await client.create_channels(["p"])
    async with client.consumer("p", "v") as consumer:
        await anext(consumer)
        await client.destroy_channels(["p"])
        with pytest.raises(ChannelNotExistError):
            async with asyncio.timeout(10):
                async for _ in consumer:
                    pass


# --- transactions --------------------------------------------------------------------------------
async def test_txn_commits_whole_and_rollback_hides_the_body(client: AsyncClient) -> None:
    await client.create_channels(["p"])
    async with client.consumer("p", "v") as consumer:
        async with client.txn("p", "v") as tx:
            r1 = await tx.send(b"t1")
            tx.send_nowait(b"t2")
            assert r1.txn_id == tx.txn_id
        with pytest.raises(RuntimeError, match="boom"):
            async with client.txn("p", "v") as tx2:
                await tx2.send(b"rolled-back")
                raise RuntimeError("boom")
        async with client.txn("p", "v") as tx3:
            await tx3.send(b"explicit")
            await tx3.rollback()
        async with client.producer("p") as producer:
            await producer.send("v", b"end")

        seen: list[list[bytes]] = []
        async with asyncio.timeout(10):
            async for pack in consumer:
                payloads = data_of(pack.messages)
                if payloads:
                    seen.append(payloads)
                if b"end" in payloads:
                    break
    # The committed body arrives whole, in one pack; the rolled-back ones never.
    assert seen == [[b"t1", b"t2"], [b"end"]]

    with pytest.raises(InvalidTxnStateError):
        await tx.commit()
    with pytest.raises(TxnNotFoundError):
        await client.commit_txn("p", "v", 987654)


async def test_txn_with_a_failed_body_message_is_rolled_back(client: AsyncClient) -> None:
    await client.create_channels(["p"])
    with pytest.raises(InvalidArgumentError):
        async with client.txn("p", "v") as tx:
            tx.send_nowait(b"fine")
            tx.send_nowait(b"", type=MessageType.TIME_TICK)  # refused by the node
    with pytest.raises(InvalidTxnStateError):
        await client.commit_txn("p", "v", tx.txn_id)


async def test_manual_txn_calls(client: AsyncClient) -> None:
    await client.create_channels(["p"])
    info = await client.begin_txn("p", "v", keepalive_ms=5000)
    assert info.keepalive_ms == 5000 and info.txn_id > 0 and info.message_id is not None
    done = await client.commit_txn("p", "v", info.txn_id)
    assert done.timetick > info.begin_timetick and done.message_id > info.message_id
    with pytest.raises(InvalidTxnStateError):
        await client.rollback_txn("p", "v", info.txn_id)
