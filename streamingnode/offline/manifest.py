"""A backup's manifest: what a backup holds, with the size and SHA-256 of every file, and the
positions it was taken at.

A backup target directory holds one directory per backup, named after the UTC time it was taken::

    <target>/<YYYYmmddTHHMMSS.ffffffZ>/manifest.json    written last, atomically
    <target>/<...>/wal/<RocksDB checkpoint files>        the log of every pchannel, groups, snapshots
    <target>/<...>/parquet/<pchannel>/<relative path>    Parquet files committed up to the WAL cut

A directory without ``manifest.json`` is a backup that did not finish: restore refuses it, and the next
backup neither reads nor reuses it.  The manifest is the only thing a restore trusts: every file it
lists is checked against its size and SHA-256 before anything is written.

Standard library only (the CLI reads manifests without the node's dependencies).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1
"""Bumped when a restore of this version could not read a newer backup correctly."""
MANIFEST = "manifest.json"
WAL_DIR = "wal"
PARQUET_DIR = "parquet"
_CHUNK = 1 << 20
_NAME = re.compile(r"\d{8}T\d{6}\.\d{6}Z(?:-\d+)?")


class BackupFormatError(ValueError):
    """A manifest that cannot be read, or a backup directory that is not one."""


@dataclass(slots=True)
class FileEntry:
    """One file of a backup: its path relative to the backup's directory, size and SHA-256 (hex)."""

    path: str
    size: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}


@dataclass(slots=True)
class ChannelPosition:
    """Where one pchannel stood in the backup: ids ``[first_id, next_id)`` are in it, ``last_timetick``
    is the largest timestamp acknowledged, and the flusher checkpoint (message id, timetick) says
    which Parquet rows are committed."""

    pchannel: str
    key: int
    first_id: int
    next_id: int
    last_timetick: int
    flusher_checkpoint: tuple[int, int] | None = None
    snapshot_id: int | None = None
    groups: dict[str, dict[str, list[int]]] = field(default_factory=dict)

    @property
    def last_id(self) -> int | None:
        """The last message id in the backup (None: the pchannel is empty)."""
        return self.next_id - 1 if self.next_id > self.first_id else None

    def to_json(self) -> dict[str, Any]:
        return {"pchannel": self.pchannel, "key": self.key, "first_id": self.first_id, "next_id": self.next_id,
                "last_timetick": self.last_timetick,
                "flusher_checkpoint": list(self.flusher_checkpoint) if self.flusher_checkpoint else None,
                "snapshot_id": self.snapshot_id, "groups": self.groups}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ChannelPosition:
        ckpt = raw.get("flusher_checkpoint")
        return cls(str(raw["pchannel"]), int(raw["key"]), int(raw["first_id"]), int(raw["next_id"]),
                   int(raw["last_timetick"]), (int(ckpt[0]), int(ckpt[1])) if ckpt else None,
                   None if raw.get("snapshot_id") is None else int(raw["snapshot_id"]), dict(raw.get("groups") or {}))


@dataclass(slots=True)
class Manifest:
    node_version: str
    created: str
    """ISO 8601 UTC time the log was cut at."""
    pchannels: list[ChannelPosition]
    files: list[FileEntry]
    parquet: bool = True
    """False when the node had no local Parquet root to back up (flusher off)."""
    partial: bool = False
    """Only the named pchannels were backed up: the database files hold the others too (they share
    table files), and a restore drops them."""
    format_version: int = FORMAT_VERSION
    copied: dict[str, int] = field(default_factory=dict)
    wal: str = "rocksdb"
    """The WAL backed up: ``rocksdb`` (a node's database files) or ``jetstream`` (a cluster's streams and
    key-value buckets, ``streamingnode.offline.cluster_backup``)."""
    """What taking it cost: files and bytes copied, files and bytes reused from the previous backup."""

    def to_json(self) -> dict[str, Any]:
        return {"format_version": self.format_version, "node_version": self.node_version, "created": self.created,
                "pchannels": [p.to_json() for p in self.pchannels], "parquet": self.parquet, "partial": self.partial,
                "copied": self.copied, "wal": self.wal, "files": [f.to_json() for f in self.files]}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Manifest:
        version = int(raw["format_version"])
        if version > FORMAT_VERSION:
            raise BackupFormatError(f"backup format version {version} is newer than this restore reads "
                                    f"({FORMAT_VERSION}): use a newer streamingnode")
        return cls(str(raw["node_version"]), str(raw["created"]),
                   [ChannelPosition.from_json(p) for p in raw["pchannels"]],
                   [FileEntry(str(f["path"]), int(f["size"]), str(f["sha256"])) for f in raw["files"]],
                   bool(raw.get("parquet", True)), bool(raw.get("partial", False)), version,
                   {k: int(v) for k, v in (raw.get("copied") or {}).items()}, str(raw.get("wal", "rocksdb")))

    def channel(self, name: str) -> ChannelPosition | None:
        return next((p for p in self.pchannels if p.pchannel == name), None)


