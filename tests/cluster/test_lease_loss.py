"""A node whose lease goes stops serving, and nothing of it keeps writing for the pchannel.

- Cut off from NATS (the server stopped: no renewal can land, and no NATS read can tell the node that
  another one took over), the holder refuses appends from the moment its lease may have run out on
  its own monotonic clock, less the margin for clock rates, with the NOT_OWNER code clients reroute on;
  nothing it was sent then is in the log.
- A lease found taken by another node closes the pchannel: its appends, its flusher and its
  retention stop, and the metrics say so (the open-pchannels gauge, the closed-on-lease-loss counter).

Both run the node in-process on its own RocksDB log (``wal = "rocksdb"``): there nothing but the
node's own lease check stands between a stale holder and an acknowledged append.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import nats
import pytest

from flusher.flusher import FlusherState
from streamingnode.client import AsyncClient
from streamingnode.cluster.leases import Lease
from streamingnode.cluster.ownership import CLOCK_RATE_MARGIN
from streamingnode.server import ServerThread
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from streamingnode.wire.codes import from_rpc_error
from tests.cluster.conftest import start_cluster
from tests.integration.conftest import node_config
from tests.natscluster import NatsCluster
from tests.waiting import until
from wal.errors import ErrorCode
from wal.kv_key import encode_key
from wal.message import MessageType
from wal.wal import WALState

pytestmark = pytest.mark.integration

LEASE = 2.0


@pytest.fixture
def nats_own(tmp_path: Path) -> Iterator[NatsCluster]:
    """A NATS server of this test alone: the test stops it."""
    cluster = start_cluster(tmp_path / "nats", 1)
    yield cluster
    cluster.stop()


def _config(root: Path, url: str, **overrides: Any) -> Any:
    base: dict[str, Any] = {"cluster_nats": url, "node_id": "a", "lease_seconds": LEASE, "cluster_prefix": "c",
                            "channels": ("p0",)}
    return node_config(root, **{**base, **overrides})


def _data(payload: bytes) -> pb.Message:
    return pb.Message(type=pb.MESSAGE_TYPE_DATA, vchannel="v", payload=payload)


async def _produce_once(address: str, pchannel: str, payload: bytes) -> str:
    """One batch on a fresh Produce stream: 'appended', or the error code's name it was refused with."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = sgrpc.StreamingNodeStub(channel).Produce()
        try:
            await call.write(spb.ProduceRequest(open=spb.ProduceOpen(pchannel=pchannel)))
            if await call.read() is grpc.aio.EOF:
                await call.code()
                return "EOF"
            await call.write(spb.ProduceRequest(batch=spb.ProduceBatch(request_id=1, messages=[_data(payload)])))
            await call.done_writing()
            resp = await call.read()
        except grpc.aio.AioRpcError as exc:
            return from_rpc_error(exc).code.name
    assert resp is not grpc.aio.EOF and resp.WhichOneof("response") == "result", resp
    result = resp.result
    return "appended" if result.WhichOneof("outcome") == "appended" else \
        pb.ErrorCode.Name(result.error.code).removeprefix("ERROR_CODE_")


async def _taken_by_another_node(url: str, prefix: str) -> None:
    """Write into the leases bucket that node "b" holds p0 now, one term up, for ten minutes."""
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(f"{prefix}_leases")
        entry = await kv.get(encode_key("p0"))
        mine = Lease.decode("p0", entry.value, entry.revision or 0)
        theirs = Lease("p0", "b", "127.0.0.1:1", mine.term + 1, mine.expires_ms + 600_000, serving=True)
        await kv.put(encode_key("p0"), theirs.encode())
    finally:
        await nc.close()


async def _payloads(address: str, pchannel: str, last: bytes) -> list[bytes]:
    seen: list[bytes] = []
    async with AsyncClient(address, reconnect_timeout=30) as client, client.consumer(pchannel, "v") as consumer:
        async for pack in consumer:
            seen += [bytes(m.payload) for m in pack.messages if m.message_type is MessageType.DATA]
            if last in seen:
                return seen
    return seen


