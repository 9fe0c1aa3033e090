"""What a flusher does about damage in its own output (flusher/README.md "Damaged files" and "Repair"):

- a damaged committed file is moved to ``_quarantine/`` and written again from the WAL, or reported lost;
- a compaction record older code wrote, listing a path as both input and output, gets its output a
  name of its own (from the file while it is there, else from the WAL), or is reported lost.

A line in ``problems`` for each loss; the node shows them in DescribeChannels.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

import structlog

from flusher import _overlaps, _probe, _repair, layout
from flusher.writer import FileWriter
from wal.wal import WAL

log = structlog.get_logger(__name__)

NOTHING: layout.DeliveryKey = (-1, -1)
"""The delivery key below every message's: what a directory with no committed file has flushed."""


class DamageRepair:
    """Repairs for the flusher of ``wal`` writing through ``files``.

    ``collections`` is the flusher's registry and ``flushed`` its largest committed delivery key per
    directory: both are the flusher's own objects, read (and ``flushed`` raised) in place.
    """

    def __init__(self, wal: WAL, files: FileWriter, root: Path, *,
                 collections: Mapping[tuple[str, str], _repair.CollectionInfo],
                 flushed: dict[str, layout.DeliveryKey], read_batch_bytes: int) -> None:
        self._wal = wal
        self._files = files
        self._root = root
        self._collections = collections
        self._flushed = flushed
        self._read_batch_bytes = read_batch_bytes
        self.quarantined = 0
        """Damaged files moved to ``_quarantine/``."""
        self.lost = 0
        """Of those (and of the outputs of records listing a path twice), the ones that could not be rebuilt."""
        self.problems: list[str] = []
        """Damage that cannot be repaired, one human-readable line per finding."""

    async def move_aside(self, d: layout.Damaged) -> None:
        moved = await self._files.in_thread(layout.quarantine, self._root, d.rel)
        self.quarantined += 1
        log.error("damaged parquet file moved aside", pchannel=self._wal.pchannel, file=d.rel,
                  moved_to=str(moved.relative_to(self._root)), reason=d.reason)

    async def check(self, rels: list[str]) -> None:
        """Read the data of the files ``rels`` (page checksums, statistics) in a child process; move
        each damaged one aside and rebuild it."""
        async for rel, _, reason in _probe.probe(_probe.DATA, self._root, self._wal.pchannel, rels):
            if reason is not None:
                d = layout.Damaged(rel, reason)
                await self.move_aside(d)
                await self.rebuild([d])

    async def rebuild(self, damaged: list[layout.Damaged]) -> None:
        """Write each moved-aside file again from the WAL, or report it lost (``problems``)."""
        first_kept = self._wal.first_id
        targets: dict[_repair.Target, layout.Damaged] = {}
        lost: list[tuple[layout.Damaged, str]] = []
        for d in damaged:
            ids = layout.parse_name(d.name)
            if ids is None:
                lost.append((d, "its name states no message ids"))
            elif min(ids) < first_kept:
                lost.append((d, f"its messages {ids[0]}..{ids[1]} are no longer in the WAL "
                                f"(the first retained is {first_kept})"))
            else:
                targets[_repair.Target(d.directory, ids[0], ids[1])] = d
        if targets:
            found = await _repair.rebuild(self._wal, list(targets), self._collections, self._read_batch_bytes)
            for target, d in targets.items():
                b = found.get(target)
                if b is None:
                    lost.append((d, f"its messages {target.first_id}..{target.last_id} were not found whole in "
                                    "the WAL"))
                    continue
                path = await self._files.commit_buffer(b)
                if b.last_key > self._flushed.get(b.directory, NOTHING):
                    self._flushed[b.directory] = b.last_key
                log.warning("damaged parquet file rewritten from the WAL", pchannel=self._wal.pchannel,
                            file=d.rel, rows=b.rows, bytes=path.stat().st_size)
        for d, why in lost:
            self.lost += 1
            line = (f"Parquet file {d.rel} was damaged ({d.reason[:200]}) and moved to "
                    f"{layout.QUARANTINE_DIR}/; it cannot be rewritten: {why}, so its rows are missing "
                    "from the Parquet output")
            self.problems.append(line)
            log.error("damaged parquet file lost", pchannel=self._wal.pchannel, file=d.rel, reason=why)

    async def repair_overlaps(self) -> None:
        """Give each output an older pass named after its input its own name, from the file while it
        is there, else from the WAL; report the ones lost (``problems``)."""
        for o in await self._files.in_thread(_overlaps.find, self._root):
            log.error("compaction record lists a path as both input and output", pchannel=self._wal.pchannel,
                      collection=o.collection, record=o.record_path, paths=list(o.paths))
            replacements: dict[str, str] = {}
            for rel in o.paths:
                new = _overlaps.renamed(rel, o.record.generation)
                directory, _, name = new.rpartition("/")
                found = await self._files.in_thread(_overlaps.source, self._root, rel)
                if found is not None:
                    data = await self._files.in_thread(found.read_bytes)
                    await self._files.commit_when_space(directory, name, functools.partial(_write_bytes, data))
                    replacements[rel] = new
                    continue
                why = await self._rebuild_lost_output(rel, directory, name)
                if why is None:
                    replacements[rel] = new
                    continue
                self.lost += 1
                line = (f"collection {o.collection!r}: compaction record {o.record_path} lists {rel} as both input "
                        f"and output, and the file is gone; it cannot be rebuilt: {why}.  The collection's "
                        "readers refuse it (reading on would show the rows its delete entries removed)")
                self.problems.append(line)
                log.error("compaction output lost", pchannel=self._wal.pchannel, collection=o.collection,
                          record=o.record_path, file=rel, reason=why)
            if len(replacements) == len(o.paths):
                await self._files.in_thread(_overlaps.publish, self._root, o, replacements, self._files.staging)
                log.warning("compaction record repaired", pchannel=self._wal.pchannel, collection=o.collection,
                            record=o.record_path, outputs=sorted(replacements.values()))

    async def _rebuild_lost_output(self, rel: str, directory: str, name: str) -> str | None:
        """Write ``directory/name`` with the messages the name of ``rel`` states, read from the WAL;
        None when done, else why it cannot be."""
        ids = layout.parse_name(rel.rpartition("/")[2])
        if ids is None:
            return "its name states no message ids"
        if ids[0] < self._wal.first_id:
            return (f"its messages {ids[0]}..{ids[1]} are no longer in the WAL (retention truncated it up to "
                    f"{self._wal.first_id})")
        target = _repair.Target(rel.rpartition("/")[0], ids[0], ids[1])
        found = await _repair.rebuild(self._wal, [target], self._collections, self._read_batch_bytes)
        b = found.get(target)
        if b is None:
            return f"its messages {ids[0]}..{ids[1]} were not found whole in the WAL"
        await self._files.commit_table(directory, name, b.to_table(self._wal.pchannel))
        log.warning("lost compaction output rebuilt from the WAL", pchannel=self._wal.pchannel, file=rel,
                    rebuilt=f"{directory}/{name}", rows=b.rows)
        return None


def _write_bytes(data: bytes, f: BinaryIO) -> None:
    f.write(data)


__all__ = ["NOTHING", "DamageRepair"]
