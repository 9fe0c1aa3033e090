"""``/metrics`` of a real node: each family counts what the load did, label sets go away with their
pchannel, and the endpoint answers bad HTTP precisely without disturbing the node."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client.parser import text_string_to_metric_families

from flusher import layout
from streamingnode.client import AsyncClient
from streamingnode.server import ServerThread
from tests.integration.conftest import node_config
from tests.waiting import until
from wal.errors import SchemaMismatchError

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("name", pa.string())])
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(address: str) -> Samples:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """The one sample of ``name`` with exactly ``labels`` (KeyError when absent)."""
    return samples[(name, frozenset(labels.items()))]


def series(samples: Samples, name: str, **labels: str) -> dict[frozenset[tuple[str, str]], float]:
    """Every sample of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return {k[1]: v for k, v in samples.items() if k[0] == name and want <= k[1]}


async def _load(address: str) -> int:
    """Produce 50 messages, a committed and a rolled back transaction, one refused insert, a flush;
    consume through the committed transaction.  Returns how many messages the consumer received."""
    async with AsyncClient(address) as client:
        await client.create_channels(["p1"])
        await client.create_group("p1", "billing")
        async with client.producer("p1") as producer:
            for i in range(50):
                last = await producer.send("v1", f"m{i}".encode() * 10)
        async with client.txn("p1", "v1") as tx:
            await tx.send(b"in txn")
        with pytest.raises(RuntimeError):
            async with client.txn("p1", "v1") as tx:
                await tx.send(b"rolled back")
                raise RuntimeError("abandon")
        data = client.data("p1")
        await data.create_collection("v2", "users", SCHEMA, primary_key="pk")
        await data.insert("v2", "users", pa.record_batch([pa.array([1, 2, 3]), pa.array(["a", "b", "c"])],
                                                          schema=SCHEMA))
        with pytest.raises(SchemaMismatchError):
            await data.insert("v2", "users", pa.record_batch([pa.array(["x"])], names=["pk"]))
        files = await data.flush("v2", "users")
        assert files
        received = 0
        async with client.consumer("p1", "v1") as consumer:
            async for pack in consumer:
                received += len(pack.messages)
                if any(m.payload == b"in txn" for m in pack.messages):
                    break
        assert received >= 51 and last.timetick > 0
        return received


async def test_metrics_count_what_the_load_did(server_thread: ServerThread) -> None:
    address = server_thread.metrics_address
    assert address is not None
    received = await _load(server_thread.address)
    s = scrape(address)

    assert value(s, "streamingnode_pchannels") == 1
    # 50 sends and both transaction bodies: a body is appended when sent; the rollback comes after.
    assert value(s, "streamingnode_append_messages_total", pchannel="p1", message_type="data", status="ok") == 52
    assert value(s, "streamingnode_append_bytes_total", pchannel="p1", message_type="data") == (
        sum(len(f"m{i}".encode() * 10) for i in range(50)) + len(b"in txn") + len(b"rolled back"))
    assert value(s, "streamingnode_append_messages_total", pchannel="p1", message_type="rollback_txn",
                 status="ok") == 1
    # The refused insert failed inside the chain (the shard step checks the schema): counted by its code.
    assert value(s, "streamingnode_append_messages_total", pchannel="p1", message_type="insert",
                 status="schema_mismatch") == 1
    assert value(s, "streamingnode_append_messages_total", pchannel="p1", message_type="insert", status="ok") == 1
    ok_batches = value(s, "streamingnode_append_latency_seconds_count", pchannel="p1", status="ok")
    assert ok_batches >= 55  # 50 sends + txn framing + DDL + insert + flush, each its own batch here
    assert value(s, "streamingnode_append_latency_seconds_bucket", pchannel="p1", status="ok", le="+Inf") == ok_batches

    assert value(s, "streamingnode_txn_duration_seconds_count", pchannel="p1", outcome="committed") == 1
    assert value(s, "streamingnode_txn_duration_seconds_count", pchannel="p1", outcome="rolled_back") == 1
    assert value(s, "streamingnode_txn_in_flight", pchannel="p1") == 0

    steps = series(s, "streamingnode_interceptor_batches_total", pchannel="p1")
    assert {dict(k)["interceptor"] for k in steps} == {"dedup", "lock", "shard", "timetick", "redo", "txn"}
    assert all(v >= ok_batches for v in steps.values())
    assert sum(series(s, "streamingnode_interceptor_seconds_total", pchannel="p1").values()) > 0

    # Delivered to the consumer: the 50 messages and the committed transaction's body (not the rolled back).
    # The node may have sent a pack or two more than the consumer read before it stopped.
    assert value(s, "streamingnode_consume_messages_total", pchannel="p1") >= received
    assert value(s, "streamingnode_consumer_streams", pchannel="p1") == 0
    assert value(s, "streamingnode_producer_streams", pchannel="p1") == 0
    # Lag is per vchannel a group has a position on: one never consumed or sought has none (as Kafka's).
    assert series(s, "streamingnode_consumer_group_lag_messages", pchannel="p1", group="billing") == {}

    assert value(s, "streamingnode_flusher_rows_total", pchannel="p1") == 3
    assert value(s, "streamingnode_flusher_files_total", pchannel="p1") >= 1
    assert value(s, "streamingnode_flusher_bytes_total", pchannel="p1") > 0
    assert value(s, "streamingnode_timetick_lag_seconds", pchannel="p1") < 60
    assert value(s, "streamingnode_wal_disk_bytes") > 0
    assert value(s, "streamingnode_parquet_disk_bytes", pchannel="p1") >= value(
        s, "streamingnode_flusher_bytes_total", pchannel="p1")  # measured off the loop, before the scrape
    assert value(s, "streamingnode_wal_messages", pchannel="p1") >= 60


