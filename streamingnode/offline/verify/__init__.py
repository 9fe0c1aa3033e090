"""``streamingnode verify``: an offline check of everything a data directory stores.

It reads the raw stores itself rather than through the WAL's open path, so that it finds damage
whatever that path makes of it:

- every journal record (``journal/*.jnl``, and ``*.jnl.kept``: files a node kept after damage;
  record header, metadata CRC, each block's CRC), reading on past a damaged record to the next valid
  one;
- every key of the RocksDB database with RocksDB's block checksums verified, continuing past an
  unreadable region to the next key range;
- every stored block (its CRC and framing) and, per pchannel, that the blocks (with those only the
  journal holds) cover the ids without a gap;
- the channel records (one a node marked damaged is a finding), the recovery snapshot(s) of each
  pchannel, and its consumer groups' committed positions (one out of range is a finding);
- every Parquet file under the Parquet root: footer, row-group statistics, every row group read back,
  and the ids its name gives against the delivery keys its metadata holds;
- every compaction record: it parses, lists no path as both input and output (older code could; the
  collection's readers refuse it until a node's flusher repairs it), and its outputs exist.

One line per finding names the file (and the byte offset or key range where known).  The database is
opened read-only while a lock on RocksDB's own LOCK file keeps a node from opening it meanwhile; a
directory a running node holds is refused (``DataDirInUseError``).  ``salvage.py`` builds on the same
scan (``scan_wal``).

The parts: ``access`` (the lock, the read-only open, a finding), ``journal``, ``tables`` (RocksDB),
``channels`` (the WAL as a whole: per pchannel, its blocks and where its ids stop being trustworthy),
``parquet``; this module is the command.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from streamingnode.offline.verify.access import DataDirInUseError, Finding, Progress, offline, one_line, open_read_only
from streamingnode.offline.verify.channels import ChannelScan, Extent, WalScan, check_groups, check_snapshots, scan_wal
from streamingnode.offline.verify.journal import JOURNAL_DIR, JournalRecord, scan_journal
from streamingnode.offline.verify.parquet import PARQUET_DIR, check_compactions, check_parquet, parquet_files
from streamingnode.offline.verify.tables import Unreadable, describe_key, rocks_file, scan_rocks
from wal.errors import StreamingError


@dataclass(slots=True)
class Report:
    findings: list[Finding]
    notes: list[str]
    counted: dict[str, int]


def verify(data_dir: str, pchannel: str | None = None, parquet_dir: str | None = None,
           progress: Progress | None = None) -> Report:
    """Check ``data_dir`` offline (see the module docstring).  Raises DataDirInUseError."""
    if not os.path.isdir(data_dir):
        raise StreamingError(f"data directory {data_dir} does not exist", path=data_dir)
    findings: list[Finding] = []
    notes: list[str] = []
    counted = {"journal records": 0, "keys": 0, "blocks": 0, "parquet files": 0, "compaction records": 0}
    with offline(data_dir):
        if os.path.exists(os.path.join(data_dir, "CURRENT")):
            try:
                db = open_read_only(data_dir)
            except Exception as exc:  # noqa: BLE001  (rocksdict raises plain Exception)
                text = str(exc)
                findings.append(Finding(rocks_file(text) or data_dir, f"RocksDB cannot open: {one_line(text)}"))
                db = None
            if db is not None:
                try:
                    scan = scan_wal(data_dir, db, progress)
                    check_snapshots(data_dir, db, scan, pchannel)
                    check_groups(data_dir, db, scan, pchannel)
                finally:
                    db.close()
                keep = {ch.name for ch in scan.channels.values()}
                if pchannel is not None and pchannel not in keep:
                    raise StreamingError(f"pchannel {pchannel!r} does not exist in {data_dir}", path=data_dir)
                findings.extend(f for f in scan.findings if pchannel is None or f.channel in (None, pchannel))
                notes.extend(scan.notes)
                for ch in scan.channels.values():
                    if pchannel is not None and ch.name != pchannel:
                        continue
                    # Damaged blocks are findings already; what only the walk shows is a missing id,
                    # unless a damaged journal record (a finding too) may have held it.
                    if not scan.explained(ch):
                        findings.extend(Finding(os.path.join(data_dir, "(rocksdb)"), f"pchannel {ch.name!r}: {why}",
                                                channel=ch.name) for _, why in ch.gaps())
                counted.update({"journal records": len(scan.journal), "keys": scan.keys,
                                "blocks": sum(len(c.extents) for c in scan.channels.values())})
        else:
            notes.append(f"{data_dir} holds no WAL database")
        root = Path(parquet_dir) if parquet_dir is not None else Path(data_dir) / PARQUET_DIR
        for path in parquet_files(root, pchannel):
            findings.extend(check_parquet(path))
            counted["parquet files"] += 1
            if progress is not None:
                progress.tick(f"{counted['parquet files']} Parquet files")
        found, counted["compaction records"] = check_compactions(root, pchannel)
        findings.extend(found)
    return Report(findings, notes, counted)


def run(data_dir: str, pchannel: str | None, parquet_dir: str | None, out: TextIO = sys.stdout,
        err: TextIO = sys.stderr) -> int:
    """The ``verify`` command: 0 when clean, 1 on any finding, 2 when the check could not run."""
    try:
        report = verify(data_dir, pchannel, parquet_dir, Progress(err))
    except StreamingError as exc:
        print(f"verify: {exc}", file=err)
        return 2
    for note in report.notes:
        print(f"note: {note}", file=out)
    for f in report.findings:
        print(f.line(), file=out)
    counts = ", ".join(f"{n} {what}" for what, n in report.counted.items())
    verdict = f"{len(report.findings)} finding(s)" if report.findings else "clean"
    print(f"verify {data_dir}: {verdict} ({counts})", file=out, flush=True)
    return 1 if report.findings else 0


__all__ = [
    "JOURNAL_DIR",
    "PARQUET_DIR",
    "ChannelScan",
    "DataDirInUseError",
    "Extent",
    "Finding",
    "JournalRecord",
    "Progress",
    "Report",
    "Unreadable",
    "WalScan",
    "check_compactions",
    "check_groups",
    "check_parquet",
    "check_snapshots",
    "describe_key",
    "offline",
    "open_read_only",
    "parquet_files",
    "run",
    "scan_journal",
    "scan_rocks",
    "scan_wal",
    "verify",
]
