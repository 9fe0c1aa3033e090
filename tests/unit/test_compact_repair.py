"""Repairing what older code's compaction did to a collection's only delete file (flusher/_overlaps.py).

The older naming is planted back (outputs named ``<first>-<last>.parquet``, no check of the record),
the ten-row reproduction runs through a real flusher, and a flusher started on the result repairs it:
from the file while it is there, from the WAL once it is gone, and reports it lost (readers keep
refusing the collection) once retention truncated the WAL past it.  ``verify`` names the record.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from flusher import Flusher, FlusherConfig, _overlaps, layout
from flusher.compact import CompactionConfig
from flusher.read.spark import read_collection_arrow
from interceptors.recovery.streaming_wal import StreamingWAL
from tests.unit.test_flusher import SCHEMA, open_stream, rows
from tests.waiting import until
from wal import WALManager, bodies

EAGER = CompactionConfig(min_files=2, horizon_seconds=0, grace_seconds=0)


@pytest.fixture
async def swal(manager: WALManager) -> AsyncIterator[StreamingWAL]:
    s = await open_stream(manager)
    yield s
    await s.aclose()


def _plant_old_naming(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = layout.file_name
    monkeypatch.setattr(layout, "file_name", lambda first, last, generation=None: plain(first, last))
    monkeypatch.setattr(layout, "check_record", lambda root, collection, rec: None)


async def _next_ms(after: int) -> None:
    """Wait until the wall clock is 2 ms past the physical part of timetick ``after``."""
    await until(lambda: time.time() * 1000 >= (after >> 18) + 2, "the clock to move past a timetick")


async def _old_passes(swal: StreamingWAL, f: Flusher) -> None:
    """The ten-row reproduction through a flusher: rows 1..8 in two files; deletes of keys 1, 2, 3 in
    three files, a few ms apart; pass A (horizon between the deletes of 1 and 2) merges the delete
    files into one; rows 9 and 10 in two files; pass B (horizon between 2 and 3) rewrites the one
    delete file, under its own name: the record lists it as input and output."""
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    for start in (1, 5):
        await swal.append(bodies.insert("v", "c", rows(start, 4)))
        await f.flush("v", "c")
    ticks = []
    for k in (1, 2, 3):
        if ticks:
            await _next_ms(ticks[-1])
        ticks.append((await swal.append(bodies.delete("v", "c", [k]))).timetick)
        await f.flush("v", "c")
    await _next_ms(ticks[-1])
    [a] = await f.compact("c", config=EAGER, now_ms=(ticks[0] >> 18) + 1)
    assert a.generation == 1 and a.delete_entries_dropped == 1
    for start in (9, 10):
        await swal.append(bodies.insert("v", "c", rows(start, 1)))
        await f.flush("v", "c")
    [b] = await f.compact("c", config=EAGER, now_ms=(ticks[1] >> 18) + 1)
    assert b.generation == 2 and b.delete_entries_dropped == 1
    [o] = _overlaps.find(f.root)
    assert o.record.generation == 2 and len(o.paths) == 1


def _keys(root: Path, as_of: int | None = None) -> list[int]:
    return sorted(read_collection_arrow(root, "c", as_of).column("pk").to_pylist())


async def _restart(swal: StreamingWAL, f: Flusher) -> Flusher:
    await f.aclose()
    g = Flusher(swal, f.root, FlusherConfig())
    await g.start()
    await until(lambda: not _overlaps.find(g.root) or bool(g.problems), "the flusher to repair the record")
    return g


@pytest.mark.parametrize("gone", [False, True], ids=["file-kept", "file-deleted"])
async def test_a_flusher_gives_an_output_named_after_its_input_its_own_name_and_the_deletes_hold_again(
    swal: StreamingWAL, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gone: bool,
) -> None:
    f = Flusher(swal, tmp_path, FlusherConfig())
    await f.start()
    _plant_old_naming(monkeypatch)
    await _old_passes(swal, f)
    monkeypatch.undo()
    [o] = _overlaps.find(tmp_path)
    [rel] = o.paths
    if gone:  # what the older recovery did once the grace period was over: the only copy deleted
        for p in (rel, layout.hidden(rel)):
            (tmp_path / p).unlink(missing_ok=True)
    with pytest.raises(layout.OverlappingRecordError, match=f"collection 'c': compaction record .* lists {rel}"):
        _keys(tmp_path)
    g = await _restart(swal, f)
    try:
        assert g.problems == []
        assert _overlaps.find(tmp_path) == []
        [_, rec] = layout.read_records(tmp_path, "c")
        assert rec.outputs[-1] == _overlaps.renamed(rel, 2) and rel in rec.inputs
        assert _keys(tmp_path) == list(range(4, 11))
        _, _, horizon = layout.visible_files(tmp_path, "c")
        assert _keys(tmp_path, horizon) == list(range(3, 9))  # key 3's delete is after the horizon
        # Compaction goes on from the repaired set, and the old path goes with the grace period.
        await g.compact("c", config=EAGER, now_ms=int(time.time() * 1000))
        assert _keys(tmp_path) == list(range(4, 11))
        assert not (tmp_path / rel).exists()
    finally:
        await g.aclose()


async def test_an_output_lost_past_retention_is_reported_and_readers_keep_refusing(
    swal: StreamingWAL, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    f = Flusher(swal, tmp_path, FlusherConfig())
    await f.start()
    _plant_old_naming(monkeypatch)
    await _old_passes(swal, f)
    monkeypatch.undo()
    [o] = _overlaps.find(tmp_path)
    [rel] = o.paths
    for p in (rel, layout.hidden(rel)):
        (tmp_path / p).unlink(missing_ok=True)
    await swal.append(bodies.insert("v", "c", rows(50, 1)))
    await f.flush("v")
    await swal.wal.truncate(f.checkpoint.message_id)  # retention: everything flushed may go
    g = await _restart(swal, f)
    try:
        [line] = g.problems
        assert f"collection 'c': compaction record {o.record_path} lists {rel} as both input and output" in line
        assert "are no longer in the WAL" in line
        assert g.stats().files_lost == 1
        with pytest.raises(layout.OverlappingRecordError):
            _keys(tmp_path)
        # A pass over every collection leaves this one alone and compacts the others.
        await swal.append(bodies.create_collection("v", "d", SCHEMA, "pk"))
        for start in (1, 2):
            await swal.append(bodies.insert("v", "d", rows(start, 1)))
            await g.flush("v", "d")
        results = await g.compact(config=EAGER)
        assert [(r.collection, r.generation) for r in results] == [("d", 1)]
        with pytest.raises(layout.OverlappingRecordError):
            await g.compact("c", config=EAGER)
    finally:
        await g.aclose()


def test_verify_names_the_collection_and_the_record(tmp_path: Path) -> None:
    from streamingnode.offline.verify import check_compactions  # noqa: PLC0415

    root = tmp_path / "parquet"
    rel = f"{layout.deletes_dir('c')}/{layout.file_name(3, 5)}"
    rec = layout.CompactionRecord(2, 7, (rel,), (rel,), {})
    (root / "p" / layout.compactions_dir("c")).mkdir(parents=True)
    (root / "p" / layout.compactions_dir("c") / layout.record_name(2)).write_bytes(rec.to_json())
    findings, read = check_compactions(root, None)
    assert read == 1
    assert len(findings) == 1, f"the record listing {rel} as input and output was not reported: {findings}"
    [finding] = findings
    assert finding.channel == "p"
    assert finding.line() == (
        f"{root / 'p' / 'c' / '_compactions' / layout.record_name(2)}: collection 'c': compaction record 2 lists "
        f"{rel} as both input and output: readers refuse the collection; start the node to rebuild the file from "
        "the WAL")


def test_the_verify_command_reports_it_and_exits_1(tmp_path: Path) -> None:
    import io  # noqa: PLC0415

    from streamingnode.offline.verify import run  # noqa: PLC0415

    data_dir = tmp_path / "data"
    rel = f"{layout.deletes_dir('c')}/{layout.file_name(3, 5)}"
    records = data_dir / "parquet" / "p" / layout.compactions_dir("c")
    records.mkdir(parents=True)
    (records / layout.record_name(2)).write_bytes(layout.CompactionRecord(2, 7, (rel,), (rel,), {}).to_json())
    out, err = io.StringIO(), io.StringIO()
    assert run(str(data_dir), None, None, out, err) == 1, err.getvalue()
    lines = out.getvalue().splitlines()
    assert f"{records / layout.record_name(2)}: collection 'c': compaction record 2 lists {rel} as both" in \
        out.getvalue(), lines
    assert lines[-1].startswith(f"verify {data_dir}: 1 finding(s)") and "1 compaction records" in lines[-1], lines
