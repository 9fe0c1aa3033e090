"""Damage is contained to its pchannel: the node starts and serves the others; the damaged one is
FAILED (DescribeChannels, the metric, one log line) and every call on it is refused with its cause's
code; destroying it works.  Also when the damage is met while serving (a consume reaching it)."""

from __future__ import annotations

import asyncio
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import rocksdict
import structlog
from prometheus_client.parser import text_string_to_metric_families

from streamingnode.client import AsyncClient, ChannelDescription, Client
from streamingnode.server import ServerThread
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc
from tests.integration.conftest import node_config
from tests.integration.rpc_helpers import consume, data, payloads, produce
from tests.waiting import until
from wal import WALManager
from wal.errors import ErrorCode

pytestmark = pytest.mark.integration


def status_of(exc: grpc.aio.AioRpcError) -> tuple[grpc.StatusCode, str]:
    """(gRPC code, message) of a failed call."""
    return exc.code(), exc.details() or ""


# --- damage ----------------------------------------------------------------------------------------
async def _channel_key(data_dir: Path, name: str) -> int:
    manager = await WALManager.start_rocksdb(data_dir)
    try:
        return (await manager.describe_channel(name)).key
    finally:
        await manager.aclose()


def _block_keys(db: rocksdict.Rdict, key: int) -> list[bytes]:
    """The stored block keys of the channel with ``key``, in id order."""
    prefix = b"D" + key.to_bytes(4, "big")
    it = db.iter()
    it.seek(prefix)
    out = []
    while it.valid() and it.key().startswith(prefix):
        out.append(it.key())
        it.next()
    del it
    return out


def _flip(db: rocksdict.Rdict, block: bytes) -> None:
    value = bytearray(db[block])
    value[-3] ^= 0x5A  # inside the block's body: its checksum no longer matches
    db.put(block, bytes(value))


async def _damage(data_dir: Path, name: str, which: int) -> None:
    """Flip a byte of pchannel ``name``'s stored block number ``which`` (-1: the last), offline."""
    key = await _channel_key(data_dir, name)
    db = rocksdict.Rdict(str(data_dir), options=rocksdict.Options(raw_mode=True))
    try:
        blocks = _block_keys(db, key)
        assert len(blocks) >= 3, blocks
        _flip(db, blocks[which])
        db.flush()
    finally:
        db.close()


# --- the node --------------------------------------------------------------------------------------
def _fill(data_dir: Path, rows: int = 20) -> None:
    """A node with pchannels "bad" and "good", each holding ``rows`` messages in separate blocks."""
    with ServerThread(node_config(data_dir, channels=("bad", "good"), flusher=False)) as srv:

        async def write() -> None:
            async with grpc.aio.insecure_channel(srv.address) as ch:
                stub = streaming_pb2_grpc.StreamingNodeStub(ch)
                for name in ("bad", "good"):
                    await produce(stub, name, [[data("v", f"{name}{i}".encode())] for i in range(rows)])

        asyncio.run(write())


@pytest.fixture
def damaged_at_open(tmp_path: Path) -> Iterator[ServerThread]:
    """A node whose pchannel "bad" cannot open (its last block is damaged), "good" intact."""
    data_dir = tmp_path / "data"
    _fill(data_dir)
    asyncio.run(_damage(data_dir, "bad", -1))
    with structlog.testing.capture_logs() as logs:
        srv = ServerThread(node_config(data_dir, flusher=False)).start()
    srv.logs = logs  # type: ignore[attr-defined]
    try:
        yield srv
    finally:
        srv.stop()


def test_a_node_starts_beside_a_pchannel_that_cannot_open(tmp_path: Path) -> None:
    """The start itself, in the test's body (the fixture above starts the node before the test runs, so a
    start that fails there shows only as a setup error)."""
    data_dir = tmp_path / "data"
    _fill(data_dir)
    asyncio.run(_damage(data_dir, "bad", -1))
    srv = ServerThread(node_config(data_dir, flusher=False))
    try:
        try:
            srv.start()
        except Exception as exc:
            raise AssertionError(f"the node did not start beside a damaged pchannel: {exc!r}") from None
        with Client(srv.address) as client:
            assert _only(client.describe_channels(["bad"]), "bad").state == "failed"
    finally:
        srv.stop()


