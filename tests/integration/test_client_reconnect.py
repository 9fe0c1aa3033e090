"""Producers and consumers across a node restart (same data directory, same port, mid-stream)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamingnode.client import AsyncClient, Producer
from streamingnode.server import ServerThread
from tests.integration.conftest import node_config
from tests.integration.test_client import data_of, read_until
from wal.errors import UnavailableError
from wal.message import AppendResult

pytestmark = pytest.mark.integration


class RestartableNode:
    """A node that can be stopped and started again on the same port over the same data."""

    def __init__(self, data_dir: Path) -> None:
        self.thread = ServerThread(node_config(data_dir)).start()
        self.address = self.thread.address
        self.restarts = 0

    def restart(self) -> None:
        config = dataclasses.replace(self.thread.config, listen=self.address)
        self.thread.stop(grace=0.2)
        self.thread = ServerThread(config).start()
        self.restarts += 1

    def stop(self) -> None:
        self.thread.stop()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[RestartableNode]:
    n = RestartableNode(tmp_path / "data")
    try:
        yield n
    finally:
        n.stop()


class Traffic:
    """Workers that keep one send each in flight until told to stop, so a restart always catches
    batches unanswered.  ``sent`` is in the order the producer took the messages."""

    def __init__(self, producer: Producer, vchannel: str = "v", workers: int = 8) -> None:
        self.producer = producer
        self.vchannel = vchannel
        self.sent: list[bytes] = []
        self.ok: list[tuple[bytes, AppendResult]] = []
        self.failed: list[tuple[bytes, BaseException]] = []
        self.stop = asyncio.Event()
        self.progress = asyncio.Condition()
        self._tasks = [asyncio.create_task(self._work(w)) for w in range(workers)]

    async def _work(self, worker: int) -> None:
        n = 0
        while not self.stop.is_set():
            payload = b"w%d-%06d" % (worker, n)
            n += 1
            fut = self.producer.send_nowait(self.vchannel, payload)
            self.sent.append(payload)
            try:
                result = await fut
            except UnavailableError as exc:
                self.failed.append((payload, exc))
            else:
                self.ok.append((payload, result))
            async with self.progress:
                self.progress.notify_all()

    async def wait_ok(self, count: int) -> None:
        async with self.progress:
            await self.progress.wait_for(lambda: len(self.ok) >= count)

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.gather(*self._tasks)


async def run_across_restart(node: RestartableNode, traffic: Traffic) -> None:
    """Let some traffic through, restart the node under it, let more through after."""
    await traffic.wait_ok(200)
    # ServerThread.restart blocks: on a thread, the client's loop keeps sending (and failing) meanwhile.
    await asyncio.to_thread(node.restart)
    await traffic.wait_ok(len(traffic.ok) + 200)
    await traffic.finish()


async def test_idempotent_producer_loses_and_duplicates_nothing_across_a_restart(node: RestartableNode) -> None:
    async with AsyncClient(node.address, reconnect_timeout=20.0) as client:
        await client.create_channels(["p"])
        producer = client.producer("p", producer_id="idem-1", linger=0.002)
        traffic = Traffic(producer)
        await run_across_restart(node, traffic)
        await producer.aclose()
        assert node.restarts == 1 and producer.reconnects >= 1, "the stream really broke and came back"
        assert traffic.failed == [], "an idempotent producer resends instead of failing"
        results = [r for _, r in traffic.ok]
        assert len({r.message_id for r in results}) == len(results)

        async with client.producer("p") as tail:
            await tail.send("v", b"end")
        async with client.consumer("p", "v") as consumer:
            got = await read_until(consumer, b"end", timeout=30)
        assert data_of(got) == [*traffic.sent, b"end"], "every message exactly once, in send order"
        by_payload = {m.payload: m.message_id for m in got}
        assert all(by_payload[p] == r.message_id for p, r in traffic.ok), "a resend is answered with the original id"


async def test_plain_producer_fails_only_unanswered_sends_and_never_duplicates(node: RestartableNode) -> None:
    async with AsyncClient(node.address, reconnect_timeout=20.0) as client:
        await client.create_channels(["p"])
        producer = client.producer("p", linger=0.002)
        traffic = Traffic(producer)
        await run_across_restart(node, traffic)
        await producer.aclose()
        assert producer.reconnects >= 1
        assert all(exc.retriable for _, exc in traffic.failed), "outcome unknown: UNAVAILABLE"

        async with client.producer("p") as tail:
            await tail.send("v", b"end")
        async with client.consumer("p", "v") as consumer:
            got = data_of(await read_until(consumer, b"end", timeout=30))
        assert len(got) == len(set(got)), "no duplicates, ever"
        assert {p for p, _ in traffic.ok} <= set(got), "every answered send is in the log"
        assert set(got) - {b"end"} <= set(traffic.sent)
        order = {p: i for i, p in enumerate(traffic.sent)}
        assert [order[p] for p in got[:-1]] == sorted(order[p] for p in got[:-1]), "send order kept"


@pytest.mark.parametrize("group", [None, "g"])
async def test_consumer_resumes_across_a_restart_without_loss_or_duplicates(
    node: RestartableNode, group: str | None,
) -> None:
    async with AsyncClient(node.address, reconnect_timeout=20.0) as client:
        await client.create_channels(["p"])
        if group is not None:
            await client.create_group("p", group)
        # Small packs, so the consumer is mid-way through many when the node goes away.
        consumer = client.consumer("p", "v", group=group, max_pack_messages=7)
        await consumer.wait_opened()
        producer = client.producer("p", producer_id="c-1", linger=0.002)
        traffic = Traffic(producer)
        received: list[bytes] = []
        packs = 0

        async def read() -> None:
            nonlocal packs
            async for pack in consumer:
                packs += 1
                received.extend(data_of(pack.messages))
                if group is not None and packs % 3 == 0:
                    # Commit only now and then: the group lags behind what was received, and the
                    # resume must still not repeat what came after the commit.
                    await consumer.ack(pack)
                if b"end" in received:
                    return

        reader = asyncio.create_task(read())
        await run_across_restart(node, traffic)
        await producer.aclose()
        async with client.producer("p") as tail:
            await tail.send("v", b"end")
        async with asyncio.timeout(30):
            await reader
        await consumer.aclose()
        assert consumer.reconnects >= 1, "the read really broke and came back"
        assert traffic.failed == []
        assert received == [*traffic.sent, b"end"], "every message once, in order, across the restart"
        if group is not None:
            (desc,) = await client.describe_groups("p", [group])
            assert desc.committed("v") is not None
