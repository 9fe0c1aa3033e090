"""Durable append and catch-up scan of the WAL, measured against raw rocksdict in the same process.

    .venv/bin/python bench/wal_append.py [--messages N] [--size 1024] [--appenders 16] [--batch 100] [--runs 3]
    .venv/bin/python bench/wal_append.py --verify-cost [--messages N] [--runs 5]   # read checksums on / off

Every run measures, each in a fresh temporary directory, ours and raw back to back (which goes first
alternates between runs):

* durable append, ours: ``WALManager.start_rocksdb`` (Durability.SYNC), one pchannel, ``--appenders``
  asyncio tasks each calling ``await wal.append_batch([...])`` with ``--batch`` messages until
  ``--messages`` are stored; once per ``SyncMethod``.  The Message objects are built inside the timed
  region.  One TimeTick is appended in the data every 1,000 messages so that a reader gets packs.
* durable append, raw rocksdict: the same number of ``--size`` records with 12-byte keys, ``WriteBatch``
  of 1,000 puts, written with ``WriteOptions.sync = True`` or unsynced followed by ``flush_wal(True)``.
* catch-up scan, ours: a new manager over the database of the flush_wal append (so the tail buffer is
  empty and everything comes from storage), ``wal.read(ReadOption())`` until every message is seen.
* scan, raw: a rocksdict iterator over the (reopened) raw sync=True database, key and value of each record.
* batch 1, ours: one message per ``append_batch`` call (``--messages // 10`` messages) to show group
  commit at work: requests / commits is the coalescing factor.

The table shows medians over ``--runs``; ratios are medians of the per-run ours/raw ratios.
Benchmarks are not tests: they assert nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Run as a script from anywhere: the harness makes the repository root importable.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import rocksdict
from _harness import Run, prepare_process, repeat, tmpdir, verdict

from wal import Message, MessageType, ReadOption, WALManager, new_time_tick
from wal.backends.rocks import RocksBackend, SyncMethod

PCHANNEL = "bench-p0"
VCHANNEL = "bench-v0"
TICK_EVERY = 1000
RAW_BATCH = 1000
_RAW_KEY = struct.Struct(">IQ")  # 12 bytes, like the backend's data keys minus the prefix byte

APPEND_TARGET = 0.60
SCAN_TARGET = 0.50


# --- ours ------------------------------------------------------------------------------------------
@dataclass
class AppendRun:
    rate: float  # messages per second
    requests: int  # append_batch calls
    commits: int  # group-commit writes


async def _append_ours(path: str, n: int, size: int, appenders: int, batch: int, sync_method: SyncMethod) -> AppendRun:
    manager = await WALManager.start_rocksdb(path, sync_method=sync_method)
    try:
        await manager.create_channel(PCHANNEL)
        wal = await manager.open(PCHANNEL)
        payload = os.urandom(size)
        insert = MessageType.INSERT
        next_seq = 0  # next message index to hand to an appender (the loop is single-threaded)
        requests = 0

        async def appender() -> None:
            nonlocal next_seq, requests
            while next_seq < n:
                start = next_seq
                end = min(start + batch, n)
                next_seq = end
                # Message i has timetick i + 1; a tick at `end` follows every 1,000 messages.
                msgs = [Message(insert, VCHANNEL, payload, timetick=ts) for ts in range(start + 1, end + 1)]
                if end // TICK_EVERY != start // TICK_EVERY:
                    msgs.append(new_time_tick(end))
                await wal.append_batch(msgs)
                requests += 1

        commits0 = manager._committer.commits
        t0 = time.perf_counter()
        await asyncio.gather(*(appender() for _ in range(appenders)))
        elapsed = time.perf_counter() - t0
        commits = manager._committer.commits - commits0
        # A last barrier above every timestamp, so that a reader is handed every message (untimed).
        await wal.append(new_time_tick(n + 1))
        if wal.next_id - wal.first_id < n:
            raise RuntimeError(f"appended {wal.next_id - wal.first_id} messages, expected >= {n}")
    finally:
        await manager.aclose()
    return AppendRun(n / elapsed, requests, commits)


async def _scan_ours(path: str, n: int, verify_checksums: bool = True) -> float:
    # A fresh manager: empty tail buffer, reads storage.
    backend = await asyncio.to_thread(functools.partial(RocksBackend, path, verify_checksums=verify_checksums))
    manager = await WALManager.start(backend)
    try:
        wal = await manager.open(PCHANNEL)
        seen = 0
        insert = MessageType.INSERT
        t0 = time.perf_counter()
        scanner = wal.read(ReadOption())
        try:
            async for pack in scanner:
                for m in pack.messages:
                    if m.message_type is insert:
                        seen += 1
                if seen >= n:
                    break
        finally:
            await scanner.aclose()
        elapsed = time.perf_counter() - t0
        if seen != n:
            raise RuntimeError(f"scanned {seen} messages, expected {n}")
    finally:
        await manager.aclose()
    return n / elapsed


# --- raw rocksdict ---------------------------------------------------------------------------------
def _raw_options() -> rocksdict.Options:
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    return opts


def _raw_write(path: str, n: int, size: int, method: SyncMethod) -> float:
    db = rocksdict.Rdict(path, options=_raw_options())
    try:
        payload = os.urandom(size)
        pack = _RAW_KEY.pack
        plain = rocksdict.WriteOptions()
        synced = rocksdict.WriteOptions()
        synced.sync = True
        write_sync = method is SyncMethod.WRITE_SYNC
        t0 = time.perf_counter()
        for start in range(0, n, RAW_BATCH):
            wb = rocksdict.WriteBatch(raw_mode=True)
            for i in range(start, min(start + RAW_BATCH, n)):
                wb.put(pack(1, i), payload)
            if write_sync:
                db.write(wb, synced)
            else:
                db.write(wb, plain)
                db.flush_wal(True)
        elapsed = time.perf_counter() - t0
    finally:
        db.close()
    return n / elapsed


def _raw_scan(path: str, n: int) -> float:
    db = rocksdict.Rdict(path, options=_raw_options())  # reopened, like ours
    try:
        seen = 0
        t0 = time.perf_counter()
        it = db.iter()
        it.seek_to_first()
        while it.valid():
            it.key()
            it.value()
            seen += 1
            it.next()
        elapsed = time.perf_counter() - t0
        del it  # an iterator keeps the database open after close()
        if seen != n:
            raise RuntimeError(f"raw scan saw {seen} records, expected {n}")
    finally:
        db.close()
    return n / elapsed


# --- driver ----------------------------------------------------------------------------------------
def _run_append(path: str, n: int, size: int, appenders: int, batch: int, method: SyncMethod) -> AppendRun:
    gc.collect()
    return asyncio.run(_append_ours(path, n, size, appenders, batch, method))


def _pair(ours: Callable[[], float], raw: Callable[[], float], raw_first: bool) -> tuple[float, float]:
    """Run ours and raw back to back (order alternating between runs, against drift on a noisy host)."""
    if raw_first:
        gc.collect()
        r = raw()
        gc.collect()
        return ours(), r
    gc.collect()
    o = ours()
    gc.collect()
    return o, raw()


def _one_run(args: argparse.Namespace, root: str, index: int) -> dict[str, float]:
    n, size, appenders, batch = args.messages, args.size, args.appenders, args.batch
    n1 = max(n // 10, 1)
    raw_first = index % 2 == 1
    r: dict[str, float] = {}
    ours_db = tmpdir(root, "ours-flush-wal")  # kept for the scan
    raw_db = tmpdir(root, "raw-write-sync")  # kept for the raw scan
    try:
        # Durable append, ours (batch --batch) next to raw (WriteBatch of 1,000), per sync method.
        for method, ours_path, raw_path in (
            (SyncMethod.JOURNAL, tmpdir(root, "ours-journal"), tmpdir(root, "raw-flush-wal-j")),
            (SyncMethod.FLUSH_WAL, ours_db, tmpdir(root, "raw-flush-wal")),
            (SyncMethod.WRITE_SYNC, tmpdir(root, "ours-write-sync"), raw_db),
        ):
            key = method.value
            res: list[AppendRun] = []

            def ours(p: str = ours_path, m: SyncMethod = method, out: list[AppendRun] = res) -> float:
                out.append(_run_append(p, n, size, appenders, batch, m))
                return out[-1].rate

            def raw(p: str = raw_path, m: SyncMethod = method) -> float:
                return _raw_write(p, n, size, m)

            r[f"ours_{key}"], r[f"raw_{key}"] = _pair(ours, raw, raw_first)
            r[f"ours_{key}_commits"] = res[0].commits
            r[f"ours_{key}_coalesce"] = res[0].requests / max(res[0].commits, 1)
            for p in (ours_path, raw_path):
                if p not in (ours_db, raw_db):
                    shutil.rmtree(p, ignore_errors=True)

        # Catch-up scan: ours from storage (fresh manager) next to a raw iterator.
        r["scan_ours"], r["scan_raw"] = _pair(
            lambda: asyncio.run(_scan_ours(ours_db, n)), lambda: _raw_scan(raw_db, n), raw_first
        )
    finally:
        shutil.rmtree(ours_db, ignore_errors=True)
        shutil.rmtree(raw_db, ignore_errors=True)

    # Batch 1: one message per append_batch call; group commit coalesces the concurrent requests.
    for method in (SyncMethod.JOURNAL, SyncMethod.FLUSH_WAL, SyncMethod.WRITE_SYNC):
        key = f"ours_b1_{method.value}"
        path = tmpdir(root, key)
        try:
            b1 = _run_append(path, n1, size, appenders, 1, method)
        finally:
            shutil.rmtree(path, ignore_errors=True)
        r[key] = b1.rate
        r[f"{key}_requests"] = b1.requests
        r[f"{key}_commits"] = b1.commits
        r[f"{key}_coalesce"] = b1.requests / max(b1.commits, 1)

    # Paired ratios: each ours next to the raw figure measured beside it.
    # JOURNAL (the default) against the same raw flush_wal limit as FLUSH_WAL, measured beside it.
    r["ratio_journal"] = r["ours_journal"] / r["raw_journal"]
    r["ratio_flush_wal"] = r["ours_flush_wal"] / r["raw_flush_wal"]
    r["ratio_write_sync"] = r["ours_write_sync"] / r["raw_write_sync"]
    r["ratio_best"] = (max(r["ours_journal"], r["ours_flush_wal"], r["ours_write_sync"])
                       / max(r["raw_journal"], r["raw_flush_wal"], r["raw_write_sync"]))
    r["ratio_scan"] = r["scan_ours"] / r["scan_raw"]
    return r


def _report(args: argparse.Namespace, runs: list[dict[str, float]]) -> None:
    med = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
    n1 = max(args.messages // 10, 1)
    print()
    print(
        f"wal_append: {args.messages:,} messages of {args.size} B, {args.appenders} appenders, "
        f"batch {args.batch}; medians of {len(runs)} run(s)"
    )
    rows = [
        (f"ours append, batch {args.batch}, journal (default)", "ours_journal"),
        ("raw WriteBatch(1000) + flush_wal(True), beside it", "raw_journal"),
        (f"ours append, batch {args.batch}, flush_wal", "ours_flush_wal"),
        ("raw WriteBatch(1000) + flush_wal(True)", "raw_flush_wal"),
        (f"ours append, batch {args.batch}, write_sync", "ours_write_sync"),
        ("raw WriteBatch(1000) + sync=True", "raw_write_sync"),
        (f"ours append, batch 1 ({n1:,} msgs), journal", "ours_b1_journal"),
        (f"ours append, batch 1 ({n1:,} msgs), flush_wal", "ours_b1_flush_wal"),
        (f"ours append, batch 1 ({n1:,} msgs), write_sync", "ours_b1_write_sync"),
        ("ours catch-up scan (from storage)", "scan_ours"),
        ("raw iterator scan", "scan_raw"),
    ]
    width = max(len(label) for label, _ in rows)
    print(f"{'what':<{width}} | {'median msg/s':>12} | each run")
    print(f"{'-' * width}-+-{'-' * 12}-+-{'-' * 30}")
    for label, key in rows:
        each = ", ".join(f"{run[key]:,.0f}" for run in runs)
        extra = ""
        if f"{key}_coalesce" in med:
            extra = f"  [commits {med[f'{key}_commits']:,.0f}, {med[f'{key}_coalesce']:.1f} requests/commit]"
        print(f"{label:<{width}} | {med[key]:>12,.0f} | {each}{extra}")
    print()
    print("ratios are medians of the per-run ratios (ours / raw measured back to back)")
    for method, raw_label in (("journal", "raw WriteBatch+flush_wal"), ("flush_wal", "raw WriteBatch+flush_wal"),
                              ("write_sync", "raw WriteBatch+sync")):
        print(
            f"append durable ({method}) ours {med[f'ours_{method}']:,.0f} msg/s | "
            f"{raw_label} {med[f'raw_{method}']:,.0f} msg/s | {verdict(med[f'ratio_{method}'], APPEND_TARGET)}"
        )
    print(f"append durable, best ours / best raw: {verdict(med['ratio_best'], APPEND_TARGET)}")
    for method in ("journal", "flush_wal", "write_sync"):
        key = f"ours_b1_{method}"
        print(
            f"append durable batch=1 ({method}) ours {med[key]:,.0f} msg/s | "
            f"{med[f'{key}_requests']:,.0f} requests in {med[f'{key}_commits']:,.0f} commits | "
            f"coalescing {med[f'{key}_coalesce']:.1f} requests/commit"
        )
    print(
        f"scan ours {med['scan_ours']:,.0f} msg/s | raw iterator {med['scan_raw']:,.0f} msg/s | "
        f"{verdict(med['ratio_scan'], SCAN_TARGET)}"
    )
    rates = {m: med[f"ours_{m}"] for m in ("journal", "flush_wal", "write_sync")}
    print(
        f"fastest SyncMethod (ours, batch {args.batch}): {max(rates, key=lambda m: rates[m])} "
        f"(journal / flush_wal = {rates['journal'] / rates['flush_wal']:.2f}, "
        f"flush_wal / write_sync = {rates['flush_wal'] / rates['write_sync']:.2f}; batch 1: journal / flush_wal "
        f"{med['ours_b1_journal'] / med['ours_b1_flush_wal']:.2f})"
    )


def _verify_cost(args: argparse.Namespace) -> None:
    """Catch-up scan with RocksDB's read-side block checksums verified (the default) and not, paired in
    the same run over one database: the order alternates, each figure a median over ``--runs`` pairs."""
    root = tempfile.mkdtemp(prefix="wal-verify-", dir=args.dir)
    try:
        path = os.path.join(root, "db")
        _run_append(path, args.messages, args.size, args.appenders, args.batch, SyncMethod.JOURNAL)
        on: list[float] = []
        off: list[float] = []
        for i in range(args.runs):
            for verify in ((True, False) if i % 2 == 0 else (False, True)):
                gc.collect()
                (on if verify else off).append(asyncio.run(_scan_ours(path, args.messages, verify)))
        ratios = [b / a for a, b in zip(on, off, strict=True)]
        cost = statistics.median(ratios) - 1
        print()
        print(f"wal_append --verify-cost: catch-up scan of {args.messages:,} messages of {args.size} B from "
              f"storage (a table file), {args.runs} pairs")
        for label, rates in (("on ", on), ("off", off)):
            each = ", ".join(f"{x:,.0f}" for x in rates)
            print(f"verify_checksums {label}: median {statistics.median(rates):,.0f} msg/s | {each}")
        print(f"cost of verification (median of paired off/on - 1): {cost:+.1%} "
              f"({'within' if cost <= 0.10 else 'over'} the 10 % target)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _profile(args: argparse.Namespace, part: str) -> None:
    """cProfile one ours run: the event-loop thread and the worker thread doing the storage work."""
    import cProfile  # noqa: PLC0415
    import pstats  # noqa: PLC0415

    from wal._committer import GroupCommitter  # noqa: PLC0415
    from wal.backends.rocks import RocksBackend  # noqa: PLC0415

    n = args.messages
    root = tempfile.mkdtemp(prefix="wal-bench-profile-", dir=args.dir)
    loop_prof, worker_prof = cProfile.Profile(), cProfile.Profile()
    try:
        path = tmpdir(root, "ours")
        if part == "append":
            # cProfile sees only its own thread: profile the writer thread's work separately.
            write = GroupCommitter._write
            GroupCommitter._write = lambda self, reqs: worker_prof.runcall(write, self, reqs)  # type: ignore[method-assign]
            try:
                run = loop_prof.runcall(
                    asyncio.run, _append_ours(path, n, args.size, args.appenders, args.batch, SyncMethod.FLUSH_WAL)
                )
            finally:
                GroupCommitter._write = write  # type: ignore[method-assign]
            rate = run.rate
            worker = "writer thread (GroupCommitter._write)"
        else:
            asyncio.run(_append_ours(path, n, args.size, args.appenders, args.batch, SyncMethod.FLUSH_WAL))
            read_blocks = RocksBackend.read_blocks
            RocksBackend.read_blocks = lambda self, *a: worker_prof.runcall(read_blocks, self, *a)  # type: ignore[method-assign]
            try:
                rate = loop_prof.runcall(asyncio.run, _scan_ours(path, n))
            finally:
                RocksBackend.read_blocks = read_blocks  # type: ignore[method-assign]
            worker = "reader thread (RocksBackend.read_blocks)"
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"ours {part} under cProfile: {rate:,.0f} msg/s (profiling roughly halves the rate)")
    print("\n=== event-loop thread, by cumulative time ===")
    pstats.Stats(loop_prof).sort_stats("cumulative").print_stats(25)
    print(f"=== {worker}, by internal time ===")
    pstats.Stats(worker_prof).sort_stats("tottime").print_stats(15)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--messages", type=int, default=200_000, help="messages per append run (default 200,000)")
    p.add_argument("--size", type=int, default=1024, help="payload bytes per message (default 1024)")
    p.add_argument("--appenders", type=int, default=16, help="concurrent appender tasks (default 16)")
    p.add_argument("--batch", type=int, default=100, help="messages per append_batch call (default 100)")
    p.add_argument("--runs", type=int, default=3, help="runs; the table shows medians (default 3)")
    p.add_argument("--dir", default=None, help="parent of the temporary databases (default: system temp)")
    p.add_argument(
        "--profile",
        choices=("append", "scan"),
        help="instead of the comparison, cProfile one ours append (flush_wal) or scan, loop and worker thread",
    )
    p.add_argument(
        "--verify-cost", action="store_true",
        help="instead of the comparison, the catch-up scan with RocksDB's read checksums on and off, paired",
    )
    args = p.parse_args(argv)
    if min(args.messages, args.size, args.appenders, args.batch, args.runs) < 1:
        p.error("every size and count must be >= 1")

    prepare_process()
    if args.profile:
        _profile(args, args.profile)
        return 0
    if args.verify_cost:
        _verify_cost(args)
        return 0

    def describe(r: Run) -> str:
        return (
            f"ours journal {r['ours_journal']:,.0f}, flush_wal {r['ours_flush_wal']:,.0f}, "
            f"write_sync {r['ours_write_sync']:,.0f}, "
            f"raw flush_wal {r['raw_flush_wal']:,.0f}, raw sync {r['raw_write_sync']:,.0f}, "
            f"scan ours {r['scan_ours']:,.0f}, raw {r['scan_raw']:,.0f} msg/s; "
            f"ratios append {r['ratio_journal']:.2f}/{r['ratio_flush_wal']:.2f}/{r['ratio_write_sync']:.2f}, "
            f"scan {r['ratio_scan']:.2f}"
        )

    runs = repeat(args, "wal-bench", _one_run, describe)
    _report(args, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