def _failed_gauge(srv: ServerThread) -> dict[str, float]:
    assert srv.metrics_address is not None
    with urllib.request.urlopen(f"http://{srv.metrics_address}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {s.labels["pchannel"]: s.value for f in text_string_to_metric_families(text)
            if f.name == "streamingnode_pchannel_failed" for s in f.samples}


async def _refused_everywhere(stub: streaming_pb2_grpc.StreamingNodeStub, name: str) -> list[str]:
    """Every kind of call on pchannel ``name``: each must fail DATA_LOSS naming it; their messages."""
    calls = [
        lambda: produce(stub, name, [[data("v", b"x")]]),
        lambda: consume(stub, spb.ConsumeOpen(pchannel=name, vchannel="v"), until=1),
        lambda: stub.BeginTxn(spb.BeginTxnRequest(pchannel=name, vchannel="v")),
        lambda: stub.CommitTxn(spb.CommitTxnRequest(pchannel=name, vchannel="v", txn_id=1)),
        lambda: stub.CreateConsumerGroup(spb.CreateConsumerGroupRequest(pchannel=name, group="g")),
        lambda: stub.DescribeConsumerGroups(spb.DescribeConsumerGroupsRequest(pchannel=name)),
        lambda: stub.SeekConsumerGroup(spb.SeekConsumerGroupRequest(pchannel=name, group="g")),
        lambda: stub.Flush(spb.FlushRequest(pchannel=name, vchannel="v")),
        lambda: stub.GetLatestPosition(spb.GetLatestPositionRequest(pchannel=name)),
    ]
    messages = []
    for call in calls:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call()
        code, message = status_of(info.value)
        assert code is grpc.StatusCode.DATA_LOSS, (code, message)
        assert f"pchannel '{name}' is FAILED" in message and "CORRUPTED" in message, message
        messages.append(message)
    return messages


def _only(descriptions: list[ChannelDescription], name: str) -> ChannelDescription:
    (found,) = [d for d in descriptions if d.name == name]
    return found


def _journal_records_end(path: str) -> int:
    """Where a journal file's records end: the file is zero-written ahead of them, and a record
    never ends with a zero byte."""
    with open(path, "rb") as f:
        return len(f.read().rstrip(b"\0"))


async def test_a_pchannel_that_cannot_open_fails_alone(damaged_at_open: ServerThread) -> None:
    srv = damaged_at_open
    async with grpc.aio.insecure_channel(srv.address) as ch:
        # The node started and reports SERVING: it works, for the pchannels it can serve.
        from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: PLC0415

        health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING

        async with AsyncClient(srv.address) as client:
            described = await client.describe_channels()
        bad, good = _only(described, "bad"), _only(described, "good")
        assert good.state == "serving" and not good.failure and good.failure_code is None
        assert bad.state == "failed" and bad.failed and bad.failure_code is ErrorCode.CORRUPTED
        assert bad.failure.startswith("CORRUPTED: ") and "last block of pchannel 'bad'" in bad.failure, bad.failure
        assert len(bad.failure) < 400

        # The metric and exactly one error line name it.
        assert _failed_gauge(srv) == {"bad": 1.0, "good": 0.0}
        lines = [e for e in srv.logs if e["log_level"] == "error" and e.get("pchannel") == "bad"]  # type: ignore[attr-defined]
        assert len(lines) == 1 and lines[0]["code"] == "CORRUPTED", lines
        assert "last block of pchannel 'bad'" in lines[0]["error"]

        stub = streaming_pb2_grpc.StreamingNodeStub(ch)
        await _refused_everywhere(stub, "bad")

        # The other pchannel serves as before: what it held, and what is written now.
        await produce(stub, "good", [[data("v", b"after")]])
        got = await consume(stub, spb.ConsumeOpen(pchannel="good", vchannel="v"), until=21)
        assert payloads(got) == [f"good{i}".encode() for i in range(20)] + [b"after"]
        groups = await stub.DescribeConsumerGroups(spb.DescribeConsumerGroupsRequest())
        assert groups.groups == []  # across every pchannel: the failed one is skipped, not an error

        # An operator can drop it; afterwards the name is free again and the metric forgets it.
        await stub.DestroyChannels(spb.DestroyChannelsRequest(channel_names=["bad"]))
        assert _failed_gauge(srv) == {"good": 0.0}
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.GetLatestPosition(spb.GetLatestPositionRequest(pchannel="bad"))
        assert info.value.code() is grpc.StatusCode.NOT_FOUND
        await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["bad"]))
        await produce(stub, "bad", [[data("v", b"fresh")]])
        assert payloads(await consume(stub, spb.ConsumeOpen(pchannel="bad", vchannel="v"), until=1)) == [b"fresh"]


