"""The flusher's commit protocol: write a temporary, fsync, rename, fsync the directory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

import pytest

from flusher import commit
from flusher.commit import commit_file, remove_temporaries


def test_a_committed_file_appears_whole_under_its_name_and_no_temporary_remains(tmp_path: Path) -> None:
    seen: list[list[str]] = []

    def write(f: BinaryIO) -> None:
        f.write(b"hello ")
        # While writing, only the hidden temporary exists in the directory.
        seen.append(sorted(os.listdir(tmp_path / "a" / "b")))
        f.write(b"world")

    path = commit_file(tmp_path / "a" / "b", "x.parquet", write)
    assert path == tmp_path / "a" / "b" / "x.parquet"
    assert path.read_bytes() == b"hello world"
    assert seen == [[".x.parquet.tmp"]]
    assert sorted(os.listdir(path.parent)) == ["x.parquet"]


def test_a_crash_between_rename_and_checkpoint_rewrites_the_same_name(tmp_path: Path) -> None:
    commit_file(tmp_path, "f", lambda f: f.write(b"old"))
    commit_file(tmp_path, "f", lambda f: f.write(b"new"))
    assert (tmp_path / "f").read_bytes() == b"new"


def test_a_failed_write_leaves_no_final_file(tmp_path: Path) -> None:
    def boom(f: BinaryIO) -> None:
        f.write(b"partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        commit_file(tmp_path, "f.parquet", boom)
    assert not (tmp_path / "f.parquet").exists()
    assert os.listdir(tmp_path) == []  # nor a temporary: a failed write removes its own


def test_temporaries_are_removed_at_any_depth_and_data_files_kept(tmp_path: Path) -> None:
    d = tmp_path / "c" / "partition=p" / "segment=1"
    d.mkdir(parents=True)
    (d / ".1-2.parquet.tmp").write_bytes(b"x")
    (d / "1-2.parquet").write_bytes(b"y")
    (tmp_path / "c" / "._dropped.tmp").write_bytes(b"z")
    assert remove_temporaries(tmp_path) == 2
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["1-2.parquet"]
    assert remove_temporaries(tmp_path / "missing") == 0


def test_names_that_would_escape_or_hide_are_refused(tmp_path: Path) -> None:
    for bad in (".hidden", "a/b"):
        with pytest.raises(ValueError, match="invalid file name"):
            commit_file(tmp_path, bad, lambda f: None)


def test_the_crash_hook_names_a_known_step() -> None:
    assert commit.crash_point.parse(None) is None
    assert commit.crash_point.parse("rename") == ("rename", 1)
    assert commit.crash_point.parse("fsync:3") == ("fsync", 3)
    with pytest.raises(ValueError, match="STREAMINGNODE_FLUSHER_KILL_AT='nowhere': step must be one of"):
        commit.crash_point.parse("nowhere")
