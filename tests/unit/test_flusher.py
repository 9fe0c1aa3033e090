"""The flusher over a real StreamingWAL (memory and RocksDB): what reaches Parquet, when, and exactly once."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import flusher as flusher_package
from flusher import CHECKPOINT_META, Flusher, FlusherConfig
from interceptors.recovery.streaming_wal import ChainConfig, StreamingWAL, open_streaming_wal
from tests.conftest import ManagerFactory
from tests.flushed import data_files, delete_files, pks, read_all
from tests.waiting import until
from wal import Message, SchemaMismatchError, TxnExpiredError, WALManager, bodies

FAST = ChainConfig(tick_interval=0.01, segment_max_rows=1000)
SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("name", pa.string()),
                    pa.field("vec", pa.list_(pa.float32(), 4))])


def rows(start: int, n: int, schema: pa.Schema = SCHEMA) -> pa.RecordBatch:
    return pa.record_batch([
        pa.array(range(start, start + n), pa.int64()),
        pa.array([f"r{i}" for i in range(start, start + n)]),
        pa.array([[float(i)] * 4 for i in range(start, start + n)], pa.list_(pa.float32(), 4)),
    ], schema=schema)


async def open_stream(manager: WALManager, config: ChainConfig = FAST) -> StreamingWAL:
    if "p" not in await manager.list_channels():
        await manager.create_channel("p")
    swal = await open_streaming_wal(manager, "p", config)
    await swal.ready()
    return swal


async def settle(flusher: Flusher, swal: StreamingWAL) -> int:
    """Wait until the flusher processed everything appended so far; returns that timestamp."""
    ts = (await swal.append(Message(bodies.MessageType.DATA, "v", b"mark"))).timetick
    await flusher.wait_flushed(ts)
    return ts


@pytest.fixture
async def swal(manager: WALManager) -> AsyncIterator[StreamingWAL]:
    s = await open_stream(manager)
    yield s
    await s.aclose()


async def start(swal: StreamingWAL, root: Path, **limits: object) -> Flusher:
    f = Flusher(swal, root, FlusherConfig(**limits))  # type: ignore[arg-type]
    await f.start()
    return f


# --- what reaches Parquet ------------------------------------------------------------------------
async def test_a_segment_seal_writes_its_rows_with_ts_and_segment_columns(swal: StreamingWAL, tmp_path: Path) -> None:
    f = await start(swal, tmp_path)
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    results = [await swal.append(bodies.insert("v", "c", rows(i * 10, 10))) for i in range(3)]
    assert data_files(tmp_path) == []  # nothing sealed yet: rows wait in memory
    await f.flush("v")
    files = data_files(tmp_path)
    assert len(files) == 1
    t = pq.read_table(files[0])
    assert t.column_names == ["pk", "name", "vec", "_ts", "_id", "_segment"]
    assert all(t.schema.field(c).type == pa.int64() for c in ("_ts", "_id", "_segment"))
    assert t.column("pk").to_pylist() == list(range(30))
    assert t.column("_ts").to_pylist() == [r.timetick for r in results for _ in range(10)]
    assert t.column("_id").to_pylist() == [r.message_id for r in results for _ in range(10)]
    stored = {m.message_id: m for m in await swal.wal.read_stored(swal.wal.first_id)}
    segment = bodies.read_segment(stored[results[0].message_id])
    assert set(t.column("_segment").to_pylist()) == {segment}
    assert files[0].parent.name == f"segment={segment}" and files[0].parent.parent.name == "partition=_default"
    assert files[0].name == f"{results[0].message_id:020d}-{results[-1].message_id:020d}.parquet"
    assert pq.ParquetFile(files[0]).metadata.row_group(0).column(0).compression == "ZSTD"
    stats = f.stats()
    assert (stats.rows_written, stats.files_written, stats.buffered_bytes) == (30, 1, 0)
    await f.aclose()


async def test_a_seal_by_the_shard_step_writes_the_segment(manager: WALManager, tmp_path: Path) -> None:
    swal = await open_stream(manager, ChainConfig(tick_interval=0.01, segment_max_rows=10))
    f = await start(swal, tmp_path)
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    for i in range(5):
        await swal.append(bodies.insert("v", "c", rows(i * 4, 4)))  # 4 + 4 | 4 + 4 (seal at 10 rows) | 4
    await settle(f, swal)
    files = data_files(tmp_path)
    assert [pq.read_metadata(p).num_rows for p in files] == [8, 8]  # the fifth batch is still growing
    assert len({p.parent for p in files}) == 2
    await f.aclose()
    await swal.aclose()


async def test_committed_transactions_carry_the_commit_ts_and_rolled_back_or_expired_never_appear(
    swal: StreamingWAL, tmp_path: Path
) -> None:
    f = await start(swal, tmp_path)
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    ctx, _ = await swal.begin_txn("v", keepalive_ms=10_000)
    await swal.append(bodies.insert("v", "c", rows(0, 3)).with_txn(ctx))
    plain = await swal.append(bodies.insert("v", "c", rows(100, 2)))  # same segment, after the body by id
    rolled, _ = await swal.begin_txn("v", keepalive_ms=10_000)
    await swal.append(bodies.insert("v", "c", rows(200, 2)).with_txn(rolled))
    await swal.rollback_txn(rolled.txn_id)
    expiring, _ = await swal.begin_txn("v", keepalive_ms=30)
    await swal.append(bodies.insert("v", "c", rows(300, 2)).with_txn(expiring))
    commit = await swal.commit_txn(ctx.txn_id)
    await until(lambda: swal.txns.min_open_begin_id() is None, "ticks to expire the idle transaction")
    with pytest.raises(TxnExpiredError):
        await swal.commit_txn(expiring.txn_id)
    await f.flush("v")
    t = read_all(data_files(tmp_path))
    assert t is not None
    got = dict(zip(t.column("pk").to_pylist(), t.column("_ts").to_pylist(), strict=True))
    assert got == {100: plain.timetick, 101: plain.timetick, 0: commit.timetick, 1: commit.timetick,
                   2: commit.timetick}
    assert t.column("pk").to_pylist() == [100, 101, 0, 1, 2]  # in the order they became visible
    await f.aclose()


async def test_deletes_are_written_per_collection_with_the_primary_key_name_and_ts(
    swal: StreamingWAL, tmp_path: Path
) -> None:
    schema = pa.schema([pa.field("id", pa.string(), nullable=False), pa.field("x", pa.float64())])
    f = await start(swal, tmp_path)
    await swal.append(bodies.create_collection("v", "s", schema, "id"))
    d1 = await swal.append(bodies.delete("v", "s", ["a", "b"]))
    d2 = await swal.append(bodies.delete("v", "s", pa.array(["c"], pa.large_string())))
    files = await f.flush("v", "s")
    assert [Path(p).parent.as_posix() for p in files] == ["_deletes/s"]
    [path] = delete_files(tmp_path, "s")
    assert path.name == f"{d1.message_id:020d}-{d2.message_id:020d}.parquet"
    t = pq.read_table(path)
    assert t.column_names == ["id", "_ts", "_id"]
    assert t.schema.field("id").type == pa.string()
    assert t.to_pylist() == [{"id": "a", "_ts": d1.timetick, "_id": d1.message_id},
                             {"id": "b", "_ts": d1.timetick, "_id": d1.message_id},
                             {"id": "c", "_ts": d2.timetick, "_id": d2.message_id}]
    assert f.stats().delete_rows_written == 3
    await f.aclose()


async def test_manual_flush_writes_only_its_vchannel_and_collection(swal: StreamingWAL, tmp_path: Path) -> None:
    f = await start(swal, tmp_path)
    for v, c in (("v", "a"), ("v", "b"), ("w", "z")):
        await swal.append(bodies.create_collection(v, c, SCHEMA, "pk"))
        await swal.append(bodies.insert(v, c, rows(0, 2)))
    files = await f.flush("v", "a")
    assert len(files) == 1 and files[0].startswith("a/partition=_default/segment=")
    assert (tmp_path / files[0]).is_file()
    assert data_files(tmp_path, "b") == [] and data_files(tmp_path, "z") == []
    files = await f.flush("v")
    assert [p.split("/")[0] for p in files] == ["b"]
    assert await f.flush("v") == []
    assert len(await f.flush("")) == 1  # a broadcast flush reaches every vchannel
    assert pks(tmp_path, "z") == [0, 1]
    await f.aclose()


async def test_flush_returns_at_once_although_the_flusher_reads_only_by_ticks(
    manager: WALManager, tmp_path: Path
) -> None:
    # An hour between beats and no other reader: nothing ticks unless the flush asks for it.
    s = await open_stream(manager, ChainConfig(tick_interval=3600))
    f = await start(s, tmp_path)
    await s.append(bodies.create_collection("v", "a", SCHEMA, "pk"))
    await s.append(bodies.insert("v", "a", rows(0, 3)))
    files = await asyncio.wait_for(f.flush("v", "a"), 10)
    assert len(files) == 1 and pks(tmp_path, "a") == [0, 1, 2]
    await f.aclose()
    await s.aclose()


# --- limits ---------------------------------------------------------------------------------------
async def test_row_and_byte_limits_cut_files(swal: StreamingWAL, tmp_path: Path) -> None:
    f = await start(swal, tmp_path, max_rows=25)
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    for i in range(6):
        await swal.append(bodies.insert("v", "c", rows(i * 10, 10)))
    await settle(f, swal)
    assert [pq.read_metadata(p).num_rows for p in data_files(tmp_path)] == [30, 30]
    await f.aclose()
    size = len(bodies.insert("v", "c", rows(0, 10)).payload)
    # The same log again into another root (with its own checkpoint), cut by bytes this time.
    g = await start(swal, tmp_path / "b", max_bytes=size * 2, checkpoint_name="second")
    await settle(g, swal)
    assert [pq.read_metadata(p).num_rows for p in data_files(tmp_path / "b")] == [20, 20, 20]
    assert pks(tmp_path / "b") == list(range(60))
    await g.aclose()


async def test_the_age_limit_writes_an_idle_buffer(swal: StreamingWAL, tmp_path: Path) -> None:
    f = await start(swal, tmp_path, max_age_seconds=0.2)
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    await swal.append(bodies.insert("v", "c", rows(0, 3)))
    await settle(f, swal)
    assert data_files(tmp_path) == []
    # Idle TimeTicks keep the flusher's clock going: the buffer is written once it is 0.2 s old.
    await until(lambda: bool(data_files(tmp_path)), "the idle buffer to be written")
    assert pks(tmp_path) == [0, 1, 2]
    await f.aclose()


async def test_the_age_limit_counts_from_the_data_not_from_a_restart(swal: StreamingWAL, tmp_path: Path) -> None:
    limit = 2.0
    f = await start(swal, tmp_path, max_age_seconds=limit)
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    inserted = await swal.append(bodies.insert("v", "c", rows(0, 3)))
    await settle(f, swal)
    await f.aclose()  # a restart before the age limit: the rows were only in memory
    assert data_files(tmp_path) == []
    born_ms = inserted.timetick >> 18
    await until(lambda: time.time_ns() // 1_000_000 > born_ms + limit * 1000, "the rows to pass the age limit",
                timeout=limit + 10)
    loop = asyncio.get_running_loop()
    restarted = loop.time()
    g = await start(swal, tmp_path, max_age_seconds=limit)  # replays the rows from its checkpoint
    await until(lambda: bool(data_files(tmp_path)), "the replayed rows to be written")
    # Already older than the limit when replayed: written at once, not a whole limit after the restart.
    assert loop.time() - restarted < limit
    assert pks(tmp_path) == [0, 1, 2]
    await g.aclose()


async def test_the_memory_cap_writes_the_largest_buffer_first(swal: StreamingWAL, tmp_path: Path) -> None:
    small = len(bodies.insert("v", "a", rows(0, 5)).payload)
    big = len(bodies.insert("v", "b", rows(0, 50)).payload)
    cap = big * 2 + small * 2
    f = await start(swal, tmp_path, memory_cap_bytes=cap)
    for c in ("a", "b"):
        await swal.append(bodies.create_collection("v", c, SCHEMA, "pk"))
    await swal.append(bodies.insert("v", "a", rows(0, 5)))
    await swal.append(bodies.insert("v", "b", rows(0, 50)))
    await swal.append(bodies.insert("v", "b", rows(50, 50)))
    await settle(f, swal)
    assert data_files(tmp_path, "a") == data_files(tmp_path, "b") == []  # under the cap
    await swal.append(bodies.insert("v", "a", rows(5, 5)))
    await swal.append(bodies.insert("v", "a", rows(10, 5)))  # over the cap: b, the largest, goes
    await settle(f, swal)
    assert pks(tmp_path, "b") == list(range(100)) and data_files(tmp_path, "a") == []
    stats = f.stats()
    assert stats.buffered_bytes == 3 * small and stats.peak_buffered_bytes <= cap + small
    await f.aclose()


# --- DDL ------------------------------------------------------------------------------------------
async def test_drop_collection_writes_what_is_left_and_a_marker_and_ignores_later_messages(
    swal: StreamingWAL, tmp_path: Path
) -> None:
    f = await start(swal, tmp_path)
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    await swal.append(bodies.insert("v", "c", rows(0, 4)))
    await swal.append(bodies.delete("v", "c", [1]))
    drop = await swal.append(bodies.drop_collection("v", "c"))
    await settle(f, swal)
    assert pks(tmp_path) == [0, 1, 2, 3]
    assert len(delete_files(tmp_path)) == 1
    marker = json.loads((tmp_path / "c" / "_dropped").read_text())
    assert marker == {"collection": "c", "vchannel": "v", "timetick": drop.timetick, "message_id": drop.message_id}
    # A second vchannel's collection of another name is untouched; nothing more appears for "c".
    await swal.append(bodies.create_collection("w", "d", SCHEMA, "pk"))
    await swal.append(bodies.insert("w", "d", rows(0, 1)))
    assert await f.flush("v") == []
    assert len(await f.flush("w")) == 1
    assert f.stats().buffers == 0
    await f.aclose()


async def test_rows_refused_by_the_shard_step_never_reach_the_flusher(swal: StreamingWAL, tmp_path: Path) -> None:
    f = await start(swal, tmp_path)
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    wrong = pa.record_batch([pa.array([1], pa.int64()), pa.array([2], pa.int64()),
                             pa.array([[0.0] * 4], pa.list_(pa.float32(), 4))], names=["pk", "name", "vec"])
    with pytest.raises(SchemaMismatchError):
        await swal.append_batch([bodies.insert("v", "c", rows(0, 2)), bodies.insert("v", "c", wrong)])
    await swal.append(bodies.insert("v", "c", rows(10, 1)))
    await f.flush("v")
    assert pks(tmp_path) == [10]
    await f.aclose()


async def test_every_column_type_round_trips_through_parquet(swal: StreamingWAL, tmp_path: Path) -> None:
    schema = pa.schema([
        pa.field("id", pa.int64(), nullable=False), pa.field("i32", pa.int32()), pa.field("f32", pa.float32()),
        pa.field("f64", pa.float64()), pa.field("ok", pa.bool_()), pa.field("s", pa.string()),
        pa.field("ls", pa.large_string()), pa.field("b", pa.binary()), pa.field("lb", pa.large_binary()),
        pa.field("vec", pa.list_(pa.float32(), 3)), pa.field("doc", pa.json_()),
    ])
    batch = pa.record_batch([
        pa.array([1, 2], pa.int64()), pa.array([-1, None], pa.int32()), pa.array([1.5, None], pa.float32()),
        pa.array([2.25, -0.0], pa.float64()), pa.array([True, None]), pa.array(["é", None]),
        pa.array(["x" * 10, ""], pa.large_string()), pa.array([b"\x00\xff", None]),
        pa.array([b"z", b""], pa.large_binary()),
        pa.array([[1.0, 2.0, 3.0], None], pa.list_(pa.float32(), 3)),
        pa.array(['{"a": [1, 2]}', None], pa.json_()),
    ], schema=schema)
    f = await start(swal, tmp_path)
    await swal.append(bodies.create_collection("v", "all", schema, "id"))
    await swal.append(bodies.insert("v", "all", batch))
    await f.flush("v")
    [path] = data_files(tmp_path, "all")
    t = pq.read_table(path)
    assert t.column_names == [*schema.names, "_ts", "_id", "_segment"]
    assert t.select(schema.names).schema.remove_metadata().equals(schema)
    assert t.select(schema.names).to_pylist() == batch.to_pylist()
    await f.aclose()


# --- exactly once across restarts -----------------------------------------------------------------
async def test_a_restart_replays_buffered_rows_and_skips_committed_ones(
    open_manager: ManagerFactory, tmp_path: Path
) -> None:
    manager = await open_manager()
    swal = await open_stream(manager)
    f = await start(swal, tmp_path, max_rows=5)
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    for i in range(7):
        await swal.append(bodies.insert("v", "c", rows(i * 2, 2)))  # files of 6 rows; 2 rows buffered
    await settle(f, swal)
    assert pks(tmp_path) == list(range(12))
    before = f.checkpoint
    await f.aclose()
    await swal.aclose()
    await manager.aclose()

    manager = await open_manager()
    swal = await open_stream(manager)
    f = await start(swal, tmp_path, max_rows=5)
    assert f.checkpoint == before
    await swal.append(bodies.insert("v", "c", rows(100, 1)))  # the collection came back from the checkpoint
    await f.flush("v")
    assert pks(tmp_path) == [*range(14), 100]
    await f.aclose()
    await swal.aclose()


async def test_a_lost_checkpoint_replays_everything_without_duplicates_even_across_transactions(
    swal: StreamingWAL, tmp_path: Path
) -> None:
    """The files are the truth: with the checkpoint gone, every message is read again and each
    directory skips what its files hold.  A transaction body is older by id than rows written while
    it was open, but visible after them: an id watermark would lose it here."""
    f = await start(swal, tmp_path, max_rows=2)
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    ctx, _ = await swal.begin_txn("v", keepalive_ms=10_000)
    await swal.append(bodies.insert("v", "c", rows(0, 1)).with_txn(ctx))
    await swal.append(bodies.insert("v", "c", rows(10, 2)))  # a file of its own (max_rows=2), id above the body
    await swal.commit_txn(ctx.txn_id)
    await swal.append(bodies.insert("v", "c", rows(20, 1)))
    await swal.append(bodies.delete("v", "c", [10]))
    await settle(f, swal)
    assert pks(tmp_path) == [0, 10, 11, 20]  # the body and row 20 made the second file
    assert len(data_files(tmp_path)) == 2
    await f.aclose()
    await swal.wal.put_meta(CHECKPOINT_META, json.dumps(
        {"version": 1, "message_id": swal.wal.first_id, "timetick": 0, "collections": []}).encode())
    g = await start(swal, tmp_path, max_rows=2)
    await swal.append(bodies.insert("v", "c", rows(30, 1)))
    await g.flush("")
    assert pks(tmp_path) == [0, 10, 11, 20, 30]
    t = read_all(delete_files(tmp_path))
    assert t is not None and t.column("pk").to_pylist() == [10]
    await g.aclose()


async def test_a_replay_that_cuts_files_elsewhere_still_writes_each_row_and_delete_once(
    swal: StreamingWAL, tmp_path: Path
) -> None:
    """Deterministic names make a replay with the same limits rewrite the same files; with other limits
    the names differ, and only the skip of what the files already hold keeps each row once."""
    f = await start(swal, tmp_path, max_rows=2)
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    for i in range(5):
        await swal.append(bodies.insert("v", "c", rows(i * 10, 1)))  # files [0, 10] and [20, 30]; 40 buffered
    for k in (0, 10, 20):
        await swal.append(bodies.delete("v", "c", [k]))  # a delete file [0, 10]; 20 buffered
    await settle(f, swal)
    assert (len(data_files(tmp_path)), len(delete_files(tmp_path))) == (2, 1)
    await f.aclose()
    await swal.wal.put_meta(CHECKPOINT_META, json.dumps(
        {"version": 1, "message_id": swal.wal.first_id, "timetick": 0, "collections": []}).encode())
    g = await start(swal, tmp_path, max_rows=3)  # everything is read again, cut in threes
    await g.flush("")
    assert pks(tmp_path) == [0, 10, 20, 30, 40]
    t = read_all(delete_files(tmp_path))
    assert t is not None and sorted(t.column("pk").to_pylist()) == [0, 10, 20]
    await g.aclose()


async def test_wait_flushed_fails_when_the_flusher_is_closed(swal: StreamingWAL, tmp_path: Path) -> None:
    f = await start(swal, tmp_path)
    waiter = asyncio.ensure_future(f.wait_flushed(1 << 62))
    await until(lambda: bool(f._waiters), "the waiter to register")
    await f.aclose()
    with pytest.raises(Exception, match="closed"):
        await waiter
    await f.aclose()  # idempotent


async def test_rows_of_a_transaction_committed_after_its_segment_sealed_are_written_without_a_flush(
    manager: WALManager, tmp_path: Path
) -> None:
    swal = await open_stream(manager, ChainConfig(tick_interval=0.01, segment_max_rows=10))
    f = await start(swal, tmp_path)
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    ctx, _ = await swal.begin_txn("v", keepalive_ms=10_000)
    await swal.append(bodies.insert("v", "c", rows(0, 3)).with_txn(ctx))
    await swal.append(bodies.insert("v", "c", rows(10, 7)))  # the segment reaches 10 rows: sealed
    await settle(f, swal)
    assert pks(tmp_path) == list(range(10, 17))
    commit = await swal.commit_txn(ctx.txn_id)
    await f.wait_flushed(commit.timetick)
    files = data_files(tmp_path)
    assert len(files) == 2 and files[0].parent == files[1].parent  # the same segment, a second file
    assert pks(tmp_path) == [0, 1, 2, *range(10, 17)]
    await f.aclose()
    await swal.aclose()


async def test_stats_and_checkpoint_follow_the_log(swal: StreamingWAL, tmp_path: Path) -> None:
    # No interval: every pack the flusher processes may move the checkpoint, so each settle below is a
    # chance for it to pass the buffered rows (no waiting on time).
    f = await start(swal, tmp_path, checkpoint_interval_seconds=0.0)
    assert f.checkpoint.message_id == swal.wal.first_id
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    ins = await swal.append(bodies.insert("v", "c", rows(0, 5)))
    await settle(f, swal)
    s = f.stats()
    assert (s.buffers, s.buffered_rows, s.rows_written) == (1, 5, 0)
    for _ in range(3):
        await settle(f, swal)
        assert f.checkpoint.message_id <= ins.message_id  # buffered rows hold the checkpoint back
    assert f.checkpoint.message_id > swal.wal.first_id, "the checkpoint moved up to the buffered rows"
    await f.flush("v")
    ts = await settle(f, swal)
    assert f.checkpoint.message_id > ins.message_id  # written: the checkpoint moves past the rows
    assert f.stats().lag_ms >= 0 and f.stats().processed_timetick >= ts
    await f.aclose()


def test_the_package_exports_what_the_node_needs() -> None:
    assert set(flusher_package.__all__) == {
        "CHECKPOINT_META", "Flusher", "FlusherConfig", "FlusherState", "FlusherStats", "commit_file",
        "remove_temporaries",
    }


def test_importing_the_package_stays_light_for_spark_submit() -> None:
    # The reader takes the timestamp layout from wal.clock and the zone rule from wal.zoned_time (both
    # standard library only); nothing else of the log, no RocksDB and no gRPC may load with it.
    code = ("import sys, flusher, flusher.read.spark; "
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('rocksdict', 'interceptors', 'grpc') "
            "or (m.startswith('wal') and m not in ('wal', 'wal.clock', 'wal.zoned_time'))); "
            "print(heavy); assert flusher.Flusher.__name__ == 'Flusher'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"
