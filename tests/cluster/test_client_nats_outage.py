"""An idempotent producer through an outage of the whole NATS cluster under two nodes: the server is
stopped (SIGKILL) for longer than the client's call timeout, well within ``reconnect_timeout``, and
started again.  No send fails; once NATS is back every send is acknowledged, and the log holds every
one exactly once, in the order acknowledged.

Before, the producer failed everything it had buffered with DeadlineExceededError about 5 s into the
outage (reconnect_timeout was 180 s): the nodes answered the owner lookup (DescribeChannels) with
DEADLINE_EXCEEDED, which the lookup re-raised instead of asking the next node, and which was not a
code a reopening stream retries.  The outage's length is the point of the test (it must outlast the
5 s call timeout), so it is waited out; everything else waits on conditions."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamingnode.client import AsyncClient
from tests.cluster.conftest import start_cluster
from tests.natscluster import NatsCluster
from tests.node_process import NodeProcess
from tests.waiting import until
from wal.errors import UnavailableError
from wal.message import MessageType

pytestmark = pytest.mark.integration

CALL_TIMEOUT = 5.0  # the client's unary deadline, as in the outside check that found the defect
OUTAGE = 15.0
"""Seconds NATS stays down: longer than CALL_TIMEOUT and than the 10 s a node holds a write its log
refused before it answers the batch UNAVAILABLE (so the producer sees the outage), far less than
RECONNECT_TIMEOUT."""
RECONNECT_TIMEOUT = 180.0
LEASE = 3.0


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("nats-outage"), 1)
    yield cluster
    cluster.stop()


@pytest.fixture
def nodes(nats: NatsCluster, tmp_path: Path) -> Iterator[list[NodeProcess]]:
    common = ("--wal", "jetstream", "--nats", nats.url, "--nats-replicas", "1", "--cluster-prefix", "out",
              "--lease-seconds", str(LEASE), "--drain-seconds", "1", "--parquet-root", str(tmp_path / "parquet"))
    procs = [NodeProcess(tmp_path / n, None, "--node-id", n, *common) for n in ("a", "b")]
    try:
        for proc in procs:
            proc.start()
        yield procs
    finally:
        for proc in procs:
            proc.kill()


async def test_an_idempotent_producer_loses_nothing_through_a_nats_outage_longer_than_its_call_timeout(
        nats: NatsCluster, nodes: list[NodeProcess]) -> None:
    p = "outage"
    acked: list[int] = []
    stop = asyncio.Event()
    async with AsyncClient([n.address for n in nodes], timeout=CALL_TIMEOUT,
                           reconnect_timeout=RECONNECT_TIMEOUT) as client:
        await client.create_channels([p])

        async def served() -> bool:
            try:
                await client.latest_position(p)
            except UnavailableError:
                return False
            return True

        await until(served, "the pchannel served", timeout=30)

        async def produce() -> None:
            async with client.producer(p, producer_id="through-outage", max_batch_messages=20) as producer:
                for n in itertools.count(0, 10):
                    if stop.is_set():
                        return
                    futures = [producer.send_nowait("v", f"m{n + j:06d}".encode()) for j in range(10)]
                    for j, fut in enumerate(futures):
                        await fut  # a failed send ends the task with its error
                        acked.append(n + j)

        producing = asyncio.create_task(produce())
        try:
            await until(lambda: len(acked) >= 100 or producing.done(), "the first sends", timeout=30)
            lookups = client.router.resolutions
            nats.kill(0)
            down_at = time.monotonic()
            # Down until the outage reached the producer: the node gave up on a batch (it holds a write
            # its log refused for 10 s), the stream was left, and the owner looked up again, twice, in
            # vain (the nodes cannot read the log: DEADLINE_EXCEEDED).
            await until(lambda: (time.monotonic() - down_at >= OUTAGE and client.router.resolutions >= lookups + 2)
                        or producing.done(), "the outage to reach the producer", timeout=120)
            assert not producing.done(), f"the producer gave up during the outage: {producing.exception()!r}"
            during = len(acked)
            nats.start(0)
            await nats.ready()
            await until(lambda: len(acked) >= during + 100 or producing.done(), "sends acknowledged after the outage",
                        timeout=RECONNECT_TIMEOUT)
            if producing.done():
                producing.result()
            print(f"\nNATS down {time.monotonic() - down_at:.1f} s in all; {len(acked)} sends acknowledged; "
                  f"{client.router.resolutions - lookups} owner lookups meanwhile")
        finally:
            stop.set()
            await asyncio.wait_for(producing, 120)

        async with client.producer(p) as plain:
            await plain.send("v", b"END")
        seen: list[bytes] = []
        async with asyncio.timeout(60), client.consumer(p, "v") as consumer:
            async for pack in consumer:
                seen += [bytes(m.payload) for m in pack.messages if m.message_type is MessageType.DATA]
                if b"END" in seen:
                    break
    numbers = [int(s[1:]) for s in seen if s != b"END"]
    assert len(numbers) == len(set(numbers)), "a send stored twice"
    assert numbers == acked, "the log does not hold exactly the acknowledged sends, in order"