class Stopped(Exception):
    """The work was stopped through its ``Pace`` (the caller went away, the node is shutting down)."""


class Pace:
    """Keeps reading at most ``bytes_per_second`` (0: no limit) by sleeping between chunks: the thread
    that copies then leaves the CPU and the disk to the node's appends.  ``stop()`` (from any thread)
    makes the next chunk raise ``Stopped``."""

    def __init__(self, bytes_per_second: int = 0) -> None:
        self.rate = bytes_per_second
        self._start = time.monotonic()
        self._done = 0
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def __call__(self, n: int) -> None:
        if self._stop.is_set():
            raise Stopped
        if self.rate <= 0:
            return
        self._done += n
        ahead = self._done / self.rate - (time.monotonic() - self._start)
        if ahead > 0:
            self._stop.wait(ahead)


_UNPACED = Pace()


def file_sha256(path: str | os.PathLike[str], pace: Pace = _UNPACED) -> tuple[int, str]:
    """(size, SHA-256 hex) of a file, read in chunks (hashlib lets other threads run meanwhile)."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
            pace(len(chunk))
    return size, h.hexdigest()


def copy_hashed(src: str | os.PathLike[str], dst: str | os.PathLike[str], pace: Pace = _UNPACED) -> tuple[int, str]:
    """Copy ``src`` to the new file ``dst`` (fsynced), hashing what is copied in the same pass."""
    h = hashlib.sha256()
    size = 0
    with open(src, "rb") as fin, open(dst, "xb") as fout:
        while chunk := fin.read(_CHUNK):
            h.update(chunk)
            fout.write(chunk)
            size += len(chunk)
            pace(len(chunk))
        fout.flush()
        os.fsync(fout.fileno())
    return size, h.hexdigest()


def fsync_dir(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(directory: Path, manifest: Manifest) -> None:
    """Write ``directory/manifest.json`` atomically: temporary, fsync, rename, directory fsync.  Until
    the rename the backup has no manifest and is visibly incomplete."""
    tmp = directory / f".{MANIFEST}.tmp"
    with open(tmp, "w") as f:
        json.dump(manifest.to_json(), f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / MANIFEST)
    fsync_dir(directory)


def read_manifest(directory: Path) -> Manifest:
    """The manifest of the backup in ``directory``; BackupFormatError when it is missing or unreadable."""
    path = directory / MANIFEST
    try:
        raw = json.loads(path.read_text())
        return Manifest.from_json(raw)
    except FileNotFoundError:
        raise BackupFormatError(f"{directory} has no {MANIFEST}: not a backup, or one that did not finish") from None
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise BackupFormatError(f"{path} is damaged or not a backup manifest: {exc}") from None


def backups_in(target: Path) -> tuple[list[Path], list[Path]]:
    """(complete, incomplete) backup directories of a target, oldest first."""
    if not target.is_dir():
        return [], []
    names = sorted(p for p in target.iterdir() if p.is_dir() and _NAME.fullmatch(p.name))
    return [p for p in names if (p / MANIFEST).is_file()], [p for p in names if not (p / MANIFEST).is_file()]


def resolve_backup(path: Path) -> Path:
    """The backup a restore reads: ``path`` itself when it holds a manifest, else the newest complete
    backup in it."""
    if (path / MANIFEST).is_file():
        return path
    complete, incomplete = backups_in(path)
    if complete:
        return complete[-1]
    if incomplete:
        raise BackupFormatError(f"{path} holds only backups that did not finish (no {MANIFEST}): "
                                f"{', '.join(p.name for p in incomplete)}")
    raise BackupFormatError(f"{path} holds no backup (no {MANIFEST}, no backup directories)")


def damaged_files(directory: Path, manifest: Manifest) -> list[str]:
    """Every file of the manifest that is missing, of another size or of another SHA-256, each as
    ``path: why``."""
    bad: list[str] = []
    for entry in manifest.files:
        path = directory / entry.path
        try:
            size, digest = file_sha256(path)
        except FileNotFoundError:
            bad.append(f"{path}: missing")
            continue
        except OSError as exc:
            bad.append(f"{path}: unreadable ({exc.strerror})")
            continue
        if size != entry.size:
            bad.append(f"{path}: {size} bytes, the manifest says {entry.size}")
        elif digest != entry.sha256:
            bad.append(f"{path}: SHA-256 {digest[:16]}... differs from the manifest's {entry.sha256[:16]}...")
    return bad


__all__ = [
    "FORMAT_VERSION",
    "MANIFEST",
    "PARQUET_DIR",
    "WAL_DIR",
    "BackupFormatError",
    "ChannelPosition",
    "FileEntry",
    "Manifest",
    "Pace",
    "Stopped",
    "backups_in",
    "copy_hashed",
    "damaged_files",
    "file_sha256",
    "read_manifest",
    "resolve_backup",
    "write_manifest",
]