async def test_a_holder_cut_off_from_nats_refuses_appends_before_its_lease_can_have_expired_anywhere(
    nats_own: NatsCluster, tmp_path: Path,
) -> None:
    srv = ServerThread(_config(tmp_path / "a", nats_own.url, flusher=False)).start()
    try:
        own = srv.node.ownership
        assert own is not None
        # Every renewal's send time and whether it landed, as the node's loop sends them.
        renewals: list[tuple[float, bool]] = []
        in_flight = [0]
        renew = own.leases.renew

        async def recorded(current: Lease, term: int | None = None, *, serving: bool = True) -> Lease | None:
            sent = time.monotonic()
            in_flight[0] += 1
            try:
                out = await renew(current, term, serving=serving)
            except BaseException:
                renewals.append((sent, False))
                raise
            finally:
                in_flight[0] -= 1
            renewals.append((sent, out is not None))
            return out
        own.leases.renew = recorded  # type: ignore[method-assign]

        assert await _produce_once(srv.address, "p0", b"before") == "appended"
        await until(lambda: any(ok for _, ok in renewals), "a renewal of the lease to land", timeout=30)
        nats_own.kill(0)  # the node is cut off from NATS; its clients still reach it
        cut = time.monotonic()
        # None sent after the cut can land; once none sent before it is still waiting, the last landed.
        await until(lambda: in_flight[0] == 0, "the renewals sent before the cut to end", timeout=30)
        last = max(sent for sent, ok in renewals if ok)
        assert last < cut
        # From here a contender whose clock runs up to CLOCK_RATE_MARGIN faster may see the lease
        # expired: measured on the holder's own clock (this process's monotonic clock is the node's).
        may_have_expired = last + LEASE * (1 - CLOCK_RATE_MARGIN)
        await until(lambda: time.monotonic() >= may_have_expired, "the lease to run out on the holder's clock",
                    timeout=30)
        assert await _produce_once(srv.address, "p0", b"late") == ErrorCode.NOT_OWNER.name

        # NATS back: the node takes its lease again (a new term) and serves; nothing sent late is stored.
        nats_own.start(0)
        await nats_own.ready()

        async def served() -> bool:
            return await _produce_once(srv.address, "p0", b"END") == "appended"
        await until(served, "the node to serve p0 again once NATS is back", timeout=60)
        seen = await asyncio.wait_for(_payloads(srv.address, "p0", b"END"), 60)
        assert b"before" in seen and b"late" not in seen, seen
    finally:
        srv.stop()


async def test_a_lease_taken_by_another_node_closes_the_pchannel_its_flusher_and_says_so_in_the_metrics(
    nats_r1: NatsCluster, tmp_path: Path,
) -> None:
    srv = ServerThread(_config(tmp_path / "a", nats_r1.url, cluster_prefix="loss")).start()
    try:
        node = srv.node
        own = node.ownership
        assert own is not None
        metrics = node.metrics.registry

        async def channel() -> Any:
            return node.channel("p0")
        served = srv.run(channel())
        assert served.flusher is not None and served.flusher.state is FlusherState.RUNNING
        assert metrics.get_sample_value("streamingnode_pchannels") == 1
        assert await _produce_once(srv.address, "p0", b"before") == "appended"

        # Another node holds the lease now (as after a partition that outlived it): written into KV.
        await _taken_by_another_node(nats_r1.url, "loss")

        def closed_counted() -> bool:
            value = metrics.get_sample_value("streamingnode_pchannels_closed_on_lease_loss_total",
                                             {"pchannel": "p0", "reason": "lost"})
            return value == 1
        await until(closed_counted, "the pchannel counted as closed on lease loss", timeout=30)
        # Closed for real: the flusher stopped reading and writing, the WAL takes no append.
        assert served.flusher.state is FlusherState.CLOSED
        assert served.stream.wal.state is WALState.CLOSED
        assert metrics.get_sample_value("streamingnode_pchannels") == 0
        assert metrics.get_sample_value("streamingnode_pchannel_closing", {"pchannel": "p0"}) is None
        assert metrics.get_sample_value("streamingnode_pchannel_owned", {"pchannel": "p0"}) == 0
        assert await _produce_once(srv.address, "p0", b"after") == ErrorCode.NOT_OWNER.name
    finally:
        srv.stop()


