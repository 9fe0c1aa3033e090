"""An executor's column read across a node restart (same data, same port, mid-read): the stream is
opened again after the last whole pack taken, so the range's rows come out once each, in order."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from streamingnode.client import Client
from streamingnode.spark import _columns, _range
from streamingnode.spark._options import Connection, Offset
from tests.integration.test_client_reconnect import RestartableNode
from tests.spark_stream.test_columns import SCHEMA

pytestmark = pytest.mark.integration

# Larger than what gRPC buffers for a stream, so most packs are still on the node when it stops.
PAYLOAD = 8 << 10
COUNT = 3000


@pytest.fixture
def node(tmp_path: Path) -> Iterator[RestartableNode]:
    n = RestartableNode(tmp_path / "data")
    try:
        yield n
    finally:
        n.stop()


def test_a_read_resumes_after_the_last_whole_pack_across_a_restart(node: RestartableNode) -> None:
    sent = [b"%06d" % i + bytes(PAYLOAD) for i in range(COUNT)]
    with Client(node.address) as client:
        client.create_channels(["p"])
        with client.producer("p") as producer:
            for i in range(0, COUNT, 500):  # several ticks: several packs
                for payload in sent[i:i + 500]:
                    producer.send_nowait("v", payload)
                producer.flush()
        end = _range.latest(client, "p", Offset("p", -1, 0))
    conn = Connection((node.address,), None, None, None, None, 30.0)
    packs = _columns.read_packs(conn, Offset("p", -1, 0), end, "", ())
    batches: list[pa.RecordBatch] = []
    before = 0
    for pack in packs:
        batch = _columns.plain_batch(pack, end.timetick, SCHEMA)
        if batch is not None:
            batches.append(batch)
            if node.restarts == 0:  # the first pack with rows taken: the node goes away under the read
                before = batch.num_rows
                node.restart()
    got = pa.Table.from_batches(batches, SCHEMA).column("payload").to_pylist()
    assert node.restarts == 1 and 0 < before < COUNT
    assert len(got) == COUNT and got == sent, "every message once, in order, across the restart"
