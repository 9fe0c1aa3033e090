"""Which incarnation of a pchannel a Parquet directory belongs to, and how a destroyed one moves aside.

A pchannel's files live in ``<parquet root>/<pchannel>``.  Destroying the channel and creating one of
the same name gives a new incarnation whose message ids start again; if it took over the old
directory, its flusher would read the old files as its own (their delivery keys would hide its new
messages) and overwrite them name by name.  So:

- the directory holds a marker, ``.incarnation``, with the WAL's channel key (never reused);
- ``claim`` (on every open) moves a directory whose marker names another key aside before the
  flusher starts, and so does it for a directory without a marker when the channel is new (a
  leftover of a destroy that crashed before its move); an existing channel adopts an unmarked
  directory (written before markers existed) and marks it;
- ``retire`` (on destroy, and for leftovers) renames the directory to
  ``<parquet root>/.destroyed/<pchannel>-<key>-<ns>``: kept, since it is user data, in a dot
  directory no reader lists, under a name no later incarnation can take.

Every path goes through ``commit.inside``: it stays under the Parquet root whatever the name.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import structlog

from flusher.commit import fsync_dir, inside, make_dirs

log = structlog.get_logger(__name__)

MARKER = ".incarnation"
GRAVEYARD = ".destroyed"


def read_marker(directory: Path) -> int | None:
    """The channel key a directory was claimed by (None: no marker, or an unreadable one)."""
    try:
        return int((directory / MARKER).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _write_marker(directory: Path, key: int) -> None:
    # The commit protocol in small: temporary, fsync, rename, directory fsync.  A crash leaves a
    # '.incarnation.tmp' that the flusher's start-up cleanup removes.
    tmp = directory / f"{MARKER}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{key}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / MARKER)
    fsync_dir(directory)


def claim(parquet_root: Path, pchannel: str, key: int, *, new: bool) -> Path:
    """The directory of the incarnation ``key`` of ``pchannel``, created and marked; a directory
    left there by another incarnation is retired first.  ``new``: the channel was just created."""
    directory = inside(parquet_root, pchannel)
    if directory.exists():
        owner = read_marker(directory)
        if owner == key:
            return directory
        if owner is not None or new:
            moved = retire(parquet_root, pchannel, owner)
            log.warning("parquet directory of another incarnation moved aside", pchannel=pchannel, key=key,
                        other_key=owner, moved_to=str(moved))
    make_dirs(directory)
    _write_marker(directory, key)
    return directory


def retire(parquet_root: Path, pchannel: str, key: int | None) -> Path | None:
    """Move ``<parquet root>/<pchannel>`` into the graveyard; returns where (None: there was none)."""
    directory = inside(parquet_root, pchannel)
    if not directory.exists():
        return None
    graveyard = inside(parquet_root, GRAVEYARD)
    make_dirs(graveyard)
    stem = f"{pchannel}-{'unmarked' if key is None else key}-{time.time_ns()}"
    target = inside(graveyard, stem)
    n = 0
    # A rename onto an existing empty directory would replace it silently: never reuse a name.
    while target.exists():
        n += 1
        target = inside(graveyard, f"{stem}-{n}")
    directory.rename(target)
    fsync_dir(graveyard)
    fsync_dir(parquet_root)
    return target


__all__ = ["GRAVEYARD", "MARKER", "claim", "read_marker", "retire"]
