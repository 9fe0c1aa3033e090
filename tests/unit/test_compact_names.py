"""A compaction output never takes the name of an input (flusher/README.md, Compaction).

The reproduction: a collection with exactly one visible delete file, and a pass that drops one of its
entries, rewrote that file under its own name.  The record listed one path as input and output, the
readers subtracted it (no delete file was read at all), the link found the name taken, and after the
grace period the input, the only copy, was deleted: every deleted row came back, as of every timetick.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flusher import layout
from flusher.compact import CompactionConfig, compact_collection
from flusher.compaction_record import recover
from flusher.read.spark import read_collection_arrow
from tests.unit.test_compact import _tuples, _write, visible
from wal.clock import compose

EAGER = CompactionConfig(min_files=2, horizon_seconds=0, grace_seconds=0)


def _ms(ms: int) -> int:
    return compose(ms, 0)


def _ten_rows_two_passes(root: Path) -> None:
    """Rows 1..8 in two files; deletes of keys 1, 2, 3 a millisecond apart; pass A with its horizon
    between the deletes of 1 and 2 merges the delete files into one; two more data files (rows 9, 10);
    pass B with its horizon between the deletes of 2 and 3 drops key 2's entry, leaving one delete
    file to rewrite."""
    _write(root, "c/partition=p/segment=1", [1, 2, 3, 4], _ms(10), 1)
    _write(root, "c/partition=p/segment=1", [5, 6, 7, 8], _ms(20), 2)
    for i, k in enumerate((1, 2, 3)):
        _write(root, layout.deletes_dir("c"), [k], _ms(30 + i), 3 + i, data=False)
    a = compact_collection(root, "c", EAGER, now_ms=30)
    assert a.generation == 1 and a.delete_entries_dropped == 1  # key 1's: its row is dropped with it
    _write(root, "c/partition=p/segment=2", [9], _ms(40), 6)
    _write(root, "c/partition=p/segment=2", [10], _ms(41), 7)
    b = compact_collection(root, "c", EAGER, now_ms=31)
    assert b.generation == 2 and b.delete_entries_dropped == 1  # key 2's


def test_a_pass_rewriting_the_only_delete_file_keeps_its_entries(tmp_path: Path) -> None:
    _ten_rows_two_passes(tmp_path)
    everything = list(range(4, 11))
    # As of the horizon (31) key 3's delete (at 32) is still ahead; rows 9 and 10 come at 40 and 41.
    for as_of, expected in ((None, everything), (_ms(31), list(range(3, 9))), (_ms(32), list(range(4, 9))),
                            (_ms(41), everything), (_ms(1000), everything)):
        assert sorted(k for k, _ in visible(tmp_path, as_of)) == expected, as_of
        t = read_collection_arrow(tmp_path, "c", as_of)
        assert sorted(t.column("pk").to_pylist()) == expected, as_of
    _, deletes, _ = layout.visible_files(tmp_path, "c")
    assert [k for k, _, _ in _tuples(deletes)] == [3]
    for rec in layout.read_records(tmp_path, "c"):
        assert set(rec.inputs).isdisjoint(rec.outputs), rec


def test_every_output_name_carries_its_generation_and_no_flusher_file_does(tmp_path: Path) -> None:
    _ten_rows_two_passes(tmp_path)
    records = layout.read_records(tmp_path, "c")
    for rec in records:
        for out in rec.outputs:
            name = out.rpartition("/")[2]
            assert layout.name_generation(name) == rec.generation, out
            assert layout.parse_name(name) is not None, out
        assert all(layout.name_generation(p.rpartition("/")[2]) != rec.generation for p in rec.inputs)
    assert layout.name_generation(layout.file_name(3, 5)) is None


def _old_code_record(root: Path, generation: int, inputs: list[str], outputs: list[str],
                     horizon: int = _ms(30)) -> Path:
    """A record as older code wrote it (outputs named ``<first>-<last>.parquet``, maybe an input's)."""
    rec = layout.CompactionRecord(generation, horizon, tuple(inputs), tuple(outputs), {})
    d = root / layout.compactions_dir("c")
    d.mkdir(parents=True, exist_ok=True)
    path = d / layout.record_name(generation)
    path.write_bytes(rec.to_json())
    return path


def test_a_pass_whose_output_would_take_an_input_name_commits_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check when the record is built: the old naming (no generation) is planted back."""
    plain = layout.file_name
    monkeypatch.setattr(layout, "file_name", lambda first, last, generation=None: plain(first, last))
    with pytest.raises(layout.OverlappingRecordError, match=r"collection 'c': compaction record .*00002\.json "
                                                             r"lists _deletes/c/0+3-0+5\.parquet as both"):
        _ten_rows_two_passes(tmp_path)  # pass B rewrites the one delete file: its own name
    assert [r.generation for r in layout.read_records(tmp_path, "c")] == [1]
    monkeypatch.undo()
    assert sorted(k for k, _ in visible(tmp_path)) == list(range(4, 11))


def test_readers_refuse_a_record_listing_a_path_as_input_and_output_and_recovery_keeps_the_file(
    tmp_path: Path,
) -> None:
    from flusher.read.duckdb import read_collection_duckdb  # noqa: PLC0415

    _write(tmp_path, "c/partition=p/segment=1", [1, 2, 3], _ms(10), 1)
    _write(tmp_path, layout.deletes_dir("c"), [2, 3], _ms(20), 2, data=False)
    only = f"{layout.deletes_dir('c')}/{layout.file_name(2, 2)}"
    record = _old_code_record(tmp_path, 1, [only], [only])
    match = f"collection 'c': compaction record {record} lists {only} as both input and output"
    with pytest.raises(layout.OverlappingRecordError, match=match):
        layout.visible_files(tmp_path, "c")
    with pytest.raises(layout.OverlappingRecordError, match=match):
        read_collection_arrow(tmp_path, "c")
    import duckdb  # noqa: PLC0415

    with duckdb.connect() as con, pytest.raises(layout.OverlappingRecordError, match=match):
        read_collection_duckdb(con, tmp_path, "c")
    # Its grace period is long over: recovery still keeps the one copy of the entries.
    assert recover(tmp_path, "c", 0.0, now=record.stat().st_mtime + 3600) == 0
    assert (tmp_path / only).exists()
    with pytest.raises(layout.OverlappingRecordError):
        compact_collection(tmp_path, "c", EAGER, now_ms=1 << 40)
    assert (tmp_path / only).exists()


def test_a_table_compacted_by_older_code_without_an_overlap_still_reads(tmp_path: Path) -> None:
    """Older outputs are named ``<first>-<last>.parquet`` (no generation): still read, and compacted on."""
    _write(tmp_path, "c/partition=p/segment=1", [1, 2, 3, 4], _ms(10), 1)
    _write(tmp_path, layout.deletes_dir("c"), [1], _ms(20), 2, data=False)
    _write(tmp_path, layout.deletes_dir("c"), [2], _ms(21), 3, data=False)
    merged = f"{layout.deletes_dir('c')}/{layout.file_name(2, 3)}"
    inputs = [f"{layout.deletes_dir('c')}/{layout.file_name(i, i)}" for i in (2, 3)]
    # What the older code's pass wrote: the merged file under its hidden name, then the record.
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    t = pa.concat_tables([pq.read_table(tmp_path / p) for p in inputs])
    meta = dict(pq.read_schema(tmp_path / inputs[0]).metadata or {})
    meta[layout.LAST_KEY] = layout.encode_key((_ms(21), 3))
    pq.write_table(t.replace_schema_metadata(meta), tmp_path / layout.hidden(merged))
    _old_code_record(tmp_path, 1, inputs, [merged], _ms(20))
    assert sorted(k for k, _ in visible(tmp_path)) == [3, 4]
    recover(tmp_path, "c", 0.0)
    assert sorted(k for k, _ in visible(tmp_path)) == [3, 4]
    _write(tmp_path, layout.deletes_dir("c"), [3], _ms(22), 4, data=False)
    r = compact_collection(tmp_path, "c", EAGER, now_ms=1)
    assert r.generation == 2
    assert sorted(k for k, _ in visible(tmp_path)) == [4]
    assert sorted(k for k, _ in visible(tmp_path, _ms(21))) == [3, 4]