async def test_journal_damage_at_start_fails_only_the_pchannel_it_held(tmp_path: Path) -> None:
    import shutil  # noqa: PLC0415

    from wal.backends import _journal  # noqa: PLC0415

    live, image = tmp_path / "live", tmp_path / "image"
    # The image is taken while the node runs: what it acknowledged is in the journal, not in tables.
    with ServerThread(node_config(live, channels=("bad", "good"), flusher=False)) as srv:
        async with grpc.aio.insecure_channel(srv.address) as ch:
            stub = streaming_pb2_grpc.StreamingNodeStub(ch)
            for i in range(20):
                for name in ("bad", "good"):
                    await produce(stub, name, [[data("v", f"{name}{i}".encode())]])
        bad_key = (await asyncio.to_thread(srv.run, srv.node.manager.describe_channel("bad"))).key
        await asyncio.to_thread(shutil.copytree, live, image)
    (journal,) = [f for f in _journal.files(str(image / "journal")) if os.path.getsize(f) > 0]
    at, hit = 0, None
    for item in _journal.read(journal):
        assert isinstance(item, list)
        size = sum(map(len, _journal.encode(item)))
        if hit is None and at > _journal_records_end(journal) // 2 and [g.channel_key for g in item] == [bad_key]:
            hit = at
            with open(journal, "r+b") as f:  # a byte inside the record's block
                f.seek(at + size - 30)
                byte = f.read(1)[0]
                f.seek(at + size - 30)
                f.write(bytes([byte ^ 0x5A]))
        at += size
    assert hit is not None, "a record of 'bad' alone in the second half of the journal"

    with ServerThread(node_config(image, flusher=False)) as srv:
        async with AsyncClient(srv.address) as client:
            described = await client.describe_channels()
        bad, good = _only(described, "bad"), _only(described, "good")
        assert bad.failed and bad.failure_code is ErrorCode.CORRUPTED, bad
        assert f"lost journal records: {journal} is damaged at byte {hit}" in bad.failure, bad.failure
        assert good.state == "serving", good
        assert _failed_gauge(srv) == {"bad": 1.0, "good": 0.0}
        async with grpc.aio.insecure_channel(srv.address) as ch:
            stub = streaming_pb2_grpc.StreamingNodeStub(ch)
            await _refused_everywhere(stub, "bad")
            got = await consume(stub, spb.ConsumeOpen(pchannel="good", vchannel="v"), until=20)
            assert payloads(got) == [f"good{i}".encode() for i in range(20)]
    assert os.path.exists(journal + _journal.KEPT_SUFFIX), "the damaged file is kept"


