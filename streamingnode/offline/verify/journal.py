"""The journal part of ``verify``: every record of every journal file, live (``<seq>.jnl``) and kept
after damage (``<seq>.jnl.kept``), read on past damage."""

from __future__ import annotations

from dataclasses import dataclass

from streamingnode.offline.verify.access import Finding
from wal.backend import WriteGroup
from wal.backends.rocks_layout import JOURNAL_DIR, JournalTorn, journal_files, scan_journal_records


@dataclass(slots=True)
class JournalRecord:
    path: str
    offset: int
    groups: list[WriteGroup]
    kept: bool = False
    """From a kept file: a node opened the database after damage in it or before it, applied its
    groups but those of the damaged pchannels, and never replays it again."""


def scan_journal(data_dir: str, findings: list[Finding], notes: list[str],
                 damaged_keys: list[tuple[int, ...]] | None = None) -> list[JournalRecord]:
    """Every valid record of every journal file, oldest first, reading on past damage.

    A damaged stretch is a finding, except one that ends the newest live file with nothing valid
    after it and no trailer proving its record was written whole: a write torn by a crash, never
    acknowledged, which the node drops (a note).  Damage in a kept file is always a finding (the node
    kept the file because of it, or of damage before it).  The record format and the torn-tail
    judgement are the journal's own (``wal.backends.rocks_layout.scan_journal_records``); what differs
    from replay is that this goes on after damage.
    """
    paths = journal_files(data_dir)
    newest_live = max((i for i, (_, kept) in enumerate(paths) if not kept), default=None)
    records: list[JournalRecord] = []
    for i, (path, kept) in enumerate(paths):
        with open(path, "rb") as f:
            data = f.read()
        last = i == newest_live
        for record in scan_journal_records(data):
            if not isinstance(record, JournalTorn):
                offset, groups = record
                records.append(JournalRecord(path, offset, groups, kept))
                continue
            pos = record.offset
            if not record.damaged and last:
                notes.append(f"{path} at byte {pos}: torn tail of {len(data) - pos} bytes ({record.cause}); "
                             "a write cut short by a crash, never acknowledged: the node drops it")
                break
            after = ("valid records follow it" if record.resume is not None
                     else "its trailer shows it was written whole" if last
                     else "a file kept after damage" if kept
                     else "newer journal files follow it")
            keys = f" (channel keys {', '.join(map(str, record.channel_keys))})" if record.channel_keys else ""
            findings.append(Finding(path, f"damaged journal record{keys}: {record.cause}; {after}", offset=pos))
            if damaged_keys is not None:
                damaged_keys.append(tuple(record.channel_keys))  # () when its meta is unreadable
    return records


__all__ = ["JOURNAL_DIR", "JournalRecord", "journal_files", "scan_journal"]
