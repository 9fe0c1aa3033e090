"""The journal part of ``verify``: every record of every journal file, live (``<seq>.jnl``) and kept
after damage (``<seq>.jnl.kept``), read on past damage."""

from __future__ import annotations

import os
from dataclasses import dataclass

from streamingnode.offline.verify.access import Finding
from wal.backend import WriteGroup

JOURNAL_DIR = "journal"


@dataclass(slots=True)
class JournalRecord:
    path: str
    offset: int
    groups: list[WriteGroup]
    kept: bool = False
    """From a kept file: a node opened the database after damage in it or before it, applied its
    groups but those of the damaged pchannels, and never replays it again."""


def journal_files(data_dir: str) -> list[tuple[str, bool]]:
    """Every journal file, live and kept, in sequence order: (path, whether it is kept)."""
    from wal.backends import _journal  # noqa: PLC0415

    directory = os.path.join(data_dir, JOURNAL_DIR)
    both = [(p, True) for p in _journal.kept_files(directory)] + [(p, False) for p in _journal.files(directory)]
    return sorted(both, key=lambda pk: _journal.sequence_of(pk[0]))


def scan_journal(data_dir: str, findings: list[Finding], notes: list[str],
                 damaged_keys: list[tuple[int, ...]] | None = None) -> list[JournalRecord]:
    """Every valid record of every journal file, oldest first, reading on past damage.

    A damaged stretch is a finding, except one that ends the newest live file with nothing valid
    after it and no trailer proving its record was written whole: a write torn by a crash, never
    acknowledged, which the node drops (a note).  Damage in a kept file is always a finding (the node
    kept the file because of it, or of damage before it).  The record format and the torn-tail
    judgement are the journal's own (``wal.backends._journal``); what differs from replay is that this
    goes on after damage.
    """
    from wal.backends import _journal  # noqa: PLC0415

    paths = journal_files(data_dir)
    newest_live = max((i for i, (_, kept) in enumerate(paths) if not kept), default=None)
    records: list[JournalRecord] = []
    for i, (path, kept) in enumerate(paths):
        with open(path, "rb") as f:
            data = f.read()
        last = i == newest_live
        for rec in _journal.records(data):
            if rec.groups is not None:
                records.append(JournalRecord(path, rec.offset, rec.groups, kept))
                continue
            if rec.resumes_at is None and last and not rec.written_whole:
                notes.append(f"{path} at byte {rec.offset}: torn tail of {len(data) - rec.offset} bytes "
                             f"({rec.reason}); a write cut short by a crash, never acknowledged: the node drops it")
                break
            after = ("valid records follow it" if rec.resumes_at is not None
                     else "its trailer shows it was written whole" if last
                     else "a file kept after damage" if kept
                     else "newer journal files follow it")
            keys = f" (channel keys {', '.join(map(str, rec.channel_keys))})" if rec.channel_keys else ""
            findings.append(Finding(path, f"damaged journal record{keys}: {rec.reason}; {after}", offset=rec.offset))
            if damaged_keys is not None:
                damaged_keys.append(tuple(rec.channel_keys))  # () when its meta is unreadable
    return records


__all__ = ["JOURNAL_DIR", "JournalRecord", "journal_files", "scan_journal"]
