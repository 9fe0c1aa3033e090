"""Fencing of a paused owner on the shared log: a node SIGSTOPped past its lease, whose pchannel another
node took over, can store nothing once it wakes up (no appends, no flusher checkpoint, no Parquet file),
and stops serving the pchannel, pointing its callers at the new owner."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import nats.js.errors
import pyarrow as pa
import pytest

from streamingnode.client import AsyncClient
from streamingnode.cluster.ownership import preferred
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from streamingnode.wire.codes import from_rpc_error
from tests.cluster.conftest import owner_seen_by
from tests.natscluster import NatsCluster
from tests.node_process import NodeProcess
from tests.waiting import until
from wal.backends.jetstream import JetStreamBackend
from wal.errors import ErrorCode, StreamingError
from wal.kv_key import encode_key
from wal.message import MessageType

pytestmark = pytest.mark.integration

LEASE = 2.0
SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), ("name", pa.string())])
_REFUSED = ("ERROR_CODE_CHANNEL_FENCED", "ERROR_CODE_NOT_OWNER")
_prefixes = itertools.count()


class Pair:
    """Node ``a`` (with a flusher) and node ``b`` (without: any Parquet file or flusher checkpoint that
    changes once ``b`` owns the pchannel can only be ``a``'s) on one shared log and Parquet root."""

    def __init__(self, nats_r1: NatsCluster, root: Path) -> None:
        self.prefix = f"f{next(_prefixes)}"
        self.url = nats_r1.url
        self.parquet = root / "parquet"
        common = ("--wal", "jetstream", "--nats", nats_r1.url, "--nats-replicas", "1", "--cluster-prefix", self.prefix,
                  "--lease-seconds", str(LEASE), "--drain-seconds", "1", "--parquet-root", str(self.parquet))
        no_flusher = {**os.environ, "STREAMINGNODE_FLUSHER": "false"}
        self.a = NodeProcess(root / "a", None, "--node-id", "a", *common)
        self.b = NodeProcess(root / "b", None, "--node-id", "b", *common, env=no_flusher)

    def close(self) -> None:
        for proc in (self.a, self.b):
            if proc.proc is not None and proc.proc.poll() is None:
                proc.proc.send_signal(signal.SIGCONT)
            proc.kill()


@pytest.fixture
def pair(nats_r1: NatsCluster, tmp_path: Path) -> Iterator[Pair]:
    nodes = Pair(nats_r1, tmp_path)
    try:
        yield nodes
    finally:
        nodes.close()


def _files(root: Path) -> dict[str, tuple[int, int]]:
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*") if p.is_file()}


def _checkpoint_revision(url: str, prefix: str, pchannel: str) -> int:
    """The KV revision of the flusher's checkpoint of ``pchannel`` (0: none stored)."""
    backend = JetStreamBackend(url, prefix=prefix, timeout=5.0)
    try:
        key = backend.describe_channel(pchannel).key
        meta = f"c.{key}.{encode_key('flusher_checkpoint')}"

        async def revision() -> int:
            try:
                return int((await backend._kv_meta.get(meta)).revision)
            except nats.js.errors.NotFoundError:
                return 0

        return backend._call(revision(), what="reading the checkpoint's revision")
    finally:
        backend.close()


def _data(payload: bytes) -> pb.Message:
    return pb.Message(type=pb.MESSAGE_TYPE_DATA, vchannel="v", payload=payload)


async def _outcomes(call: grpc.aio.StreamStreamCall) -> list[str]:
    """Read a produce stream to its end: each batch's outcome ('appended' or its error code's name),
    then the call's own error code if it ended with one."""
    out: list[str] = []
    try:
        while (resp := await call.read()) is not grpc.aio.EOF:
            if resp.WhichOneof("response") == "result":
                r = resp.result
                out.append("appended" if r.WhichOneof("outcome") == "appended" else pb.ErrorCode.Name(r.error.code))
    except grpc.aio.AioRpcError as exc:
        out.append(f"ERROR_CODE_{from_rpc_error(exc).code.name}")
    return out


async def test_a_paused_owner_woken_after_a_takeover_stores_nothing_and_stops_serving(pair: Pair) -> None:
    p = next(f"p{i}" for i in itertools.count() if preferred(f"p{i}", ["a", "b"]) == "a")
    await asyncio.gather(asyncio.to_thread(pair.a.start), asyncio.to_thread(pair.b.start))
    a, b = pair.a.address, pair.b.address
    assert pair.a.proc is not None

    async def owned_by(address: str) -> bool:
        return await owner_seen_by(b, p) == address  # asked of b: a may be stopped

    async with AsyncClient([a, b], reconnect_timeout=30) as client:
        await client.create_channels([p])
        await until(lambda: owned_by(a), "node a to own the pchannel", timeout=30)
        data = client.data(p)
        await data.create_collection("v", "users", SCHEMA, primary_key="pk")
        await data.insert("v", "users", pa.table({"pk": [1, 2], "name": ["x", "y"]}, schema=SCHEMA))
        files, _ = await data.flush("v")
        assert files  # a's flusher wrote a file, and checkpoints past it
        await data.insert("v", "users", pa.table({"pk": [3], "name": ["z"]}, schema=SCHEMA))  # buffered at a
        await data.aclose()

        async with grpc.aio.insecure_channel(a) as channel:
            stub = sgrpc.StreamingNodeStub(channel)
            pending = stub.Produce()
            await pending.write(spb.ProduceRequest(open=spb.ProduceOpen(pchannel=p)))
            opened = await pending.read()
            assert opened is not grpc.aio.EOF and opened.WhichOneof("response") == "opened"
            os.kill(pair.a.proc.pid, signal.SIGSTOP)
            try:
                await until(lambda: owned_by(b), "node b to take the pchannel over", timeout=30)

                async def b_serves() -> bool:
                    # b names itself owner once it holds the lease, before its open (recovery) claimed
                    # the WAL's term: only then is a fenced.  An append through b proves the open done.
                    try:
                        async with AsyncClient(b, timeout=5, reconnect_timeout=2) as at_b, \
                                at_b.producer(p) as producer:
                            await producer.send("probe", b"b serves")
                    except StreamingError:
                        return False
                    return True

                await until(b_serves, "node b to serve the pchannel (its open fenced a)", timeout=30)
                checkpoint = await asyncio.to_thread(_checkpoint_revision, pair.url, pair.prefix, p)
                parquet = _files(pair.parquet)
                # Sent to the stopped owner after the takeover: pending in its socket until it wakes.
                for i in range(3):
                    batch = spb.ProduceBatch(request_id=i + 1, messages=[_data(f"stale-{i}".encode())])
                    await pending.write(spb.ProduceRequest(batch=batch))
                await pending.done_writing()
            finally:
                os.kill(pair.a.proc.pid, signal.SIGCONT)
            outcomes = await asyncio.wait_for(_outcomes(pending), 30)
            assert outcomes and all(o in _REFUSED for o in outcomes), outcomes

            # New appends to the woken node are refused too, until it answers NOT_OWNER naming b.
            sent = itertools.count()

            async def refused_naming_b() -> bool:
                call = stub.Produce()
                try:
                    # The batch only once the open is answered: a refused open ends the call, and a
                    # write racing with that end fails locally (INTERNAL), hiding the refusal.
                    await call.write(spb.ProduceRequest(open=spb.ProduceOpen(pchannel=p)))
                    if await call.read() is grpc.aio.EOF:
                        await call.code()
                        return False
                    batch = spb.ProduceBatch(request_id=1, messages=[_data(f"stale-new-{next(sent)}".encode())])
                    await call.write(spb.ProduceRequest(batch=batch))
                    await call.done_writing()
                except grpc.aio.AioRpcError as exc:
                    err = from_rpc_error(exc)
                    assert err.code in (ErrorCode.NOT_OWNER, ErrorCode.CHANNEL_FENCED), err
                    return err.code is ErrorCode.NOT_OWNER and err.fields.get("owner") == b
                got = await _outcomes(call)
                assert got and all(o in _REFUSED for o in got), got
                return False

            await until(refused_naming_b, "the woken node to refuse appends as NOT_OWNER naming b", timeout=30)

        # Nothing the woken node was sent is in the log; what the new owner appends is.
        async with client.producer(p) as producer:
            await producer.send("v", b"END")
        seen: list[bytes] = []
        async with AsyncClient(b) as at_b, at_b.consumer(p, "v") as consumer:
            async for pack in consumer:
                seen += [bytes(m.payload) for m in pack.messages if m.message_type is MessageType.DATA]
                if b"END" in seen:
                    break
        assert not [s for s in seen if s.startswith(b"stale")], seen
    # Its flusher stored no checkpoint and no file after the takeover (b runs none).
    assert await asyncio.to_thread(_checkpoint_revision, pair.url, pair.prefix, p) == checkpoint
    assert _files(pair.parquet) == parquet
