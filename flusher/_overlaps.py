"""Repairing a compaction record that lists a path as both input and output.

Older code named a pass's output after its inputs' first and last ids; a pass rewriting a collection's
only delete file (dropping some of its entries) therefore named the output after its input.  The
record listed one path as both; readers subtracted it (no delete file was read), the link found the
name taken, and once the grace period was over the input, the only copy, was deleted: every row those
entries deleted came back.  Readers now refuse such a record (``layout.OverlappingRecordError``) and
recovery never deletes the path; this module gives the output the name it should have had,
``<first>-<last>.g<generation>.parquet``, and rewrites the record to publish it:

1. the contents: the file itself when it is still there (its grace period was not over, or this code
   kept it), else its hidden name, else the messages its name states, read again from the WAL
   (``_repair.rebuild``: every delete entry from the first id through the last, a superset of what the
   pass kept: an entry it had dropped removes no row that is left, which is why it was dropped);
2. the new file committed (temporary, fsync, rename, directory fsync);
3. the record rewritten the same way (``compaction_record.write_record``), publishing the new name.  The old path
   stays an input, deleted after the grace period like any other.

When none of the three is left (retention truncated the WAL past the file's first message) the file
is lost: the record stays as it is, so readers keep refusing the collection rather than show deleted
rows again, and the flusher reports it (``Flusher.problems``, the log).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from flusher import compaction_record, layout
from flusher.layout import CompactionRecord


@dataclass(frozen=True, slots=True)
class Overlap:
    """One record of ``collection`` listing ``paths`` (relative to the root) as input and output."""

    collection: str
    record: CompactionRecord
    paths: tuple[str, ...]

    @property
    def record_path(self) -> str:
        return f"{layout.compactions_dir(self.collection)}/{layout.record_name(self.record.generation)}"


def find(root: Path) -> list[Overlap]:
    """Every record under ``root`` (one pchannel's) that lists a path as both input and output."""
    out = []
    for c in compaction_record.collections(root):
        for rec in layout.read_records(root, c):
            both = rec.overlap()
            if both:
                out.append(Overlap(c, rec, tuple(both)))
    return out


def renamed(rel: str, generation: int) -> str:
    """The name ``rel`` (an output of ``generation``) gets: the same ids, the generation added."""
    directory, _, name = rel.rpartition("/")
    ids = layout.parse_name(name)
    if ids is None:
        raise layout.LayoutError(f"{rel}: not a name of the form <first id>-<last id>.parquet")
    return f"{directory}/{layout.file_name(ids[0], ids[1], generation)}"


def source(root: Path, rel: str) -> Path | None:
    """The file still holding ``rel``'s contents: itself, or its hidden name; None when both are gone."""
    for candidate in (root / rel, root / layout.hidden(rel)):
        if candidate.is_file():
            return candidate
    return None


def publish(root: Path, overlap: Overlap, replacements: dict[str, str], staging: Path | None) -> CompactionRecord:
    """Rewrite the record with each overlapping output replaced by its new name (already committed)."""
    rec = overlap.record
    fixed = CompactionRecord(rec.generation, rec.horizon, rec.inputs,
                             tuple(replacements.get(o, o) for o in rec.outputs), rec.flushed)
    layout.check_record(root, overlap.collection, fixed)
    compaction_record.write_record(root, overlap.collection, fixed, staging)
    return fixed


__all__ = ["Overlap", "find", "publish", "renamed", "source"]