async def test_a_node_stopped_while_nats_is_down_closes_its_pchannels_and_its_log(
    nats_own: NatsCluster, tmp_path: Path,
) -> None:
    srv = ServerThread(_config(tmp_path / "a", nats_own.url, flusher=False)).start()
    node = srv.node
    assert await _produce_once(srv.address, "p0", b"before") == "appended"
    nats_own.kill(0)
    srv.stop()  # its NATS connection cannot flush what it holds: the stop goes on all the same
    assert node.channel_names() == []
    assert node.manager.state.name == "CLOSED"


async def test_a_produce_stream_opened_while_the_lease_held_is_refused_once_it_went(
    nats_r1: NatsCluster, tmp_path: Path,
) -> None:
    """The lease is checked per batch, not only when a stream opens: a stream opened while the node
    held the lease gets NOT_OWNER for a batch sent after the lease went, even while the pchannel's
    close has not begun (held back here), and nothing of that batch is stored."""
    srv = ServerThread(_config(tmp_path / "a", nats_r1.url, cluster_prefix="perbatch", flusher=False)).start()
    release = threading.Event()
    try:
        node = srv.node
        own = node.ownership
        assert own is not None
        on_lose = own._on_lose

        async def held_back(name: str, reason: str) -> None:
            await asyncio.to_thread(release.wait, 60)
            await on_lose(name, reason)
        own._on_lose = held_back  # type: ignore[method-assign]

        async with grpc.aio.insecure_channel(srv.address) as channel:
            call = sgrpc.StreamingNodeStub(channel).Produce()
            await call.write(spb.ProduceRequest(open=spb.ProduceOpen(pchannel="p0")))
            assert (await call.read()).WhichOneof("response") == "opened"

            async def send(rid: int, payload: bytes) -> str:
                await call.write(spb.ProduceRequest(batch=spb.ProduceBatch(request_id=rid, messages=[_data(payload)])))
                resp = await call.read()
                assert resp is not grpc.aio.EOF and resp.WhichOneof("response") == "result", resp
                outcome = resp.result
                return "appended" if outcome.WhichOneof("outcome") == "appended" else \
                    pb.ErrorCode.Name(outcome.error.code).removeprefix("ERROR_CODE_")

            assert await send(1, b"before") == "appended"
            # Another node holds the lease now: written into KV, as after a partition that outlived it.
            await _taken_by_another_node(nats_r1.url, "perbatch")
            await until(lambda: not own.serves("p0"), "the node to see the lease gone", timeout=30)
            served = srv.run(_served(node))
            assert served.stream.wal.state is WALState.RUNNING  # the close is held back: only the check stands
            assert await send(2, b"late") == ErrorCode.NOT_OWNER.name
            call.cancel()
        stored = srv.run(_stored(served))
        assert b"before" in stored and b"late" not in stored, stored
    finally:
        release.set()
        srv.stop()


async def _served(node: Any) -> Any:
    return node._channels["p0"]


async def _stored(channel: Any) -> list[bytes]:
    """The DATA payloads in p0's log, as its WAL holds them in memory (the whole of this short log)."""
    wal = channel.stream.wal
    cached = wal.read_cached(wal.first_id, 1 << 20)
    assert cached is not None
    return [bytes(m.payload) for m in cached if m.message_type is MessageType.DATA]
