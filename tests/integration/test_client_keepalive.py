"""The client's keepalive, seen on the wire: a TCP proxy between the SDK and a node reads the HTTP/2
frames going each way (it counts PINGs and GOAWAYs) and can freeze (it stops passing bytes either
way, as a hung node or a partition does, while connections stay up).

- The node accepts the SDK's pings, with a stream open or none, at the SDK's shortest interval:
  never GOAWAY too_many_pings (gRPC servers allow one ping every five minutes by default).
- A frozen node is left: the stream to it fails within about ``keepalive_time + keepalive_timeout``
  and the producer keeps its sends buffered; once the node answers again every send is delivered,
  once, in order.  A consumer leaves it too and resumes after the last message it received.
  Without keepalive the stream to a hung node never errors.
- ``keepalive_time`` below what nodes accept is refused, naming the field."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest

from streamingnode.client import AsyncClient, Client
from streamingnode.wire.defaults import MIN_PING_INTERVAL
from tests.integration.test_client import data_of, read_until
from tests.waiting import until
from wal.errors import InvalidArgumentError
from wal.message import MessageType

pytestmark = pytest.mark.integration

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_PING, _GOAWAY = 6, 7
_ACK = 1


class _Frames:
    """HTTP/2 frame counts of one direction, parsed as bytes pass (after the client's preface)."""

    def __init__(self, preface: bool) -> None:
        self._buf = b""
        self._skip = len(_PREFACE) if preface else 0
        self.pings = 0
        self.acks = 0
        self.goaways: list[bytes] = []

    def feed(self, data: bytes) -> None:
        self._buf += data
        if self._skip:
            taken = min(self._skip, len(self._buf))
            self._buf, self._skip = self._buf[taken:], self._skip - taken
        while len(self._buf) >= 9:
            length = int.from_bytes(self._buf[:3], "big")
            kind, flags = self._buf[3], self._buf[4]
            if len(self._buf) < 9 + length:
                return
            payload = self._buf[9:9 + length]
            self._buf = self._buf[9 + length:]
            if kind == _PING:
                if flags & _ACK:
                    self.acks += 1
                else:
                    self.pings += 1
            elif kind == _GOAWAY:
                self.goaways.append(payload)


class H2Proxy:
    """Passes TCP between clients and ``upstream``, counting frames; ``frozen`` holds every byte."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.to_node = _Frames(preface=True)
        self.to_client = _Frames(preface=False)
        self.thawed = asyncio.Event()
        self.thawed.set()
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    def freeze(self) -> None:
        self.thawed.clear()

    def thaw(self) -> None:
        self.thawed.set()

    async def start(self) -> H2Proxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        host, port = self.upstream.rsplit(":", 1)
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        for src, dst, frames in ((reader, up_writer, self.to_node), (up_reader, writer, self.to_client)):
            task = asyncio.create_task(self._pump(src, dst, frames))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, frames: _Frames) -> None:
        try:
            while data := await src.read(65536):
                await self.thawed.wait()  # frozen: the bytes wait here, as in a hung peer's socket
                frames.feed(data)
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                dst.close()


@pytest.fixture
async def proxy(server: str) -> AsyncIterator[H2Proxy]:
    p = await H2Proxy(server).start()
    try:
        yield p
    finally:
        p.thaw()
        await p.close()


def _too_many_pings(proxy: H2Proxy) -> list[bytes]:
    return [g for g in proxy.to_client.goaways if b"too_many_pings" in g]


async def test_the_node_accepts_pings_at_the_shortest_interval_with_and_without_calls(proxy: H2Proxy) -> None:
    async with AsyncClient(proxy.address, keepalive_time=MIN_PING_INTERVAL, keepalive_timeout=5.0) as client:
        await client.create_channels(["p"])
        # No call open: pinged all the same (a connection about to be used is checked too).
        await until(lambda: proxy.to_node.pings >= 4 or bool(proxy.to_client.goaways), "pings on an idle connection",
                    timeout=30)
        assert _too_many_pings(proxy) == [], "the node refused the pings of an idle connection"
        async with client.producer("p", producer_id="pinged", linger=0) as producer:
            await producer.send("v", b"one")
            seen = proxy.to_node.pings
            # A stream open and idle: the pings go on (gRPC's default stops after two without data).
            await until(lambda: proxy.to_node.pings >= seen + 4 or bool(proxy.to_client.goaways),
                        "pings beside an idle stream", timeout=30)
            assert _too_many_pings(proxy) == [], "the node answered the pings with GOAWAY too_many_pings"
            await producer.send("v", b"two")
            assert producer.reconnects == 0
        assert proxy.to_client.acks >= proxy.to_node.pings - 1
        assert proxy.to_client.goaways == [], "the node sent GOAWAY"
        assert proxy.connections == 1
        async with client.consumer("p", "v") as consumer:
            assert data_of(await read_until(consumer, b"two")) == [b"one", b"two"]


async def test_a_frozen_node_is_left_and_the_sends_delivered_once_when_it_answers_again(proxy: H2Proxy) -> None:
    async with AsyncClient(proxy.address, reconnect_timeout=120.0, keepalive_time=1.0,
                           keepalive_timeout=1.0) as client:
        await client.create_channels(["p"])
        async with client.producer("p", producer_id="frozen", max_batch_messages=20) as producer:
            sent = [f"m{i:04d}".encode() for i in range(200)]
            await asyncio.gather(*(producer.send_nowait("v", m) for m in sent[:50]))
            assert producer.connected
            proxy.freeze()
            pending = [producer.send_nowait("v", m) for m in sent[50:]]
            # The stream to the hung node fails (keepalive), though not one byte came back from it.
            await until(lambda: not producer.connected, "the producer to leave the frozen node", timeout=30)
            assert not any(f.done() for f in pending)
            assert _too_many_pings(proxy) == []
            proxy.thaw()
            async with asyncio.timeout(60):
                results = await asyncio.gather(*pending)
        assert producer.reconnects >= 1
        ids = [r.message_id for r in results]
        assert ids == sorted(set(ids))
        async with client.producer("p") as plain:
            await plain.send("v", b"END")
        async with client.consumer("p", "v") as consumer:
            assert data_of(await read_until(consumer, b"END", timeout=30)) == [*sent, b"END"]


async def test_a_consumer_on_a_frozen_node_leaves_it_and_resumes_without_loss_or_duplicates(
        server: str, proxy: H2Proxy) -> None:
    async with AsyncClient(server) as direct:
        await direct.create_channels(["p"])
        async with direct.producer("p") as producer:
            await asyncio.gather(*(producer.send_nowait("v", f"a{i:03d}".encode()) for i in range(50)))
    got: list[bytes] = []
    async with AsyncClient(proxy.address, reconnect_timeout=120.0, keepalive_time=1.0,
                           keepalive_timeout=1.0) as client, client.consumer("p", "v") as consumer:
        reading = asyncio.create_task(_read_into(consumer, got, b"END"))
        await until(lambda: len(got) >= 50, "the first messages")
        proxy.freeze()
        await until(lambda: not consumer.connected, "the consumer to leave the frozen node", timeout=30)
        async with AsyncClient(server) as direct, direct.producer("p") as producer:
            await asyncio.gather(*(producer.send_nowait("v", f"b{i:03d}".encode()) for i in range(50)))
            await producer.send("v", b"END")
        proxy.thaw()
        async with asyncio.timeout(60):
            await reading
        assert consumer.reconnects >= 1
    assert got == [f"a{i:03d}".encode() for i in range(50)] + [f"b{i:03d}".encode() for i in range(50)] + [b"END"]


async def _read_into(consumer: Any, out: list[bytes], last: bytes) -> None:
    async for pack in consumer:
        for m in pack.messages:
            if m.message_type is MessageType.DATA:
                out.append(bytes(m.payload))
                if m.payload == last:
                    return


@pytest.mark.parametrize("value", [0.5, 0.0, -1.0, float("nan")])
def test_keepalive_time_below_what_nodes_accept_is_refused(value: float) -> None:
    with pytest.raises(InvalidArgumentError, match="keepalive_time must be at least 1 s") as info:
        AsyncClient("127.0.0.1:1", keepalive_time=value)
    assert info.value.fields["field"] == "keepalive_time"
    with pytest.raises(InvalidArgumentError, match="keepalive_time"):
        Client("127.0.0.1:1", keepalive_time=value)


async def test_keepalive_can_be_turned_off_and_its_timeout_must_be_positive() -> None:
    await AsyncClient("127.0.0.1:1", keepalive_time=None).aclose()  # no options, nothing refused
    with pytest.raises(InvalidArgumentError, match="keepalive_timeout must be > 0"):
        AsyncClient("127.0.0.1:1", keepalive_timeout=0)


def test_the_frame_counter_reads_pings_acks_and_goaways() -> None:
    frames = _Frames(preface=True)

    def frame(kind: int, flags: int, payload: bytes) -> bytes:
        return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + struct.pack(">I", 0) + payload

    wire = _PREFACE + frame(4, 0, b"") + frame(_PING, 0, bytes(8)) + frame(_PING, _ACK, bytes(8)) + \
        frame(_GOAWAY, 0, bytes(8) + b"too_many_pings")
    for i in range(0, len(wire), 7):  # as TCP may cut it
        frames.feed(wire[i:i + 7])
    assert (frames.pings, frames.acks, len(frames.goaways)) == (1, 1, 1)
