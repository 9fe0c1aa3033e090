"""Compaction of small files (flusher/compact.py) over files a real flusher wrote."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flusher import CHECKPOINT_META, Flusher, FlusherConfig, layout
from flusher.compact import CompactionConfig, compact_collection
from interceptors.recovery.streaming_wal import StreamingWAL
from tests.unit.test_flusher import SCHEMA, open_stream, rows, settle
from wal import WALManager, bodies

EAGER = CompactionConfig(min_files=2, horizon_seconds=0, grace_seconds=0)


def _tuples(files: list[str], pk: str = "pk") -> list[tuple[int, int, int]]:
    out: list[tuple[int, int, int]] = []
    for f in files:
        t = pq.read_table(f)
        ids = t.column("_id").to_pylist() if "_id" in t.column_names else [0] * t.num_rows
        out.extend(zip(t.column(pk).to_pylist(), t.column("_ts").to_pylist(), ids, strict=True))
    return out


def visible(root: Path, as_of: int | None = None) -> list[tuple[int, int]]:
    """The rows a reader sees as of ``as_of`` by the row rule, from ``layout.visible_files``."""
    data, deletes, horizon = layout.visible_files(root, "c")
    layout.check_as_of(as_of, horizon, "c")
    dels = [d for d in _tuples(deletes) if as_of is None or d[1] <= as_of]
    out = []
    for k, ts, mid in _tuples(data):
        if as_of is not None and ts > as_of:
            continue
        if any(dk == k and (ts, mid) < (dts, did) for dk, dts, did in dels):
            continue
        out.append((k, ts))
    return sorted(out)


async def _small_files(swal: StreamingWAL, f: Flusher, n: int) -> list[int]:
    """``n`` flushes of two rows each, then deletes of keys 0 and 3 (and of 1000, never inserted);
    returns the timeticks after each step."""
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    ticks = []
    for i in range(n):
        await swal.append(bodies.insert("v", "c", rows(2 * i, 2)))
        await f.flush("v", "c")
        ticks.append(await settle(f, swal))
    await swal.append(bodies.delete("v", "c", [0, 1000]))
    await f.flush("v", "c")
    await swal.append(bodies.delete("v", "c", [3]))
    await f.flush("v", "c")
    ticks.append(await settle(f, swal))
    return ticks


def _sizes(root: Path) -> tuple[int, int]:
    data, deletes, _ = layout.visible_files(root, "c")
    files = data + deletes
    return len(files), sum(Path(p).stat().st_size for p in files)


async def test_compaction_shrinks_the_files_drops_dead_rows_and_keeps_reads_at_or_after_the_horizon_exact(
    manager: WALManager, tmp_path: Path
) -> None:
    swal = await open_stream(manager)
    f = Flusher(swal, tmp_path, FlusherConfig(compaction=EAGER))
    await f.start()
    ticks = await _small_files(swal, f, 10)
    before = visible(tmp_path)
    count, size = _sizes(tmp_path)
    [r] = await f.compact()
    assert r.generation == 1 and r.rows_dropped == 2  # keys 0 and 3: deleted before the horizon
    assert r.delete_entries_dropped == 3  # no row older than any of them is left
    after_count, after_size = _sizes(tmp_path)
    assert (after_count, r.files_after) == (1, 1)  # the deletes are all gone: one data file
    assert after_count < count and after_size < size
    assert r.horizon is not None and r.horizon >= ticks[-1]
    later = await settle(f, swal)
    assert visible(tmp_path) == visible(tmp_path, later) == before
    assert visible(tmp_path, r.horizon) == before
    with pytest.raises(layout.AsOfBeforeHorizonError, match=f"as-of timetick {ticks[0]} is before"):
        visible(tmp_path, ticks[0])
    # Every input is gone (grace 0) and nothing hidden is left behind.
    assert [p.name for p in tmp_path.rglob(".*.parquet")] == []
    assert f.compaction_stats().runs == 1
    await f.aclose()
    await swal.aclose()


async def test_a_flusher_replaying_everything_never_writes_compacted_rows_again(
    manager: WALManager, tmp_path: Path
) -> None:
    swal = await open_stream(manager)
    f = Flusher(swal, tmp_path, FlusherConfig(compaction=EAGER))
    await f.start()
    await _small_files(swal, f, 6)
    expected = visible(tmp_path)
    await f.compact()
    await f.aclose()
    # The checkpoint is lost: the new flusher reads the whole log again.  Every segment directory it
    # would write to is gone; only the compaction record says what they held.
    await swal.wal.put_meta(CHECKPOINT_META, json.dumps(
        {"version": 1, "message_id": swal.wal.first_id, "timetick": 0, "collections": []}).encode())
    g = Flusher(swal, tmp_path, FlusherConfig(compaction=EAGER))
    await g.start()
    await swal.append(bodies.insert("v", "c", rows(500, 1)))
    await g.flush("")
    await settle(g, swal)
    assert visible(tmp_path) == sorted([*expected, *[(k, ts) for k, ts in visible(tmp_path) if k == 500]])
    # Nothing compacted away is written again (a reader would hide it by name, a plain glob would not).
    [rec] = layout.read_records(tmp_path, "c")
    assert [p for p in rec.inputs if (tmp_path / p).exists()] == []
    assert len([k for k, _ in visible(tmp_path) if k == 500]) == 1
    await g.aclose()
    await swal.aclose()


async def test_a_reader_running_while_compaction_runs_sees_the_old_set_or_the_new_never_a_mix(
    manager: WALManager, tmp_path: Path
) -> None:
    swal = await open_stream(manager)
    f = Flusher(swal, tmp_path, FlusherConfig())
    await f.start()
    await _small_files(swal, f, 8)
    expected = visible(tmp_path)
    seen: list[list[tuple[int, int]]] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def read() -> None:
        # The test's own reader of visible_files, and the shipped pyarrow reader, in turns.
        from flusher.read.spark import read_collection_arrow  # noqa: PLC0415

        turn = 0
        while not stop.is_set() or turn < 2:  # each reader at least once
            try:
                if turn % 2 == 0:
                    seen.append(visible(tmp_path))
                else:
                    t = read_collection_arrow(tmp_path, "c")
                    seen.append(sorted(zip(t.column("pk").to_pylist(), t.column("_ts").to_pylist(), strict=True)))
                turn += 1
            except BaseException as exc:
                errors.append(exc)
                return

    reader = threading.Thread(target=read)
    reader.start()
    try:
        # Several generations, each with a grace period of 0: inputs vanish right after the switch.
        for n in range(3):
            await swal.append(bodies.insert("v", "c", rows(100 + 2 * n, 2)))
            await f.flush("v", "c")
            await swal.append(bodies.insert("v", "c", rows(200 + 2 * n, 2)))
            await f.flush("v", "c")
            expected = visible(tmp_path)
            await f.compact()
            assert visible(tmp_path) == expected
    finally:
        stop.set()
        reader.join()
    assert errors == []
    assert len(seen) >= 2 and all(s in _prefixes(expected) for s in seen)
    await f.aclose()
    await swal.aclose()


def _prefixes(final: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Every state a reader may see: the rows of the first k inserts of the test (in ts order)."""
    by_ts = sorted(final, key=lambda r: r[1])
    return [sorted(by_ts[:k]) for k in range(len(by_ts) + 1)]


