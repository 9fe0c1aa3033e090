"""The ``streamingnode`` Spark source: rows/s of a streaming count against the SDK consumer alone and
against ``spark.read.parquet`` of the same rows, and produce-to-row latency at a 1 s trigger.

    .venv/bin/python bench/spark_stream.py [--messages 200000] [--size 1024] [--runs 3]
                                           [--latency-seconds 20] [--latency-rate 200] [--dir /tmp]

The node runs in its own process (``python -m streamingnode serve``, as bench/produce_consume.py
starts it), so neither the SDK consumer nor Spark's driver shares its GIL.  Untimed: ``--messages``
DATA messages of ``--size`` random bytes (each its own) are produced to pchannel ``p`` (vchannels ``v0`` and ``v1``,
alternating), and the same rows, shaped as the source's plain schema (``id``, ``vchannel``, ``type``,
``timetick``, ``time``, ``properties``, ``payload``), are written with pyarrow to one Parquet file
(zstd), standing for "the same data flushed" (the flusher writes only collections).  Spark is local
(``local[2]``: the machine has 2 cores), started once, untimed, and warmed once, untimed: one batch
read of the node (``count()``), so that the first timed query does not pay for starting the Python
workers and for the JVM compiling the Arrow-to-row path (the first query on a fresh session took 2-3x
longer than the next ones), as a long-running Spark application never would.

Timed, ``--runs`` times each, medians in the table:

* **SDK consumer alone**: an ``AsyncClient`` consumer from the log's beginning until it has seen every
  DATA message (the catch-up read of bench/produce_consume.py).
* **Spark streaming, whole pchannel** (one partition) and **per vchannel** (``vchannel=v0,v1``: two
  partitions): ``readStream`` from ``earliest``, default read limit (everything available in one
  micro-batch), ``foreachBatch`` counting the batch's rows; from ``start()`` until the counts reach
  ``--messages`` (so it includes the query's planning and the first trigger, a few hundred ms).
* **Spark batch read of the node**: ``spark.read.format("streamingnode")`` ``count()``.
* **spark.read.parquet**: ``count()`` (which Spark answers from the footers alone) and
  ``sum(length(payload))`` (which reads every payload, the fair comparison with the source, which
  always hands every row's bytes to Spark).

Latency: a query with ``trigger(processingTime="1 second")`` from ``latest`` on ``v0``; a producer in
this process sends ``--latency-rate`` messages/s for ``--latency-seconds``, each carrying its send time
(``time.time_ns()``) in its first 8 bytes; the sample is from that send time until ``foreachBatch``
has the row collected on the driver.  p50/p99 over all samples.  Targets (issue 17): the streaming
read >= 50% of the SDK consumer's rate; p50 <= trigger + 1 s.  Benchmarks are not tests: this
asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# Run as a script from anywhere: the harness makes the repository root importable.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import pyarrow as pa
import pyarrow.parquet as pq
from _harness import prepare_process, verdict
from produce_consume import _node

from streamingnode.client import AsyncClient, Client
from wal import clock
from wal.message import MessageType
from wal.options import DeliverPolicy

PCHANNEL = "p"
STAMP = struct.Struct("<q")
RATE_TARGET = 0.5  # x the SDK consumer
TRIGGER_S = 1.0


def _produce(addr: str, n: int, size: int, parquet: Path) -> None:
    """``n`` messages through the SDK, and the same rows (with their ids and timeticks) to Parquet."""
    # Distinct random payloads: one repeated payload would let zstd shrink the Parquet file to nothing.
    payloads = [os.urandom(size) for _ in range(n)]
    with Client(addr) as client, client.producer(PCHANNEL) as producer:
        futures = [producer.send_nowait(f"v{i % 2}", payloads[i]) for i in range(n)]
        producer.flush()
        results = [f.result() for f in futures]
    ms = [clock.physical_ms(r.timetick) * 1000 for r in results]
    table = pa.table({
        "id": pa.array([r.message_id for r in results], pa.int64()),
        "vchannel": pa.array([f"v{i % 2}" for i in range(n)], pa.string()),
        "type": pa.array(["data"] * n, pa.string()),
        "timetick": pa.array([r.timetick for r in results], pa.int64()),
        "time": pa.array(ms, pa.timestamp("us", tz="UTC")),
        "properties": pa.array([[] for _ in range(n)], pa.map_(pa.string(), pa.string())),
        "payload": pa.array(payloads, pa.binary()),
    })
    pq.write_table(table, parquet, compression="zstd")


async def _sdk_rate(addr: str, n: int) -> float:
    async with AsyncClient(addr) as client:
        seen = 0
        t0 = time.perf_counter()
        async with client.consumer(PCHANNEL, "", policy=DeliverPolicy.all()) as consumer:
            async for pack in consumer:
                seen += sum(1 for m in pack.messages if m.message_type is MessageType.DATA)
                if seen >= n:
                    break
        return n / (time.perf_counter() - t0)


def _spark() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession  # noqa: PLC0415

    from streamingnode.spark import register  # noqa: PLC0415

    spark = (SparkSession.builder.master("local[2]").appName("bench-spark-stream")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "2g")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


class _Counts:
    def __init__(self) -> None:
        self.rows = 0
        self.done = threading.Event()
        self.target = 0

    def __call__(self, df: Any, batch_id: int) -> None:
        self.rows += df.count()
        if self.rows >= self.target:
            self.done.set()


def _stream_rate(spark: Any, addr: str, n: int, checkpoint: str, vchannels: str | None) -> float:
    counts = _Counts()
    counts.target = n
    reader = (spark.readStream.format("streamingnode").option("addr", addr).option("pchannel", PCHANNEL)
              .option("startingOffsets", "earliest"))
    if vchannels:
        reader = reader.option("vchannel", vchannels)
    t0 = time.perf_counter()
    query = (reader.load().writeStream.foreachBatch(counts).option("checkpointLocation", checkpoint)
             .trigger(processingTime="0 seconds").start())
    try:
        while not counts.done.wait(0.05):
            if not query.isActive:
                raise RuntimeError(f"the query ended: {query.exception()}")
        elapsed = time.perf_counter() - t0
    finally:
        query.stop()
    # Where a data batch's time went (Spark's own phases): printed, not tabulated.
    for progress in query.recentProgress:
        if "addBatch" in progress.durationMs:
            print(f"  batch {progress.batchId}: {progress.durationMs}", file=sys.stderr)
    if counts.rows != n:
        raise RuntimeError(f"counted {counts.rows} rows, expected {n}")
    return n / elapsed


def _timed(n: int, action: Any) -> float:
    t0 = time.perf_counter()
    got = action()
    elapsed = time.perf_counter() - t0
    if got != n:
        raise RuntimeError(f"got {got}, expected {n}")
    return n / elapsed


class _Latency:
    def __init__(self) -> None:
        self.samples: list[float] = []

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = df.select("payload").collect()
        now = time.time_ns()
        self.samples += [(now - STAMP.unpack_from(r.payload)[0]) / 1e6 for r in rows]


def _latency(spark: Any, addr: str, checkpoint: str, seconds: float, rate: float, size: int) -> list[float]:
    sink = _Latency()
    query = (spark.readStream.format("streamingnode").option("addr", addr).option("pchannel", PCHANNEL)
             .option("vchannel", "v0").load().writeStream.foreachBatch(sink)
             .option("checkpointLocation", checkpoint).trigger(processingTime=f"{TRIGGER_S} seconds").start())
    try:
        while not query.recentProgress:  # the query has resolved "latest": what comes now is read
            time.sleep(0.05)
        filler = os.urandom(size - STAMP.size)
        count = int(seconds * rate)
        with Client(addr) as client, client.producer(PCHANNEL, linger=0) as producer:
            t0 = time.perf_counter()
            for i in range(count):
                time.sleep(max(0.0, t0 + i / rate - time.perf_counter()))  # a steady rate, not a burst
                producer.send_nowait("v0", STAMP.pack(time.time_ns()) + filler)
            producer.flush()
        while len(sink.samples) < count:
            if not query.isActive:
                raise RuntimeError(f"the query ended: {query.exception()}")
            time.sleep(0.1)
    finally:
        query.stop()
    return sink.samples


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latency-seconds", type=float, default=20.0, help="0: rates only, no latency part")
    parser.add_argument("--latency-rate", type=float, default=200.0)
    parser.add_argument("--dir", default=None, help="where the temporary data directory goes")
    args = parser.parse_args()
    prepare_process()
    from pyspark.sql import functions as F  # noqa: PLC0415

    tmp = tempfile.mkdtemp(prefix="spark-stream-", dir=args.dir)
    try:
        with _node(os.path.join(tmp, "data"), tmp, PCHANNEL) as node:
            addr = node.match.group(1)
            parquet = Path(tmp) / "flushed.parquet"
            t0 = time.perf_counter()
            _produce(addr, args.messages, args.size, parquet)
            print(f"produced {args.messages:,} x {args.size} B in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            spark = _spark()
            n = args.messages
            t0 = time.perf_counter()
            warm = spark.read.format("streamingnode").option("addr", addr).option("pchannel", PCHANNEL).load().count()
            print(f"warmed up (a batch read of {warm:,} rows) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            rows: dict[str, list[float]] = {k: [] for k in (
                "SDK consumer alone", "Spark streaming, whole pchannel (1 partition)",
                "Spark streaming, vchannel=v0,v1 (2 partitions)", "Spark batch read of the node, count()",
                "spark.read.parquet, count()", "spark.read.parquet, sum(length(payload))")}
            for i in range(args.runs):
                names = iter(rows)
                rows[next(names)].append(asyncio.run(_sdk_rate(addr, n)))
                rows[next(names)].append(_stream_rate(spark, addr, n, os.path.join(tmp, f"ck-a{i}"), None))
                rows[next(names)].append(_stream_rate(spark, addr, n, os.path.join(tmp, f"ck-b{i}"), "v0,v1"))
                node_df = spark.read.format("streamingnode").option("addr", addr).option("pchannel", PCHANNEL)
                rows[next(names)].append(_timed(n, lambda: node_df.load().count()))  # noqa: B023
                rows[next(names)].append(_timed(n, lambda: spark.read.parquet(str(parquet)).count()))
                total = n * args.size
                rows[next(names)].append(_timed(total, lambda: spark.read.parquet(str(parquet))
                                                .select(F.sum(F.length("payload"))).first()[0]) * n / total)
                print(f"run {i + 1}/{args.runs}: " + ", ".join(f"{v[-1]:,.0f}" for v in rows.values()),
                      file=sys.stderr, flush=True)
            samples = (_latency(spark, addr, os.path.join(tmp, "ck-lat"), args.latency_seconds, args.latency_rate,
                                args.size) if args.latency_seconds > 0 else [])
            spark.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    sdk = statistics.median(rows["SDK consumer alone"])
    print(f"\n{n:,} messages x {args.size} B, medians of {args.runs} runs (rows/s):\n")
    print("| read | rows/s | runs | vs SDK consumer |")
    print("|---|---:|---|---:|")
    for name, values in rows.items():
        med = statistics.median(values)
        print(f"| {name} | {med:,.0f} | {' · '.join(f'{v:,.0f}' for v in values)} | {med / sdk:.2f} |")
    stream = statistics.median(rows["Spark streaming, whole pchannel (1 partition)"])
    print(f"\nstreaming (1 partition) vs SDK consumer: {verdict(stream / sdk, RATE_TARGET)}")
    if not samples:
        print("produce-to-row latency: not measured (--latency-seconds 0)")
        return
    p50, p99 = _pct(samples, 0.5), _pct(samples, 0.99)
    print(f"produce-to-row latency at a {TRIGGER_S:.0f} s trigger, {len(samples)} samples: p50 {p50:.0f} ms, "
          f"p99 {p99:.0f} ms, max {max(samples):.0f} ms (target p50 <= {(TRIGGER_S + 1) * 1000:.0f} ms"
          f"{'' if p50 <= (TRIGGER_S + 1) * 1000 else ', MISSED'})")


if __name__ == "__main__":
    main()
