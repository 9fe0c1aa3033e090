"""The lean path of a lone append: what it skips, and the rules it keeps.

A produce stream hands a batch without transactions straight to the chain (``start_append``: the
chain's own future, no task around it); the SDK sends a lone message at linger 0 at once instead of
one loop turn later.  Kept: the batch is observed (metrics) once, a batch inside the chain runs to
its end whoever stops waiting for it, recovery is waited for (and a caller cancelled while waiting
appends nothing), transactions take the path that rolls back one grown too large, and messages sent
while one is in flight still share a batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from interceptors.recovery.streaming_wal import ChainConfig, StreamingWAL, open_streaming_wal
from streamingnode.client import AsyncClient
from streamingnode.server import ServerThread
from streamingnode.server.produce import ProduceStream
from tests.factories import data
from tests.integration.conftest import node_config
from tests.waiting import until
from wal import AppendResult, Message, WALManager
from wal.adaptor import WALAdaptor
from wal.message import TxnContext, payload_bytes


async def _open(manager: WALManager) -> StreamingWAL:
    await manager.create_channel("p")
    swal = await open_streaming_wal(manager, "p", ChainConfig(tick_interval=0.05))
    await swal.ready()
    ready = swal.adaptor._ready_task  # the adaptor learns of it one loop turn later
    assert ready is not None
    await until(ready.done, "the adaptor ready")
    return swal


class _GatedChain:
    """A chain whose readiness and whose appends each wait for a gate the test opens."""

    def __init__(self) -> None:
        self.recovered = asyncio.Event()
        self.release = asyncio.Event()
        self.entered: list[list[Message]] = []

    async def ready(self) -> None:
        await self.recovered.wait()

    async def close(self) -> None:
        return None

    async def __call__(self, batch: list[Message]) -> list[AppendResult]:
        self.entered.append(batch)
        await self.release.wait()
        return [AppendResult(i, 100 + i, None) for i in range(len(batch))]


async def _gated(manager: WALManager) -> tuple[WALAdaptor, _GatedChain]:
    await manager.create_channel("g")
    chain = _GatedChain()
    adaptor = WALAdaptor(await manager.open("g"), chain)
    adaptor.start()
    return adaptor, chain


async def test_a_lone_batch_goes_to_the_chain_directly_and_is_observed_once(manager: WALManager) -> None:
    swal = await _open(manager)
    observed: list[tuple[int, BaseException | None]] = []
    swal.adaptor.observer = lambda batch, _seconds, error, _nbytes: observed.append((len(batch), error))
    fut = swal.start_append([data("v", b"lone")])
    assert fut is not None, "a ready chain and no transaction: the lean path"
    (result,) = await asyncio.shield(fut)
    assert [m.payload for m in await swal.wal.read_stored(result.message_id)] == [b"lone"]
    await until(lambda: len(observed) == 1, "the batch observed")
    assert observed == [(1, None)]  # the metrics' observer: once per batch, as on the awaiting path
    await swal.aclose()


async def test_the_callers_payload_sum_reaches_the_observer(manager: WALManager) -> None:
    # The produce stream sums a batch's payload once and hands the sum on: the metrics observer
    # counts bytes from it instead of summing the batch again (None: the observer sums itself).
    swal = await _open(manager)
    observed: list[int | None] = []
    swal.adaptor.observer = lambda _batch, _seconds, _error, nbytes: observed.append(nbytes)
    batch = [data("v", b"abc"), data("v", b"defg")]
    fut = swal.start_append(batch, nbytes=payload_bytes(batch))
    assert fut is not None
    await asyncio.shield(fut)
    fut = swal.start_append([data("v", b"x")])
    assert fut is not None
    await asyncio.shield(fut)
    await until(lambda: len(observed) == 2, "both batches observed")
    assert observed == [7, None]
    await swal.aclose()


async def test_transactions_and_recovery_take_the_awaiting_path(manager: WALManager) -> None:
    swal = await _open(manager)
    body = data("v", b"in a txn").with_txn(TxnContext(1, 10_000))
    assert swal.start_append([body]) is None  # append_batch rolls back a txn grown too large first
    await swal.aclose()
    adaptor, chain = await _gated(manager)
    assert adaptor.start_append([data("v")]) is None  # still recovering
    chain.recovered.set()
    chain.release.set()
    assert len(await adaptor.append_batch([data("v")])) == 1
    await adaptor.aclose()


async def test_a_caller_cancelled_while_recovery_runs_appends_nothing(manager: WALManager) -> None:
    adaptor, chain = await _gated(manager)
    waiting = asyncio.ensure_future(adaptor.append_batch([data("v", b"never")]))
    await until(lambda: adaptor._ready_task is not None and not waiting.done(), "the append waiting")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    chain.recovered.set()
    chain.release.set()
    assert len(await adaptor.append_batch([data("v", b"after")])) == 1
    assert [[m.payload for m in b] for b in chain.entered] == [[b"after"]]
    await adaptor.aclose()


async def test_a_batch_in_the_chain_runs_to_its_end_when_its_waiter_is_cancelled(manager: WALManager) -> None:
    adaptor, chain = await _gated(manager)
    chain.recovered.set()
    ready = adaptor._ready_task
    assert ready is not None
    await until(ready.done, "the chain ready")
    fut = adaptor.start_append([data("v", b"kept")])
    assert fut is not None
    waiter = asyncio.ensure_future(asyncio.shield(fut))
    await until(lambda: len(chain.entered) == 1, "the batch in the chain")
    waiter.cancel()
    chain.release.set()
    assert len(await fut) == 1 and not fut.cancelled()
    await adaptor.aclose()


# --- the SDK ---------------------------------------------------------------------------------------
@pytest.fixture
def node(tmp_path: Path) -> Iterator[ServerThread]:
    srv = ServerThread(node_config(tmp_path / "data", channels=["p"]))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
async def client(node: ServerThread) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(node.address, timeout=10.0) as c:
        yield c


async def test_a_lone_send_at_linger_0_is_sealed_before_it_waits(client: AsyncClient) -> None:
    async with client.producer("p", linger=0) as producer:
        await producer.send("v", b"first")  # the stream is open; nothing is queued or in flight now
        call = producer.send("v", b"lone")
        call.send(None)  # runs the call up to its wait for the answer
        # Sealed already: no loop turn (and no timer) between the call and the batch going out.
        assert not producer._accumulator.has_open and not producer._accumulator.lingering
        assert len(producer._accumulator.sealed) + len(producer._sender.in_flight) == 1
        call.close()
        await producer.flush()
        assert producer.batches_written == 2


async def test_sends_made_while_one_is_in_flight_still_share_a_batch(client: AsyncClient) -> None:
    async with client.producer("p", linger=0) as producer:
        results = await asyncio.gather(*(producer.send("v", b"m%03d" % i) for i in range(60)))
        # The first goes alone at once; the rest gather behind it.
        assert producer.batches_written <= 6, producer.batches_written
    ids = [r.message_id for r in results]
    assert ids == sorted(ids) and len(set(ids)) == 60


async def test_a_produce_stream_cancelled_while_its_batch_is_in_the_chain_leaves_the_batch_to_finish(
    manager: WALManager,
) -> None:
    adaptor, chain = await _gated(manager)
    chain.recovered.set()
    ready = adaptor._ready_task
    assert ready is not None
    await until(ready.done, "the chain ready")
    fut = adaptor.start_append([data("v", b"kept")])
    assert fut is not None
    node = SimpleNamespace(config=SimpleNamespace(produce_max_in_flight=4, produce_max_in_flight_bytes=1 << 20))
    stream = ProduceStream(node, SimpleNamespace())  # type: ignore[arg-type]
    await stream.slots.acquire()
    stream.pending.append((1, fut, True, True, 4))  # as the reader leaves a batch on the lean path
    stream.wake.set()
    writer = asyncio.ensure_future(stream._write_results())
    await until(lambda: len(chain.entered) == 1 and not stream.pending, "the writer waiting on the batch")
    writer.cancel()  # the call went away: its writer is cancelled
    with pytest.raises(asyncio.CancelledError):
        await writer
    chain.release.set()
    assert len(await fut) == 1 and not fut.cancelled()  # not cut in half
    await adaptor.aclose()
