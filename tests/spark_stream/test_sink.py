"""The sink: a query copying p1 to p2, stopped, its last batch made to run again (as after a crash
between the tasks' writes and Spark's commit), restarted: every row is in p2 exactly once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamingnode.client import Client
from streamingnode.server import ServerThread
from tests.spark_stream.test_source import _produce, wait

pytestmark = pytest.mark.integration


def _copy(spark: Any, addr: str, checkpoint: Path) -> Any:
    source = (spark.readStream.format("streamingnode").option("addr", addr).option("pchannel", "p1")
              .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", "40").load())
    return (source.select("payload", "vchannel").writeStream.format("streamingnode").option("addr", addr)
            .option("pchannel", "p2").option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="100 milliseconds").start())


def _read_p2(spark: Any, addr: str) -> list[bytes]:
    df = spark.read.format("streamingnode").option("addr", addr).option("pchannel", "p2").load()
    return [r.payload for r in df.collect()]


def test_a_restarted_sink_leaves_every_row_once(sspark: Any, node: ServerThread, tmp_path: Path) -> None:
    with Client(node.address) as client:
        client.create_channels(["p1", "p2"])
    _produce(node.address, 0, 100)
    checkpoint = tmp_path / "checkpoint"
    query = _copy(sspark, node.address, checkpoint)
    try:
        wait(query, lambda: len(list((checkpoint / "commits").glob("[0-9]*"))) >= 2, "two committed batches")
    finally:
        query.stop()
    # Forget the last commit: Spark runs that batch again, and its tasks send the same messages.
    commits = sorted((checkpoint / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    commits[-1].unlink()
    (checkpoint / "commits" / f".{commits[-1].name}.crc").unlink(missing_ok=True)
    _produce(node.address, 100, 20)
    query = _copy(sspark, node.address, checkpoint)
    try:
        wait(query, lambda: len(_read_p2(sspark, node.address)) >= 120, "all 120 rows in p2")
    finally:
        query.stop()
    got = _read_p2(sspark, node.address)
    assert sorted(got) == sorted(f"m{i}".encode() for i in range(120))


def test_sink_needs_a_payload_column(sspark: Any, node: ServerThread) -> None:
    df = sspark.createDataFrame([(1,)], "x long")
    with pytest.raises(Exception, match="streamingnode option 'payload'"):
        df.write.format("streamingnode").option("addr", node.address).option("pchannel", "p2").mode("append").save()
