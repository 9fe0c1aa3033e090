"""The backend conformance suite: every test runs on the memory and the RocksDB backend."""

from __future__ import annotations

import asyncio
import pathlib

import pytest

from tests.conftest import BackendHarness, ManagerFactory
from tests.factories import flat, ins, packs_until, tick
from tests.waiting import until
from wal import (
    ChannelExistError,
    ChannelFencedError,
    ChannelNotExistError,
    DeliverPolicy,
    ImmutableMessageError,
    InvalidArgumentError,
    Message,
    MessageType,
    OnShutdownError,
    OutOfRangeError,
    ReadOption,
    StreamingError,
    WALManager,
)


async def test_channels_create_list_describe_destroy(manager: WALManager) -> None:
    await manager.create_channel("b", {"role": "test"})
    await manager.create_channel("a")
    assert await manager.list_channels() == ["a", "b"]
    with pytest.raises(ChannelExistError, match="'a' already exists"):
        await manager.create_channel("a")
    info = await manager.describe_channel("b")
    assert (info.name, info.term, info.properties, info.last_id) == ("b", 0, {"role": "test"}, None)
    await manager.destroy_channel("a")
    assert await manager.list_channels() == ["b"]
    with pytest.raises(ChannelNotExistError):
        await manager.destroy_channel("a")
    with pytest.raises(ChannelNotExistError, match="'nope' does not exist"):
        await manager.open("nope")


async def test_invalid_channel_names(manager: WALManager) -> None:
    for bad in ["", "x" * 300, "a\x00b"]:
        with pytest.raises(InvalidArgumentError):
            await manager.create_channel(bad)


async def test_append_assigns_dense_ids_and_term(manager: WALManager) -> None:
    await manager.create_channel("p")
    wal = await manager.open("p")
    r1 = await wal.append(ins("v", 1))
    rs = await wal.append_batch([ins("v", 2), ins("v", 3)])
    assert [r1.message_id] + [r.message_id for r in rs] == [0, 1, 2]
    assert [r.timetick for r in rs] == [2, 3]
    assert wal.last_id == 2 and wal.last_timetick == 3
    assert await wal.append_batch([]) == []


async def test_appended_message_becomes_immutable(manager: WALManager) -> None:
    await manager.create_channel("p")
    wal = await manager.open("p")
    msg = ins("v", 1)
    await wal.append(msg)
    assert msg.message_id == 0 and msg.wal_term == wal.term
    with pytest.raises(ImmutableMessageError):
        msg.with_timetick(5)
    with pytest.raises(InvalidArgumentError, match="already appended"):
        await wal.append(msg)


async def test_concurrent_appends_are_group_committed(manager: WALManager) -> None:
    await manager.create_channel("p")
    wal = await manager.open("p")
    results = await asyncio.gather(*(wal.append(ins("v", i + 1, b"x" * 100)) for i in range(500)))
    ids = sorted(r.message_id for r in results)
    assert ids == list(range(500))
    # 500 concurrent appends must not take 500 writes: they coalesce while a write runs.
    assert manager._committer.commits < 250


async def test_many_pchannels_in_one_backend(manager: WALManager) -> None:
    wals = []
    for i in range(5):
        await manager.create_channel(f"p{i}")
        wals.append(await manager.open(f"p{i}"))
    await asyncio.gather(*(w.append_batch([ins("v", k + 1, f"{w.pchannel}-{k}".encode()) for k in range(20)])
                           for w in wals))
    for w in wals:
        await w.append(tick(100))
        got = flat(await packs_until(w.read(), 100))
        assert [m.payload for m in got] == [f"{w.pchannel}-{k}".encode() for k in range(20)]


async def test_reopen_recovers_ids_timetick_and_term(open_manager: ManagerFactory) -> None:
    m = await open_manager()
    await m.create_channel("p")
    wal = await m.open("p")
    await wal.append_batch([ins("v", 10), ins("v", 30), ins("v", 20)])
    await m.aclose()
    m2 = await open_manager()
    wal2 = await m2.open("p")
    assert (wal2.term, wal2.first_id, wal2.next_id, wal2.last_timetick) == (2, 0, 3, 30)
    assert (await wal2.append(ins("v", 40))).message_id == 3
    await wal2.append(tick(50))
    got = flat(await packs_until(wal2.read(), 50))
    assert [m.timetick for m in got] == [10, 20, 30, 40]
    assert [m.wal_term for m in got] == [1, 1, 1, 2]


