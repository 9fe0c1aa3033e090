"""Compaction (flusher/compact.py) against pyarrow rewriting the same files, and a Spark as-of count
before and after it.

    .venv/bin/python bench/compact.py [--files 1000] [--rows-per-file 1000] [--messages-per-file 10]
                                      [--delete-share 0.01] [--runs 3] [--no-spark] [--profile]

Every run, in a fresh temporary directory:

* The tree (untimed): ``--files`` data files of ``--rows-per-file`` rows (default 1,000 x 1,000 = 1M
  rows) of one collection, 4 columns (int64 pk, string, float64, fixed_size_list<float32>[16]), written
  in the flusher's exact layout and format rather than through a flusher (a flusher commits one file
  per flush; 1,000 of them through a real WAL would take most of the run): ``<root>/c/partition=_default/
  segment=<s>/<first_id>-<last_id>.parquet`` (ten files a segment), the columns ``_ts``, ``_id`` and
  ``_segment`` after the user's, each file ``--messages-per-file`` messages (one ``(_ts, _id)`` each),
  the footer metadata the flusher writes (first/last delivery key, pchannel, primary key), zstd, page
  checksums as compaction writes them.  Plus ``--delete-share`` of the keys deleted (spread evenly),
  in ten delete files under ``<root>/_deletes/c/`` (columns pk, ``_ts``, ``_id``), each delete later
  than the row it removes.  All timeticks are an hour old.
* pyarrow (timed): read every data file (``pq.ParquetFile(path).read()``), concatenate, write one file with the same
  compression (zstd), page checksums, fsync.  It applies no delete: it is the floor of the same I/O.
* ours (timed): ``compact_collection(root, "c", CompactionConfig(min_files=2, horizon_seconds=0,
  grace_seconds=0))``: recovery, planning (which reads every data file's key columns when there are
  deletes), the anti-join of the rows deleted before the horizon, one output, the delete files merged
  minus the entries that remove nothing left, the record, the link, the inputs deleted.  The output
  is checked against the tree (row count).  pyarrow reads a copy of the tree (compaction deletes the
  small files); which of the two goes first alternates.
* Spark (unless ``--no-spark``): one local[2] session for all runs (warmed on the first tree before
  anything is timed); ``flusher.read.spark.read_collection(spark, root, "c", as_of_ts=T).count()`` on the
  1,000 small files, then the same on the compacted tree, ``T`` the compaction horizon (the earliest
  as-of a compacted tree still answers).  Both counts are checked equal.

The table shows medians over ``--runs``; each ratio is the median of the per-run ratios.
``--profile`` instead cProfiles one compaction.  Benchmarks are not tests: they assert nothing about speed.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as a script from anywhere: the harness makes the repository root importable.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from _harness import Run, prepare_process, repeat, verdict

from flusher import layout
from flusher.compact import CompactionConfig, compact_collection
from wal.bodies import DEFAULT_PARTITION
from wal.clock import compose

COLLECTION = "c"
DIM = 16
TARGET = 0.70
FILES_PER_SEGMENT = 10
DELETE_FILES = 10
SCHEMA = pa.schema([
    pa.field("pk", pa.int64(), nullable=False),
    pa.field("name", pa.string()),
    pa.field("score", pa.float64()),
    pa.field("vec", pa.list_(pa.float32(), DIM)),
])
_META = {layout.PCHANNEL: b"bench-p0", b"streamingnode.primary_key": b"pk"}


def _int64(value: int, n: int) -> pa.Array:
    return pa.nulls(n, pa.int64()).fill_null(value)


def build_tree(root: Path, files: int, rows_per_file: int, messages: int, delete_share: float) -> int:
    """The small files (and delete files) described in the module docstring; returns the live rows."""
    start_ms = int(time.time() * 1000) - 3_600_000
    per_msg = rows_per_file // messages
    mid = 0
    for i in range(files):
        n = per_msg * messages
        pk = pa.array(range(i * n, (i + 1) * n), pa.int64())
        name = pc.binary_join_element_wise("name-", pc.cast(pk, pa.string()), "")
        vec = pa.FixedSizeListArray.from_arrays(pc.cast(pc.random(n * DIM), pa.float32()), DIM)
        segment = i // FILES_PER_SEGMENT
        ts_parts, id_parts = [], []
        first_key = last_key = (0, 0)
        for j in range(messages):
            mid += 1
            ts = compose(start_ms + mid, 0)
            ts_parts.append(_int64(ts, per_msg))
            id_parts.append(_int64(mid, per_msg))
            first_key = (ts, mid) if j == 0 else first_key
            last_key = (ts, mid)
        meta = {**_META, layout.FIRST_KEY: layout.encode_key(first_key),
                layout.LAST_KEY: layout.encode_key(last_key)}
        table = pa.table({"pk": pk, "name": name, "score": pc.random(n), "vec": vec,
                          "_ts": pa.concat_arrays(ts_parts), "_id": pa.concat_arrays(id_parts),
                          "_segment": _int64(segment, n)}).cast(_data_schema()).replace_schema_metadata(meta)
        directory = root / layout.segment_dir(COLLECTION, DEFAULT_PARTITION, segment)
        directory.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, directory / layout.file_name(first_key[1], last_key[1]), compression="zstd",
                       write_page_checksum=True)
    total = files * per_msg * messages
    deleted = int(total * delete_share)
    if deleted:
        step = total // deleted
        keys = list(range(0, deleted * step, step))
        ddir = root / layout.deletes_dir(COLLECTION)
        ddir.mkdir(parents=True, exist_ok=True)
        chunk = -(-len(keys) // DELETE_FILES)
        for k in range(0, len(keys), chunk):
            mid += 1
            ts = compose(start_ms + mid, 0)
            part = keys[k:k + chunk]
            meta = {**_META, layout.FIRST_KEY: layout.encode_key((ts, mid)),
                    layout.LAST_KEY: layout.encode_key((ts, mid))}
            table = pa.table({"pk": pa.array(part, pa.int64()), "_ts": _int64(ts, len(part)),
                              "_id": _int64(mid, len(part))}).replace_schema_metadata(meta)
            pq.write_table(table, ddir / layout.file_name(mid, mid), compression="zstd", write_page_checksum=True)
    return total - deleted


def _data_schema() -> pa.Schema:
    return pa.schema([*SCHEMA, pa.field("_ts", pa.int64(), nullable=False), pa.field("_id", pa.int64(), nullable=False),
                      pa.field("_segment", pa.int64(), nullable=False)])


def _data_files(root: Path) -> list[Path]:
    return sorted((root / COLLECTION).glob("partition=*/segment=*/*.parquet"))


def rewrite_pyarrow(root: Path, out: Path) -> int:
    """Read every data file, write them as one (zstd, page checksums), fsync; returns the rows."""
    tables = []
    for p in _data_files(root):
        with pq.ParquetFile(p) as f:  # the fastest plain read of one file (pq.read_table sets up a dataset)
            tables.append(f.read())
    merged = pa.concat_tables(tables)
    with open(out, "wb") as f:
        pq.write_table(merged, f, compression="zstd", write_page_checksum=True)
        f.flush()
        os.fsync(f.fileno())
    return merged.num_rows


def _config() -> CompactionConfig:
    return CompactionConfig(min_files=2, horizon_seconds=0, grace_seconds=0)


def _spark() -> Any:
    from pyspark.sql import SparkSession  # noqa: PLC0415  (only when Spark is measured)

    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    return (SparkSession.builder.master("local[2]").appName("bench-compact")
            .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2").config("spark.default.parallelism", "2")
            .config("spark.driver.memory", "4g").getOrCreate())


def _spark_count(spark: Any, root: Path, as_of: int) -> tuple[float, int]:
    from flusher.read.spark import read_collection  # noqa: PLC0415

    t0 = time.perf_counter()
    n = read_collection(spark, str(root), COLLECTION, as_of_ts=as_of).count()
    return time.perf_counter() - t0, int(n)


_SPARK: list[Any] = []


def _one_run(args: argparse.Namespace, root: str, index: int) -> Run:
    tree = Path(tempfile.mkdtemp(prefix="tree-", dir=root))
    live = build_tree(tree, args.files, args.rows_per_file, args.messages_per_file, args.delete_share)
    total = args.files * (args.rows_per_file // args.messages_per_file) * args.messages_per_file
    files_before = len(_data_files(tree))
    bytes_before = sum(p.stat().st_size for p in _data_files(tree))
    run: Run = {"files_before": files_before, "mb_before": bytes_before / 1e6}
    horizon = compose(int(time.time() * 1000), 0)

    def ours() -> None:
        t0 = time.perf_counter()
        r = compact_collection(tree, COLLECTION, _config(), now_ms=horizon >> 18)
        run["ours_s"] = time.perf_counter() - t0
        if r.rows_after != live or r.horizon != horizon:
            raise SystemExit(f"compaction kept {r.rows_after} rows at horizon {r.horizon}, "
                             f"expected {live} at {horizon}")
        run["files_after"] = r.files_after
        run["mb_after"] = r.bytes_after / 1e6

    def theirs() -> None:
        out = Path(root, f"pyarrow-{index}.parquet")
        t0 = time.perf_counter()
        n = rewrite_pyarrow(copy, out)
        run["pyarrow_s"] = time.perf_counter() - t0
        out.unlink()
        if n != total:
            raise SystemExit(f"pyarrow rewrote {n} rows, expected {total}")

    spark = None
    if args.spark:
        if not _SPARK:
            _SPARK.append(_spark())
            for _ in range(2):  # the JVM's first reads (class loading, JIT) are not the reader's cost
                _spark_count(_SPARK[0], tree, horizon)
        spark = _SPARK[0]
        run["spark_before_s"], n_before = _spark_count(spark, tree, horizon)
        if n_before != live:
            raise SystemExit(f"Spark counted {n_before} rows before compaction, expected {live}")
    # Compaction deletes the small files, so pyarrow reads a copy; which of the two goes first alternates.
    copy = Path(root, f"copy-{index}")
    shutil.copytree(tree, copy)
    for step in ((theirs, ours) if index % 2 == 0 else (ours, theirs)):
        step()
    shutil.rmtree(copy)
    if spark is not None:
        run["spark_after_s"], n_after = _spark_count(spark, tree, horizon)
        if n_after != live:
            raise SystemExit(f"Spark counted {n_after} rows after compaction, expected {live}")
        run["spark_speedup"] = run["spark_before_s"] / run["spark_after_s"]
    run["ours"] = total / run["ours_s"]
    run["pyarrow"] = total / run["pyarrow_s"]
    run["ratio"] = run["ours"] / run["pyarrow"]
    return run


def _describe(r: Run) -> str:
    s = f"ours {r['ours']:,.0f} rows/s, pyarrow {r['pyarrow']:,.0f} rows/s, ratio {r['ratio']:.2f}"
    if "spark_speedup" in r:
        s += f"; Spark {r['spark_before_s']:.2f} s -> {r['spark_after_s']:.2f} s"
    return s


def _report(args: argparse.Namespace, runs: list[Run]) -> None:
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    total = args.files * (args.rows_per_file // args.messages_per_file) * args.messages_per_file
    print()
    print(f"compaction: {total:,} rows (int64, string, float64, fixed_size_list<float32>[{DIM}]) in "
          f"{args.files:,} files ({med['mb_before']:.1f} MB), {args.delete_share:.1%} of the keys deleted, "
          f"{args.runs} runs")
    width = 44
    print(f"{'what':<{width}} | {'median':>14} | each run")
    print(f"{'-' * width}-+-{'-' * 14}-+-{'-' * 30}")
    rows = [("compaction (ours), rows/s", "ours", "{:,.0f}"), ("pyarrow read all + write one, rows/s", "pyarrow",
                                                                 "{:,.0f}"),
            ("ours / pyarrow", "ratio", "{:.2f}")]
    if "spark_speedup" in med:
        rows += [(f"Spark as-of count, {args.files:,} small files, s", "spark_before_s", "{:.2f}"),
                 ("Spark as-of count, compacted, s", "spark_after_s", "{:.2f}"),
                 ("Spark speed-up", "spark_speedup", "{:.1f}")]
    for label, key, fmt in rows:
        print(f"{label:<{width}} | {fmt.format(med[key]):>14} | {', '.join(fmt.format(r[key]) for r in runs)}")
    print(f"files {med['files_before']:.0f} -> {med['files_after']:.0f}, MB {med['mb_before']:.1f} -> "
          f"{med['mb_after']:.1f}")
    print(f"throughput: {verdict(med['ratio'], TARGET)}")


def _profile(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        tree = Path(root)
        build_tree(tree, args.files, args.rows_per_file, args.messages_per_file, args.delete_share)
        prof = cProfile.Profile()
        prof.enable()
        t0 = time.perf_counter()
        r = compact_collection(tree, COLLECTION, _config())
        elapsed = time.perf_counter() - t0
        prof.disable()
    print(f"compaction under cProfile: {r.rows_before / elapsed:,.0f} rows/s ({r.rows_after:,} rows kept)")
    pstats.Stats(prof).sort_stats("cumulative").print_stats(30)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--files", type=int, default=1000, help="small data files (default 1,000)")
    p.add_argument("--rows-per-file", type=int, default=1000, help="rows per small file (default 1,000)")
    p.add_argument("--messages-per-file", type=int, default=10, help="insert messages per file (default 10)")
    p.add_argument("--delete-share", type=float, default=0.01, help="share of the keys deleted (default 0.01)")
    p.add_argument("--runs", type=int, default=3, help="runs; the table shows medians (default 3)")
    p.add_argument("--no-spark", dest="spark", action="store_false", help="skip the Spark counts")
    p.add_argument("--dir", default=None, help="parent of the temporary trees (default: system temp)")
    p.add_argument("--profile", action="store_true", help="instead, cProfile one compaction")
    args = p.parse_args(argv)
    if not 0 <= args.delete_share < 1 or args.files < 2 or args.messages_per_file < 1 \
            or args.rows_per_file < args.messages_per_file:
        p.error("need --files >= 2, 0 <= --delete-share < 1 and --rows-per-file >= --messages-per-file")
    prepare_process()
    if args.profile:
        _profile(args)
        return 0
    runs = repeat(args, "bench-compact", _one_run, _describe)
    _report(args, runs)
    if _SPARK:
        _SPARK[0].stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
