"""Bytes RocksDB's compactions write per byte the WAL appends, with the node's default settings.

    .venv/bin/python bench/write_amp.py            # measure and print
    .venv/bin/python bench/write_amp.py --check    # fail (exit 1) over the budget

The instruction budget (``bench/append_instructions.py``) counts the append path with memtables
larger than its run, so RocksDB's own flushes and compactions never fall inside it.  Its settings can
still make bulk appends cost more: smaller memtables under RocksDB's default level-0 trigger made
compaction rewrite level 1 every 64 MiB written, about a microsecond of CPU per 1 KiB message, and
neither the instruction count nor any timed test saw it.  This check sees it the way that does not
depend on the host: it appends ``--mib`` of 1 KiB-message blocks (with a time-index entry each, as the
node writes them) to a ``RocksBackend`` with the node's defaults, waits after each block until the
journal's flush thread and RocksDB have nothing left to run, and reads from RocksDB's statistics how
many bytes its compactions wrote (flushes excluded).  Settling after each block makes the figure the
same on every run and host (which files a flush or compaction takes no longer races the writer), so a
change in it is a change in the settings or in what is written.  The budget
(``compaction_bytes_per_byte`` in ``bench/append_budget.json``) allows 25%: compactions come in steps
(a level-0 compaction every 16 flushed files), and a small change in the bytes written can move one
across the end of the run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
BUDGET = _HERE / "append_budget.json"
KEY = "compaction_bytes_per_byte"
TOLERANCE = 0.25
_BLOCK_MESSAGES = 1000


def _gb(stats: str, what: str) -> float:
    found = re.search(rf"^{what}: ([\d.]+) GB write", stats, re.M)
    if found is None:
        raise RuntimeError(f"RocksDB's statistics have no {what!r} line:\n{stats[:2000]}")
    return float(found.group(1))


def _settle(backend: object, deadline: float) -> None:
    # A journal switch (every 64 MiB) flushes the memtable from the journal's own thread, with
    # whatever the memtable holds when that thread gets to it: wait for it first (one thread, so a
    # no-op queued behind it runs after it), then for RocksDB's flushes and compactions.
    flusher = backend._jflusher  # type: ignore[attr-defined]
    if flusher is not None:
        flusher.submit(lambda: None).result()
    db = backend._db  # type: ignore[attr-defined]
    busy = ("compaction-pending", "num-running-compactions", "num-running-flushes", "mem-table-flush-pending")
    while any(db.property_int_value(f"rocksdb.{p}") for p in busy):
        if time.monotonic() > deadline:
            raise RuntimeError("RocksDB still compacting after 10 minutes")
        time.sleep(0.005)


def measure(mib: int, size: int, tmp: str | None = None) -> tuple[float, int]:
    """(bytes compactions wrote per byte appended, level-0 files at the end)."""
    from wal.backend import TickEntry, WriteGroup  # noqa: PLC0415
    from wal.backends.rocks import RocksBackend  # noqa: PLC0415

    work = tempfile.mkdtemp(prefix="write-amp-", dir=tmp)
    try:
        backend = RocksBackend(os.path.join(work, "db"))
        try:
            key = backend.create_channel("p", {}).key
            block = os.urandom(_BLOCK_MESSAGES * size)  # incompressible, as most payloads are
            db = backend._db  # RocksDB's own counters: the node needs no public seam for them
            deadline = time.monotonic() + 600
            appended = next_id = 0
            while appended < mib << 20:
                tick = next_id // _BLOCK_MESSAGES + 1
                group = WriteGroup(key, next_id, block, [TickEntry(tick, next_id + _BLOCK_MESSAGES - 1, next_id)], tick)
                backend.write([group], False)
                next_id += _BLOCK_MESSAGES
                appended += len(block)
                # Settle after every block: a flush and the compaction it starts finish before the next
                # write, so which files each compaction takes follows from the settings alone.  Left
                # to race the writer, the picks moved with thread timing (0.70 to 1.01 on one tree): a journal
                # switch's flush took whatever the memtable held, so 46 to 48 files were flushed, and
                # the 48th started a third compaction.
                _settle(backend, deadline)
            stats = str(db.property_value("rocksdb.stats"))
            level0 = int(db.property_int_value("rocksdb.num-files-at-level0"))
        finally:
            backend.close()
        # "Cumulative compaction" counts what flushes wrote too; "Flush(GB): cumulative" is theirs.
        flushed = re.search(r"^Flush\(GB\): cumulative ([\d.]+)", stats, re.M)
        if flushed is None:
            raise RuntimeError(f"RocksDB's statistics have no flush line:\n{stats[:2000]}")
        compacted = _gb(stats, "Cumulative compaction") - float(flushed.group(1))
        return max(0.0, compacted) * (1 << 30) / appended, level0
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--mib", type=int, default=640, help="MiB appended (default 640: ten level-1 compactions' "
                   "worth at RocksDB's default trigger)")
    p.add_argument("--size", type=int, default=1024, help="message size the blocks are made of (default 1024)")
    p.add_argument("--dir", default=None, help="parent of the temporary database (default: system temp)")
    p.add_argument("--check", action="store_true", help="exit 1 when over the budget by more than 25%%")
    p.add_argument("--write-budget", action="store_true", help=f"store the figure in {BUDGET.name}")
    args = p.parse_args(argv)
    sys.path.insert(0, str(_HERE.parent))
    per, level0 = measure(args.mib, args.size, args.dir)
    budget = json.loads(BUDGET.read_text()) if BUDGET.exists() else {}
    allowed = budget.get(KEY)
    line = (f"write_amp: {args.mib} MiB appended, compactions wrote {per:.2f} bytes per byte "
            f"({level0} level-0 files left)")
    if allowed is not None:
        line += f"; budget {allowed:.2f}, ratio {per / allowed:.2f}"
    print(line)
    if args.write_budget:
        BUDGET.write_text(json.dumps({**budget, KEY: round(per, 3)}, indent=2) + "\n")
        print(f"budget written to {BUDGET}")
    if args.check:
        if allowed is None:
            print(f"no {KEY} in {BUDGET}", file=sys.stderr)
            return 1
        if per > allowed * (1 + TOLERANCE):
            print(f"write-amp check FAILED: compactions wrote {per:.2f} bytes per appended byte, over the budget "
                  f"{allowed:.2f} by more than {TOLERANCE:.0%} (if intended, refresh it: see bench/README.md)",
                  file=sys.stderr)
            return 1
        print(f"write-amp check passed (within {TOLERANCE:.0%} of the budget)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
