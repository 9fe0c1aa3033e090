"""The flusher (WAL -> Parquet) against pyarrow writing the same rows, and produce -> Parquet freshness.

    .venv/bin/python bench/flush.py [--rows 500000] [--batch 1000] [--runs 3]
                                    [--fresh-inserts 100] [--fresh-rows 100] [--fresh-rate 20]

Every run, each in a fresh temporary directory, in one process:

* throughput, ours: ``WALManager.start_rocksdb`` (default FLUSH_WAL), ``open_streaming_wal`` with the
  default ``ChainConfig``, one collection of 4 columns (int64 pk, string, float64, fixed_size_list<float32>[16])
  and ``--rows`` rows inserted in messages of ``--batch`` rows (untimed), all BEFORE the flusher starts.
  Timed: ``Flusher(swal, root).start()`` (default ``FlusherConfig``: zstd) until ``await flusher.flush("v", "c")``
  returns, i.e. catch-up read of the WAL + decode + buffering + Parquet encode + the commit protocol (tmp
  file, fsync, rename, directory fsync) + checkpoint, for every row.  The rows are checked afterwards
  (``stats().rows_written``).  The shard step seals a segment at 64 MiB of payload (~90 B a row here),
  so up to ~700,000 rows it is one file; more rows give several.
* throughput, pyarrow: the same rows (the inserted batches concatenated, plus the ``_ts`` and ``_segment``
  int64 columns the flusher adds) cut into files of exactly the row counts the flusher wrote; each one
  ``pq.write_table(slice, f, compression="zstd")`` into an open file, then ``os.fsync``.  Built untimed.
  Which of the two goes first alternates between runs (a pyarrow-first run uses the previous run's sizes).
* freshness: a fresh database and a running flusher; ``--fresh-inserts`` inserts of ``--fresh-rows`` rows,
  one at a time, started at a steady ``--fresh-rate`` per second.  Two modes, each with its own flusher:
  - ``flush()``: default limits; the sample is from just before ``await swal.append(insert)`` until
    ``await flusher.flush("v", "c")`` returned (the MANUAL_FLUSH was processed: a file holding those rows
    is renamed into place and its directory fsynced).
  - ``max_rows``: ``FlusherConfig(max_rows=--fresh-rows)``, so each insert fills a buffer and is written on
    its own, no flush message; the sample is from just before the append until
    ``flusher.wait_flushed(insert.timetick)`` returned (the flusher processed the pack holding the insert,
    and the file was durable before that), so it includes whatever the scanner waits for before it hands
    over the pack holding the insert (measured: milliseconds, not ``ChainConfig.tick_interval``).
  p50/p99 are over the samples of all runs.

The table shows medians over ``--runs``; the ratio is the median of the per-run ours/pyarrow ratios.
``--profile`` instead cProfiles one throughput run of ours (event loop, and the flusher's file thread).
Benchmarks are not tests: they assert nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Run as a script from anywhere: the harness makes the repository root importable.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from _harness import Run, prepare_process, repeat, tmpdir, verdict

from flusher import Flusher, FlusherConfig
from interceptors.recovery.streaming_wal import StreamingWAL, open_streaming_wal
from wal import WALManager, bodies

PCHANNEL = "bench-p0"
VCHANNEL = "v"
COLLECTION = "c"
DIM = 16
TARGET = 0.70
SCHEMA = pa.schema([
    pa.field("pk", pa.int64(), nullable=False),
    pa.field("name", pa.string()),
    pa.field("score", pa.float64()),
    pa.field("vec", pa.list_(pa.float32(), DIM)),
])


def make_batches(n: int, batch: int) -> list[pa.RecordBatch]:
    """``n`` rows in record batches of ``batch`` rows (random floats, distinct strings)."""
    pk = pa.array(range(n), pa.int64())
    name = pc.binary_join_element_wise("name-", pc.cast(pk, pa.string()), "")
    score = pc.random(n)
    flat = pc.cast(pc.random(n * DIM), pa.float32())
    vec = pa.FixedSizeListArray.from_arrays(flat, DIM)
    table = pa.Table.from_arrays([pk, name, score, vec], schema=SCHEMA)
    return table.to_batches(max_chunksize=batch)


async def _open(path: str) -> tuple[WALManager, StreamingWAL]:
    manager = await WALManager.start_rocksdb(path)
    await manager.create_channel(PCHANNEL)
    swal = await open_streaming_wal(manager, PCHANNEL)
    await swal.ready()
    await swal.append(bodies.create_collection(VCHANNEL, COLLECTION, SCHEMA, "pk"))
    return manager, swal


def _files(root: str) -> list[Path]:
    return sorted(Path(root, COLLECTION).glob("partition=*/segment=*/*.parquet"))


# --- throughput ------------------------------------------------------------------------------------
async def _flush_ours(db: str, out: str, batches: list[pa.RecordBatch],
                      profile: tuple[object, ...] | None = None) -> tuple[float, list[int]]:
    """Insert everything (untimed), then time a flusher from start to the flush of everything."""
    n = sum(b.num_rows for b in batches)
    manager, swal = await _open(db)
    try:
        msgs = [bodies.insert(VCHANNEL, COLLECTION, b) for b in batches]
        for i in range(0, len(msgs), 16):
            await swal.append_batch(msgs[i:i + 16])
        del msgs
        gc.collect()
        flusher = Flusher(swal, out)
        if profile is not None:
            profile[0].enable()  # type: ignore[attr-defined]
        t0 = time.perf_counter()
        await flusher.start()
        await flusher.flush(VCHANNEL, COLLECTION)
        elapsed = time.perf_counter() - t0
        if profile is not None:
            profile[0].disable()  # type: ignore[attr-defined]
        stats = flusher.stats()
        await flusher.aclose()
        if stats.rows_written != n:
            raise RuntimeError(f"flusher wrote {stats.rows_written} rows, expected {n}")
    finally:
        await swal.aclose()
        await manager.aclose()
    counts = [pq.read_metadata(f).num_rows for f in _files(out)]
    if sum(counts) != n:
        raise RuntimeError(f"files hold {sum(counts)} rows, expected {n}")
    return n / elapsed, counts


def _flush_pyarrow(out: str, batches: list[pa.RecordBatch], counts: list[int]) -> float:
    """The same rows plus the two int64 system columns, one write_table + fsync per file of ``counts`` rows."""
    n = sum(counts)
    table = pa.Table.from_batches(batches)
    table = table.append_column(pa.field("_ts", pa.int64(), nullable=False), pa.nulls(n, pa.int64()).fill_null(1))
    table = table.append_column(pa.field("_segment", pa.int64(), nullable=False),
                                pa.nulls(n, pa.int64()).fill_null(7))
    slices, start = [], 0
    for c in counts:
        slices.append(table.slice(start, c))
        start += c
    t0 = time.perf_counter()
    for i, piece in enumerate(slices):
        with open(os.path.join(out, f"{i:05d}.parquet"), "wb") as f:
            pq.write_table(piece, f, compression="zstd")
            f.flush()
            os.fsync(f.fileno())
    elapsed = time.perf_counter() - t0
    return n / elapsed


# --- freshness -------------------------------------------------------------------------------------
async def _freshness(db: str, out: str, batch: pa.RecordBatch, inserts: int, rate: float, mode: str) -> list[float]:
    """Milliseconds from insert start until its rows are in a durable file (see the module docstring)."""
    manager, swal = await _open(db)
    config = FlusherConfig(max_rows=batch.num_rows) if mode == "max_rows" else FlusherConfig()
    flusher = Flusher(swal, out, config)
    samples: list[float] = []
    try:
        await flusher.start()
        await flusher.flush(VCHANNEL, COLLECTION)  # the collection registered, the reader caught up
        interval = 1.0 / rate
        begin = time.perf_counter()
        for k in range(inserts):
            delay = begin + k * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            msg = bodies.insert(VCHANNEL, COLLECTION, batch)
            t0 = time.perf_counter()
            res = await swal.append(msg)
            if mode == "flush":
                await flusher.flush(VCHANNEL, COLLECTION)
            else:
                await flusher.wait_flushed(res.timetick)
            samples.append((time.perf_counter() - t0) * 1000)
        stats = flusher.stats()
        if stats.rows_written != inserts * batch.num_rows:
            raise RuntimeError(f"{mode}: flusher wrote {stats.rows_written} rows, expected {inserts * batch.num_rows}")
    finally:
        await flusher.aclose()
        await swal.aclose()
        await manager.aclose()
    return samples


# --- driver ----------------------------------------------------------------------------------------
_DATA: dict[tuple[int, int], list[pa.RecordBatch]] = {}
_FRESH: dict[str, list[float]] = {"flush": [], "max_rows": []}


def _data(n: int, batch: int) -> list[pa.RecordBatch]:
    if (n, batch) not in _DATA:
        _DATA[(n, batch)] = make_batches(n, batch)
    return _DATA[(n, batch)]


def _one_run(args: argparse.Namespace, root: str, index: int) -> Run:
    batches = _data(args.rows, args.batch)
    r: Run = {}

    def ours() -> None:
        gc.collect()
        rate, counts = asyncio.run(_flush_ours(tmpdir(root, "ours-db"), tmpdir(root, "ours-out"), batches))
        r["ours"], r["files"], r["rows_per_file"] = rate, len(counts), statistics.median(counts)
        _COUNTS[:] = counts

    def raw() -> None:
        gc.collect()
        r["pyarrow"] = _flush_pyarrow(tmpdir(root, "pyarrow-out"), batches, _COUNTS)

    # pyarrow needs the flusher's file sizes: run 0 is ours first, then the order alternates.
    for step in ((raw, ours) if index % 2 == 1 else (ours, raw)):
        step()
    r["ratio"] = r["ours"] / r["pyarrow"]

    fresh_batch = _data(args.fresh_rows, args.fresh_rows)[0]
    for mode in ("flush", "max_rows"):
        gc.collect()
        s = asyncio.run(_freshness(tmpdir(root, f"fresh-{mode}-db"), tmpdir(root, f"fresh-{mode}-out"),
                                   fresh_batch, args.fresh_inserts, args.fresh_rate, mode))
        _FRESH[mode].extend(s)
        r[f"fresh_{mode}_p50"] = _pct(s, 50)
        r[f"fresh_{mode}_p99"] = _pct(s, 99)
    return r


_COUNTS: list[int] = []
"""Rows per file the flusher wrote in the last run (the same every run: the shard seals at 64 MiB)."""


def _pct(samples: list[float], p: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))]


def _report(args: argparse.Namespace, runs: list[Run]) -> None:
    med = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
    print()
    print(f"flush: {args.rows:,} rows (int64, string, float64, fixed_size_list<float32>[{DIM}]) in inserts of "
          f"{args.batch:,}; medians of {len(runs)} run(s)")
    rows = [
        ("ours: Flusher start -> flush() returned (catch-up)", "ours"),
        ("pyarrow: write_table zstd + fsync, same files", "pyarrow"),
    ]
    width = max(len(label) for label, _ in rows)
    print(f"{'what':<{width}} | {'median rows/s':>13} | each run")
    print(f"{'-' * width}-+-{'-' * 13}-+-{'-' * 30}")
    for label, key in rows:
        print(f"{label:<{width}} | {med[key]:>13,.0f} | {', '.join(f'{run[key]:,.0f}' for run in runs)}")
    print(f"files per run {med['files']:.0f}, median rows per file {med['rows_per_file']:,.0f}; per-run ratios "
          + ", ".join(f"{run['ratio']:.2f}" for run in runs))
    print(f"throughput ours {med['ours']:,.0f} rows/s | pyarrow {med['pyarrow']:,.0f} rows/s | "
          f"ratio of medians {med['ours'] / med['pyarrow']:.2f} | {verdict(med['ratio'], TARGET)}")
    print()
    print(f"freshness: {args.fresh_inserts} inserts of {args.fresh_rows} rows at {args.fresh_rate:g}/s per run, "
          f"insert start -> rows in a durable Parquet file; all {len(runs)} run(s) pooled")
    for mode, label in (("flush", "insert + flush(\"v\", \"c\")"),
                        ("max_rows", f"insert, max_rows={args.fresh_rows}, wait_flushed(ts)")):
        s = _FRESH[mode]
        print(f"  {label:<42} p50 {_pct(s, 50):7.1f} ms | p99 {_pct(s, 99):7.1f} ms | max {max(s):7.1f} ms "
              f"(n={len(s)}; per-run p50 " + ", ".join(f"{run[f'fresh_{mode}_p50']:.1f}" for run in runs) + ")")


def _profile(args: argparse.Namespace) -> None:
    """cProfile one throughput run of ours: the event loop and the flusher's file thread (commit_file)."""
    import cProfile  # noqa: PLC0415
    import pstats  # noqa: PLC0415
    import shutil  # noqa: PLC0415

    import flusher.writer as fmod  # noqa: PLC0415

    batches = _data(args.rows, args.batch)
    loop_prof, worker_prof = cProfile.Profile(), cProfile.Profile()
    commit = fmod.commit_file
    fmod.commit_file = lambda *a: worker_prof.runcall(commit, *a)  # type: ignore[assignment]
    root = tempfile.mkdtemp(prefix="flush-bench-profile-", dir=args.dir)
    try:
        rate, counts = asyncio.run(_flush_ours(tmpdir(root, "db"), tmpdir(root, "out"), batches, (loop_prof,)))
    finally:
        fmod.commit_file = commit  # type: ignore[assignment]
        shutil.rmtree(root, ignore_errors=True)
    print(f"ours under cProfile: {rate:,.0f} rows/s, {len(counts)} files")
    print("\n=== event-loop thread, by cumulative time ===")
    pstats.Stats(loop_prof).sort_stats("cumulative").print_stats(30)
    print("=== flusher file thread (commit_file), by cumulative time ===")
    pstats.Stats(worker_prof).sort_stats("cumulative").print_stats(15)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rows", type=int, default=500_000, help="rows for the throughput part (default 500,000)")
    p.add_argument("--batch", type=int, default=1000, help="rows per insert message (default 1,000)")
    p.add_argument("--runs", type=int, default=3, help="runs; the table shows medians (default 3)")
    p.add_argument("--fresh-inserts", type=int, default=100, help="freshness inserts per mode and run (default 100)")
    p.add_argument("--fresh-rows", type=int, default=100, help="rows per freshness insert (default 100)")
    p.add_argument("--fresh-rate", type=float, default=20.0, help="freshness inserts per second (default 20)")
    p.add_argument("--dir", default=None, help="parent of the temporary databases (default: system temp)")
    p.add_argument("--profile", action="store_true", help="instead, cProfile one throughput run of ours")
    args = p.parse_args(argv)
    if min(args.rows, args.batch, args.runs, args.fresh_inserts, args.fresh_rows) < 1 or args.fresh_rate <= 0:
        p.error("every size, count and rate must be > 0")

    prepare_process()
    if args.profile:
        _profile(args)
        return 0

    def describe(r: Run) -> str:
        return (f"ours {r['ours']:,.0f} rows/s, pyarrow {r['pyarrow']:,.0f} rows/s, ratio {r['ratio']:.2f}, "
                f"{r['files']:.0f} files; freshness p50/p99 flush {r['fresh_flush_p50']:.1f}/"
                f"{r['fresh_flush_p99']:.1f} ms, max_rows {r['fresh_max_rows_p50']:.1f}/"
                f"{r['fresh_max_rows_p99']:.1f} ms")

    runs = repeat(args, "flush-bench", _one_run, describe)
    _report(args, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
