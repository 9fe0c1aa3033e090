"""Fan-out: durable produce while many consumers tail the same vchannel.

    .venv/bin/python bench/fanout.py [--consumers 0,10,100,500] [--count 50000] [--runs 3]

The node runs in its own process. For each consumer count N, in a fresh data directory: N Consume
streams (DeliverPolicy.latest, one vchannel) are opened from ``--procs`` separate processes, each
with a raw grpc.aio stream whose responses are not deserialized (the worker counts bytes only: the
node is what is measured); once all are open, ``--count`` DATA messages of ``--size`` bytes are
produced durably through the SDK (``send_nowait``, ``--linger``), each message's ack latency timed
from ``send_nowait`` to its future's completion. Reported per N: produce msgs/s, ack p50/p99, total
messages the node delivered per second while the producer ran (the node's ``consume_messages``
counter, read from its /metrics before and after), the share of responses sent from the shared cache
(hits / (hits + misses)), the node's peak RSS and its CPU per produced message. A probe process
beside them sends one message at a time (linger 0, every 2 ms) and times each ack: the bulk
producer's ack times include its own queue of ``--window`` unanswered sends (Little's law: window /
rate), the probe's show what an append waits for behind delivery work.

``--consumer-nice 19`` runs the consumer processes at the lowest CPU priority: on a 2-core machine the
readers otherwise take whatever CPU the node and the producer leave them, however little the node
spends on them; niced, they stand for readers on other machines (the node's own cost of serving them
is what remains).
``--stalled N`` adds a case of N consumers that open their stream and never read: its RSS is compared
with 500 MB + N x the per-consumer cap (``consume_buffer_bytes``).  ``--node-flag`` passes extra serve
flags; ``--baseline-flag`` runs each tailing case again with other flags, as its comparison in the
same run (e.g. ``--consume-cache-bytes=0``: every consumer encodes its own, and none takes another's
responses; which goes first alternates).
``--profile OUT`` records the node under py-spy for the largest N (a flame graph, or collapsed stacks
if OUT ends in .txt).
``--raw-floor`` adds, per run, the raw limit of the transport on this machine: the same consumer
processes, as many streams as the largest N, read from a bare grpc.aio server that writes
``--raw-bytes`` responses as fast as they are taken (no log, no encoding).  Printed beside the case
with the largest N: CPU per delivered MB of the server and of the consumer processes, raw against ours,
and the cores that delivering 500k msgs/s of ``--size`` bytes takes at the raw cost alone.
Benchmarks are not tests: they assert nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import BareServer, cpu_seconds, prepare_process, serve_bare, tmpdir  # noqa: I001

import grpc

from produce_consume import CHANNEL_OPTIONS, PYTHON, ROOT, VCHANNEL, _node, _sdk

PCHANNEL = "fan"
PRODUCE_RATIO_TARGET = 0.5  # with 100 consumers, of the 0-consumer rate
ACK_P99_TARGET_MS = 50.0
DELIVERY_TARGET = 500_000  # msgs/s in total


# --- the consumer processes --------------------------------------------------------------------------
async def _worker(addr: str, n: int, stall: bool) -> None:
    """``n`` tailing streams; prints "ready" once all are open, then counts bytes until stdin closes."""
    from streamingnode.v1 import streaming_pb2 as spb  # noqa: PLC0415

    open_req = spb.ConsumeRequest(open=spb.ConsumeOpen(
        pchannel=PCHANNEL, vchannel=VCHANNEL, policy={"latest": {}})).SerializeToString()
    received = [0, 0]  # bytes, responses
    async with grpc.aio.insecure_channel(addr, options=CHANNEL_OPTIONS) as channel:
        # No deserializer: responses arrive as bytes, nothing is parsed.
        method = channel.stream_stream("/streamingnode.v1.StreamingNode/Consume")
        calls = []
        for _ in range(n):
            call = method()
            await call.write(open_req)
            await call.read()  # 'opened'
            calls.append(call)

        async def drain(call: Any) -> None:
            while True:
                data = await call.read()
                if data is grpc.aio.EOF:
                    return
                received[0] += len(data)
                received[1] += 1

        tasks = [] if stall else [asyncio.ensure_future(drain(c)) for c in calls]
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes it
        for t in tasks:
            t.cancel()
        for c in calls:
            c.cancel()
    print(f"bytes {received[0]} responses {received[1]}", flush=True)


async def _raw_server(size: int) -> None:
    """The raw limit: Consume answered by a bare grpc.aio server with ``size``-byte responses written as
    fast as the stream takes them, until stdin closes."""
    payload = os.urandom(size)

    async def consume(requests: Any, context: Any) -> None:
        await requests.__anext__()  # the open request
        await context.write(b"")  # 'opened'
        while True:
            await context.write(payload)

    await serve_bare(grpc.method_handlers_generic_handler(
        "streamingnode.v1.StreamingNode", {"Consume": grpc.stream_stream_rpc_method_handler(consume)}),
        CHANNEL_OPTIONS)


def _raw_floor(args: argparse.Namespace, streams: int, seconds: float = 5.0) -> dict[str, float]:
    """CPU per MB of the bare server and of the consumer processes, ``streams`` streams for ``seconds``."""
    with BareServer(__file__, str(args.raw_bytes)) as server:
        group = _Consumers(server.address, streams, args.procs, False, args.consumer_nice)
        try:
            cpu0 = server.cpu
            readers0 = sum(cpu_seconds(p.pid) for p in group.procs)
            t0 = time.perf_counter()
            time.sleep(seconds)
            elapsed = time.perf_counter() - t0
            cpu = server.cpu - cpu0
            readers_cpu = sum(cpu_seconds(p.pid) for p in group.procs) - readers0
        finally:
            got, _ = group.stop()
    mb = got / 1e6  # read until the workers stopped: a little more than in the window, so a floor
    return {"raw_mb_s": mb / elapsed, "raw_server_us_mb": cpu / mb * 1e6, "raw_readers_us_mb": readers_cpu / mb * 1e6}


async def _probe(addr: str) -> None:
    """One message at a time (linger 0), each awaited, until stdin closes: what an append waits for
    behind the node's other work, without the bulk producer's client-side queue.  Prints the samples."""
    sdk = _sdk()
    client = sdk.AsyncClient(addr)
    lat: list[float] = []
    stop = asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    try:
        producer = client.producer(PCHANNEL, linger=0)
        print("ready", flush=True)
        while not stop.done():
            t0 = time.perf_counter()
            await producer.send(VCHANNEL, b"p" * 64)
            lat.append(time.perf_counter() - t0)
            await asyncio.sleep(0.002)
        await producer.aclose()
    finally:
        await client.aclose()
    print("lat " + " ".join(f"{x:.6f}" for x in lat), flush=True)


class _Probe:
    def __init__(self, addr: str) -> None:
        env = dict(os.environ, GRPC_VERBOSITY="ERROR", PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen([PYTHON, __file__, "--probe", addr], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env, cwd=str(ROOT))
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("probe failed to start")

    def stop(self) -> list[float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        out = self.proc.stdout.read()
        self.proc.wait(60)
        self.proc.stdout.close()
        found = re.search(r"lat (.*)", out)
        return sorted(float(x) for x in found.group(1).split()) if found else []


class _Consumers:
    """``total`` streams spread over ``procs`` worker processes."""

    def __init__(self, addr: str, total: int, procs: int, stall: bool, nice: int = 0) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        procs = max(1, min(procs, total))
        env = dict(os.environ, GRPC_VERBOSITY="ERROR", PYTHONPATH=str(ROOT))
        for i in range(procs if total else 0):
            n = total // procs + (1 if i < total % procs else 0)
            self.procs.append(subprocess.Popen(
                ["nice", "-n", str(nice), PYTHON, __file__, "--worker", addr, str(n), "stall" if stall else "read"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=str(ROOT)))
        for p in self.procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"consumer worker failed: {line!r}")

    def stop(self) -> tuple[int, int]:
        """Bytes and responses the streams read (until they stopped, after the producer)."""
        got = responses = 0
        for p in self.procs:
            assert p.stdin is not None and p.stdout is not None
            p.stdin.close()  # the worker's signal to stop
            out = p.stdout.read()
            p.wait(60)
            p.stdout.close()
            found = re.search(r"bytes (\d+) responses (\d+)", out)
            if found:
                got, responses = got + int(found.group(1)), responses + int(found.group(2))
        return got, responses


# --- the node side -----------------------------------------------------------------------------------
def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _counters(metrics_url: str) -> dict[str, float]:
    """Messages delivered, and the shared cache's hits and misses, so far; the bytes the node holds for
    its consumers now (sent or queued, not yet taken by them)."""
    with urllib.request.urlopen(metrics_url, timeout=30) as resp:
        text = resp.read().decode()
    out = {"delivered": 0.0, "packs": 0.0, "hits": 0.0, "misses": 0.0, "held": 0.0}
    for line in text.splitlines():
        for key, prefix in (("delivered", "streamingnode_consume_messages_total{"),
                            ("packs", "streamingnode_consume_packs_total{"),
                            ("hits", "streamingnode_consume_cache_hits_total "),
                            ("misses", "streamingnode_consume_cache_misses_total "),
                            ("held", "streamingnode_consume_held_bytes ")):
            if line.startswith(prefix):
                out[key] += float(line.rsplit(" ", 1)[1])
    return out


async def _produce(sdk: Any, addr: str, n: int, size: int, linger: float, window: int) -> tuple[float, list[float]]:
    client = sdk.AsyncClient(addr)
    lat: list[float] = []
    try:
        producer = client.producer(PCHANNEL, linger=linger)
        payload = os.urandom(size)
        outstanding: collections.deque[asyncio.Future[Any]] = collections.deque()
        perf = time.perf_counter

        def timed(t0: float) -> Any:
            return lambda _f: lat.append(perf() - t0)

        t0 = perf()
        for _ in range(n):
            fut = producer.send_nowait(VCHANNEL, payload)
            fut.add_done_callback(timed(perf()))
            outstanding.append(fut)
            if len(outstanding) >= window:
                await outstanding.popleft()
        await producer.flush()
        for f in outstanding:
            f.result()
        elapsed = perf() - t0
        await producer.aclose()
    finally:
        await client.aclose()
    return n / elapsed, lat


def _one(args: argparse.Namespace, root: str, consumers: int, stall: bool, base: bool) -> dict[str, float]:
    data_dir, logs = tmpdir(root, "node"), tmpdir(root, "logs")
    extra = tuple(args.node_flag) + (tuple(args.baseline_flag) if base else ())
    out: dict[str, float] = {}
    with _node(data_dir, logs, PCHANNEL, extra=extra) as node:
        addr = node.match.group(1)
        metrics_url = re.search(r"metrics (http://\S+)\)", Path(node.log_path).read_text())
        assert metrics_url is not None
        url = metrics_url.group(1)
        peak = [_rss_mb(node.proc.pid)]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.1):
                peak[0] = max(peak[0], _rss_mb(node.proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        spy = None
        if args.profile and consumers == max(args.consumers) and not stall and not base:
            spy = subprocess.Popen([str(Path(PYTHON).parent / "py-spy"), "record", "-o", args.profile, "-r", "50",
                                    "--format", "raw" if args.profile.endswith(".txt") else "flamegraph",
                                    "-p", str(node.proc.pid), "--nonblocking"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        group = _Consumers(addr, consumers, args.procs, stall, args.consumer_nice)
        probe = _Probe(addr)
        try:
            before = _counters(url)
            cpu0 = cpu_seconds(node.proc.pid)
            readers0 = sum(cpu_seconds(p.pid) for p in group.procs)
            t0 = time.perf_counter()
            rate, lat = asyncio.run(_produce(_sdk(), addr, args.count, args.size, args.linger, args.window))
            elapsed = time.perf_counter() - t0
            cpu = cpu_seconds(node.proc.pid) - cpu0
            readers_cpu = sum(cpu_seconds(p.pid) for p in group.procs) - readers0
            after = _counters(url)
            peak[0] = max(peak[0], _rss_mb(node.proc.pid))
        finally:
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    spy.wait(60)
            probe_lat = probe.stop()
            got, responses = group.stop()
            done.set()
            sampler.join()
        lat.sort()
        out = {"produce": rate, "p50_ms": lat[len(lat) // 2] * 1e3, "p99_ms": lat[int(len(lat) * 0.99)] * 1e3,
               "delivered": (after["delivered"] - before["delivered"]) / elapsed,
               "msgs_per_pack": (after["delivered"] - before["delivered"]) / max(after["packs"] - before["packs"], 1),
               "shared": (after["hits"] - before["hits"]) / max(after["hits"] + after["misses"] - before["hits"]
                                                                - before["misses"], 1), "rss_mb": peak[0],
               "node_cpu_us": cpu / args.count * 1e6, "held_mb_at_end": after["held"] / 2**20,
               # Cores used while the producer ran: the node's, and the consumer processes' (which
               # share this machine's cores with the node and the producer).
               "node_cores": cpu / elapsed, "readers_cores": readers_cpu / elapsed,
               # What the streams read, per response (the raw floor's cost per MB depends on it).
               "response_kb": got / max(responses, 1) / 1024,
               "probe_p50_ms": _pct(probe_lat, 0.5) * 1e3, "probe_p99_ms": _pct(probe_lat, 0.99) * 1e3}
    shutil.rmtree(data_dir, ignore_errors=True)
    return out


def _label(case: tuple[int, bool, bool]) -> str:
    return f"{case[0]}{' stalled' if case[1] else ''}{' base' if case[2] else ''}"


def _pct(sorted_samples: list[float], q: float) -> float:
    if not sorted_samples:
        return float("nan")
    return sorted_samples[min(int(len(sorted_samples) * q), len(sorted_samples) - 1)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--consumers", default="0,10,100,500", help="tailing consumer counts (default 0,10,100,500)")
    p.add_argument("--stalled", type=int, default=500, help="consumers that never read, one more case (0: none)")
    p.add_argument("--count", type=int, default=50_000, help="messages produced per case (default 50,000)")
    p.add_argument("--size", type=int, default=1024, help="payload bytes (default 1024)")
    p.add_argument("--runs", type=int, default=3, help="runs; each figure is the median (default 3)")
    p.add_argument("--procs", type=int, default=4, help="consumer worker processes (default 4)")
    p.add_argument("--linger", type=float, default=0.005, help="SDK producer linger, seconds (default 0.005)")
    p.add_argument("--window", type=int, default=8000, help="unanswered sends before waiting (default 8000)")
    p.add_argument("--cap-mb", type=float, default=4.0, help="the node's consume_buffer_bytes, MiB (default 4)")
    p.add_argument("--node-flag", action="append", default=[], help="extra serve flag (repeatable)")
    p.add_argument("--baseline-flag", action="append", default=[],
                   help="serve flag of a comparison run of each tailing case, e.g. --consume-cache-bytes=0 "
                        "(repeatable; none: no comparison)")
    p.add_argument("--profile", default=None, help="py-spy flame graph of the node at the largest N (SVG path)")
    p.add_argument("--raw-floor", action="store_true",
                   help="per run, the transport's raw limit: a bare grpc.aio server and the same consumers")
    p.add_argument("--raw-bytes", type=int, default=512 << 10, help="the raw server's response size (512 KiB)")
    p.add_argument("--consumer-nice", type=int, default=0,
                   help="niceness of the consumer processes (default 0; 19: they take only the CPU that the "
                   "node, producer and probe leave, as readers on other machines would)")
    p.add_argument("--dir", default=None, help="parent of the temporary directories")
    args = p.parse_args(argv)
    args.consumers = [int(x) for x in args.consumers.split(",") if x]
    prepare_process()
    root = tempfile.mkdtemp(prefix="fanout-", dir=args.dir)
    cases = [(n, False, False) for n in args.consumers] + ([(args.stalled, True, False)] if args.stalled else [])
    if args.baseline_flag:  # each tailing case with consumers again, with the comparison's flags
        cases = [c for n in args.consumers for c in ((n, False, False), (n, False, True))[: 2 if n else 1]] + \
            [c for c in cases if c[1]]
    results: dict[tuple[int, bool, bool], list[dict[str, float]]] = {c: [] for c in cases}
    raw: list[dict[str, float]] = []
    try:
        for i in range(args.runs):
            for case in cases if i % 2 == 0 else cases[::-1]:  # which goes first alternates
                r = _one(args, root, *case)
                results[case].append(r)
                print(f"run {i + 1}/{args.runs} {_label(case)}: "
                      + ", ".join(f"{k} {v:,.1f}" for k, v in r.items()), file=sys.stderr, flush=True)
            if args.raw_floor and max(args.consumers):
                r = _raw_floor(args, max(args.consumers))
                raw.append(r)
                print(f"run {i + 1}/{args.runs} raw: " + ", ".join(f"{k} {v:,.1f}" for k, v in r.items()),
                      file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    def med(case: tuple[int, bool, bool], key: str) -> float:
        return statistics.median(r[key] for r in results[case])

    print(f"fan-out: {args.count:,} x {args.size} B durable SDK produce, medians of {args.runs} runs")
    print(f"{'consumers':>12} {'produce/s':>10} {'ack p50':>8} {'ack p99':>8} {'probe p50':>9} {'probe p99':>9} "
          f"{'delivered/s':>12} {'shared':>6} {'RSS MB':>7} {'node CPU/msg':>12}")
    if args.baseline_flag:
        print(f"'base': with {' '.join(args.baseline_flag)}")
    for case in cases:
        print(f"{_label(case):>12} {med(case, 'produce'):>10,.0f} {med(case, 'p50_ms'):>6.1f}ms "
              f"{med(case, 'p99_ms'):>6.1f}ms "
              f"{med(case, 'probe_p50_ms'):>7.2f}ms {med(case, 'probe_p99_ms'):>7.2f}ms "
              f"{med(case, 'delivered'):>12,.0f} {med(case, 'shared'):>6.0%} {med(case, 'rss_mb'):>7.0f} "
              f"{med(case, 'node_cpu_us'):>10.1f}µs")
    base = (0, False, False)
    hundred = (100, False, False)
    if base in results and hundred in results:
        ratio = med(hundred, "produce") / med(base, "produce")
        print(f"100 consumers: produce {ratio:.2f} of 0 (target >= {PRODUCE_RATIO_TARGET}), ack p99 "
              f"{med(hundred, 'p99_ms'):.1f} ms, probe p99 {med(hundred, 'probe_p99_ms'):.1f} ms (target <= "
              f"{ACK_P99_TARGET_MS:.0f}), delivered "
              f"{med(hundred, 'delivered'):,.0f}/s (target >= {DELIVERY_TARGET:,})")
    top = (max(args.consumers), False, False)
    if raw and top in results and base in results:
        # Ours per delivered MB: the node's CPU beyond what producing alone costs it, and the consumer
        # processes' CPU, over the payload bytes the node delivered while the producer ran.
        mb = med(top, "delivered") * args.size / 1e6 / med(top, "produce") * args.count
        node_us = (med(top, "node_cpu_us") - med(base, "node_cpu_us")) * args.count / mb
        readers_us = med(top, "readers_cores") / (med(top, "delivered") * args.size / 1e6) * 1e6
        raw_server = statistics.median(r["raw_server_us_mb"] for r in raw)
        raw_readers = statistics.median(r["raw_readers_us_mb"] for r in raw)
        need = DELIVERY_TARGET * args.size / 1e6  # MB/s
        print(f"transport with {top[0]} streams, CPU per delivered MB: node {node_us:,.0f} µs against the bare "
              f"server's {raw_server:,.0f} ({node_us / raw_server:.1f}x); consumer processes {readers_us:,.0f} µs "
              f"against {raw_readers:,.0f} on the bare server ({readers_us / raw_readers:.1f}x); bare server "
              f"{statistics.median(r['raw_mb_s'] for r in raw):,.0f} MB/s")
        print(f"delivering {DELIVERY_TARGET:,} msgs/s of {args.size} B ({need:,.0f} MB/s) at the raw cost alone takes "
              f"{need * (raw_server + raw_readers) / 1e6:.2f} cores ({need * raw_server / 1e6:.2f} sending, "
              f"{need * raw_readers / 1e6:.2f} reading) of this machine's {os.cpu_count()}")
    if args.stalled:
        bound = 500 + args.stalled * args.cap_mb
        print(f"{args.stalled} stalled consumers: RSS {med((args.stalled, True, False), 'rss_mb'):.0f} MB "
              f"(bound 500 MB + {args.stalled} x {args.cap_mb:g} MiB = {bound:,.0f} MB)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--probe":
        asyncio.run(_probe(sys.argv[2]))
        sys.exit(0)
    if len(sys.argv) == 3 and sys.argv[1] == "--raw-server":
        asyncio.run(_raw_server(int(sys.argv[2])))
        sys.exit(0)
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        asyncio.run(_worker(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "stall"))
        sys.exit(0)
    sys.exit(main())
