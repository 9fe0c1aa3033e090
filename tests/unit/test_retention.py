"""WAL retention over a real RocksDB WAL: each bound holds the cut on its own, a truncated log recovers
the same state from its snapshot, and readers get exactly what is kept (or a precise error)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from flusher import Flusher, FlusherConfig
from interceptors.dedup import PROP_PRODUCER, PROP_SEQUENCE, dedup_step
from interceptors.recovery.snapshot import SNAPSHOT_META, RecoverySnapshot, load_snapshot
from interceptors.recovery.streaming_wal import StreamingWAL, open_streaming_wal
from streamingnode.node.groups import ConsumerGroups
from streamingnode.node.retention import ChannelRetention, RetentionConfig
from tests.flushed import pks
from tests.reopening import FAST, SCHEMA, Opened, rows
from tests.waiting import persisted_tick, until
from wal import Message, MessageType, OutOfRangeError, Position, bodies
from wal.errors import ProducerFencedError
from wal.options import DeliverPolicy, ReadOption

NOW = RetentionConfig(retention_seconds=0, check_seconds=3600)
"""No time floor: only the other bounds hold the cut (checks are run by hand)."""


@pytest.fixture
async def opened(tmp_path: Path) -> AsyncIterator[Opened]:
    o = Opened(tmp_path / "db")
    await o.open()
    yield o
    await o.close()


async def data(swal: StreamingWAL, n: int, vchannel: str = "v") -> list[int]:
    """``n`` plain messages, one append each (one stored block each); their ids."""
    return [(await swal.append(Message(MessageType.DATA, vchannel, b"x" * 100))).message_id for _ in range(n)]


async def test_flusher_checkpoint_holds_the_cut(opened: Opened, tmp_path: Path) -> None:
    swal = opened.swal
    assert swal is not None
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    flusher = Flusher(swal, tmp_path / "parquet", FlusherConfig(checkpoint_interval_seconds=0.0))
    await flusher.start()
    try:
        for i in range(5):
            await swal.append(bodies.insert("v", "c", rows(i, 1)))
        await flusher.flush("v")
        # Fewer rows than a segment holds: they stay buffered until the next manual flush.
        held = [(await swal.append(bodies.insert("v", "c", rows(100 + i, 1)))).message_id for i in range(5)]
        await data(swal, 5)
        mark = await swal.append(Message(MessageType.DATA, "v", b"mark"))
        await flusher.wait_flushed(mark.timetick)
        await persisted_tick(swal)
        checkpoint = flusher.checkpoint.message_id
        assert checkpoint <= held[0]  # the buffered inserts hold the flusher's checkpoint back

        retention = ChannelRetention(swal, None, flusher, NOW)
        done = await retention.check()
        assert done is not None and done.held_by == "flusher"
        assert 0 < swal.wal.first_id <= checkpoint
        # Once the buffered rows are in files, the checkpoint and the cut move on.
        await flusher.flush("v")
        mark = await swal.append(Message(MessageType.DATA, "v", b"mark"))
        await flusher.wait_flushed(mark.timetick)
        await persisted_tick(swal)
        again = await retention.check()
        assert again is not None and swal.wal.first_id > held[-1]
        assert swal.wal.first_id <= flusher.checkpoint.message_id
    finally:
        await flusher.aclose()


async def test_each_consumer_group_holds_the_cut(opened: Opened) -> None:
    swal = opened.swal
    assert swal is not None
    ids = await data(swal, 30)
    await persisted_tick(swal)  # the groups hold the cut, not the time bound
    groups = await ConsumerGroups.load(swal.wal)
    await groups.create("empty")  # committed nothing: holds nothing back
    await groups.create("a")
    await groups.create("b")
    await groups.commit("a", [("v", Position("p", ids[20], 0))])
    await groups.commit("b", [("v", Position("p", ids[25], 0)), ("w", Position("p", ids[10], 0))])
    retention = ChannelRetention(swal, groups, None, NOW)

    done = await retention.check()
    assert done is not None and done.held_by == "group:b"
    assert 0 < swal.wal.first_id <= ids[10]
    await groups.commit("b", [("w", Position("p", ids[29], 0))])
    done = await retention.check()
    assert done is not None and done.held_by == "group:a"
    assert ids[10] < swal.wal.first_id <= ids[20]
    # A group resumes from its position: still readable.
    scanner = swal.read(ReadOption(deliver_policy=DeliverPolicy.start_from(ids[20])))
    await scanner.aclose()


async def test_open_transaction_holds_the_cut_and_no_transaction_is_split(opened: Opened) -> None:
    swal = opened.swal
    assert swal is not None
    await data(swal, 10)
    ctx, begin = await swal.begin_txn("w", keepalive_ms=0)
    await swal.append(Message(MessageType.DATA, "w", b"body-1").with_txn(ctx))
    after = await data(swal, 10)
    await persisted_tick(swal)
    retention = ChannelRetention(swal, None, None, NOW)

    done = await retention.check()
    assert done is not None and done.held_by == "txn"
    assert 0 < swal.wal.first_id <= begin.message_id

    # Committed now, but a group sits inside it: the cut may not fall between its BeginTxn and commit,
    # or a reader from the first kept message would never see the transaction.
    await swal.append(Message(MessageType.DATA, "w", b"body-2").with_txn(ctx))
    await swal.commit_txn(ctx.txn_id)
    groups = await ConsumerGroups.load(swal.wal)
    await groups.create("g")
    await groups.commit("g", [("w", Position("p", after[5], 0))])
    await persisted_tick(swal)  # after the commit: the time bound moves past it
    retention = ChannelRetention(swal, groups, None, NOW)
    assert await retention.bound() == (after[5], "group:g")
    await retention.check()
    assert swal.wal.first_id <= begin.message_id
    scanner = swal.read(ReadOption(vchannel="w"))
    seen: list[bytes] = []
    async for pack in scanner:
        seen += [m.payload for m in pack.messages if m.txn is not None and m.message_type is MessageType.DATA]
        if len(seen) == 2:
            break
    await scanner.aclose()
    assert seen == [b"body-1", b"body-2"]


async def test_retention_time_keeps_every_younger_message(opened: Opened) -> None:
    swal = opened.swal
    assert swal is not None
    old = await data(swal, 10)
    # A persisted tick after the old half, then a gap in wall time before the young half: the cutoff
    # below falls between the two, with the tick's index entry below it.
    tick_ms = (await persisted_tick(swal)).timetick >> 18
    await until(lambda: time.time_ns() // 1_000_000 > tick_ms + 20, "20 ms of wall time after the tick")
    young_results = [await swal.append(Message(MessageType.DATA, "v", b"y")) for _ in range(10)]
    await data(swal, 1)
    cutoff_ms = (young_results[0].timetick >> 18) - 10
    keep = RetentionConfig(retention_seconds=60, check_seconds=3600)

    # Now: everything is younger than a minute, nothing goes.
    assert await ChannelRetention(swal, None, None, keep).check() is None
    assert swal.wal.first_id == 0
    # A minute after the cutoff: the old half may go, the young half stays.
    later = ChannelRetention(swal, None, None, keep, wall_ms=lambda: cutoff_ms + 60_000)
    done = await later.check()
    assert done is not None and done.held_by == "retention"
    assert old[0] < swal.wal.first_id <= young_results[0].message_id
    stats = later.stats()
    assert stats.truncations == 1 and stats.messages_truncated == done.messages == swal.wal.first_id
    assert stats.bytes_truncated >= 100 * len([i for i in old if i < swal.wal.first_id])


async def test_negative_retention_keeps_everything(opened: Opened) -> None:
    swal = opened.swal
    assert swal is not None
    await data(swal, 10)
    await persisted_tick(swal)  # nothing else would hold a cut: a check that ran would truncate
    forever = ChannelRetention(swal, None, None, RetentionConfig(retention_seconds=-1, check_seconds=0.01))
    # The control: an enabled retention of another pchannel, checking as often on the same loop.  Once
    # it has checked several times, so would have the other, had it been started.
    assert opened.manager is not None
    await opened.manager.create_channel("q")
    other = await open_streaming_wal(opened.manager, "q", FAST)
    control = ChannelRetention(other, None, None, RetentionConfig(retention_seconds=0, check_seconds=0.01))
    forever.start()
    control.start()
    try:
        await until(lambda: control.stats().checks >= 5, "five checks of the enabled control")
    finally:
        await control.aclose()
        await forever.aclose()
        await other.aclose()
    assert forever.stats().checks == 0
    assert swal.wal.first_id == 0


async def test_recovery_after_truncation_rebuilds_registry_segments_dedup(opened: Opened) -> None:
    swal = opened.swal
    assert swal is not None
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    await swal.append(bodies.create_partition("v", "c", "p1"))
    await swal.append(bodies.create_collection("v", "gone", SCHEMA, "pk"))
    await swal.append(bodies.insert("v", "gone", rows(0, 3)))
    await swal.append(bodies.drop_collection("v", "gone"))
    dedup_msg = bodies.insert("v", "c", rows(0, 4))
    dedup_msg = Message(dedup_msg.message_type, "v", dedup_msg.payload,
                        {**dedup_msg.properties, PROP_PRODUCER: "prod", PROP_SEQUENCE: "7"})
    step = dedup_step(swal.chain.interceptors)
    assert step is not None
    assert await step.open_producer("prod", None) == (1, 0)
    assert await step.open_producer("prod", None) == (2, 0)  # the producer's epoch is now 2
    original = await swal.append(dedup_msg)
    for i in range(4):  # 4 + 4*4 = 20 rows in _default: two segments sealed, then a growing one
        await swal.append(bodies.insert("v", "c", rows(10 + i * 4, 4)))
    await swal.append(bodies.insert("v", "c", rows(50, 3), partition="p1"))
    ctx, _ = await swal.begin_txn("v", keepalive_ms=0)
    await swal.rollback_txn(ctx.txn_id)
    await data(swal, 5)
    await persisted_tick(swal)  # the time bound lets the cut pass the DDL and the first inserts
    before = (swal.shard.collections("v"), swal.shard.growing_segments(), swal.shard.next_segment_id,
              swal.txns.next_txn_id)
    assert before[1] and before[2] > 2

    done = await ChannelRetention(swal, None, None, NOW).check()
    assert done is not None and swal.wal.first_id > original.message_id  # the DDL and the first inserts are gone
    snapshot = await load_snapshot(swal.wal)
    assert snapshot is not None and snapshot.message_id == swal.wal.first_id

    swal = await opened.reopen()
    assert swal.wal.first_id == snapshot.message_id
    assert swal.shard.collections("v") == before[0]
    assert "gone" not in swal.shard.collections("v")
    assert swal.shard.growing_segments() == before[1]
    assert swal.shard.next_segment_id == before[2]
    assert swal.txns.next_txn_id >= before[3]
    # A segment opened after the restart takes a new id, never one used before.
    await swal.append(bodies.create_partition("v", "c", "p2"))
    fresh = await swal.append(bodies.insert("v", "c", rows(70, 1), partition="p2"))
    (stored,) = await swal.wal.read_stored(fresh.message_id, 1)
    assert bodies.read_segment(stored) == before[2]
    # The dedup window survives: the resend returns the original result and writes nothing.
    end = swal.wal.next_id
    resend = Message(dedup_msg.message_type, "v", dedup_msg.payload,
                     {k: v for k, v in dedup_msg.properties.items() if k not in (bodies.PROP_SEGMENT, "rows")})
    assert await swal.append(resend) == original
    # So do the producer's epoch (in the pchannel's metadata, which retention never cuts) and its
    # high-water mark (in the snapshot): the zombie of epoch 1 is refused, the next sequence is 8.
    step = dedup_step(swal.chain.interceptors)
    assert step is not None
    with pytest.raises(ProducerFencedError):
        await step.open_producer("prod", 1)
    assert await step.open_producer("prod", 2) == (2, 8)
    # Only the tick beat may write meanwhile (it persists a TimeTick after the insert above whenever
    # its interval comes round): nothing else lies past `end`.
    after = await swal.wal.read_stored(end) if swal.wal.next_id > end else []
    assert [m.message_type for m in after if m.message_type is not MessageType.TIME_TICK] == []
    # And the dropped collection stays dropped.
    with pytest.raises(Exception, match="dropped"):
        await swal.append(bodies.insert("v", "gone", rows(0, 1)))


async def test_readers_get_the_kept_messages_or_a_precise_error(opened: Opened) -> None:
    opened.manager_options["tail_buffer_bytes"] = 1  # readers read storage, not the in-memory tail
    swal = await opened.reopen()
    ids = await data(swal, 20)
    await persisted_tick(swal)  # the group holds the cut, not the time bound
    behind = swal.read(ReadOption(read_batch_bytes=1))  # a reader that will fall behind the cut
    await behind.__anext__()
    # After a restart the clock runs ahead of the wall by up to its persisted window: look from later.
    later = time.time_ns() // 1_000_000 + 60_000
    groups = await ConsumerGroups.load(swal.wal)
    await groups.create("g")
    await groups.commit("g", [("v", Position("p", ids[10], 0))])
    await ChannelRetention(swal, groups, None, NOW, wall_ms=lambda: later).check()
    first = swal.wal.first_id
    assert ids[0] < first <= ids[10]

    with pytest.raises(OutOfRangeError, match="outside pchannel"):
        swal.read(ReadOption(deliver_policy=DeliverPolicy.start_from(ids[0])))
    with pytest.raises(OutOfRangeError, match="truncated"):
        for _ in range(100):  # never a silent skip over what was truncated
            await behind.__anext__()
    await behind.aclose()

    kept = [m.message_id for m in await swal.wal.read_stored(first, 1 << 20)
            if m.message_type is MessageType.DATA]
    scanner = swal.read()  # "all": from the first kept message
    seen: list[int] = []
    async for pack in scanner:
        seen += [m.message_id for m in pack.messages if m.message_type is MessageType.DATA]  # type: ignore[misc]
        if seen and seen[-1] >= ids[-1]:
            break
    await scanner.aclose()
    assert seen == kept and first <= seen[0] <= first + 1  # the first kept may be a TimeTick


async def test_snapshot_above_first_id_after_a_crash_is_used_then_truncated(opened: Opened) -> None:
    """The state a kill between step 1 (snapshot) and step 2 (truncate) leaves behind."""
    swal = opened.swal
    assert swal is not None
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    await swal.append(bodies.insert("v", "c", rows(0, 3)))
    await data(swal, 10)
    await persisted_tick(swal)  # a cut above the first id, as the state under test has
    retention = ChannelRetention(swal, None, None, NOW)
    bound, _ = await retention.bound()
    cut = await swal.wal.block_start(bound)
    assert cut > 0
    from interceptors.recovery.snapshot import ShadowReplay  # noqa: PLC0415
    from interceptors.recovery.streaming_wal import default_interceptors  # noqa: PLC0415

    steps, _, txns, _ = default_interceptors(swal.wal, FAST)
    shadow = ShadowReplay(swal.wal, steps, txns)
    await shadow.advance(cut)
    await swal.wal.put_meta(SNAPSHOT_META, shadow.capture().encode())
    growing = swal.shard.growing_segments()

    swal = await opened.reopen()
    assert swal.wal.first_id == 0  # nothing truncated yet
    assert swal.shard.growing_segments() == growing and "c" in swal.shard.collections("v")
    done = await ChannelRetention(swal, None, None, NOW).check()
    assert done is not None and swal.wal.first_id >= cut
    swal = await opened.reopen()
    assert swal.shard.growing_segments() == growing and "c" in swal.shard.collections("v")


def test_a_damaged_snapshot_is_a_clear_error() -> None:
    with pytest.raises(Exception, match="recovery snapshot of pchannel 'p' is unreadable"):
        RecoverySnapshot.decode(b"{not json", "p")
    with pytest.raises(Exception, match="unknown version"):
        RecoverySnapshot.decode(b'{"version": 99, "message_id": 1, "steps": {}}', "p")


async def test_an_abandoned_expired_transaction_does_not_hold_the_cut_forever(opened: Opened) -> None:
    swal = opened.swal
    assert swal is not None
    await data(swal, 5)
    _, begin = await swal.begin_txn("w", keepalive_ms=20)  # never committed nor rolled back
    await until(lambda: swal.txns.min_open_begin_id() is None, "ticks to expire the idle transaction")
    await data(swal, 10)
    # The expiry is seen by replay only through a persisted TimeTick after the keepalive; the tick
    # made while the transaction was still open keeps its BeginTxn in the time index, so the time
    # bound passes it only with the tick after the next write.
    await persisted_tick(swal)
    await data(swal, 1)
    await persisted_tick(swal)
    assert swal.txns.min_open_begin_id() is None
    done = await ChannelRetention(swal, None, None, NOW).check()
    assert done is not None and swal.wal.first_id > begin.message_id


async def _flushed(flusher: Flusher, swal: StreamingWAL, *vchannels: str) -> None:
    for v in vchannels:
        await flusher.flush(v)
    ts = (await swal.append(Message(MessageType.DATA, "v", b"mark"))).timetick
    await flusher.wait_flushed(ts)


async def test_a_flusher_first_started_after_a_truncation_writes_the_retained_rows(
    opened: Opened, tmp_path: Path,
) -> None:
    swal = opened.swal
    assert swal is not None
    created = (await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))).message_id
    for i in range(3):
        await swal.append(bodies.insert("v", "c", rows(i, 1)))
    last = (await data(swal, 3))[-1]
    # A persisted tick's entry may name the last message itself (what it confirmed), and the cut keeps
    # that message: one more message after `last` makes the tick wanted lie strictly past it.
    await data(swal, 1)
    await persisted_tick(swal)
    await ChannelRetention(swal, None, None, NOW).check()
    assert swal.wal.first_id > last > created, "the CreateCollection and the first rows are gone from the log"
    for i in range(4):
        await swal.append(bodies.insert("v", "c", rows(100 + i, 1)))
    flusher = Flusher(swal, tmp_path / "parquet", FlusherConfig(checkpoint_interval_seconds=0.0))
    await flusher.start()
    try:
        await _flushed(flusher, swal, "v")
        assert pks(tmp_path / "parquet", "c") == [100, 101, 102, 103]
    finally:
        await flusher.aclose()


async def test_a_flusher_whose_checkpoint_was_truncated_away_starts_from_the_retained_log(
    opened: Opened, tmp_path: Path,
) -> None:
    swal = opened.swal
    assert swal is not None
    root = tmp_path / "parquet"
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    flusher = Flusher(swal, root, FlusherConfig(checkpoint_interval_seconds=0.0))
    await flusher.start()
    await swal.append(bodies.insert("v", "c", rows(0, 2)))
    await _flushed(flusher, swal, "v")
    await flusher.aclose()  # off from here: retention no longer waits for it
    stale = flusher.checkpoint.message_id
    await swal.append(bodies.create_collection("w", "d", SCHEMA, "pk"))
    lost = (await swal.append(bodies.insert("v", "c", rows(10, 2)))).message_id  # truncated while off
    await data(swal, 2)
    await persisted_tick(swal)
    done = await ChannelRetention(swal, None, None, NOW).check()
    assert swal.wal.first_id > lost > stale, (done, stale)
    await swal.append(bodies.insert("v", "c", rows(20, 2)))
    await swal.append(bodies.insert("w", "d", rows(30, 2)))
    again = Flusher(swal, root, FlusherConfig(checkpoint_interval_seconds=0.0))
    await again.start()
    try:
        await _flushed(again, swal, "v", "w")
        assert pks(root, "c") == [0, 1, 20, 21]
        assert pks(root, "d") == [30, 31], "a collection created after the checkpoint, before the cut"
    finally:
        await again.aclose()
