"""A flusher whose pchannel was taken over cannot commit a Parquet file afterwards, even one whose write
began before the takeover (an owner paused mid-write, as a SIGSTOPped node is): a shared filesystem
cannot fence a rename, so every file is staged in a directory of its term that the next term's flusher
removes before it lists what is committed."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from flusher import Flusher, FlusherConfig, commit, layout
from interceptors.recovery.streaming_wal import open_streaming_wal
from tests.flushed import data_files, pks
from tests.unit.test_compact import EAGER, _small_files
from tests.unit.test_flusher import FAST, SCHEMA, open_stream, rows
from tests.waiting import until
from wal import ChannelFencedError, WALManager, bodies


class _PausedCommit:
    """Holds the first file commit of a flusher in its thread, before anything is written, until
    released: the owner SIGSTOPped just before a commit, woken after the takeover."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self._real = commit.make_dirs
        self._first = True
        monkeypatch.setattr(commit, "make_dirs", self._make_dirs)

    def _make_dirs(self, directory: Path) -> None:
        if self._first:
            self._first = False
            self.entered.set()
            assert self.release.wait(60), "the paused commit was never released"
        self._real(directory)


async def test_a_flusher_paused_mid_write_commits_nothing_after_a_newer_term_started(
        manager: WALManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old_wal = await open_stream(manager)
    old = Flusher(old_wal, tmp_path, FlusherConfig())
    await old.start()
    await old_wal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    await old_wal.append(bodies.insert("v", "c", rows(0, 10)))
    paused = _PausedCommit(monkeypatch)
    stale_flush = asyncio.ensure_future(old.flush("v"))
    await until(paused.entered.is_set, what="the old term's flusher to begin its commit")

    # The takeover: a new term of the pchannel, and its flusher on the same root.
    new_wal = await open_streaming_wal(manager, "p", FAST)
    await new_wal.ready()
    new = Flusher(new_wal, tmp_path, FlusherConfig())
    await new.start()
    await new_wal.append(bodies.insert("v", "c", rows(10, 10)))
    await new.flush("v")
    assert pks(tmp_path) == list(range(20))
    committed = {f: f.stat().st_ino for f in data_files(tmp_path)}

    paused.release.set()  # the old owner wakes up and goes on with its commit
    with pytest.raises(ChannelFencedError):
        await asyncio.wait_for(stale_flush, 30)
    # Not one file replaced or added: the old term's file (same name here, by chance of the cut; a
    # different cut would overlap the new owner's rows) never reached the tree.
    assert {f: f.stat().st_ino for f in data_files(tmp_path)} == committed
    assert pks(tmp_path) == list(range(20))
    await old.aclose()
    await new.aclose()
    await new_wal.aclose()
    await old_wal.aclose()


async def test_a_flusher_of_an_older_term_refuses_to_start_beside_a_newer_one(
        manager: WALManager, tmp_path: Path) -> None:
    old_wal = await open_stream(manager)
    new_wal = await open_streaming_wal(manager, "p", FAST)
    await new_wal.ready()
    new = Flusher(new_wal, tmp_path, FlusherConfig())
    await new.start()
    old = Flusher(old_wal, tmp_path, FlusherConfig())
    with pytest.raises(ChannelFencedError, match="newer term"):
        await old.start()  # it must not remove the newer term's staging directory
    assert (tmp_path / f".staging-{new_wal.wal.term}").is_dir()
    await new.aclose()
    await new_wal.aclose()
    await old_wal.aclose()


async def test_a_compaction_of_an_older_term_commits_nothing_after_a_newer_term_started(
        manager: WALManager, tmp_path: Path) -> None:
    # A compaction pass runs on the flusher's thread and commits with its record: an owner paused during
    # a pass must not land that record (and so swap files under readers) once the next owner started.
    old_wal = await open_stream(manager)
    old = Flusher(old_wal, tmp_path, FlusherConfig(compaction=EAGER))
    await old.start()
    await _small_files(old_wal, old, 4)
    before = layout.visible_files(tmp_path, "c")
    new_wal = await open_streaming_wal(manager, "p", FAST)
    await new_wal.ready()
    new = Flusher(new_wal, tmp_path, FlusherConfig())
    await new.start()  # removes the old term's staging directory
    with pytest.raises(ChannelFencedError, match="newer term"):
        await old.compact()
    assert layout.visible_files(tmp_path, "c") == before
    assert layout.read_records(tmp_path, "c") == []
    await old.aclose()
    await new.aclose()
    await new_wal.aclose()
    await old_wal.aclose()
