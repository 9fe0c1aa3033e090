"""The one commit protocol of the flusher: how a file appears in the output tree, atomically.

Every file the flusher writes (Parquet data, delete files, drop markers) goes through
``commit_file``, in these numbered steps:

1. ``mkdir``     create missing directories; fsync the parent of each new one (its entry must be durable)
2. ``write``     write the content to ``.<name>.tmp`` in the target directory
3. ``fsync``     fsync that temporary file
4. ``rename``    rename it to ``<name>`` (atomic on POSIX: a reader sees no file or the whole file)
5. ``dirsync``   fsync the directory, so the rename survives a power loss

The caller (the flusher) then advances its checkpoint, step 6.  Names are deterministic, so a crash
at any step re-writes the same content under the same name; a temporary file left by a crash starts
with a dot, never matches a reader's ``*.parquet`` glob, and is removed by ``remove_temporaries`` at
start.

**Staging by term.**  Several nodes may write one pchannel's directory over time (cluster mode: the
pchannel's owner changes), and a shared filesystem cannot fence a rename: an owner paused before a
commit (SIGSTOP, a long GC, a partition) would, once it wakes, rename its file beside the next owner's.
So the flusher passes ``staging``, a directory of its WAL term (``.staging-<term>`` in the pchannel's
directory, made by ``open_staging``), and step 2 writes the temporary there.  The next term's flusher
removes every older term's staging directory before it lists what is committed.  From then on the old
writer can neither create its temporary (its directory is gone, and ``commit_file`` never re-creates
it) nor rename one it had already written (that name is gone): the commit fails with
``StagingFencedError`` and nothing reaches the tree.  A rename that completed before the removal is
seen by the new flusher's listing and adopted like any committed file.

Crash tests set ``STREAMINGNODE_FLUSHER_KILL_AT=<step>[:<n>]``: the process SIGKILLs itself right
after the ``n``-th time (default 1) step ``<step>`` completes — see ``crash_point``.  The variable is
read once at import, so the hook costs one ``is None`` test when unset.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from wal.crashpoints import CrashPoints

TMP_PREFIX = "."
TMP_SUFFIX = ".tmp"
STEPS = ("mkdir", "partial", "write", "fsync", "rename", "dirsync", "checkpoint")
"""Crash points, in protocol order.  ``partial`` is in the middle of step 2 (the first bytes written);
``checkpoint`` is after the flusher stored its checkpoint (step 6).  ``mkdir`` fires only when a
directory was created."""

KILL_ENV = "STREAMINGNODE_FLUSHER_KILL_AT"


crash_point = CrashPoints(KILL_ENV, STEPS)
"""Called after each step of the protocol (see ``wal.crashpoints``)."""


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` (creations, renames) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(directory: Path) -> None:
    """Create ``directory`` and missing parents, fsyncing the parent of each one created."""
    missing: list[Path] = []
    d = directory
    while not d.exists():
        missing.append(d)
        d = d.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            continue
        fsync_dir(d.parent)
    if missing:
        crash_point("mkdir")


def temporary_name(name: str) -> str:
    return f"{TMP_PREFIX}{name}{TMP_SUFFIX}"


class _HalfKill:
    """A file wrapper that fires the ``partial`` crash point after the first bytes went out.

    Parquet is written in several ``write`` calls; the wrapper lets the crash test cut the temporary
    file short, which is what a crash during a large write leaves behind.  Only used when the hook is
    armed.
    """

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self._written = 0
        self._fired = False

    def write(self, data: bytes | memoryview) -> int:
        n = self._f.write(data)
        self._written += n
        if not self._fired and self._written > 0:
            self._fired = True
            self._f.flush()
            crash_point("partial")
        return n

    def __getattr__(self, name: str) -> object:
        return getattr(self._f, name)


STAGING_PREFIX = ".staging-"


class StagingFencedError(RuntimeError):
    """A commit whose staging directory was removed by a newer term's flusher: nothing was committed."""


def staging_term(name: str) -> int | None:
    """The term a staging directory's name states, or None when it is not one."""
    rest = name.removeprefix(STAGING_PREFIX)
    return int(rest) if rest != name and rest.isdigit() else None


