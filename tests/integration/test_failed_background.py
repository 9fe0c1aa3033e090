"""Damage met by a pchannel's background work moves it to FAILED, as damage met by a call does.

The flusher and retention read the WAL on their own (the flusher from its checkpoint, retention's
shadow replays for the truncation and the periodic recovery snapshots).  When such a read meets a
damaged block, the pchannel goes to FAILED (DescribeChannels, the metric, one error line), calls on it
are refused (DATA_LOSS), and every other pchannel keeps serving.  A damaged recovery snapshot is not
damage to the log: retention passes over it, as recovery does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import structlog

from interceptors.recovery.snapshot import SNAPSHOT_META, load_snapshot
from streamingnode.client import AsyncClient
from streamingnode.config import NodeConfig
from streamingnode.server import ServerThread
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc
from tests.integration.conftest import node_config
from tests.integration.rpc_helpers import consume, data, payloads, produce
from tests.integration.test_failed_pchannel import _damage, _failed_gauge, _fill, _only
from tests.waiting import until
from wal.errors import ErrorCode

pytestmark = pytest.mark.integration

FAILED_WHILE_SERVING = "pchannel failed while serving: its storage is damaged"


class _Node:
    """A running node and the log lines captured since it started."""

    def __init__(self, config: NodeConfig) -> None:
        self.capture = structlog.testing.capture_logs()
        self.logs: list[dict[str, Any]] = self.capture.__enter__()
        self.srv = ServerThread(config).start()

    def close(self) -> None:
        try:
            self.srv.stop()
        finally:
            self.capture.__exit__(None, None, None)

    def events(self, level: str, pchannel: str = "bad") -> list[dict[str, Any]]:
        return [e for e in self.logs if e["log_level"] == level and e.get("pchannel") == pchannel]


@pytest.fixture
def damaged_behind(tmp_path: Path) -> Path:
    """A data directory with pchannels "bad" and "good" (20 messages each, in separate blocks, and a
    recovery snapshot at their end), and block 1 of "bad" damaged.  The node opens it (recovery
    replays from the snapshot, never reading block 1): only a read from the start meets the damage."""
    data_dir = tmp_path / "data"
    _fill(data_dir)
    asyncio.run(_damage(data_dir, "bad", 1))
    return data_dir


@pytest.fixture
def running() -> Iterator[list[_Node]]:
    """Nodes started by a test, stopped after it (each with its captured logs)."""
    nodes: list[_Node] = []
    yield nodes
    for node in nodes:
        node.close()


async def _is_failed(srv: ServerThread, name: str) -> bool:
    async with AsyncClient(srv.address) as client:
        return _only(await client.describe_channels([name]), name).failed


async def _failed_alone(node: _Node, stopped: str, *, kept: bool = True) -> None:
    """pchannel "bad" goes FAILED on its own (the background task logged ``stopped``), and only it."""
    srv = node.srv
    await until(lambda: _is_failed(srv, "bad"), "pchannel 'bad' FAILED", timeout=30)
    async with AsyncClient(srv.address) as client:
        described = await client.describe_channels()
    bad, good = _only(described, "bad"), _only(described, "good")
    assert bad.state == "failed" and bad.failure_code is ErrorCode.CORRUPTED, bad
    assert bad.failure.startswith("CORRUPTED: ") and "of pchannel 'bad' is damaged" in bad.failure, bad.failure
    assert good.state == "serving" and not good.failed, good
    assert _failed_gauge(srv) == {"bad": 1.0, "good": 0.0}

    # One error line names it (the node's); the task that met the damage says so as a warning.
    errors = node.events("error")
    assert [e["event"] for e in errors] == [FAILED_WHILE_SERVING], errors
    assert errors[0]["code"] == "CORRUPTED" and "of pchannel 'bad' is damaged" in errors[0]["error"]
    assert stopped in [e["event"] for e in node.events("warning")]

    # Its channel closes in the background, flusher and retention with it.
    await until(lambda: all(t.done() for t in srv.node._closers.values()), "the failed channel closed")
    # ... whole: the stopped task's error does not stop the close half-way (its WAL left open).
    assert "closing the failed pchannel failed" not in [e["event"] for e in node.events("warning")]
    async with grpc.aio.insecure_channel(srv.address) as ch:
        stub = streaming_pb2_grpc.StreamingNodeStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await produce(stub, "bad", [[data("v", b"x")]])
        assert info.value.code() is grpc.StatusCode.DATA_LOSS
        assert "pchannel 'bad' is FAILED" in (info.value.details() or "")

        # The other pchannel serves: what is written now (what it held before too, unless its own
        # retention truncated it).
        _, results = await produce(stub, "good", [[data("v", b"after")]])
        after = results[0].appended.results[0].id
        got = await consume(stub, spb.ConsumeOpen(pchannel="good", vchannel="v",
                                                  policy=pb.DeliverPolicy(start_from=after)), until=1)
        assert payloads(got) == [b"after"]
        if kept:
            got = await consume(stub, spb.ConsumeOpen(pchannel="good", vchannel="v"), until=21)
            assert payloads(got) == [f"good{i}".encode() for i in range(20)] + [b"after"]


async def test_the_flusher_meeting_a_damaged_block_fails_its_pchannel(
    damaged_behind: Path, running: list[_Node], tmp_path: Path,
) -> None:
    # The flusher has no checkpoint yet: it reads "bad" from its first message and meets block 1.
    node = _Node(node_config(damaged_behind, parquet_dir=tmp_path / "parquet", retention_seconds=-1))
    running.append(node)
    await _failed_alone(node, "flusher stopped: the WAL it reads is damaged")
    # The flusher of the other pchannel is still reading.
    assert node.srv.node.channel("good").flusher is not None
    assert node.srv.node.channel("good").flusher.state.value == "running"  # type: ignore[union-attr]


async def test_retention_meeting_a_damaged_block_fails_its_pchannel(
    damaged_behind: Path, running: list[_Node],
) -> None:
    # Everything may go (no flusher, no groups, no time floor): the truncation's shadow replay reads
    # "bad" from its first message up to the cut and meets block 1.
    node = _Node(node_config(damaged_behind, flusher=False, retention_seconds=0, retention_check_seconds=0.1))
    running.append(node)
    await _failed_alone(node, "retention stopped: the WAL it reads is damaged", kept=False)


async def test_the_snapshot_replay_meeting_a_damaged_block_fails_its_pchannel(
    tmp_path: Path, running: list[_Node],
) -> None:
    """The periodic snapshots' shadow replay follows the log: a block written now that reads back
    damaged (the disk returns other bytes than were written) stops it.  The replay takes what the
    WAL's in-memory tail holds from there, so the tail here holds nothing (a 1-byte budget evicts
    every commit): the replay reads the block from storage, as it does once the tail moved on."""
    data_dir = tmp_path / "data"
    await asyncio.to_thread(_fill, data_dir)
    node = _Node(node_config(data_dir, flusher=False, retention_seconds=-1, snapshot_every_messages=1,
                             tail_buffer_bytes=1))
    running.append(node)
    srv = node.srv
    backend = srv.node.manager.backend
    bad_key = srv.run(srv.node.manager.describe_channel("bad")).key
    mark = srv.node.channel("bad").stream.wal.next_id
    real = backend.read_blocks

    def read_blocks(channel_key: int, from_id: int, max_bytes: int) -> list[tuple[int, bytes]]:
        # Blocks of "bad" written from here on come back with a flipped byte; the WAL's own checksum
        # check finds it (the trigger is the only thing faked).
        blocks = real(channel_key, from_id, max_bytes)
        if channel_key != bad_key:
            return blocks
        return [(first, _flipped(block) if first >= mark else block) for first, block in blocks]

    backend.read_blocks = read_blocks  # type: ignore[method-assign]
    try:
        async with grpc.aio.insecure_channel(srv.address) as ch:
            await produce(streaming_pb2_grpc.StreamingNodeStub(ch), "bad", [[data("v", b"damaged on read")]])
        await _failed_alone(node, "recovery snapshots stopped: the WAL they read is damaged")
    finally:
        backend.read_blocks = real  # type: ignore[method-assign]


def _flipped(block: bytes) -> bytes:
    damaged = bytearray(block)
    damaged[-3] ^= 0x5A  # inside the block's body: its checksum no longer matches
    return bytes(damaged)


async def test_a_damaged_truncation_snapshot_does_not_fail_the_pchannel(tmp_path: Path, running: list[_Node]) -> None:
    """The snapshot retention stored with its last truncation is damaged: the log is not, so the
    pchannel keeps serving (retention truncates nothing more while it stays damaged, and says so)."""
    node = _Node(node_config(tmp_path / "data", channels=("bad", "good"), flusher=False, retention_seconds=0,
                             retention_check_seconds=0.05))
    running.append(node)
    srv = node.srv
    wal = srv.node.channel("bad").stream.wal
    retention = srv.node.channel("bad").retention
    assert retention is not None
    async with grpc.aio.insecure_channel(srv.address) as ch:
        stub = streaming_pb2_grpc.StreamingNodeStub(ch)
        await produce(stub, "bad", [[data("v", f"m{i}".encode())] for i in range(5)])
        await until(lambda: retention.stats().truncations > 0, "a first truncation")
        assert srv.run(load_snapshot(wal)) is not None

        async def damage() -> None:
            await wal.put_meta(SNAPSHOT_META, b"{not a snapshot")

        srv.run(damage())
        await produce(stub, "bad", [[data("v", f"n{i}".encode())] for i in range(5)])
        checks = retention.stats().checks
        await until(lambda: retention.stats().checks >= checks + 3, "three retention checks past the damage")
        assert not await _is_failed(srv, "bad")
        _, results = await produce(stub, "bad", [[data("v", b"still serving")]])
        assert results[0].WhichOneof("outcome") == "appended"
    assert not node.events("error")
    assert "retention: the truncation snapshot is damaged, nothing is truncated" in [
        e["event"] for e in node.events("warning")]
