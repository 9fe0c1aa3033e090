"""SIGKILL during compaction, after each step: recovery leaves exactly the visible rows, once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flusher import layout
from flusher.compact import CompactionConfig, compact_collection
from flusher.compaction_record import KILL_ENV, STEPS, recover
from tests.unit.test_compact import _write, visible

_CHILD = """
import sys
from pathlib import Path
from flusher.compact import CompactionConfig, compact_collection
compact_collection(Path(sys.argv[1]), "c", CompactionConfig(min_files=2, horizon_seconds=0, grace_seconds=0),
                   now_ms=1 << 40)
"""


def _tree(root: Path) -> None:
    for i in range(6):
        _write(root, f"c/partition=p/segment={i}", [i, 100 + i], 10 + i, i)
    _write(root, layout.deletes_dir("c"), [2], 30, 20, data=False)
    _write(root, layout.deletes_dir("c"), [3, 999], 31, 21, data=False)


@pytest.mark.parametrize("step", STEPS)
def test_a_kill_after_each_step_leaves_the_visible_rows_exactly_once(tmp_path: Path, step: str) -> None:
    _tree(tmp_path)
    expected = visible(tmp_path)
    child = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], env={**os.environ, KILL_ENV: step},
                           capture_output=True, timeout=120, check=False)
    assert child.returncode == -9, child.stderr.decode()[-2000:]
    assert visible(tmp_path) == expected  # readers, before any recovery
    recover(tmp_path, "c")
    assert visible(tmp_path) == expected
    assert [p.name for p in tmp_path.rglob(".*.parquet")] == []
    committed = bool(layout.read_records(tmp_path, "c"))
    assert committed == (step != "output")
    # The next pass completes (or redoes) the work: same rows, fewer files.
    compact_collection(tmp_path, "c", CompactionConfig(min_files=2, horizon_seconds=0, grace_seconds=0),
                       now_ms=1 << 40)
    assert visible(tmp_path) == expected
    data, deletes, _ = layout.visible_files(tmp_path, "c")
    assert len(data) == 1 and len(deletes) <= 1


_PASS_B = """
import sys
from pathlib import Path
from flusher.compact import CompactionConfig, compact_collection
compact_collection(Path(sys.argv[1]), "c", CompactionConfig(min_files=2, horizon_seconds=0, grace_seconds=0),
                   now_ms=31)
"""


@pytest.mark.parametrize("step", STEPS)
def test_a_kill_while_the_only_delete_file_is_rewritten_loses_no_entry(tmp_path: Path, step: str) -> None:
    """The two-pass reproduction (tests/unit/test_compact_names.py), killed after each step of pass B."""
    from wal.clock import compose  # noqa: PLC0415

    _write(tmp_path, "c/partition=p/segment=1", [1, 2, 3, 4], compose(10, 0), 1)
    _write(tmp_path, "c/partition=p/segment=1", [5, 6, 7, 8], compose(20, 0), 2)
    for i, k in enumerate((1, 2, 3)):
        _write(tmp_path, layout.deletes_dir("c"), [k], compose(30 + i, 0), 3 + i, data=False)
    compact_collection(tmp_path, "c", CompactionConfig(min_files=2, horizon_seconds=0, grace_seconds=0), now_ms=30)
    _write(tmp_path, "c/partition=p/segment=2", [9], compose(40, 0), 6)
    _write(tmp_path, "c/partition=p/segment=2", [10], compose(41, 0), 7)
    expected = [(k, ts) for k, ts in visible(tmp_path)]
    assert [k for k, _ in expected] == list(range(4, 11))
    child = subprocess.run([sys.executable, "-c", _PASS_B, str(tmp_path)], env={**os.environ, KILL_ENV: step},
                           capture_output=True, timeout=120, check=False)
    assert child.returncode == -9, child.stderr.decode()[-2000:]
    assert visible(tmp_path) == expected
    recover(tmp_path, "c")
    assert visible(tmp_path) == expected
    for rec in layout.read_records(tmp_path, "c"):
        assert set(rec.inputs).isdisjoint(rec.outputs)
    compact_collection(tmp_path, "c", CompactionConfig(min_files=2, horizon_seconds=0, grace_seconds=0),
                       now_ms=1 << 40)
    assert visible(tmp_path) == expected
