"""Periodic recovery snapshots over a real RocksDB WAL: a restart replays only what came after the
newest one (nothing truncated), a damaged newest one falls back to the one before it (or to full
replay) with a warning naming it and the recovered state is whole, and the shadow replay that feeds
them decodes in a worker thread, never on the event loop."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import structlog

from interceptors.dedup import PROP_PRODUCER, PROP_SEQUENCE
from interceptors.recovery.snapshot import (
    PERIODIC_METAS,
    SNAPSHOT_META,
    RecoverySnapshot,
    ShadowReplay,
    stored_snapshots,
)
from interceptors.recovery.streaming_wal import StreamingWAL, default_interceptors
from streamingnode.node import retention as retention_module
from streamingnode.node.retention import ChannelRetention, RetentionConfig, next_snapshot_poll
from tests.reopening import BY_HAND, SCHEMA, Opened, rows
from tests.waiting import persisted_tick, until
from wal import AppendResult, Message, MessageType, bodies


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Opened]:
    n = Opened(tmp_path / "db")
    await n.open()
    yield n
    await n.close()


async def data(swal: StreamingWAL, n: int) -> list[int]:
    return [(await swal.append(Message(MessageType.DATA, "v", b"x" * 100))).message_id for _ in range(n)]


async def snapshot(swal: StreamingWAL) -> RecoverySnapshot:
    retention = ChannelRetention(swal, None, None, BY_HAND)
    taken = await retention.snapshot(force=True)
    assert taken is not None
    return taken


async def collection_and_insert(swal: StreamingWAL) -> tuple[Message, AppendResult]:
    """Collection "c" and an insert from an idempotent producer ("prod", sequence 7): the insert as
    sent, and its result (a resend after recovery must get the same one from the dedup window)."""
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    insert = bodies.insert("v", "c", rows(0, 4))
    insert = Message(insert.message_type, "v", insert.payload,
                     {**insert.properties, PROP_PRODUCER: "prod", PROP_SEQUENCE: "7"})
    return insert, await swal.append(insert)


def again(sent: Message) -> Message:
    """``sent`` as its producer sends it again (without what the shard step stamped on it)."""
    return Message(sent.message_type, "v", sent.payload,
                   {k: v for k, v in sent.properties.items() if k not in (bodies.PROP_SEGMENT, "rows")})


async def flip_a_byte(swal: StreamingWAL, name: str) -> None:
    raw = await swal.wal.get_meta(name)
    assert raw is not None
    i = len(raw) // 2
    await swal.wal.put_meta(name, raw[:i] + bytes([raw[i] ^ 0x01]) + raw[i + 1:])


async def test_restart_replays_only_what_came_after_the_newest_snapshot(node: Opened) -> None:
    swal = node.swal
    assert swal is not None
    await data(swal, 60)
    taken = await snapshot(swal)
    assert taken.message_id > 60
    await data(swal, 7)
    await node.close()
    end = swal.wal.next_id  # after the close: a TimeTick the beat persisted just before it is replayed too

    swal = await node.open()
    assert swal.wal.first_id == 0  # nothing was truncated: only the snapshot shortened the replay
    assert swal.recovery_replayed == end - taken.message_id
    assert swal.recovery_replayed is not None and swal.recovery_replayed < 20


async def test_the_periodic_task_stores_snapshots_by_itself(node: Opened) -> None:
    """Every N messages: alternately in both slots, each one newer than the one before."""
    swal = node.swal
    assert swal is not None
    retention = ChannelRetention(swal, None, None, RetentionConfig(
        retention_seconds=-1, snapshot_every_messages=10, snapshot_every_seconds=0))
    await data(swal, 15)
    first = await retention.snapshot()
    assert first is not None
    assert await retention.snapshot() is None  # not due: fewer than 10 written since
    await data(swal, 15)
    second = await retention.snapshot()
    assert second is not None and second.message_id > first.message_id
    slots = [await swal.wal.get_meta(n) for n in PERIODIC_METAS]
    assert all(slots)
    assert {RecoverySnapshot.decode(s, "p").message_id for s in slots if s} == {first.message_id, second.message_id}


async def test_a_damaged_newest_snapshot_falls_back_to_the_one_before(node: Opened) -> None:
    swal = node.swal
    assert swal is not None
    resent, original = await collection_and_insert(swal)
    older = await snapshot(swal)
    # A transaction written after the older snapshot: the newer one is taken after its commit.
    ctx, _ = await swal.begin_txn("v", keepalive_ms=0)
    parts = [await swal.append(Message(MessageType.DATA, "v", f"t{i}".encode(), txn=ctx)) for i in range(3)]
    assert all(r.message_id for r in parts)
    await swal.commit_txn(ctx.txn_id)
    await data(swal, 5)
    newer = await snapshot(swal)
    assert newer.message_id > older.message_id
    (newer_slot,) = [n for n, s in (await stored_snapshots(swal.wal)).items() if s.message_id == newer.message_id]
    await flip_a_byte(swal, newer_slot)
    await node.close()
    end = swal.wal.next_id  # after the close: a TimeTick the beat persisted just before it is replayed too

    with structlog.testing.capture_logs() as logs:
        swal = await node.open()
    warned = [e for e in logs if e["log_level"] == "warning" and e.get("snapshot") == newer_slot]
    assert warned and "checksum" in warned[0]["error"]
    assert swal.recovery_replayed == end - older.message_id  # from the older one, not from 0
    # The recovered state is whole: the collection, the dedup window, the transaction.
    assert "c" in swal.shard.collections("v")
    assert await swal.append(again(resent)) == original
    # Committed whole before the restart: recovery rolled nothing back, nothing was added to it.
    assert await _txn_messages(swal, ctx.txn_id) == [
        MessageType.BEGIN_TXN, MessageType.DATA, MessageType.DATA, MessageType.DATA, MessageType.COMMIT_TXN]


async def test_every_snapshot_damaged_means_full_replay_with_a_warning(node: Opened) -> None:
    swal = node.swal
    assert swal is not None
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    await data(swal, 5)
    await snapshot(swal)
    await data(swal, 5)
    await snapshot(swal)
    for name in PERIODIC_METAS:
        await flip_a_byte(swal, name)
    await node.close()
    end = swal.wal.next_id  # after the close: a TimeTick the beat persisted just before it is replayed too

    with structlog.testing.capture_logs() as logs:
        swal = await node.open()
    assert {e.get("snapshot") for e in logs if e["log_level"] == "warning"} >= set(PERIODIC_METAS)
    assert swal.recovery_replayed == end
    assert "c" in swal.shard.collections("v")


async def test_no_snapshot_is_taken_inside_a_transaction(node: Opened) -> None:
    swal = node.swal
    assert swal is not None
    await data(swal, 3)
    retention = ChannelRetention(swal, None, None, BY_HAND)
    await retention.snapshot(force=True)
    ctx, begin = await swal.begin_txn("v", keepalive_ms=0)
    await swal.append(Message(MessageType.DATA, "v", b"in", txn=ctx))
    await persisted_tick(swal)
    assert await retention.snapshot(force=True) is None  # the transaction spans the end of the log
    commit = await swal.commit_txn(ctx.txn_id)
    taken = await retention.snapshot(force=True)
    assert taken is not None and taken.message_id > commit.message_id > begin.message_id


async def test_the_shadow_replay_decodes_in_a_worker_thread(node: Opened, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where it runs, not how long it takes: the decode and replay never run on the loop's thread."""
    swal = node.swal
    assert swal is not None
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    await data(swal, 30)
    await persisted_tick(swal)
    threads: list[int] = []
    real = ShadowReplay._replay_batch  # both paths: blocks read from storage, messages from the tail

    def spy(self: ShadowReplay, *args: object) -> bool:
        threads.append(threading.get_ident())
        return real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(ShadowReplay, "_replay_batch", spy)
    swal.recovered_snapshot = None  # the periodic shadow replays from the start, as after an old log
    await snapshot(swal)  # from the WAL's in-memory tail
    assert threads and threading.get_ident() not in threads
    # From storage: once the tail no longer holds them (evicted), the blocks are read and decoded.
    threads.clear()
    wal = swal.wal
    wal._tail.reset(wal.next_id)
    steps, _, txns, _ = default_interceptors(wal, swal.config)
    assert await ShadowReplay(wal, steps, txns).advance(wal.next_id)
    assert threads and threading.get_ident() not in threads
    threads.clear()
    # The truncation's shadow, too (no time floor: it cuts up to the last message).
    done = await ChannelRetention(swal, None, None, RetentionConfig(retention_seconds=0)).check()
    assert done is not None and await swal.wal.get_meta(SNAPSHOT_META) is not None
    assert threads and threading.get_ident() not in threads


