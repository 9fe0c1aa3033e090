"""A Spark driver in its own process, for the SIGKILL test: a streaming query over pchannel ``p1`` with
a checkpoint, writing each micro-batch to ``<out>/batch-<id>.json`` (a re-run of a batch that already
has its file goes to ``batch-<id>.rerun-<n>.json``, so the test can check it held the same rows).
Files are written under a hidden name and renamed, so a kill never leaves half a file.  The query
stops when ``<out>/STOP`` exists.

    python -m tests.spark_stream.stream_driver ADDR CHECKPOINT OUT
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def _write_batch(out: Path, df: Any, batch_id: int) -> None:
    rows = [[r.vchannel, r.payload.decode(), r.id] for r in df.orderBy("id").collect()]
    name = f"batch-{batch_id}.json"
    n = 0
    while (out / name).exists():
        n += 1
        name = f"batch-{batch_id}.rerun-{n}.json"
    hidden = out / f".{name}"
    hidden.write_text(json.dumps(rows))
    os.replace(hidden, out / name)


def main(addr: str, checkpoint: str, out_dir: str) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession  # noqa: PLC0415  (after the environment is set)

    from streamingnode.spark import register  # noqa: PLC0415

    out = Path(out_dir)
    spark = (SparkSession.builder.master("local[2]").appName("streamingnode-driver")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    query = (spark.readStream.format("streamingnode").option("addr", addr).option("pchannel", "p1")
             .option("vchannel", "v0,v1").option("startingOffsets", "earliest")
             .option("maxMessagesPerTrigger", "40").load()
             .writeStream.foreachBatch(lambda df, batch_id: _write_batch(out, df, batch_id))
             .option("checkpointLocation", checkpoint).trigger(processingTime="100 milliseconds").start())
    # Polling a file is this process's only way to hear "stop"; the test never waits on time.
    while query.isActive and not (out / "STOP").exists():
        time.sleep(0.05)
    query.stop()
    failed = query.exception()
    spark.stop()
    if failed is not None:
        raise SystemExit(f"the query failed: {failed}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
