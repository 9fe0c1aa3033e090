"""A write the WAL backend cannot do for a moment (UNAVAILABLE: a NATS leader election in cluster mode,
a connection being re-established) is held by the node and written again, in order, ahead of the
appends queued behind it: the producer's batches are neither failed nor reordered (before, each
failed append was tried again on its own and a producer's pipelined batches landed out of order)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from interceptors.redo import RedoInterceptor
from streamingnode.client import AsyncClient
from streamingnode.server import ServerThread
from tests.integration.test_client import data_of, read_until
from wal.backends.rocks import RocksBackend
from wal.errors import ErrorCode, StreamingError, UnavailableError

pytestmark = pytest.mark.integration


class _Flaky:
    """Fails the backend writes numbered in ``failing`` (counting writes that carry DATA of pchannel
    ``p``) with UNAVAILABLE, before anything is written."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, failing: set[int]) -> None:
        self.failing = failing
        self.writes = 0
        self.failed = 0
        self._lock = threading.Lock()
        real = RocksBackend.write

        def write(backend: RocksBackend, groups: list[Any], durable: bool) -> None:
            with self._lock:
                if any(len(g.block) > 2000 for g in groups):  # a batch of messages, not a lone tick
                    self.writes += 1
                    if self.writes in self.failing:
                        self.failed += 1
                        raise UnavailableError("injected: the WAL backend is unavailable for a moment")
            real(backend, groups, durable)

        monkeypatch.setattr(RocksBackend, "write", write)


@pytest.fixture
async def client(server: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server, timeout=10.0, reconnect_timeout=10.0) as c:
        yield c


@pytest.fixture
def flaky(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Flaky]:
    yield _Flaky(monkeypatch, {3, 4, 9})


async def test_writes_the_backend_refuses_for_a_moment_are_held_and_land_exactly_once_in_order(
        client: AsyncClient, flaky: _Flaky) -> None:
    await client.create_channels(["p"])
    payloads = [f"m{i:05d}".encode() + bytes(100) for i in range(3000)]
    async with client.producer("p", producer_id="transient", max_batch_messages=100) as producer:
        futures = [producer.send_nowait("v", p) for p in payloads]
        async with asyncio.timeout(60):
            results = await asyncio.gather(*futures)
    assert flaky.failed == 3, "the injected failures did not happen: the test proves nothing"
    ids = [r.message_id for r in results]
    assert ids == sorted(set(ids)), "acknowledged out of order or twice"
    async with client.consumer("p", "v") as consumer:
        got = await read_until(consumer, payloads[-1], timeout=30)
    assert data_of(got) == payloads, "a message lost, duplicated or reordered"
    assert [m.message_id for m in got] == ids


async def test_a_write_unavailable_for_longer_than_the_hold_fails_and_is_not_retried_out_of_order(
        client: AsyncClient, server_thread: ServerThread, monkeypatch: pytest.MonkeyPatch) -> None:
    await client.create_channels(["p"])
    server_thread.node.manager._committer.hold_unavailable_seconds = 0.3
    flaky = _Flaky(monkeypatch, set(range(1, 10_000)))  # unavailable until further notice
    async with client.producer("p", producer_id="long-outage", max_batch_messages=100) as producer:
        futures = [producer.send_nowait("v", bytes(200)) for _ in range(300)]
        async with asyncio.timeout(60):
            outcomes = await asyncio.gather(*futures, return_exceptions=True)
    assert all(isinstance(o, StreamingError) and o.code is ErrorCode.UNAVAILABLE for o in outcomes), outcomes[:3]
    # The committer's retry hint stays inside the node: nothing of it in what the client is told.
    assert not any("held_seconds" in o.fields for o in outcomes if isinstance(o, StreamingError))
    assert flaky.failed >= 2
    [redo] = [i for i in server_thread.node.channel("p").stream.chain.interceptors if isinstance(i, RedoInterceptor)]
    assert redo.redos == 0, "appends the committer gave up on were tried again one by one (out of order)"
