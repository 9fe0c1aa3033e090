"""The streaming source against a real node and real local Spark: exactly once across a stop and a
restart from the checkpoint, whole transactions, rolled-back ones never, and bad options at start."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from streamingnode.client import Client
from streamingnode.server import ServerThread
from tests.waiting import until_sync

pytestmark = pytest.mark.integration


class Batches:
    """What foreachBatch saw, per batch id: a batch Spark runs again after a restart must hold the
    same rows (the offsets in the checkpoint pin it), so it replaces, and the union counts once."""

    def __init__(self) -> None:
        self.by_id: dict[int, list[tuple[str, bytes]]] = {}
        self.reruns: list[tuple[int, bool]] = []
        self._lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = [(r.vchannel, r.payload) for r in df.orderBy("id").collect()]
        with self._lock:
            if batch_id in self.by_id:
                self.reruns.append((batch_id, self.by_id[batch_id] == rows))
            self.by_id[batch_id] = rows

    def all_rows(self) -> list[tuple[str, bytes]]:
        with self._lock:
            return [r for b in sorted(self.by_id) for r in self.by_id[b]]


def _stream(spark: Any, addr: str, checkpoint: Path, sink: Batches, **options: str) -> Any:
    reader = spark.readStream.format("streamingnode").option("addr", addr).option("pchannel", "p1")
    for k, v in options.items():
        reader = reader.option(k, v)
    return (reader.load().writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="100 milliseconds").start())


def wait(query: Any, condition: Any, what: str) -> None:
    """Until ``condition()``; a query that died fails the test with its own error."""
    def check() -> bool:
        if not query.isActive:
            raise AssertionError(f"the query ended: {query.exception()}")
        return bool(condition())

    until_sync(check, what, timeout=120)


def _produce(addr: str, start: int, n: int) -> None:
    with Client(addr) as client, client.producer("p1") as producer:
        for i in range(start, start + n):
            producer.send_nowait(f"v{i % 2}", f"m{i}".encode())
        producer.flush()


def test_every_message_once_across_a_stop_and_restart(sspark: Any, node: ServerThread, tmp_path: Path) -> None:
    with Client(node.address) as client:
        client.create_channels(["p1"])
    _produce(node.address, 0, 120)
    sink = Batches()
    checkpoint = tmp_path / "checkpoint"
    query = _stream(sspark, node.address, checkpoint, sink, startingOffsets="earliest", maxMessagesPerTrigger="30",
                    vchannel="v0,v1")
    try:
        wait(query, lambda: len(sink.by_id) >= 2, "two micro-batches")
    finally:
        query.stop()
    assert len(sink.all_rows()) < 200  # stopped mid-way: more is still to come
    _produce(node.address, 120, 80)  # written while the query is down
    query = _stream(sspark, node.address, checkpoint, sink, startingOffsets="latest", maxMessagesPerTrigger="30",
                    vchannel="v0,v1")
    try:
        wait(query, lambda: len(sink.all_rows()) >= 200, "all 200 messages")
        _produce(node.address, 200, 10)  # and live, while it runs
        wait(query, lambda: len(sink.all_rows()) >= 210, "the live ones")
    finally:
        query.stop()
    rows = sink.all_rows()
    assert sorted(p for _, p in rows) == sorted(f"m{i}".encode() for i in range(210))
    assert all(same for _, same in sink.reruns)
    for v in ("v0", "v1"):  # per-vchannel order over the batches
        got = [int(p[1:]) for vc, p in rows if vc == v]
        assert got == sorted(got)


def test_transactions_whole_in_one_batch_and_rolled_back_never(
        sspark: Any, node: ServerThread, tmp_path: Path) -> None:
    with Client(node.address) as client:
        client.create_channels(["p1"])
        _produce(node.address, 0, 4)
        with client.txn("p1", "v0") as tx:
            for i in range(6):
                tx.send(f"t{i}".encode())
        info = client.begin_txn("p1", "v0")
        with client.producer("p1") as producer:
            producer.send("v0", b"between")
        client.rollback_txn("p1", "v0", info.txn_id)
        _produce(node.address, 4, 4)
    sink = Batches()
    # One message per trigger at most: a batch still takes the whole transaction.
    query = _stream(sspark, node.address, tmp_path / "ck", sink, startingOffsets="earliest",
                    maxMessagesPerTrigger="1")
    try:
        wait(query, lambda: len(sink.all_rows()) >= 15, "every committed message")
    finally:
        query.stop()
    payloads = [p for _, p in sink.all_rows()]
    assert sorted(payloads) == sorted([f"m{i}".encode() for i in range(8)] + [f"t{i}".encode() for i in range(6)]
                                      + [b"between"])
    holding = [b for b, rows in sink.by_id.items() if any(p.startswith(b"t") for _, p in rows)]
    assert len(holding) == 1
    assert [p for _, p in sink.by_id[holding[0]] if p.startswith(b"t")] == [f"t{i}".encode() for i in range(6)]


def test_batch_read_over_a_range(sspark: Any, node: ServerThread) -> None:
    with Client(node.address) as client:
        client.create_channels(["p1"])
        _produce(node.address, 0, 10)
        middle, _ = client.latest_position("p1")
        _produce(node.address, 10, 10)
    assert middle is not None
    def base() -> Any:  # a DataFrameReader's options are mutable: one each
        return sspark.read.format("streamingnode").option("addr", node.address).option("pchannel", "p1")

    first = base().option("endingOffsets", f'{{"message_id": {middle.message_id}, "timetick": {middle.timetick}}}')
    assert sorted(r.payload for r in first.load().collect()) == sorted(f"m{i}".encode() for i in range(10))
    rest = base().option("startingOffsets", f'{{"message_id": {middle.message_id}, "timetick": {middle.timetick}}}')
    rows = rest.option("vchannel", "v0,v1").load()
    assert rows.rdd.getNumPartitions() == 2
    assert sorted(r.payload for r in rows.collect()) == sorted(f"m{i}".encode() for i in range(10, 20))
    one = rows.collect()[0]
    assert one.type == "data" and one.properties == {} and one.time.year >= 2026


@pytest.mark.parametrize(("options", "named"), [
    ({"pchannel": "nope"}, "'pchannel': no pchannel 'nope'"),
    ({"startingOffsets": '{"message_id": 1, '}, "'startingOffsets': malformed JSON"),
    ({"startingOffsets": '{"message_id": "x", "timetick": 1}'}, "'startingOffsets': message_id must be"),
    ({"addr": "127.0.0.1:1", "timeout": "1"}, "'addr': cannot reach the node at 127.0.0.1:1"),
    ({"maxMessagesPerTrigger": "0"}, "'maxMessagesPerTrigger': expected a positive integer"),
    ({"types": "data,bogus"}, "'types': unknown message type 'bogus'"),
])
def test_bad_options_fail_at_start_naming_the_option(
        sspark: Any, node: ServerThread, options: dict[str, str], named: str) -> None:
    with Client(node.address) as client:
        client.create_channels(["p1"])
    reader = sspark.readStream.format("streamingnode").option("addr", node.address).option("pchannel", "p1")
    for k, v in options.items():
        reader = reader.option(k, v)
    with pytest.raises(Exception, match="PYTHON_DATA_SOURCE_ERROR") as caught:
        reader.load()
    assert f"streamingnode option {named}" in str(caught.value)


def test_a_batch_boundary_while_a_transaction_is_open_never_splits_it(sspark: Any, node: ServerThread) -> None:
    """The boundary is the latest position taken after the transaction's BEGIN and some of its body
    were stored, and before its COMMIT: its body (stored before and after the boundary) comes whole
    after it, at its commit, and nothing of it before."""
    with Client(node.address) as client:
        client.create_channels(["p1"])
        _produce(node.address, 0, 2)
        with client.txn("p1", "v0") as tx:
            for i in range(3):
                tx.send(f"t{i}".encode())
            _produce(node.address, 2, 4)  # plain messages after the stored body: the boundary is past it
            boundary, _ = client.latest_position("p1")
            tx.send(b"t3")
        _produce(node.address, 6, 2)
    assert boundary is not None
    at = f'{{"message_id": {boundary.message_id}, "timetick": {boundary.timetick}}}'

    def read(**options: str) -> list[bytes]:
        reader = sspark.read.format("streamingnode").option("addr", node.address).option("pchannel", "p1")
        for k, v in options.items():
            reader = reader.option(k, v)
        return [r.payload for r in reader.load().orderBy("timetick", "id").collect()]

    before, after = read(endingOffsets=at), read(startingOffsets=at)
    assert before == [f"m{i}".encode() for i in range(6)]
    assert sorted(after) == sorted([f"t{i}".encode() for i in range(4)] + [b"m6", b"m7"])
    assert read(startingOffsets=at, vchannel="v0") == [f"t{i}".encode() for i in range(4)] + [b"m6"]


def test_an_idle_query_runs_no_stream_of_empty_batches(sspark: Any, node: ServerThread, tmp_path: Path) -> None:
    """Ticks alone do not move the position an idle pchannel reports (a TimeTick is stored only after
    data), so triggers find nothing new and run no batch: counted over many triggers, each reported
    as a no-data progress event."""
    with Client(node.address) as client:
        client.create_channels(["p1"])
    sink = Batches()
    sspark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "0")
    try:
        query = _stream(sspark, node.address, tmp_path / "ck", sink, startingOffsets="earliest")
    finally:
        sspark.conf.unset("spark.sql.streaming.noDataProgressEventInterval")
    try:
        _produce(node.address, 0, 2)
        wait(query, lambda: len(sink.all_rows()) >= 2, "the two messages")
        seen = len(query.recentProgress)
        wait(query, lambda: len(query.recentProgress) >= min(seen + 30, 100), "30 more triggers")
    finally:
        query.stop()
    empty = [b for b, rows in sink.by_id.items() if not rows]
    # At most the one a TimeTick stored right after the data can cause (none was seen), never one
    # per trigger.
    assert len(empty) <= 1, f"empty micro-batches {empty} over {len(query.recentProgress)} triggers"
