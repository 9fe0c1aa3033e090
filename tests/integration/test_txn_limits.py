"""Limits that keep acknowledged data deliverable: transaction bounds, transactions larger than one
response, message sizes a default gRPC client can receive, and gRPC's own "larger than max"."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import grpc
import pytest

from streamingnode.client import AsyncClient, Client, Consumer
from streamingnode.server import ServerThread
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc
from tests.integration.conftest import node_config
from wal.errors import ErrorCode, InvalidTxnStateError, MessageTooLargeError, TxnTooLargeError
from wal.message import Message, MessageType
from wal.scanner import MsgPack

pytestmark = pytest.mark.integration


def data_of(messages: Sequence[Message]) -> list[bytes]:
    return [m.payload for m in messages if m.message_type is MessageType.DATA]


async def packs_until(consumer: Consumer, marker: bytes, *, timeout: float = 30.0) -> list[MsgPack]:
    """Every pack with DATA up to the one holding ``marker``."""
    out: list[MsgPack] = []
    async with asyncio.timeout(timeout):
        async for pack in consumer:
            if data_of(pack.messages):
                out.append(pack)
                if marker in data_of(pack.messages):
                    return out
    raise AssertionError(f"the read ended before {marker!r}")


@pytest.fixture
def bounded(tmp_path: Path) -> Iterator[ServerThread]:
    """A node whose transactions hold at most 5 bodies and 4,000 bytes."""
    srv = ServerThread(node_config(tmp_path / "data", txn_max_messages=5, txn_max_bytes=4000))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
async def bounded_client(bounded: ServerThread) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(bounded.address, timeout=10.0, reconnect_timeout=10.0) as c:
        await c.create_channels(["p"])
        yield c


class _Leave(Exception):
    """Ends a transaction block on purpose."""


# --- transaction bounds --------------------------------------------------------------------------
@pytest.mark.parametrize(("bodies", "size", "bound"), [(6, 10, "txn_max_messages = 5"),
                                                         (3, 1500, "txn_max_bytes = 4000")])
async def test_txn_over_its_bound_is_refused_and_rolled_back(
    bounded: ServerThread, bounded_client: AsyncClient, bodies: int, size: int, bound: str,
) -> None:
    client = bounded_client
    async with client.consumer("p", "v") as consumer:
        big = await client.begin_txn("p", "v")
        async with client.producer("p") as plain:
            async with client.txn("p", "v") as small:  # another transaction, interleaved, within bounds
                with pytest.raises(_Leave):
                    async with client.txn("p", "v") as over:
                        with pytest.raises(TxnTooLargeError) as caught:
                            for i in range(bodies):
                                await over.send(b"%d" % i + b"x" * size)
                                await small.send(b"small-%d" % i) if i < 2 else None
                                await plain.send("v", b"plain-%d" % i)
                        err = caught.value
                        assert err.code is ErrorCode.TXN_TOO_LARGE and bound in str(err), err
                        assert "rolled back" in str(err) and err.fields["bound"] == bound.split(" ", maxsplit=1)[0]
                        # Rolled back in the log by the node before the client heard of it (the
                        # client has not asked for a rollback yet); later bodies and commit say why.
                        session = bounded.node.channel("p").stream.txns.get(over.txn_id)
                        assert session is not None and session.rollback_written
                        with pytest.raises(InvalidTxnStateError, match=bound.split(" ", maxsplit=1)[0]):
                            await over.send(b"late")
                        with pytest.raises(InvalidTxnStateError, match=bound.split(" ", maxsplit=1)[0]):
                            await client.commit_txn("p", "v", over.txn_id)
                        raise _Leave
            await plain.send("v", b"end")

        # The untouched transaction `big` (begun first, no body) does not hold the readers' view back.
        await client.rollback_txn("p", "v", big.txn_id)
        seen = [data_of(p.messages) for p in await packs_until(consumer, b"end")]
    flat = [x for payloads in seen for x in payloads]
    assert not [x for x in flat if x[:1].isdigit()], "nothing of the refused transaction is delivered"
    assert [b"small-0", b"small-1"] in seen, "the other transaction arrives whole"
    assert [x for x in flat if x.startswith(b"plain")] == [b"plain-%d" % i for i in range(bodies - 1)]


async def test_txn_at_its_bound_commits(bounded_client: AsyncClient) -> None:
    client = bounded_client
    async with client.consumer("p", "v") as consumer:
        async with client.txn("p", "v") as tx:
            for i in range(5):
                tx.send_nowait(b"%d" % i + b"x" * 700)
        async with client.producer("p") as plain:
            await plain.send("v", b"end")
        seen = [data_of(p.messages) for p in await packs_until(consumer, b"end")]
    assert seen == [[b"%d" % i + b"x" * 700 for i in range(5)], [b"end"]]


# --- transactions larger than one response -------------------------------------------------------
SMALL_PACK = 16 << 10
"""consume_max_pack_bytes of the node below: a transaction of 100 KiB takes several responses."""


@pytest.fixture
def small_packs(tmp_path: Path) -> Iterator[ServerThread]:
    srv = ServerThread(node_config(tmp_path / "data", consume_max_pack_bytes=SMALL_PACK))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


async def _produce_txn(client: AsyncClient, bodies: Sequence[bytes], marker: bytes = b"end") -> None:
    async with client.producer("p") as plain:
        await plain.send("v", b"before")
        async with client.txn("p", "v") as tx:
            for body in bodies:
                tx.send_nowait(body)
        await plain.send("v", marker)


BODIES = [b"%04d" % i + b"x" * 1000 for i in range(100)]
SMALL_CHANNEL = 64 << 10
"""max_message_bytes of the SDK clients below: less than the transaction (which once came as one
response, refused by the client's gRPC and retried forever)."""


def whole_in_one_pack(seen: list[list[bytes]], bodies: Sequence[bytes], marker: bytes = b"end") -> None:
    """``seen`` (each pack's DATA payloads) is before, the transaction, then ``marker``, with the
    transaction inside one pack."""
    assert [x for pack in seen for x in pack] == [b"before", *bodies, marker]
    assert any(pack[-len(bodies):] == list(bodies) for pack in seen), "the transaction arrives in one pack"


async def test_raw_stub_gets_a_big_txn_as_continued_parts_that_fit(small_packs: ServerThread) -> None:
    async with AsyncClient(small_packs.address, timeout=10.0) as client:
        await client.create_channels(["p"])
        await _produce_txn(client, BODIES)
    # A generated client of any language: default channel options (4 MiB receive limit).
    async with grpc.aio.insecure_channel(small_packs.address) as channel:
        call = streaming_pb2_grpc.StreamingNodeStub(channel).Consume()
        await call.write(spb.ConsumeRequest(open=spb.ConsumeOpen(pchannel="p", vchannel="v")))
        parts: list[spb.ConsumeResponse] = []
        async with asyncio.timeout(30):
            while True:
                resp = await call.read()
                if resp.WhichOneof("response") != "pack" or not len(resp.pack.messages):
                    continue
                parts.append(resp)
                if any(m.payload == b"end" for m in resp.pack.messages):
                    break
        call.cancel()
    sizes = [r.ByteSize() for r in parts]
    assert all(n <= SMALL_PACK for n in sizes), sizes
    txn = [r for r in parts if r.pack.continued]
    assert len(txn) >= 5, "the transaction comes in several responses"
    # The continued parts and the one closing them hold the transaction, whole and in order.
    closing = parts[parts.index(txn[-1]) + 1]
    joined = [m.payload for r in [*txn, closing] for m in r.pack.messages if m.type == MessageType.DATA]
    assert [x for x in joined if x != b"before"] == BODIES
    for r in txn:  # acking a part re-reads the whole transaction, never half of it
        assert list(r.pack.end_positions) == list(r.pack.start_positions)


async def test_sdk_async_gets_a_big_txn_whole_and_resumes_after_it(small_packs: ServerThread) -> None:
    async with AsyncClient(small_packs.address, timeout=10.0) as producing:
        await producing.create_channels(["p"])
        await producing.create_group("p", "g")
        await _produce_txn(producing, BODIES)
    async with AsyncClient(small_packs.address, timeout=10.0, reconnect_timeout=10.0,
                           max_message_bytes=SMALL_CHANNEL) as client:
        async with client.consumer("p", "v", group="g") as consumer:
            packs = await packs_until(consumer, b"end")
            seen = [data_of(p.messages) for p in packs]
            whole_in_one_pack(seen, BODIES)
            txn_pack = next(p for p in packs if BODIES[0] in data_of(p.messages))
            assert txn_pack.begin_ts < txn_pack.messages[-1].timetick <= txn_pack.end_ts
            await consumer.ack(txn_pack)  # processed up to and including the transaction
        async with client.producer("p") as plain:
            await plain.send("v", b"after")
        async with client.consumer("p", "v", group="g") as again:
            resumed = [x for p in await packs_until(again, b"after") for x in data_of(p.messages)]
        rest = [x for p in packs[packs.index(txn_pack) + 1:] for x in data_of(p.messages)]
        assert resumed == [*rest, b"after"], "resumed exactly after the transaction's pack"


def test_sdk_sync_and_msgstream_get_a_big_txn_whole(small_packs: ServerThread) -> None:
    with Client(small_packs.address, timeout=10.0) as producing:
        producing.create_channels(["p"])
        with producing.producer("p") as plain:
            plain.send("v", b"before")
            with producing.txn("p", "v") as tx:
                for body in BODIES:
                    tx.send(body)
            plain.send("v", b"end")
    with Client(small_packs.address, timeout=10.0, max_message_bytes=SMALL_CHANNEL) as sync:
        with sync.consumer("p", "v") as consumer:
            seen: list[list[bytes]] = []
            while not seen or b"end" not in seen[-1]:
                pack = consumer.next(timeout=30)
                assert pack is not None, "no pack within 30 s"
                if data_of(pack.messages):
                    seen.append(data_of(pack.messages))
        whole_in_one_pack(seen, BODIES)

    async def msgstream() -> list[list[bytes]]:
        async with AsyncClient(small_packs.address, timeout=10.0, max_message_bytes=SMALL_CHANNEL) as client:
            stream = client.msgstream()
            await stream.as_consumer(["p"], "g", position="earliest")
            out: list[list[bytes]] = []
            async with asyncio.timeout(30):
                while not out or b"end" not in out[-1]:
                    pack = await stream.consume()
                    if data_of(pack.messages):
                        out.append(data_of(pack.messages))
            return out

    whole_in_one_pack(asyncio.run(msgstream()), BODIES)


async def test_sdk_with_a_4mib_channel_gets_a_10mib_txn(server: str) -> None:
    bodies = [b"%04d" % i + bytes(256 << 10) for i in range(40)]
    async with AsyncClient(server, timeout=30.0, reconnect_timeout=10.0, max_message_bytes=4 << 20) as client:
        await client.create_channels(["p"])
        await _produce_txn(client, bodies)
        async with client.consumer("p", "v") as consumer:
            whole_in_one_pack([data_of(p.messages) for p in await packs_until(consumer, b"end")], bodies)


# --- deliverable defaults ------------------------------------------------------------------------
async def test_a_max_size_message_reaches_a_client_with_a_4mib_limit(server_thread: ServerThread) -> None:
    """The default max_message_bytes, spent on the most envelope a message can cost: 65,535 short
    properties (the codec's most), a 255-byte vchannel, a 128-byte pchannel in every position."""
    limit = server_thread.node.config.max_message_bytes
    keys = [f"{i:x}" for i in range(65535)]
    vchannel = "\U0001f600" * 63 + "abc"
    counted = len(vchannel) + sum(map(len, keys))  # the vchannel in characters (at most 255 bytes)
    payload = bytes(limit - counted)
    pchannel = "p" * 128
    async with AsyncClient(server_thread.address, timeout=30.0, max_message_bytes=8 << 20) as client:
        await client.create_channels([pchannel])
        async with client.producer(pchannel) as producer:
            await producer.send(vchannel, payload, properties=dict.fromkeys(keys, ""))
            with pytest.raises(MessageTooLargeError):
                await producer.send(vchannel, payload + b"x", properties=dict.fromkeys(keys, ""))
    async with grpc.aio.insecure_channel(server_thread.address, options=[
            ("grpc.max_receive_message_length", 4 << 20)]) as channel:
        call = streaming_pb2_grpc.StreamingNodeStub(channel).Consume()
        await call.write(spb.ConsumeRequest(open=spb.ConsumeOpen(pchannel=pchannel, vchannel=vchannel)))
        async with asyncio.timeout(30):
            while True:
                resp = await call.read()
                if resp.WhichOneof("response") == "pack" and len(resp.pack.messages):
                    break
        call.cancel()
    (m,) = resp.pack.messages
    assert m.payload == payload and len(m.properties) == len(keys)


async def test_a_message_over_the_stated_receive_limit_is_refused_precisely(server: str) -> None:
    async with AsyncClient(server, timeout=10.0, reconnect_timeout=5.0, max_receive_bytes=100_000) as client:
        await client.create_channels(["p"])
        async with client.producer("p") as producer:
            await producer.send("v", bytes(200_000))
        consumer = client.consumer("p", "v")
        async with asyncio.timeout(20):
            with pytest.raises(MessageTooLargeError, match="max_response_bytes") as caught:
                async for _ in consumer:
                    pass
        assert "100000" in str(caught.value) and caught.value.fields.get("field") == "max_response_bytes", (
            "refused by the node before sending, not by the client's gRPC")
        await consumer.aclose()
    # Raised by the consumer (the SDK raises its channel's limit too), the same message arrives.
    async with AsyncClient(server, timeout=10.0, max_receive_bytes=1 << 20) as client, \
            client.consumer("p", "v") as consumer:
        async with asyncio.timeout(20):
            async for pack in consumer:
                if pack.messages:
                    assert pack.messages[0].payload == bytes(200_000)
                    break


async def test_grpc_own_message_larger_than_max_is_not_retried_forever(server: str) -> None:
    """A channel limit under what the consumer tells the node: gRPC itself refuses the response."""
    async with AsyncClient(server, timeout=10.0) as client:
        await client.create_channels(["p"])
        async with client.producer("p") as producer:
            await producer.send("v", bytes(100_000))
    async with grpc.aio.insecure_channel(server, options=[("grpc.max_receive_message_length", 50_000)]) as channel:
        consumer = Consumer(streaming_pb2_grpc.StreamingNodeStub(channel), "p", "v", reconnect_timeout=60.0,
                            max_receive_bytes=4 << 20)
        try:
            async with asyncio.timeout(20):  # well within reconnect_timeout: no endless retry
                with pytest.raises(MessageTooLargeError, match="max_receive_bytes") as caught:
                    async for _ in consumer:
                        pass
        finally:
            await consumer.aclose()
    err = caught.value
    assert not err.retriable and err.fields["limit"] == 50_000 and "50000" in str(err)


async def test_a_tiny_stated_limit_still_gets_empty_packs_then_a_precise_error(server: str) -> None:
    async with AsyncClient(server, timeout=10.0) as client:
        await client.create_channels(["p"])
    async with grpc.aio.insecure_channel(server) as channel:
        call = streaming_pb2_grpc.StreamingNodeStub(channel).Consume()
        await call.write(spb.ConsumeRequest(open=spb.ConsumeOpen(pchannel="p", vchannel="v", max_response_bytes=1)))
        async with asyncio.timeout(20):
            kinds = [(await call.read()).WhichOneof("response") for _ in range(3)]
            assert kinds == ["opened", "pack", "pack"], "time still advances for the consumer"
            async with AsyncClient(server, timeout=10.0) as client, client.producer("p") as producer:
                await producer.send("v", b"x")
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                while True:
                    await call.read()
        call.cancel()
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "max_response_bytes" in (caught.value.details() or "")


async def test_a_callers_channel_option_wins_over_the_clients_defaults(server: str) -> None:
    """An explicit ``options=`` entry is the channel's limit, not shadowed by the client's own default."""
    async with AsyncClient(server, timeout=10.0) as client:
        await client.create_channels(["p"])
        async with client.producer("p") as producer:
            await producer.send("v", bytes(100_000))
    limited = AsyncClient(server, timeout=10.0, reconnect_timeout=60.0,
                          options=[("grpc.max_receive_message_length", 50_000)])
    async with limited as client, asyncio.timeout(20), client.consumer("p", "v") as consumer:
        with pytest.raises(MessageTooLargeError) as caught:
            async for _ in consumer:
                pass
    assert caught.value.fields["limit"] == 50_000
