"""The backup manifest: what restore trusts, and how a target's backups are told apart."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from streamingnode.offline.manifest import (
    FORMAT_VERSION,
    MANIFEST,
    BackupFormatError,
    ChannelPosition,
    FileEntry,
    Manifest,
    copy_hashed,
    damaged_files,
    file_sha256,
    read_manifest,
    resolve_backup,
    write_manifest,
)


def _backup(d: Path, files: dict[str, bytes]) -> Manifest:
    d.mkdir(parents=True)
    entries = []
    for rel, data in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)
        entries.append(FileEntry(rel, *file_sha256(d / rel)))
    m = Manifest("1.0", "2026-11-29T10:00:00+00:00", [ChannelPosition("p", 1, 0, 10, 99, (5, 50), 3,
                                                                       {"g": {"v": [4, 40]}})], entries)
    write_manifest(d, m)
    return m


def test_a_manifest_reads_back_as_written(tmp_path: Path) -> None:
    m = _backup(tmp_path / "20261129T100000.000000Z", {"wal/CURRENT": b"MANIFEST-1\n", "parquet/p/a.parquet": b"x" * 5})
    back = read_manifest(tmp_path / "20261129T100000.000000Z")
    assert back == m
    assert back.channel("p") is not None and back.channel("p").last_id == 9  # type: ignore[union-attr]
    assert not list((tmp_path / "20261129T100000.000000Z").glob(".*.tmp")), "no temporary left behind"


def test_a_newer_format_or_a_damaged_manifest_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "b"
    _backup(d, {"wal/x": b"1"})
    doc = json.loads((d / MANIFEST).read_text())
    doc["format_version"] = FORMAT_VERSION + 1
    (d / MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(BackupFormatError, match="newer"):
        read_manifest(d)
    (d / MANIFEST).write_text("{not json")
    with pytest.raises(BackupFormatError, match="damaged"):
        read_manifest(d)


def test_the_newest_complete_backup_of_a_target_is_the_one_restored(tmp_path: Path) -> None:
    _backup(tmp_path / "20261129T100000.000000Z", {"wal/x": b"1"})
    _backup(tmp_path / "20261129T110000.000000Z", {"wal/x": b"2"})
    (tmp_path / "20261129T120000.000000Z").mkdir()  # did not finish: no manifest
    (tmp_path / "unrelated").mkdir()
    assert resolve_backup(tmp_path) == tmp_path / "20261129T110000.000000Z"
    assert resolve_backup(tmp_path / "20261129T100000.000000Z") == tmp_path / "20261129T100000.000000Z"
    with pytest.raises(BackupFormatError, match="no backup"):
        resolve_backup(tmp_path / "unrelated")


def test_every_damage_is_named_and_nothing_else(tmp_path: Path) -> None:
    rng = random.Random(7)
    files = {f"wal/{i:06d}.sst": rng.randbytes(rng.randrange(1, 5000)) for i in range(20)}
    d = tmp_path / "b"
    _backup(d, files)
    assert damaged_files(d, read_manifest(d)) == []
    victims = rng.sample(sorted(files), 5)
    kinds = {}
    for n, rel in enumerate(victims):
        path = d / rel
        data = bytearray(path.read_bytes())
        if n == 0:
            path.unlink()
            kinds[rel] = "missing"
        elif n == 1:
            path.write_bytes(bytes(data) + b"x")
            kinds[rel] = "bytes"
        else:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            path.write_bytes(bytes(data))
            kinds[rel] = "SHA-256"
    found = damaged_files(d, read_manifest(d))
    assert len(found) == len(victims)
    for rel, kind in kinds.items():
        assert any(line.startswith(str(d / rel)) and kind in line for line in found), (rel, found)


def test_copy_hashed_hashes_what_it_copies_and_never_overwrites(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(random.Random(1).randbytes(3 << 20))
    assert copy_hashed(src, tmp_path / "dst") == file_sha256(src)
    assert (tmp_path / "dst").read_bytes() == src.read_bytes()
    with pytest.raises(FileExistsError):
        copy_hashed(src, tmp_path / "dst")
