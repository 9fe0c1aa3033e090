"""A producer whose owner is paused (SIGSTOP: a hung process, or one cut off by a partition) for longer
than its lease moves to the node that takes the pchannel over while the old owner is still stopped.

Before the client had keepalive, the stream to the stopped node never failed: the producer stalled
for the whole pause (a 24 s pause was a 24.2 s stall) although another node served the pchannel a
lease later.  Now the connection's pings go unanswered, the stream fails within about
``keepalive_time + keepalive_timeout``, the owner is resolved again through the other seed, and the
producer's held batches go to the new owner.  Asserted by condition: acknowledged sends resume while
the old owner is still stopped; afterwards every acknowledged send is in the log exactly once, in
the order acknowledged.  The stall is printed (run with ``-s``), not asserted."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamingnode.client import AsyncClient
from streamingnode.cluster.ownership import preferred
from tests.cluster.conftest import owner_seen_by
from tests.natscluster import NatsCluster
from tests.node_process import NodeProcess
from tests.waiting import until
from wal.message import MessageType

pytestmark = pytest.mark.integration

LEASE = 2.0
_prefixes = itertools.count()


class _Pair:
    def __init__(self, nats: NatsCluster, root: Path) -> None:
        common = ("--wal", "jetstream", "--nats", nats.url, "--nats-replicas", "1",
                  "--cluster-prefix", f"cp{next(_prefixes)}", "--lease-seconds", str(LEASE), "--drain-seconds", "1",
                  "--parquet-root", str(root / "parquet"))
        self.a = NodeProcess(root / "a", None, "--node-id", "a", *common)
        self.b = NodeProcess(root / "b", None, "--node-id", "b", *common)

    def close(self) -> None:
        for proc in (self.a, self.b):
            if proc.proc is not None and proc.proc.poll() is None:
                proc.proc.send_signal(signal.SIGCONT)
            proc.kill()


@pytest.fixture
def pair(nats_r1: NatsCluster, tmp_path: Path) -> Iterator[_Pair]:
    nodes = _Pair(nats_r1, tmp_path)
    try:
        yield nodes
    finally:
        nodes.close()


async def test_a_producer_leaves_an_owner_paused_past_its_lease_while_it_is_still_stopped(pair: _Pair) -> None:
    p = next(f"p{i}" for i in itertools.count() if preferred(f"p{i}", ["a", "b"]) == "a")
    await asyncio.gather(asyncio.to_thread(pair.a.start), asyncio.to_thread(pair.b.start))
    a, b = pair.a.address, pair.b.address
    assert pair.a.proc is not None
    acked: list[tuple[int, int]] = []  # (send number, message id), in acknowledgement order
    stop = asyncio.Event()

    async with AsyncClient([a, b], reconnect_timeout=120) as client:
        await client.create_channels([p])
        await until(lambda: _owned_by(b, p, a), "node a to own the pchannel", timeout=30)

        async def produce() -> None:
            async with client.producer(p, producer_id="paused-owner", max_batch_messages=20) as producer:
                for n in itertools.count(0, 10):
                    if stop.is_set():
                        return
                    futures = [producer.send_nowait("v", f"m{n + j:06d}".encode()) for j in range(10)]
                    for j, fut in enumerate(futures):
                        acked.append((n + j, (await fut).message_id))

        producing = asyncio.create_task(produce())
        try:
            await until(lambda: len(acked) >= 100 or producing.done(), "the first sends", timeout=30)
            os.kill(pair.a.proc.pid, signal.SIGSTOP)
            stopped_at, before = time.monotonic(), len(acked)
            try:
                await until(lambda: len(acked) >= before + 50 or producing.done(),
                            "sends acknowledged again while the old owner is stopped", timeout=120)
                resumed_after = time.monotonic() - stopped_at
                if producing.done():
                    producing.result()
                assert pair.a.proc.poll() is None  # still there, still stopped: the producer moved on
                assert await owner_seen_by(b, p) == b
            finally:
                os.kill(pair.a.proc.pid, signal.SIGCONT)
            stop.set()
            await asyncio.wait_for(producing, 60)
        finally:
            stop.set()
            if not producing.done():
                producing.cancel()
        print(f"\nproducer resumed {resumed_after:.1f} s after its owner was stopped (lease {LEASE} s)")

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
    assert numbers == sorted(numbers), "sends stored out of order"
    assert [n for n, _ in acked] == [n for n in numbers if n in {k for k, _ in acked}], "an acknowledged send lost"
    assert [mid for _, mid in acked] == sorted(mid for _, mid in acked)


async def _owned_by(ask: str, pchannel: str, address: str) -> bool:
    return await owner_seen_by(ask, pchannel) == address
