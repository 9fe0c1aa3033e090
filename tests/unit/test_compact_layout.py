"""The compaction records and the visible set readers build from them (``flusher.layout``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flusher import layout
from flusher.layout import AsOfBeforeHorizonError, CompactionRecord, LayoutError, check_as_of, visible_files


def _touch(root: Path, rel: str) -> str:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(b"x")
    return rel


def _record(root: Path, coll: str, rec: CompactionRecord) -> None:
    d = root / layout.compactions_dir(coll)
    d.mkdir(parents=True, exist_ok=True)
    (d / layout.record_name(rec.generation)).write_bytes(rec.to_json())


def _rel(root: Path, paths: list[str]) -> list[str]:
    return [Path(p).relative_to(root).as_posix() for p in paths]


DEL = layout.deletes_dir("c")


def test_without_records_every_visible_file_counts_and_hidden_ones_do_not(tmp_path: Path) -> None:
    a = _touch(tmp_path, "c/partition=p/segment=1/" + layout.file_name(1, 2))
    _touch(tmp_path, "c/partition=p/segment=1/." + layout.file_name(3, 4))  # uncommitted output
    _touch(tmp_path, "c/partition=p/segment=1/" + layout.file_name(5, 6) + ".tmp")
    d = _touch(tmp_path, f"{DEL}/" + layout.file_name(7, 8))
    _touch(tmp_path, "other/partition=p/segment=1/" + layout.file_name(1, 2))
    data, deletes, horizon = visible_files(tmp_path, "c")
    assert (_rel(tmp_path, data), _rel(tmp_path, deletes), horizon) == ([a], [d], None)


def test_a_committed_record_swaps_inputs_for_outputs_under_either_name(tmp_path: Path) -> None:
    ins = [_touch(tmp_path, f"c/partition=p/segment={s}/" + layout.file_name(s, s)) for s in (1, 2)]
    dins = [_touch(tmp_path, f"{DEL}/" + layout.file_name(s, s)) for s in (3, 4)]
    kept = _touch(tmp_path, "c/partition=q/segment=5/" + layout.file_name(5, 5))
    out = "c/partition=p/segment=-1/" + layout.file_name(1, 2)
    dout = f"{DEL}/" + layout.file_name(3, 4)
    _touch(tmp_path, layout.hidden(out))  # committed, not linked yet
    _touch(tmp_path, layout.hidden(dout))
    _touch(tmp_path, dout)  # linked
    _record(tmp_path, "c", CompactionRecord(1, 1000, (*ins, *dins), (out, dout), {"c/partition=p/segment=1": (1, 1)}))
    data, deletes, horizon = visible_files(tmp_path, "c")
    assert _rel(tmp_path, data) == sorted([layout.hidden(out), kept])
    assert _rel(tmp_path, deletes) == [dout]
    assert horizon == 1000
    # A later generation compacts the first one's output: the newest horizon counts.
    out2 = "c/partition=p/segment=-2/" + layout.file_name(1, 5)
    _touch(tmp_path, out2)
    _record(tmp_path, "c", CompactionRecord(2, 2000, (out, kept), (out2,), {}))
    data, _, horizon = visible_files(tmp_path, "c")
    assert (_rel(tmp_path, data), horizon) == ([out2], 2000)
    assert layout.compacted_keys(tmp_path) == {"c/partition=p/segment=1": (1, 1)}


def test_a_missing_output_or_a_bad_record_is_an_error_naming_it(tmp_path: Path) -> None:
    _record(tmp_path, "c", CompactionRecord(1, 10, (), ("c/partition=p/segment=-1/" + layout.file_name(1, 1),), {}))
    with pytest.raises(LayoutError, match="missing under both its names"):
        visible_files(tmp_path, "c")
    os.unlink(tmp_path / layout.compactions_dir("c") / layout.record_name(1))
    (tmp_path / layout.compactions_dir("c") / layout.record_name(2)).write_bytes(b"{")
    with pytest.raises(LayoutError, match=r"00000000000000000002\.json: not a compaction record"):
        visible_files(tmp_path, "c")


def test_as_of_before_the_horizon_raises_naming_both() -> None:
    check_as_of(None, 100)
    check_as_of(100, 100)
    check_as_of(5, None)
    with pytest.raises(AsOfBeforeHorizonError, match="as-of timetick 99 is before the compaction horizon 100") as e:
        check_as_of(99, 100, "c")
    assert isinstance(e.value, ValueError) and (e.value.as_of, e.value.horizon) == (99, 100)