def _write(root: Path, directory: str, keys: list[int], ts: int, mid: int, *, data: bool = True) -> None:
    cols = {"pk": pa.array(keys, pa.int64()), "_ts": pa.array([ts] * len(keys), pa.int64()),
            "_id": pa.array([mid] * len(keys), pa.int64())}
    if data:
        cols["_segment"] = pa.array([1] * len(keys), pa.int64())
    key = layout.encode_key((ts, mid))
    t = pa.table(cols).replace_schema_metadata({layout.FIRST_KEY: key, layout.LAST_KEY: key,
                                                b"streamingnode.primary_key": b"pk"})
    (root / directory).mkdir(parents=True, exist_ok=True)
    pq.write_table(t, root / directory / layout.file_name(mid, mid))


def test_an_offline_pass_keeps_every_delete_entry(tmp_path: Path) -> None:
    """Offline (no flusher), rows not yet flushed may be older than an entry: none is dropped."""
    for i in range(2):
        _write(tmp_path, layout.deletes_dir("c"), [i], 10 + i, i, data=False)
    r = compact_collection(tmp_path, "c", EAGER, drop_deletes=False)
    assert (r.generation, r.files_before, r.files_after, r.delete_entries_dropped) == (1, 2, 1, 0)
    _, deletes, _ = layout.visible_files(tmp_path, "c")
    assert sorted(k for k, _, _ in _tuples(deletes)) == [0, 1]


