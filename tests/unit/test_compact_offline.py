"""``streamingnode compact`` (streamingnode/offline/compact.py): the offline pass over a stopped node's
Parquet files, with the node's own compaction defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from flusher import Flusher, FlusherConfig, layout
from flusher.compaction_config import DEFAULT_COMPACTION, CompactionConfig
from streamingnode import __main__ as entry
from streamingnode.config import NodeConfig, compaction_config
from tests.unit.test_flusher import SCHEMA, open_stream, rows, settle
from wal import WALManager, bodies


def test_the_node_and_the_offline_command_take_their_compaction_defaults_from_one_home() -> None:
    node = compaction_config(NodeConfig())
    assert node.min_files == DEFAULT_COMPACTION.min_files == CompactionConfig().min_files
    assert node.target_bytes == DEFAULT_COMPACTION.target_bytes
    assert node.horizon_seconds == DEFAULT_COMPACTION.horizon_seconds
    assert node.grace_seconds == DEFAULT_COMPACTION.grace_seconds


async def _files(manager: WALManager, root: Path, n: int) -> None:
    """``n`` small data files of collection ``c`` in one partition, written by a real flusher."""
    swal = await open_stream(manager)
    async with Flusher(swal, root, FlusherConfig()) as f:
        await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
        for i in range(n):
            await swal.append(bodies.insert("v", "c", rows(2 * i, 2)))
            await f.flush("v", "c")
        await settle(f, swal)
    await swal.aclose()


async def test_offline_compact_by_default_leaves_a_partition_the_node_would_leave(
    manager: WALManager, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three small files: under the node's ``compaction_min_files`` (8), so the command without
    ``--min-files`` compacts nothing either (it used to default to 2 and compact them)."""
    data_dir = tmp_path / "data"
    root = data_dir / "parquet" / "p"
    await _files(manager, root, 3)
    before = layout.visible_files(root, "c")
    assert len(before[0]) == 3
    assert entry.main(["compact", "--data-dir", str(data_dir)]) == 0
    assert "p/c: generation -: 0 files" in capsys.readouterr().out
    assert layout.visible_files(root, "c") == before


async def test_offline_compact_with_min_files_merges_the_small_files_into_one(
    manager: WALManager, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "data"
    root = data_dir / "parquet" / "p"
    await _files(manager, root, 3)
    assert entry.main(["compact", "--data-dir", str(data_dir), "--min-files", "2", "--horizon-seconds", "0"]) == 0
    out = capsys.readouterr()
    assert "p/c: generation 1: 3 files" in out.out and "-> 1 (" in out.out
    assert "p: compacting c" in out.err
    data, _, _ = layout.visible_files(root, "c")
    assert len(data) == 1


async def test_offline_compact_names_a_pchannel_it_does_not_find(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "data" / "parquet" / "p").mkdir(parents=True)
    assert entry.main(["compact", "--data-dir", str(tmp_path / "data"), "--pchannel", "q"]) == 2
    assert "no Parquet directory for pchannel 'q'" in capsys.readouterr().err


def test_offline_compact_refuses_a_bad_setting_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert entry.main(["compact", "--data-dir", str(tmp_path), "--min-files", "0"]) == 2
    assert "min_files must be at least 1, got 0" in capsys.readouterr().err
