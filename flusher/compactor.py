"""A flusher's compaction passes: on the flusher's own thread (``FileWriter.in_thread``), so that no
commit of the flusher runs meanwhile, and committing through its term's staging directory, so that a
fenced flusher's pass publishes nothing.  The pass itself is ``flusher.compact``."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path

import structlog

from flusher import compact, compaction_record, layout
from flusher.commit import StagingFencedError
from flusher.compact import CompactionResult, CompactionTotals
from flusher.compaction_config import DEFAULT_COMPACTION, CompactionConfig
from flusher.writer import FileWriter

log = structlog.get_logger(__name__)


class Compactor:
    """The passes of the flusher of ``pchannel`` writing ``root`` through ``files``; ``config`` is the
    flusher's (None: it compacts only on demand, with the defaults)."""

    def __init__(self, root: Path, pchannel: str, files: FileWriter, config: CompactionConfig | None) -> None:
        self._root = root
        self._pchannel = pchannel
        self._files = files
        self._cfg = config
        self._totals = CompactionTotals()

    def recover(self) -> None:
        """Finish every committed record and delete uncommitted outputs (blocking: run it on the
        flusher's thread, before the flusher lists its committed files)."""
        grace = (self._cfg or DEFAULT_COMPACTION).grace_seconds
        for c in compaction_record.collections(self._root):
            compaction_record.recover(self._root, c, grace)

    async def run(self, collection: str | None, busy: set[str], progress: Callable[[str], None] | None, *,
                  config: CompactionConfig | None, now_ms: int | None) -> list[CompactionResult]:
        """One pass over ``collection`` (or every collection), leaving the directories ``busy`` alone
        (they hold buffered rows).  A collection whose record lists a path as both input and output is
        skipped when the pass is over every collection, and raises when it was named."""
        cfg = config or self._cfg or DEFAULT_COMPACTION
        names = [collection] if collection is not None else \
            await self._files.in_thread(compaction_record.collections, self._root)
        results = []
        for name in names:
            try:
                # Through the module: a test holds a pass back by replacing it there.
                r = await self._files.in_thread(functools.partial(
                    compact.compact_collection, self._root, name, cfg, busy=busy, progress=progress,
                    staging=self._files.staging, now_ms=now_ms))
            except StagingFencedError as exc:
                raise self._files.fenced(exc) from exc
            except layout.OverlappingRecordError as exc:
                if collection is not None:
                    raise
                # A record older code wrote that could not be repaired (``problems``): this collection
                # waits, the others are compacted.
                log.error("compaction skipped", pchannel=self._pchannel, collection=name,  # noqa: TRY400
                          error=str(exc)[:300])  # the reason is the record, not this stack
                continue
            self._totals.add(r)
            if r.generation is not None:
                log.info("compacted", pchannel=self._pchannel, collection=name, generation=r.generation,
                         files_before=r.files_before, files_after=r.files_after, bytes_before=r.bytes_before,
                         bytes_after=r.bytes_after, rows_dropped=r.rows_dropped, seconds=round(r.seconds, 3))
            results.append(r)
        return results

    def totals(self) -> CompactionTotals:
        """What the passes did since the flusher started (a copy)."""
        return dataclasses.replace(self._totals)


__all__ = ["Compactor"]