async def test_open_streams_and_scanners_are_gauged_while_open(server_thread: ServerThread) -> None:
    address = server_thread.metrics_address
    assert address is not None
    async with AsyncClient(server_thread.address) as client:
        await client.create_channels(["p1"])
        async with client.producer("p1") as producer:
            last = await producer.send("v1", b"x")
            async with client.consumer("p1", "v1") as consumer:
                async for pack in consumer:
                    if pack.end_ts >= last.timetick:
                        break
                s = scrape(address)
                assert value(s, "streamingnode_producer_streams", pchannel="p1") == 1
                assert value(s, "streamingnode_consumer_streams", pchannel="p1") == 1
                # The consumer's scanner and the flusher's, both caught up, so tailing.
                assert value(s, "streamingnode_scanners", pchannel="p1", mode="tailing") == 2
        # The server side of the closed streams ends asynchronously (and its scanner with it).
        await until(lambda: value(scrape(address), "streamingnode_scanners", pchannel="p1", mode="tailing") == 1,
                    "the consumer's scanner to close")
        await until(lambda: value(scrape(address), "streamingnode_consumer_streams", pchannel="p1") == 0
                    and value(scrape(address), "streamingnode_producer_streams", pchannel="p1") == 0,
                    "the node to close its side of both streams")
        s = scrape(address)
        assert value(s, "streamingnode_producer_streams", pchannel="p1") == 0
        assert value(s, "streamingnode_consumer_streams", pchannel="p1") == 0
        assert value(s, "streamingnode_scanners", pchannel="p1", mode="tailing") == 1


async def test_label_sets_go_away_with_their_pchannel(server_thread: ServerThread) -> None:
    address = server_thread.metrics_address
    assert address is not None
    async with AsyncClient(server_thread.address) as client:
        await client.create_channels(["gone", "kept"])
        for name in ("gone", "kept"):
            async with client.producer(name) as producer:
                await producer.send("v", b"x")
        before = scrape(address)
        assert any(("pchannel", "gone") in labels for _, labels in before)
        await client.destroy_channels(["gone"])
    after = scrape(address)
    assert not [name for name, labels in after if ("pchannel", "gone") in labels]
    assert value(after, "streamingnode_append_messages_total", pchannel="kept", message_type="data", status="ok") == 1
    assert value(after, "streamingnode_pchannels") == 1