def test_a_delete_entry_stays_while_a_row_it_removes_is_left_in_a_file_not_compacted(tmp_path: Path) -> None:
    """Partition q has one file (under min_files, few dead rows): its row of key 7 is not rewritten, so
    the entry that removes it must stay although the rows of key 7 in partition p are dropped."""
    for i in range(3):
        _write(tmp_path, "c/partition=p/segment=1", [7, 10 + i], 10 + i, i)
    _write(tmp_path, "c/partition=q/segment=2", [7, 20, 21, 22, 23, 24], 20, 5)
    _write(tmp_path, layout.deletes_dir("c"), [7], 30, 9, data=False)
    _write(tmp_path, layout.deletes_dir("c"), [11], 40, 10, data=False)  # removes p's row of key 11
    r = compact_collection(tmp_path, "c", EAGER, now_ms=1 << 40)
    assert (r.rows_dropped, r.delete_entries_dropped) == (4, 1)  # p's three 7s and its 11; the entry of 11
    data, deletes, _ = layout.visible_files(tmp_path, "c")
    assert sorted(k for k, _, _ in _tuples(deletes)) == [7]
    assert sorted(k for k, _, _ in _tuples(data)) == [7, 10, 12, 20, 21, 22, 23, 24]  # q's 7 is still there
    assert [k for k, _ in visible(tmp_path)] == [10, 12, 20, 21, 22, 23, 24]  # and still removed


async def test_a_pass_asked_for_while_the_files_are_still_checked_waits_for_the_check(
    manager: WALManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the model walk: a pass right after a restart deleted a file the check of the committed
    files was about to read, and the check took the missing file for damage."""
    import asyncio  # noqa: PLC0415

    from flusher import _probe  # noqa: PLC0415
    from flusher import compact as compact_module  # noqa: PLC0415
    from tests.waiting import until  # noqa: PLC0415

    swal = await open_stream(manager)
    f = Flusher(swal, tmp_path, FlusherConfig())
    await f.start()
    await _small_files(swal, f, 4)
    expected = visible(tmp_path)
    await f.aclose()
    order: list[str] = []
    release = asyncio.Event()
    real_probe, real_pass = _probe.probe, compact_module.compact_collection

    async def held_probe(mode: str, *args: object) -> AsyncIterator[object]:
        data = mode == _probe.DATA  # the check of the data; the footers' scan at start goes through
        if data:
            order.append("check started")
            await release.wait()
        async for answer in real_probe(mode, *args):  # type: ignore[arg-type]
            yield answer
        if data:
            order.append("check done")

    def watched_pass(*args: object, **kwargs: object) -> object:
        order.append("pass")
        return real_pass(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_probe, "probe", held_probe)
    monkeypatch.setattr(compact_module, "compact_collection", watched_pass)
    g = Flusher(swal, tmp_path, FlusherConfig())
    await g.start()
    try:
        passing = asyncio.get_running_loop().create_task(g.compact("c", config=EAGER))
        await until(lambda: "check started" in order, "the check of the committed files to start")
        assert not passing.done() and "pass" not in order
        release.set()
        [r] = await passing
        assert r.generation == 1
        assert order == ["check started", "check done", "pass"]
        assert g.problems == [] and visible(tmp_path) == expected
    finally:
        await g.aclose()
        await swal.aclose()