async def test_the_shadow_replay_takes_what_the_tail_holds_without_reading_storage(
        node: Opened, monkeypatch: pytest.MonkeyPatch) -> None:
    """A periodic snapshot follows the log as it grows: what is still in the WAL's in-memory tail is
    replayed from there (on the shared log a storage read fetches every block back over the network),
    and the state is the same as replayed from storage."""
    swal = node.swal
    assert swal is not None
    _, _ = await collection_and_insert(swal)
    await data(swal, 40)
    await persisted_tick(swal)
    wal = swal.wal
    assert wal._tail.base <= wal.first_id  # the whole log is still in the tail
    reads: list[int] = []
    real = type(wal)._read_storage

    async def counting(self: object, from_id: int, max_bytes: int) -> object:
        reads.append(from_id)
        return await real(self, from_id, max_bytes)  # type: ignore[arg-type]

    monkeypatch.setattr(type(wal), "_read_storage", counting)

    async def replayed() -> RecoverySnapshot:
        steps, _, txns, _ = default_interceptors(wal, swal.config)  # fresh steps, as retention's shadow
        shadow = ShadowReplay(wal, steps, txns)
        assert await shadow.advance(wal.next_id)
        return shadow.capture()

    from_tail = await replayed()
    assert reads == [], f"storage read although the tail held those messages: from ids {reads}"
    wal._tail.reset(wal.next_id)  # the tail lost them (evicted): the same replay from storage
    from_storage = await replayed()
    assert reads, "the replay did not read storage once the tail no longer held the messages"
    assert from_tail.message_id == from_storage.message_id == wal.next_id
    # A segment's creation is exported as wall time (monotonic + the skew at export): it differs by
    # the clocks' jitter between the two captures, nothing else.
    walls = [[seg.pop("created_wall") for seg in snap.steps["shard"]["segments"]] for snap in (from_tail, from_storage)]
    assert walls[0] and all(abs(a - b) < 1.0 for a, b in zip(*walls, strict=True))
    assert from_tail.steps == from_storage.steps and from_tail.steps["dedup"]