def _raw(address: str, request: bytes) -> bytes:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)  # the request ends here, complete or not
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_bad_http_gets_a_precise_answer_and_the_node_keeps_serving(server_thread: ServerThread) -> None:
    address = server_thread.metrics_address
    assert address is not None
    with pytest.raises(urllib.error.HTTPError) as not_found:
        urllib.request.urlopen(f"http://{address}/nope", timeout=10)
    not_found.value.close()  # an HTTPError holds the response's socket open until closed
    assert not_found.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as not_allowed:
        urllib.request.urlopen(urllib.request.Request(f"http://{address}/metrics", data=b"x", method="POST"),
                               timeout=10)
    not_allowed.value.close()
    assert not_allowed.value.code == 405
    assert _raw(address, b"garbage\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    head = _raw(address, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and head.endswith(b"\r\n\r\n"), "HEAD has headers, no body"
    assert _raw(address, b"GET /metr") == b"", "a request cut short is dropped"
    openmetrics = _raw(address, b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text\r\n\r\n")
    assert b"application/openmetrics-text" in openmetrics.split(b"\r\n\r\n", 1)[0]
    assert openmetrics.rstrip().endswith(b"# EOF")
    assert scrape(address)  # still serving


async def test_consumer_group_lag_is_zero_once_caught_up_and_stays_so_while_idle(
        server_thread: ServerThread) -> None:
    address = server_thread.metrics_address
    assert address is not None
    async with AsyncClient(server_thread.address) as client:
        await client.create_channels(["p1"])
        await client.create_group("p1", "g")
        async with client.producer("p1") as producer:
            for i in range(5):
                last = await producer.send("v1", b"x%d" % i)
        # The newest message a few ticks old (as the node's ticks count time) while the group is behind.
        ticks = server_thread.node.channel("p1").stream.timetick
        await until(lambda: (ticks.last_tick >> 18) >= (last.timetick >> 18) + 300, "300 ms of ticks after the last")
        behind = scrape(address)
        assert series(behind, "streamingnode_consumer_group_lag_seconds", pchannel="p1", group="g") == {}, (
            "a group that committed nothing has no position to measure from")
        async with client.consumer("p1", "v1", group="g") as consumer:
            async for pack in consumer:
                if pack.end_ts >= last.timetick:
                    await consumer.ack(pack)
                    break
        # The tick that follows the last message is persisted: the pchannel's last id is past it.
        async def persisted() -> bool:
            (d,) = await client.describe_channels(["p1"])
            return d.last_id is not None and d.last_id > last.message_id

        await until(persisted, "a persisted tick after the last message")
        caught_up = scrape(address)
        idle_from = ticks.last_tick
        # Idle: time goes on (twenty tick intervals of the node's ticks), nothing new is written.
        await until(lambda: (ticks.last_tick >> 18) >= (idle_from >> 18) + 1000, "a second of idle ticks")
        idle = scrape(address)
    # Nothing left to read on v1: 0 messages and 0 s, however many ticks follow (tests/integration/test_group_lag.py
    # has the other vchannel's writes).
    for s in (caught_up, idle):
        assert value(s, "streamingnode_consumer_group_lag_seconds", pchannel="p1", group="g", vchannel="v1") == 0
        assert value(s, "streamingnode_consumer_group_lag_messages", pchannel="p1", group="g", vchannel="v1") == 0


async def test_a_background_compaction_shows_in_the_compaction_counters(tmp_path: Path) -> None:
    """The node hands its compaction settings to the flusher (a short interval, no horizon) and the
    collector exports what the passes did: every file the flusher wrote but one was compacted away."""
    srv = ServerThread(node_config(tmp_path / "data", compaction_interval_seconds=0.1, compaction_min_files=3,
                                   compaction_horizon_seconds=0.0, compaction_grace_seconds=0.0))
    srv.start()
    try:
        address = srv.metrics_address
        assert address is not None
        async with AsyncClient(srv.address) as client:
            await client.create_channels(["p1"])
            data = client.data("p1")
            await data.create_collection("v2", "users", SCHEMA, primary_key="pk")
            # Three small data files, the first of ten rows: with key 0 deleted, one of its ten rows is
            # dead, under the share that has a file rewritten on its own (a fifth), so no pass may start
            # before the third file exists (compaction_min_files); with three rows, a pass could take
            # the first two files as soon as the delete was written and leave the third alone.
            for first, n in ((0, 10), (10, 3), (13, 3)):
                if first == 13:
                    # The delete is written before the third data file: the pass that the third one
                    # starts must see it to drop key 0.
                    await data.delete("v2", "users", [0])
                    await data.flush("v2", "users")
                keys = list(range(first, first + n))
                await data.insert("v2", "users", pa.record_batch([pa.array(keys), pa.array(["x"] * n)],
                                                                  schema=SCHEMA))
                await data.flush("v2", "users")
        root = srv.node.channel("p1").flusher.root  # type: ignore[union-attr]

        def settled() -> bool:
            # Key 0's row and its delete entry are gone for good, and one file holds the rest.
            s = scrape(address)
            files, deletes, _ = layout.visible_files(root, "users")
            return (value(s, "streamingnode_compaction_rows_dropped_total", pchannel="p1") == 1
                    and value(s, "streamingnode_compaction_delete_entries_dropped_total", pchannel="p1") == 1
                    and len(files) == 1 and not deletes)

        await until(settled, "a compaction that drops key 0 and leaves one file", timeout=60)
        s = scrape(address)
        [name] = layout.visible_files(root, "users")[0]
        final = Path(name)
        written = value(s, "streamingnode_flusher_files_total", pchannel="p1")
        assert written == 4  # three data files and one delete file
        assert value(s, "streamingnode_compactions_total", pchannel="p1") >= 1
        before = value(s, "streamingnode_compaction_files_total", pchannel="p1", when="before")
        after = value(s, "streamingnode_compaction_files_total", pchannel="p1", when="after")
        # Every compacted input was counted once, every output once: what is left is one file.
        assert before - after == written - 1 and after >= 1
        b_before = value(s, "streamingnode_compaction_bytes_total", pchannel="p1", when="before")
        b_after = value(s, "streamingnode_compaction_bytes_total", pchannel="p1", when="after")
        assert b_before - b_after == value(s, "streamingnode_flusher_bytes_total", pchannel="p1") - final.stat().st_size
        assert b_after >= final.stat().st_size > 0
        assert value(s, "streamingnode_compaction_seconds_total", pchannel="p1") > 0
        assert sorted(pq.read_table(final, columns=["pk"]).column("pk").to_pylist()) == list(range(1, 16))
    finally:
        srv.stop()