async def test_recovered_last_timetick_never_goes_backwards(open_manager: ManagerFactory) -> None:
    m = await open_manager()
    await m.create_channel("p")
    wal = await m.open("p")
    await wal.append(ins("v", 100))
    await wal.append(ins("v", 5))  # a later block with an older timestamp
    assert wal.last_timetick == 100
    await m.aclose()
    m2 = await open_manager()
    assert (await m2.open("p")).last_timetick == 100
    assert (await m2.describe_channel("p")).last_timetick == 100


async def test_reopen_fences_the_older_handle(manager: WALManager) -> None:
    await manager.create_channel("p")
    old = await manager.open("p")
    await old.append(ins("v", 1))
    new = await manager.open("p")
    assert new.term == old.term + 1
    with pytest.raises(ChannelFencedError) as info:
        await old.append(ins("v", 2))
    assert info.value.is_fenced and info.value.fields["term"] == old.term
    assert (await new.append(ins("v", 2))).message_id == 1


async def test_time_index_seek(manager: WALManager) -> None:
    await manager.create_channel("p")
    wal = await manager.open("p")
    for base in (100, 200, 300):
        await wal.append_batch([ins("v", base + 1), ins("v", base + 2), tick(base + 10)])
    entry = await wal._manager._run_read(manager.backend.seek_time, wal._channel_key, 215)
    assert entry is not None and (entry.timetick, entry.message_id) == (210, 5)
    assert await wal._manager._run_read(manager.backend.seek_time, wal._channel_key, 50) is None
    got = flat(await packs_until(wal.read(ReadOption(deliver_policy=DeliverPolicy.start_at_time(202))), 310))
    assert [m.timetick for m in got] == [202, 301, 302]


async def test_truncate_drops_whole_blocks_and_refuses_old_positions(open_manager: ManagerFactory) -> None:
    m = await open_manager()
    await m.create_channel("p")
    wal = await m.open("p")
    for k in range(5):  # five blocks of two messages: ids [0,1] [2,3] ...
        await wal.append_batch([ins("v", 10 * k + 1), tick(10 * k + 2)])
    first = await wal.truncate(5)
    assert first == 4  # the block [4, 5] holds id 5 and stays
    with pytest.raises(OutOfRangeError, match="outside pchannel"):
        wal.read(ReadOption(deliver_policy=DeliverPolicy.start_from(1)))
    got = flat(await packs_until(wal.read(), 42))
    assert [x.message_id for x in got] == [4, 6, 8]
    entry = await m._run_read(m.backend.seek_time, wal._channel_key, 15)
    assert entry is None  # index entries of dropped ticks are gone
    with pytest.raises(OutOfRangeError):
        await wal.truncate(100)
    await m.aclose()
    wal2 = await (await open_manager()).open("p")
    assert (wal2.first_id, wal2.next_id) == (4, 10)


async def test_backup_is_consistent_and_opens(harness: BackendHarness, open_manager: ManagerFactory,
                                              tmp_path: pathlib.Path) -> None:
    m = await open_manager()
    await m.create_channel("p")
    wal = await m.open("p")
    await wal.append_batch([ins("v", i + 1, f"m{i}".encode()) for i in range(50)])
    dest = tmp_path / "backup"
    await m.backup(dest)
    await wal.append(ins("v", 99, b"after"))  # not in the backup
    with pytest.raises(InvalidArgumentError, match="already exists"):
        await m.backup(dest)
    restored = await WALManager.start(harness.restore(str(dest)))
    try:
        w2 = await restored.open("p")
        assert (w2.next_id, w2.last_timetick) == (50, 50)
        await w2.append(tick(60))
        got = flat(await packs_until(w2.read(), 60))
        assert [x.payload for x in got] == [f"m{i}".encode() for i in range(50)]
    finally:
        await restored.aclose()