async def _txn_messages(swal: StreamingWAL, txn_id: int) -> list[MessageType]:
    """The stored messages of transaction ``txn_id``, in id order, by type."""
    got: list[MessageType] = []
    nid = swal.wal.first_id
    while nid < swal.wal.next_id:
        batch = await swal.wal.read_stored(nid)
        got += [m.message_type for m in batch if m.txn is not None and m.txn.txn_id == txn_id]
        nid = batch[-1].message_id + 1  # type: ignore[operator]
    return got


async def test_big_messages_trigger_a_snapshot_by_size(node: Opened) -> None:
    """Few but big messages: the size trigger, not the count, makes the snapshot due (a pass sees the
    bytes once its shadow replayed them: the pass after they were written)."""
    swal = node.swal
    assert swal is not None
    retention = ChannelRetention(swal, None, None, RetentionConfig(
        retention_seconds=-1, snapshot_every_messages=0, snapshot_every_seconds=0, snapshot_every_bytes=1000))
    await data(swal, 5)  # 500 payload bytes
    assert await retention.snapshot() is None
    assert await retention.snapshot() is None  # replayed, still below the size
    await data(swal, 6)
    assert await retention.snapshot() is None  # the shadow replays them now
    taken = await retention.snapshot()
    assert taken is not None and taken.message_id > 11


async def test_a_flipped_byte_anywhere_in_the_newest_snapshot_falls_back_and_recovers_whole(node: Opened) -> None:
    """The corruption sweep for snapshots: one byte at a time, at offsets drawn with a fixed seed
    across the whole stored value, then a restart.  Each time the damaged snapshot is refused with a
    warning naming it, recovery starts from the older one, and the state is whole."""
    import random  # noqa: PLC0415

    swal = node.swal
    assert swal is not None
    resent, original = await collection_and_insert(swal)
    older = await snapshot(swal)
    await data(swal, 5)
    newer = await snapshot(swal)
    (newer_slot,) = [n for n, s in (await stored_snapshots(swal.wal)).items() if s.message_id == newer.message_id]
    raw = await swal.wal.get_meta(newer_slot)
    assert raw is not None
    rng = random.Random(20)
    for offset in sorted(rng.sample(range(len(raw)), min(40, len(raw)))):
        flipped = bytes([raw[offset] ^ rng.randrange(1, 256)])
        await swal.wal.put_meta(newer_slot, raw[:offset] + flipped + raw[offset + 1:])
        await node.close()
        end = swal.wal.next_id  # after the close: a TimeTick the beat persisted just before it is replayed too
        with structlog.testing.capture_logs() as logs:
            swal = await node.open()
        assert [e for e in logs if e["log_level"] == "warning" and e.get("snapshot") == newer_slot], \
            f"byte {offset}: the damaged snapshot was not refused by name"
        assert swal.recovery_replayed == end - older.message_id, f"byte {offset}: not recovered from the older one"
        assert "c" in swal.shard.collections("v")
        assert await swal.append(again(resent)) == original, f"byte {offset}: the dedup window was not recovered"
        await swal.wal.put_meta(newer_slot, raw)


