"""A producer during an outage of what is behind the node (its WAL cannot write for a while, as when the
NATS servers of cluster mode are down): an idempotent producer keeps every send buffered and resends
the batches the node answered with a transient error (UNAVAILABLE, DEADLINE_EXCEEDED, ...) until
``reconnect_timeout`` of outage has passed; once the node writes again, every send is acknowledged,
exactly once, in order.  Before, the first batch answered UNAVAILABLE failed at once, with its sends.

A producer without a ``producer_id`` keeps its promise: a batch whose fate the node could not tell
fails at once (a resend could store it twice), and an idempotent producer whose outage outlasts
``reconnect_timeout`` fails what it holds with the node's last error."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from streamingnode.client import AsyncClient
from streamingnode.server import ServerThread
from tests.integration.test_client import data_of, read_until
from wal.backends.rocks import RocksBackend
from wal.errors import DeadlineExceededError, ErrorCode, StreamingError, UnavailableError

pytestmark = pytest.mark.integration

HOLD = 0.2
"""Seconds the node holds a write its backend refused before it answers the batch UNAVAILABLE."""


class _Outage:
    """The WAL backend refuses every write that carries a batch of messages while ``down`` is set (as
    the JetStream backend does while NATS is away): the first with ``error``, the others UNAVAILABLE
    (as JetStream's backend sends nothing after a write that failed: "the write before this one
    failed"); ``refused`` counts them.

    ``heal_on(marker, ready)``: the outage ends at the first write that holds ``marker`` (a payload's
    first bytes) once ``ready()`` -- so a test decides which batch the log takes first when it is
    back, instead of racing the node's own retries."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.down = threading.Event()
        self.refused = 0
        self.error: type[StreamingError] = UnavailableError
        self._heal: tuple[bytes, Callable[[], bool]] | None = None
        real = RocksBackend.write

        def write(backend: RocksBackend, groups: list[Any], durable: bool) -> None:
            if self.down.is_set() and any(len(g.block) > 300 for g in groups):  # messages, not a lone tick
                heal = self._heal
                if heal is not None and heal[1]() and any(heal[0] in g.block for g in groups):
                    self.down.clear()
                else:
                    self.refused += 1
                    if self.refused == 1:
                        raise self.error("injected: the shared log does not answer")
                    raise UnavailableError("injected: the shared log does not answer")
            real(backend, groups, durable)

        monkeypatch.setattr(RocksBackend, "write", write)

    def heal_on(self, marker: bytes, ready: Callable[[], bool]) -> None:
        self._heal = (marker, ready)


@pytest.fixture
def outage(monkeypatch: pytest.MonkeyPatch, server_thread: ServerThread) -> Iterator[_Outage]:
    server_thread.node.manager._committer.hold_unavailable_seconds = HOLD
    yield _Outage(monkeypatch)


@pytest.fixture
async def client(server: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server, timeout=10.0, reconnect_timeout=120.0) as c:
        await c.create_channels(["p"])
        yield c


def _payloads(n: int, start: int = 0) -> list[bytes]:
    # Random bytes: a block of them stays over the outage's size filter whatever the codec does.
    return [f"m{i:05d}".encode() + random.Random(i).randbytes(120) for i in range(start, start + n)]


@pytest.mark.parametrize("error", [UnavailableError, DeadlineExceededError])
async def test_an_idempotent_producer_keeps_its_sends_through_an_outage_and_delivers_them_once(
        client: AsyncClient, outage: _Outage, error: type[StreamingError]) -> None:
    outage.error = error
    before = _payloads(50)
    during = _payloads(300, start=50)
    async with client.producer("p", producer_id=f"outage-{error.__name__}", max_batch_messages=50) as producer:
        async with asyncio.timeout(30):
            await asyncio.gather(*(producer.send_nowait("v", p) for p in before))
        # The log comes back once the producer has left two streams whose batches were all refused,
        # at a resend of its first unwritten batch.
        outage.heal_on(during[0][:6], lambda: producer.reconnects >= 2)
        outage.down.set()
        futures = [producer.send_nowait("v", p) for p in during]
        async with asyncio.timeout(60):
            outcomes = await asyncio.gather(*futures, return_exceptions=True)
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        assert failed == [], f"{len(failed)} sends failed during the outage: {failed[:2]}"
        assert outage.refused >= 2 and producer.reconnects >= 2
    ids = [r.message_id for r in outcomes if not isinstance(r, BaseException)]
    assert ids == sorted(set(ids)), "acknowledged out of order or twice"
    async with client.producer("p") as plain:
        await plain.send("v", b"END")
    async with client.consumer("p", "v") as consumer:
        got = await read_until(consumer, b"END", timeout=30)
    assert data_of(got) == [*before, *during, b"END"], "a send lost, duplicated or reordered"


async def test_a_write_given_up_takes_the_batches_queued_behind_it_along_and_all_land_in_order(
        client: AsyncClient, outage: _Outage) -> None:
    # The node gives up on the first batch while the next ones are queued behind it. They fail with
    # it, so none can be stored ahead of it when the log comes back, and the idempotent producer
    # resends them all in order. Before, the queued ones got a fresh hold, the log came back under
    # them, and the first batch could only fail.
    first, rest = _payloads(50), _payloads(250, start=50)
    async with client.producer("p", producer_id="overtaken", max_batch_messages=50) as producer:
        await producer.send("v", b"start")
        given_up = asyncio.Event()  # the node gave a write up: the producer holds what it answered

        async def watch() -> None:
            while not producer._sender.held:
                await asyncio.sleep(0.005)
            given_up.set()
        watcher = asyncio.ensure_future(watch())
        outage.heal_on(first[0][:6], given_up.is_set)  # back for the first batch's resend
        outage.down.set()
        futures = [producer.send_nowait("v", p) for p in [*first, *rest]]
        async with asyncio.timeout(60):
            outcomes = await asyncio.gather(*futures, return_exceptions=True)
        await watcher
    assert not any(isinstance(o, BaseException) for o in outcomes), [o for o in outcomes if o is not None][:2]
    async with client.producer("p") as plain:
        await plain.send("v", b"END")
    async with client.consumer("p", "v") as consumer:
        got = await read_until(consumer, b"END", timeout=30)
    assert data_of(got) == [b"start", *first, *rest, b"END"]


async def test_a_producer_without_an_id_fails_a_batch_of_unknown_fate_at_once(
        client: AsyncClient, outage: _Outage) -> None:
    outage.error = DeadlineExceededError
    async with client.producer("p", max_batch_messages=50) as producer:
        await producer.send("v", b"first")
        outage.down.set()
        futures = [producer.send_nowait("v", p) for p in _payloads(50)]
        async with asyncio.timeout(60):
            outcomes = await asyncio.gather(*futures, return_exceptions=True)
        assert all(isinstance(o, DeadlineExceededError) for o in outcomes), outcomes[:3]
        assert outage.refused == 1  # not sent again: it might have been stored
        outage.down.clear()
        await producer.send("v", b"after")  # the producer itself goes on


async def test_an_outage_longer_than_reconnect_timeout_fails_what_the_producer_holds(
        server: str, outage: _Outage) -> None:
    async with AsyncClient(server, timeout=10.0, reconnect_timeout=1.0) as client:
        await client.create_channels(["p"])
        async with client.producer("p", producer_id="short-patience", max_batch_messages=50) as producer:
            await producer.send("v", b"first")
            outage.down.set()
            futures = [producer.send_nowait("v", p) for p in _payloads(100)]
            async with asyncio.timeout(60):
                outcomes = await asyncio.gather(*futures, return_exceptions=True)
            assert all(isinstance(o, StreamingError) and o.code is ErrorCode.UNAVAILABLE for o in outcomes), \
                outcomes[:3]
            assert outage.refused >= 2, "given up without resending"
            assert producer.buffered_bytes == 0