async def test_closed_wal_refuses_appends_and_scanners_end(manager: WALManager) -> None:
    await manager.create_channel("p")
    wal = await manager.open("p")
    scanner = wal.read(ReadOption(deliver_policy=DeliverPolicy.latest()))
    pending = asyncio.create_task(scanner.__anext__())
    await until(lambda: scanner.caught_up, "the scanner waiting at the end of the log")
    await wal.aclose()
    with pytest.raises(OnShutdownError, match="closed"):
        await wal.append(ins("v", 1))
    with pytest.raises(OnShutdownError):
        await pending
    with pytest.raises(OnShutdownError):
        wal.read()


async def test_close_drains_appends_in_flight(manager: WALManager) -> None:
    await manager.create_channel("p")
    wal = await manager.open("p")
    appends = [asyncio.create_task(wal.append(ins("v", i + 1))) for i in range(100)]
    await asyncio.sleep(0)
    await wal.aclose()
    results = await asyncio.gather(*appends)
    assert sorted(r.message_id for r in results) == list(range(100))


async def test_destroyed_pchannel_fails_readers_and_writers(manager: WALManager) -> None:
    await manager.create_channel("p")
    wal = await manager.open("p")
    await wal.append_batch([ins("v", 1), tick(2)])
    scanner = wal.read(ReadOption(deliver_policy=DeliverPolicy.latest()))
    pending = asyncio.create_task(scanner.__anext__())
    await until(lambda: scanner.caught_up, "the scanner waiting at the end of the log")
    await manager.destroy_channel("p")
    with pytest.raises(ChannelNotExistError, match="destroyed"):
        await pending
    with pytest.raises(ChannelNotExistError):
        await wal.append(ins("v", 3))
    with pytest.raises(ChannelNotExistError):
        wal.read()
    with pytest.raises(ChannelNotExistError):
        await manager.open("p")
    await manager.create_channel("p")  # the name is free again, with no old data
    fresh = await manager.open("p")
    assert fresh.next_id == 0


async def test_not_persisted_and_foreign_objects_are_refused(manager: WALManager) -> None:
    await manager.create_channel("p")
    wal = await manager.open("p")
    with pytest.raises(InvalidArgumentError, match="not-persisted"):
        await wal.append(Message(MessageType.TIME_TICK, "", timetick=1, not_persisted=True))
    with pytest.raises(InvalidArgumentError, match="expected Message"):
        await wal.append_batch([ins("v", 1), b"raw bytes"])  # type: ignore[list-item]
    assert wal.next_id == 0  # nothing of either batch was written


async def test_manager_close_is_idempotent_and_refuses_work(open_manager: ManagerFactory) -> None:
    m = await open_manager()
    await m.create_channel("p")
    await m.aclose()
    await m.aclose()
    with pytest.raises(OnShutdownError):
        await m.open("p")


async def test_a_failed_write_hands_its_ids_back_and_a_failed_publish_is_fatal(manager: WALManager) -> None:
    await manager.create_channel("p")
    wal = await manager.open("p")
    real_write = manager.backend.write

    def broken(groups: object, durable: bool) -> None:
        raise OSError("disk full")

    manager.backend.write = broken  # type: ignore[method-assign]
    msg = ins("v", 1)
    with pytest.raises(StreamingError, match="disk full"):
        await wal.append(msg)
    assert msg.message_id is None  # unsealed: it may be appended again
    manager.backend.write = real_write  # type: ignore[method-assign]
    assert (await wal.append(msg)).message_id == 0  # ids stayed dense
    real_publish = wal._on_committed

    def broken_publish(*args: object) -> None:
        raise RuntimeError("bug")

    wal._on_committed = broken_publish  # type: ignore[method-assign]
    with pytest.raises(StreamingError, match="publishing a commit failed"):
        await asyncio.wait_for(wal.append(ins("v", 2)), 5)
    wal._on_committed = real_publish  # type: ignore[method-assign]
    with pytest.raises(StreamingError, match="reopen"):
        await asyncio.wait_for(wal.append(ins("v", 3)), 5)  # refused at once, never left hanging