# --- truncation at the periodic snapshots ----------------------------------------------------------
HAND_TASK = RetentionConfig(retention_seconds=0, check_seconds=3600, snapshot_every_messages=10**9,
                            snapshot_every_seconds=3600)
"""No time floor, no check loop; the snapshot task runs (its shadow follows the log) but stores only
when a test forces it."""


async def _payloads_below(swal: StreamingWAL, stop: int) -> int:
    """Payload bytes of the stored messages below ``stop`` (from the first retained one)."""
    total, nid = 0, swal.wal.first_id
    while nid < stop:
        batch = await swal.wal.read_stored(nid)
        total += sum(len(m.payload) for m in batch if m.message_id is not None and m.message_id < stop)
        nid = batch[-1].message_id + 1  # type: ignore[operator]
    return total


async def test_a_check_cuts_at_the_newest_periodic_snapshot_and_then_waits_for_the_next(node: Opened) -> None:
    swal = node.swal
    assert swal is not None
    resent, original = await collection_and_insert(swal)
    await data(swal, 20)
    retention = ChannelRetention(swal, None, None, HAND_TASK)
    retention.start()
    try:
        taken = await retention.snapshot(force=True)
        assert taken is not None
        await data(swal, 10)
        await persisted_tick(swal)
        cut = await swal.wal.block_start(taken.message_id)
        freed = await _payloads_below(swal, cut)
        done = await retention.check()
        # At the snapshot (its block's start), not at the last message the bounds allow: no replay.
        assert done is not None and done.before_id == cut == swal.wal.first_id
        assert done.payload_bytes == freed
        stored = await stored_snapshots(swal.wal)
        assert stored[SNAPSHOT_META].message_id == taken.message_id
        await data(swal, 10)
        assert await retention.check() is None, "no periodic snapshot past the cut yet: wait, never replay"
        assert swal.wal.first_id == cut
        second = await retention.snapshot(force=True)
        assert second is not None
        # The time bound passes the snapshot: a tick persisted after a message written after it (the
        # last tick persisted may be the very message before the snapshot's id).
        await data(swal, 1)
        await persisted_tick(swal)
        cut2 = await swal.wal.block_start(second.message_id)
        freed2 = await _payloads_below(swal, cut2)  # from the first retained message: the last cut
        later = await retention.check()
        # Counted from the periodic shadow's own replay, not read again: equal to what was freed.
        assert later is not None and later.before_id == cut2 and later.payload_bytes == freed2
        assert retention.stats().bytes_truncated == freed + freed2
    finally:
        await retention.aclose()
    # Recovery starts at the truncation snapshot: the state is whole.
    swal = await node.reopen()
    assert "c" in swal.shard.collections("v")
    assert await swal.append(again(resent)) == original