def open_staging(root: Path, term: int) -> Path:
    """The staging directory of ``term`` under ``root`` (created), after removing every older term's.

    Raises StagingFencedError when a newer term's directory is there: this writer's term is over, and
    removing the newer one would fence the current owner instead.
    """
    make_dirs(root)
    newer: list[int] = []
    for entry in os.scandir(root):
        t = staging_term(entry.name)
        if t is None or t == term:
            continue
        if t > term:
            newer.append(t)
            continue
        # Removed with what it holds: temporaries of a term whose files must never land.
        shutil.rmtree(entry.path, ignore_errors=True)
    if newer:
        raise StagingFencedError(f"{root}: a newer term ({max(newer)}) stages files here; term {term} is over")
    staging = root / f"{STAGING_PREFIX}{term}"
    with contextlib.suppress(FileExistsError):
        staging.mkdir()
    fsync_dir(root)
    return staging


_unique = itertools.count()


def commit_file(directory: Path, name: str, write: Callable[[BinaryIO], None], *,
                staging: Path | None = None) -> Path:
    """Steps 1-5 of the protocol: ``write`` fills the file; returns its final path once durable.

    A file already under ``name`` (a crash between rename and checkpoint) is replaced by the same
    content, which is what a deterministic name makes safe.  With ``staging`` the temporary is written
    there (see the module docstring) and a removed staging directory raises StagingFencedError.
    """
    if name.startswith(TMP_PREFIX) or "/" in name:
        raise ValueError(f"invalid file name {name!r}")
    make_dirs(directory)
    # In a staging directory temporaries of several target directories meet: a counter keeps their
    # names apart (several commits of one flusher never run at once, but a rebuild may follow a write).
    tmp = (directory / temporary_name(name) if staging is None
           else staging / temporary_name(f"{os.getpid()}-{next(_unique)}-{name}"))
    final = directory / name
    try:
        # In a staging directory a newer term removed, this open fails: open never creates a
        # directory, and nothing here re-creates the staging one.
        with open(tmp, "wb") as f:
            write(_HalfKill(f) if crash_point.armed else f)  # type: ignore[arg-type]
            f.flush()
            crash_point("write")
            os.fsync(f.fileno())
        crash_point("fsync")
        os.replace(tmp, final)
    except FileNotFoundError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if staging is not None and not staging.is_dir():
            raise StagingFencedError(
                f"{final}: not committed: its staging directory {staging.name} was removed by a newer "
                f"term's flusher") from exc
        raise
    except BaseException:
        # A failed write (a full disk) leaves nothing behind: the temporary holds space the node
        # needs back, and the same name is written whole again on the next try.
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    crash_point("rename")
    fsync_dir(directory)
    crash_point("dirsync")
    return final


class PathOutsideRootError(RuntimeError):
    """A path built from a name lies outside the directory it was built under.

    Names are checked where they enter (``wal.names``), so this is a bug, not a user error: nothing
    has been touched when it is raised.
    """


def inside(root: Path, *parts: str) -> Path:
    """``root / parts`` after checking that it resolves (symbolic links and ``..`` followed) to a
    path strictly inside ``root``; raises PathOutsideRootError otherwise.

    Every directory the node and the flusher derive from a name goes through here, as a second
    line behind the name rules.  The path returned is the unresolved one, so paths reported to
    clients keep the root as configured.
    """
    path = root.joinpath(*parts)
    base = root.resolve()
    if base not in path.resolve().parents:
        raise PathOutsideRootError(f"{str(path)[:300]!r} is not inside {str(root)!r}")
    return path


def remove_temporaries(root: Path) -> int:
    """Delete temporary files left under ``root`` by a crash; returns how many."""
    removed = 0
    if not root.exists():
        return 0
    for dirpath, _, filenames in os.walk(root):
        for fn in filenames:
            if fn.startswith(TMP_PREFIX) and fn.endswith(TMP_SUFFIX):
                os.unlink(os.path.join(dirpath, fn))
                removed += 1
    return removed


__all__ = [
    "KILL_ENV",
    "STAGING_PREFIX",
    "STEPS",
    "PathOutsideRootError",
    "StagingFencedError",
    "commit_file",
    "crash_point",
    "fsync_dir",
    "inside",
    "make_dirs",
    "open_staging",
    "remove_temporaries",
    "staging_term",
]