async def test_corruption_met_while_serving_fails_that_pchannel_only(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    await asyncio.to_thread(_fill, data_dir)
    with structlog.testing.capture_logs() as logs:
        srv = ServerThread(node_config(data_dir, flusher=False)).start()
        try:
            # Behind the live node's back, a block in the middle of "bad" goes bad: the pchannel is open
            # (recovery read it intact), and what it wrote before this start is read from storage.
            async def damage() -> None:
                key = (await srv.node.manager.describe_channel("bad")).key
                db = srv.node.manager.backend._db  # type: ignore[attr-defined]
                blocks = _block_keys(db, key)
                assert len(blocks) >= 3, blocks
                _flip(db, blocks[1])

            srv.run(damage())
            async with grpc.aio.insecure_channel(srv.address) as ch:
                stub = streaming_pb2_grpc.StreamingNodeStub(ch)
                async with AsyncClient(srv.address) as client:
                    assert _only(await client.describe_channels(["bad"]), "bad").state == "serving"
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await consume(stub, spb.ConsumeOpen(pchannel="bad", vchannel="v"), until=20)
                code, message = status_of(info.value)
                assert code is grpc.StatusCode.DATA_LOSS and "pchannel 'bad'" in message, (code, message)

                async with AsyncClient(srv.address) as client:
                    bad = _only(await client.describe_channels(["bad"]), "bad")
                assert bad.failed and bad.failure_code is ErrorCode.CORRUPTED, bad
                assert "stored block at id" in bad.failure and "of pchannel 'bad' is damaged" in bad.failure
                await _refused_everywhere(stub, "bad")
                assert _failed_gauge(srv) == {"bad": 1.0, "good": 0.0}
                # Its channel closes in the background (its flusher and retention stop with it).
                await until(lambda: all(t.done() for t in srv.node._closers.values()), "the failed channel closed")

                await produce(stub, "good", [[data("v", b"after")]])
                got = await consume(stub, spb.ConsumeOpen(pchannel="good", vchannel="v"), until=21)
                assert payloads(got)[-1] == b"after" and len(payloads(got)) == 21
        finally:
            srv.stop()
    failures = [e for e in logs if e["log_level"] == "error" and e.get("pchannel") == "bad"]
    assert len(failures) == 1 and failures[0]["code"] == "CORRUPTED", failures


async def test_a_failed_sync_shows_on_every_pchannel(tmp_path: Path) -> None:
    """The group commit's sync failed: the WAL refuses every write until reopened; the node says so."""
    srv = ServerThread(node_config(tmp_path / "data", channels=("a", "b"), flusher=False)).start()
    try:
        committer = srv.node.manager._committer
        from wal.errors import UnrecoverableError  # noqa: PLC0415

        async def poison() -> None:
            committer._fatal = UnrecoverableError("WAL sync failed, reopen the WAL: OSError(5, 'EIO')")

        srv.run(poison())
        async with AsyncClient(srv.address) as client:
            for d in await client.describe_channels():
                assert d.failed and d.failure_code is ErrorCode.UNRECOVERABLE, d
                assert "WAL sync failed" in d.failure
        assert _failed_gauge(srv) == {"a": 1.0, "b": 1.0}
        async with grpc.aio.insecure_channel(srv.address) as ch:
            stub = streaming_pb2_grpc.StreamingNodeStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.GetLatestPosition(spb.GetLatestPositionRequest(pchannel="a"))
            code, message = status_of(info.value)
            assert code is grpc.StatusCode.INTERNAL and "pchannel 'a' is FAILED" in message
    finally:
        srv.stop()


async def test_a_reader_tailing_a_pchannel_that_fails_is_ended_with_the_failure(tmp_path: Path) -> None:
    """A consumer waiting at the live end when its pchannel turns FAILED is told, not left waiting."""
    from google.protobuf import empty_pb2  # noqa: PLC0415

    from streamingnode.v1 import common_pb2 as pb  # noqa: PLC0415

    data_dir = tmp_path / "data"
    await asyncio.to_thread(_fill, data_dir)
    srv = ServerThread(node_config(data_dir, flusher=False)).start()
    try:
        async with grpc.aio.insecure_channel(srv.address) as ch:
            stub = streaming_pb2_grpc.StreamingNodeStub(ch)
            tail = stub.Consume()
            await tail.write(spb.ConsumeRequest(open=spb.ConsumeOpen(
                pchannel="bad", vchannel="v", policy=pb.DeliverPolicy(latest=empty_pb2.Empty()))))
            first = await asyncio.wait_for(tail.read(), 10)  # the node answered: the reader is at the end
            assert first is not grpc.aio.EOF

            async def damage() -> None:
                key = (await srv.node.manager.describe_channel("bad")).key
                _flip(srv.node.manager.backend._db, _block_keys(srv.node.manager.backend._db, key)[1])  # type: ignore[attr-defined]

            srv.run(damage())
            with pytest.raises(grpc.aio.AioRpcError):
                await consume(stub, spb.ConsumeOpen(pchannel="bad", vchannel="v"), until=20)

            async def drain() -> grpc.StatusCode:
                while True:
                    try:
                        if await tail.read() is grpc.aio.EOF:
                            return await tail.code()
                    except grpc.aio.AioRpcError as exc:
                        return exc.code()

            code = await asyncio.wait_for(drain(), 20)
            assert code is not grpc.StatusCode.OK, "the tailing read ended as if nothing happened"
            tail.cancel()
    finally:
        srv.stop()


async def test_an_sdk_consumer_tailing_a_pchannel_that_fails_raises_its_failure(tmp_path: Path) -> None:
    """The SDK's consumer reconnects after a stream ends; on a FAILED pchannel it must stop with the
    failure (DATA_LOSS), not keep retrying."""
    from wal import DeliverPolicy  # noqa: PLC0415
    from wal.errors import CorruptedError  # noqa: PLC0415

    data_dir = tmp_path / "data"
    await asyncio.to_thread(_fill, data_dir)
    srv = ServerThread(node_config(data_dir, flusher=False)).start()
    try:
        async with AsyncClient(srv.address, reconnect_timeout=60.0) as client:
            consumer = client.consumer("bad", "v", policy=DeliverPolicy.latest())
            packs = aiter(consumer)
            await asyncio.wait_for(anext(packs), 10)  # at the live end

            async def damage() -> None:
                db = srv.node.manager.backend._db  # type: ignore[attr-defined]
                key = (await srv.node.manager.describe_channel("bad")).key
                _flip(db, _block_keys(db, key)[1])

            srv.run(damage())
            async with grpc.aio.insecure_channel(srv.address) as ch:
                with pytest.raises(grpc.aio.AioRpcError):
                    await consume(streaming_pb2_grpc.StreamingNodeStub(ch),
                                  spb.ConsumeOpen(pchannel="bad", vchannel="v"), until=20)

            async def drain() -> None:
                async for _ in packs:
                    pass

            try:
                with pytest.raises(CorruptedError, match="FAILED"):
                    await asyncio.wait_for(drain(), 20)
            finally:
                await consumer.aclose()
    finally:
        srv.stop()


async def test_a_unary_call_that_meets_damage_fails_the_pchannel(tmp_path: Path) -> None:
    """Not only produce and consume: a unary RPC on a pchannel whose storage turns out damaged moves it to
    FAILED too (here GetLatestPosition, its read made to meet the damage)."""
    from wal.errors import CorruptedError  # noqa: PLC0415

    srv = ServerThread(node_config(tmp_path / "data", channels=("bad", "good"), flusher=False)).start()
    try:
        stream = srv.node.channel("bad").stream

        def damaged() -> None:
            raise CorruptedError("stored block at id 3 of pchannel 'bad' is damaged: block checksum mismatch",
                                 pchannel="bad")

        stream.latest_position = damaged  # type: ignore[method-assign]
        async with grpc.aio.insecure_channel(srv.address) as ch:
            stub = streaming_pb2_grpc.StreamingNodeStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.GetLatestPosition(spb.GetLatestPositionRequest(pchannel="bad"), timeout=10)
            assert info.value.code() is grpc.StatusCode.DATA_LOSS
            async with AsyncClient(srv.address) as client:
                bad = _only(await client.describe_channels(["bad"]), "bad")
                good = _only(await client.describe_channels(["good"]), "good")
            assert bad.failed and bad.failure_code is ErrorCode.CORRUPTED, bad
            assert not good.failed
            await _refused_everywhere(stub, "bad")
    finally:
        srv.stop()