async def test_a_transaction_between_the_block_start_and_the_snapshot_means_a_replay(
    node: Opened, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Truncation keeps the whole block holding the snapshot's id.  Were a transaction's messages in
    that block, before the snapshot, the cut would split the transaction: the check replays instead
    (and cuts where the replay finds no transaction open)."""
    swal = node.swal
    assert swal is not None
    await data(swal, 5)
    ctx, begin = await swal.begin_txn("v", keepalive_ms=0)
    await swal.append(Message(MessageType.DATA, "v", b"in", txn=ctx))
    await swal.commit_txn(ctx.txn_id)
    await data(swal, 5)
    retention = ChannelRetention(swal, None, None, HAND_TASK)
    retention.start()
    try:
        taken = await retention.snapshot(force=True)
        assert taken is not None
        await data(swal, 5)
        await persisted_tick(swal)
        real = swal.wal.block_start

        async def block_start(message_id: int) -> int:
            # As if the snapshot's id sat in one block with the transaction (blocks are cut by the
            # committer's batching, which a test cannot steer): the block starts at its BeginTxn.
            return begin.message_id if message_id == taken.message_id else await real(message_id)

        monkeypatch.setattr(swal.wal, "block_start", block_start)
        done = await retention.check()
        assert done is not None and done.before_id not in (begin.message_id, taken.message_id), done
        assert done.before_id == await real(done.before_id) > taken.message_id, "the replay's cut"
    finally:
        await retention.aclose()


async def test_the_shadow_replay_skipping_plain_records_ends_in_the_state_of_a_replay_of_every_message(
        node: Opened, monkeypatch: pytest.MonkeyPatch) -> None:
    """The steps declare which plain messages they act on (``replay_types``), so the shadow hands them
    only those and the TimeTicks.  Over a mixed log (DDL, an idempotent producer's insert, plain
    records, a committed and an open transaction, ticks), that ends in the same state, position and
    payload count as handing every message to every step (what an undeclared step gets)."""
    swal = node.swal
    assert swal is not None
    await collection_and_insert(swal)
    await data(swal, 25)
    ctx, _ = await swal.begin_txn("v", keepalive_ms=0)
    await swal.append(Message(MessageType.DATA, "v", b"in-txn", txn=ctx))
    await swal.commit_txn(ctx.txn_id)
    await persisted_tick(swal)
    await data(swal, 10)
    open_ctx, _ = await swal.begin_txn("v", keepalive_ms=0)
    await swal.append(Message(MessageType.DATA, "v", b"open", txn=open_ctx))
    await data(swal, 5)
    wal = swal.wal
    head = wal.next_id  # the tick beat may append meanwhile: both replay up to here

    async def replayed() -> tuple[int, int, object, dict[str, object]]:
        steps, _, txns, _ = default_interceptors(wal, swal.config)
        shadow = ShadowReplay(wal, steps, txns)
        assert await shadow.advance(head)
        state = {s.name: s.export_state() for s in (st for st in steps if st.name != "txn")  # type: ignore[attr-defined]
                 if hasattr(s, "export_state")}
        return shadow.position, shadow.payload_bytes, shadow.open_txn_floor(), state

    filtered = await replayed()
    monkeypatch.setattr("interceptors.recovery.snapshot.plain_skipping_types", lambda step: None)
    every = await replayed()
    for snap in (filtered, every):
        for seg in snap[3]["shard"]["segments"]:  # type: ignore[index]
            seg.pop("created_wall")  # wall time at export: the clocks' jitter between the two
    assert filtered == every
    assert filtered[0] == head and filtered[2] is not None, "the open transaction is seen"


def test_the_periodic_pass_comes_sooner_while_the_log_grows_fast() -> None:
    """A quiet log waits the whole poll; a fast one waits for half of what the tail holds at the
    rate it grew, so the next pass finds its messages still in memory; never below the floor."""
    assert next_snapshot_poll(0.25, 0.25, 0, 1000) == 0.25  # nothing appended
    assert next_snapshot_poll(0.25, 0.25, 10, 16_000) == 0.25  # slow: the poll already covers it
    # 25,000 messages in 0.25 s (100k/s) with 16,000 in memory: half of them take 0.08 s.
    assert next_snapshot_poll(0.25, 0.25, 25_000, 16_000) == pytest.approx(0.08)
    assert next_snapshot_poll(0.25, 0.25, 10_000_000, 16_000) == retention_module._SNAPSHOT_MIN_POLL_SECONDS
    assert next_snapshot_poll(0.25, 0.0, 5, 16_000) == 0.25  # no time passed: no rate to go by
    assert next_snapshot_poll(0.25, 0.25, 5, 0) == 0.25  # nothing in memory (a tail of 0 bytes)


async def test_the_periodic_task_shortens_its_wait_while_appends_outrun_the_poll(
    node: Opened, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The task asks ``next_snapshot_poll`` with what was appended since its last pass and what the
    tail holds, and waits what it answers: at a fixed quarter second a bulk producer pushed the
    shadow's messages out of the tail, and every message was read back from storage and decoded a
    second time."""
    swal = node.swal
    assert swal is not None
    asked: list[tuple[int, int, float]] = []

    def recording(poll: float, elapsed: float, grown: int, held: int) -> float:
        wait = next_snapshot_poll(poll, elapsed, grown, held)
        asked.append((grown, held, wait))
        return wait

    monkeypatch.setattr(retention_module, "next_snapshot_poll", recording)
    retention = ChannelRetention(swal, None, None, RetentionConfig(
        retention_seconds=-1, snapshot_every_messages=1_000_000, snapshot_every_seconds=3600))
    retention.start()
    try:
        async def grown_once() -> bool:
            await data(swal, 20)
            return any(grown > 0 for grown, _, _ in asked)

        await until(grown_once, "a pass that saw appends")
        grown, held, _ = next(a for a in asked if a[0] > 0)
        assert grown > 0 and held > 0  # the log's messages (with its TimeTicks), and the tail's
    finally:
        await retention.aclose()
