"""A compaction's record, the one step that publishes its outputs, is durable before the pass returns.

The outputs and their directories are watched in ``test_durability.py``; this is the record that names
them: its temporary written whole and fsynced before the rename that publishes it, and the directory
of records fsynced after that rename (a crash after the pass must not bring back the inputs the pass
went on to delete, with no record that replaced them).  Watched at the system calls, as a SIGKILL
cannot show a missing fsync.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flusher import layout
from flusher.compact import CompactionConfig, compact_collection
from tests.unit.test_compact import _write
from tests.unit.test_durability import FileCalls


def test_the_record_is_fsynced_before_its_rename_and_its_directory_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(3):
        _write(tmp_path, "c/partition=p/segment=1", [2 * i, 2 * i + 1], 10 + i, i)
    calls = FileCalls(monkeypatch)
    r = compact_collection(tmp_path, "c", CompactionConfig(min_files=2, horizon_seconds=0, grace_seconds=60),
                           drop_deletes=False)
    assert r.generation == 1
    directory = str((tmp_path / layout.compactions_dir("c")).resolve())
    record = os.path.join(directory, layout.record_name(1))
    [(published, temporary)] = [(i, e[1]) for i, e in enumerate(calls.events) if e[0] == "rename" and e[2] == record]
    synced = [i for i, e in enumerate(calls.events[:published]) if e == ("fsync", temporary, "")]
    assert synced, f"the record was renamed into place before its temporary {temporary} was fsynced"
    assert calls.sizes[temporary] == os.path.getsize(record), "the record grew after its fsync"
    assert ("dirsync", directory, "") in calls.events[published:], (
        f"{directory} was not fsynced after the rename that published the record")
    [rec] = layout.read_records(tmp_path, "c")
    assert rec.generation == 1 and rec.outputs
