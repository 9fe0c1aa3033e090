"""Durable produce while many consumer groups commit positions on the same pchannel.

    .venv/bin/python bench/groups.py [--count N] [--groups 1000] [--interval 1.0] [--runs 3]

Every run starts one node (``produce_consume``'s ``_node``: its own process, a fresh data directory)
with pchannels ``quiet`` and ``busy``, then measures durable produce through the SDK exactly as
``produce_consume`` does (``--count`` messages of ``--size`` bytes, ``send_nowait`` with a window,
then ``flush``), once on each:

* **0 groups**: on ``quiet``; no group exists, nothing commits.
* **N groups**: on ``busy``, while a driver process (this script with ``--driver``) commits for
  ``--groups`` consumer groups of ``busy``, each every ``--interval`` seconds (phases spread at
  random, so about groups / interval commits per second in all), each waiting for its answer before
  the next.  The commits carry increasing positions (with their timetick: nothing to look up).
  ``--via seek`` (the default) commits with SeekConsumerGroup, one unary call each, so that what is
  measured is the commit path alone (the call, the group record stored durably on the WAL's writer
  thread).  ``--via consume`` holds a Consume stream open per group (on a vchannel nobody writes, so
  nothing is delivered) and commits with in-band ConsumeAcks, as consumers do; it then measures the
  cost of 1,000 open readers too, which issue 21's fan-out work (``bench/fanout.py``) is about.

``--raw-floor`` adds, per run, the raw limit of the calls: the same driver, against a bare grpc.aio
server whose CreateConsumerGroup and SeekConsumerGroup do nothing, and whose Consume answers each ack
and sends an empty pack every ``--quiet-seconds`` (0.5, the node's default), for 8 intervals; its CPU per call
is printed beside the node's CPU per commit (what the node used beyond producing alone, over the acks
done), with the cores the offered commits take at the raw cost alone.

``--driver-nice 19`` runs the driver at the lowest CPU priority, for groups that commit from other
machines: on 2 cores it otherwise takes CPU from the producer whatever the node does.  Its acks/s show
whether it still commits at the rate asked.

Which of the two goes first alternates between runs, against drift on a noisy host.  Reported: the
median produce msgs/s of each, their ratio (target >= 0.9), the acks the driver completed during the
produce and their latency (p50 / p99 pooled over runs).  Benchmarks are not tests: they assert nothing
about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import BareServer, Run, prepare_process, reap, repeat, serve_bare, tmpdir, verdict  # noqa: I001
import produce_consume as pc

import grpc

from streamingnode.wire import codec
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from wal.message import Position

RATIO_TARGET = 0.9
PCHANNELS = "quiet,busy"
IDLE_VCHANNEL = "nobody-writes-here"
STREAMS_PER_CHANNEL = 100  # gRPC connections of the driver: HTTP/2 streams per connection stay modest


# --- the driver (its own process) ------------------------------------------------------------------
class _Driver:
    def __init__(self, addr: str, pchannel: str, groups: int, interval: float, via: str) -> None:
        self.addr, self.pchannel, self.groups, self.interval, self.via = addr, pchannel, groups, interval, via
        self.latencies: list[float] = []
        self.errors = 0
        self.packs = 0
        self.stop = asyncio.Event()
        self.opened = 0
        self.every_open = asyncio.Event()

    async def run(self) -> None:
        # A local subchannel pool: channels to one address otherwise share one connection, and the node
        # caps the streams of a connection.
        options = [*pc.CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
        channels = [grpc.aio.insecure_channel(self.addr, options=options)
                    for _ in range((self.groups + STREAMS_PER_CHANNEL - 1) // STREAMS_PER_CHANNEL)]
        try:
            stubs = [sgrpc.StreamingNodeStub(c) for c in channels]
            names = [f"g{i:05d}" for i in range(self.groups)]
            for i in range(0, len(names), 100):
                await asyncio.gather(*(stubs[0].CreateConsumerGroup(
                    spb.CreateConsumerGroupRequest(pchannel=self.pchannel, group=n)) for n in names[i:i + 100]))
            all_open = asyncio.Event()
            group = self._group if self.via == "consume" else self._seeker
            tasks = [asyncio.create_task(group(stubs[i // STREAMS_PER_CHANNEL], n, all_open))
                     for i, n in enumerate(names)]
            opening = asyncio.ensure_future(self.every_open.wait())
            done, _ = await asyncio.wait([opening, *tasks], return_when=asyncio.FIRST_COMPLETED)
            if opening not in done:  # a stream failed to open: say why instead of waiting forever
                opening.cancel()
                for t in tasks:
                    t.cancel()
                failed = next(t for t in done if t.exception() is not None)
                raise RuntimeError(f"a group's stream failed: {failed.exception()!r}")
            all_open.set()
            print("ready", flush=True)
            await self.stop.wait()
            await asyncio.gather(*tasks)
        finally:
            for c in channels:
                await c.close()

    async def _beats(self) -> AsyncIterator[int]:
        """1, 2, ... once per ``interval`` (each caller's phase drawn at random) until ``stop``."""
        loop = asyncio.get_running_loop()
        due = loop.time() + random.uniform(0, self.interval)
        k = 0
        while not self.stop.is_set():
            try:
                await asyncio.wait_for(self.stop.wait(), max(due - loop.time(), 0))
                return
            except TimeoutError:
                pass
            due += self.interval
            k += 1
            yield k

    async def _seeker(self, stub: sgrpc.StreamingNodeStub, group: str, all_open: asyncio.Event) -> None:
        self.opened += 1
        if self.opened == self.groups:
            self.every_open.set()
        await all_open.wait()
        async for k in self._beats():
            pos = codec.position_to_pb(Position(self.pchannel, k, k))
            t0 = time.perf_counter()
            try:
                await stub.SeekConsumerGroup(spb.SeekConsumerGroupRequest(
                    pchannel=self.pchannel, group=group, vchannel=IDLE_VCHANNEL, position=pos))
            except grpc.aio.AioRpcError:
                self.errors += 1
            else:
                self.latencies.append(time.perf_counter() - t0)

    async def _group(self, stub: sgrpc.StreamingNodeStub, group: str, all_open: asyncio.Event) -> None:
        call = stub.Consume()
        await call.write(spb.ConsumeRequest(open=spb.ConsumeOpen(
            pchannel=self.pchannel, vchannel=IDLE_VCHANNEL, consumer_group=group)))
        first = await call.read()
        if first is grpc.aio.EOF or first.WhichOneof("response") != "opened":
            raise RuntimeError(f"consume open failed: {first}")
        self.opened += 1
        if self.opened == self.groups:
            self.every_open.set()
        await all_open.wait()
        async for k in self._beats():
            ack = spb.ConsumeAck(positions=[codec.position_to_pb(Position(self.pchannel, k, k), IDLE_VCHANNEL)])
            t0 = time.perf_counter()
            await call.write(spb.ConsumeRequest(ack=ack))
            while True:
                resp = await call.read()
                if resp is grpc.aio.EOF:
                    raise RuntimeError(f"consume stream of {group} ended: {await call.code()}")
                kind = resp.WhichOneof("response")
                if kind == "acked":
                    self.latencies.append(time.perf_counter() - t0)
                    break
                if kind == "error":
                    self.errors += 1
                    break
                self.packs += 1
        await call.write(spb.ConsumeRequest(close=spb.ConsumeClose()))
        await call.done_writing()
        while await call.read() is not grpc.aio.EOF:  # until the node ends the stream (after 'closed')
            pass

    def mark(self) -> None:
        """Print what happened since the previous mark (one JSON line) and start over."""
        lat = self.latencies
        print(json.dumps({"acks": len(lat), "errors": self.errors, "packs": self.packs,
                          "p50_ms": pc._pct(lat, 0.5) if lat else 0.0, "p99_ms": pc._pct(lat, 0.99) if lat else 0.0,
                          "samples": lat}), flush=True)
        self.latencies, self.errors, self.packs = [], 0, 0


def _drive(args: argparse.Namespace) -> int:
    async def main() -> None:
        driver = _Driver(args.driver, "busy", args.groups, args.interval, args.via)
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, driver.mark)
        loop.add_signal_handler(signal.SIGTERM, driver.stop.set)
        await driver.run()

    asyncio.run(main())
    return 0


# --- the runs ----------------------------------------------------------------------------------------
class _DriverProc:
    def __init__(self, addr: str, args: argparse.Namespace) -> None:
        env = dict(os.environ, GRPC_VERBOSITY="ERROR", PYTHONPATH=str(pc.ROOT))
        argv = ["nice", "-n", str(args.driver_nice), pc.PYTHON, __file__, "--driver", addr,
                "--groups", str(args.groups), "--interval", str(args.interval), "--via", args.via]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env, cwd=str(pc.ROOT), text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            self.proc.kill()
            raise RuntimeError(f"the group driver did not start: {line!r}")

    def mark(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        self.proc.send_signal(signal.SIGUSR1)
        out: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return out

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        reap(self.proc, 30)


async def _raw_server(quiet_seconds: float) -> None:
    """The raw limit of a commit: a bare grpc.aio server until stdin closes.  Its CreateConsumerGroup and
    SeekConsumerGroup answer with nothing; its Consume opens, answers each ack with the positions it
    carried, and sends an empty pack every ``quiet_seconds`` (as the node tells a reader of a quiet
    vchannel that its position moved), with no log, no group record and no scanner behind any of it."""
    async def nothing(request: bytes, context: Any) -> bytes:
        return b""

    async def consume(requests: Any, context: Any) -> None:
        await context.read()
        await context.write(spb.ConsumeResponse(opened=spb.ConsumeOpened(consumer_id=1, term=1)))
        writing = asyncio.Lock()  # one write at a time on a stream, as gRPC requires
        ts = time.time_ns()
        empty = spb.ConsumeResponse()
        empty.pack.begin_ts, empty.pack.end_ts = ts, ts
        for where in (empty.pack.start_positions.add(), empty.pack.end_positions.add()):
            where.CopyFrom(codec.position_to_pb(Position("busy", 1, ts), IDLE_VCHANNEL))

        async def quiet() -> None:
            while True:
                await asyncio.sleep(quiet_seconds)
                async with writing:
                    await context.write(empty)

        beat = asyncio.get_running_loop().create_task(quiet())
        try:
            while (request := await context.read()) is not grpc.aio.EOF:
                kind = request.WhichOneof("request")
                if kind == "ack":
                    async with writing:
                        await context.write(spb.ConsumeResponse(acked=spb.ConsumeAcked(
                            positions=request.ack.positions)))
                elif kind == "close":
                    beat.cancel()
                    async with writing:
                        await context.write(spb.ConsumeResponse(closed=spb.ConsumeClosed()))
                    return
        finally:
            beat.cancel()

    handlers: dict[str, grpc.RpcMethodHandler] = {
        name: grpc.unary_unary_rpc_method_handler(nothing) for name in ("CreateConsumerGroup", "SeekConsumerGroup")}
    handlers["Consume"] = grpc.stream_stream_rpc_method_handler(
        consume, request_deserializer=spb.ConsumeRequest.FromString,
        response_serializer=spb.ConsumeResponse.SerializeToString)
    await serve_bare(grpc.method_handlers_generic_handler("streamingnode.v1.StreamingNode", handlers))


def _raw_floor(args: argparse.Namespace) -> float:
    """Server CPU µs per commit of the bare server under the same driver (``--via`` as the run's)."""
    with BareServer(__file__, str(args.quiet_seconds)) as server:
        driver = _DriverProc(server.address, args)
        try:
            time.sleep(args.interval)
            driver.mark()
            cpu0 = server.cpu
            time.sleep(8 * args.interval)
            cpu = server.cpu - cpu0
            calls = int(driver.mark()["acks"])
        finally:
            driver.stop()
    return float(cpu) / max(calls, 1) * 1e6


def _one_run(args: argparse.Namespace, root: str, index: int, lat: list[float]) -> Run:
    sdk = pc._sdk()
    r: Run = {}
    with pc._node(tmpdir(root, "node"), tmpdir(root, "logs"), PCHANNELS, extra=tuple(args.node_flag)) as node:
        addr = node.match.group(1)

        def produce(pchannel: str, key: str) -> None:
            coro = pc._produce_sdk(sdk, addr, pchannel, args.count, args.size, args.linger, args.max_batch_bytes,
                                   args.sdk_window)
            r[key] = pc._timed(node, args.count, r, key, coro)

        order = ["none", "groups"] if index % 2 == 0 else ["groups", "none"]
        for kind in order:
            if kind == "none":
                produce("quiet", "produce_none")
                continue
            driver = _DriverProc(addr, args)
            try:
                time.sleep(args.interval)  # every group has acked about once: the steady rate
                driver.mark()
                t0 = time.perf_counter()
                produce("busy", "produce_groups")
                seconds = time.perf_counter() - t0
                during = driver.mark()
            finally:
                driver.stop()
            r["acks_per_s"] = during["acks"] / seconds
            r["ack_errors"] = during["errors"]
            r["packs"] = during["packs"]
            lat += during["samples"]
    r["ratio"] = r["produce_groups"] / r["produce_none"]
    # The node's CPU per commit: what it used beyond producing alone, over the acks done meanwhile.
    r["node_us_per_ack"] = ((r["produce_groups_srv_us"] - r["produce_none_srv_us"]) * args.count
                            / max(r["acks_per_s"] * args.count / r["produce_groups"], 1))
    if args.raw_floor:
        r["raw_us_per_call"] = _raw_floor(args)
    return r


def _pcts(lat: list[float]) -> str:
    return f"{pc._pct(lat, 0.5):.1f} / {pc._pct(lat, 0.99):.1f} ms" if lat else "no commits"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--count", type=int, default=200_000, help="messages per produce (default 200,000)")
    p.add_argument("--size", type=int, default=1024, help="payload bytes (default 1024)")
    p.add_argument("--groups", type=int, default=1000, help="consumer groups committing (default 1,000)")
    p.add_argument("--interval", type=float, default=1.0,
                   help="seconds between two acks of one group (default 1.0: groups/interval commits/s)")
    p.add_argument("--via", choices=("seek", "consume"), default="seek",
                   help="how groups commit: SeekConsumerGroup calls (default) or acks on open Consume streams")
    p.add_argument("--runs", type=int, default=3, help="runs; throughput is the median (default 3)")
    p.add_argument("--linger", type=float, default=0.005, help="SDK producer linger, seconds (default 0.005)")
    p.add_argument("--max-batch-bytes", type=int, default=1 << 20, help="SDK producer max_batch_bytes (default 1 MiB)")
    p.add_argument("--sdk-window", type=int, default=8000,
                   help="SDK producer: unanswered send_nowait futures before waiting for the oldest (default 8000)")
    p.add_argument("--node-flag", action="append", default=[],
                   help="extra serve flag, e.g. --consume-quiet-pack-seconds=2 (repeatable)")
    p.add_argument("--raw-floor", action="store_true",
                   help="per run, the calls' raw limit: the same driver against a bare grpc.aio server")
    p.add_argument("--driver-nice", type=int, default=0,
                   help="niceness of the groups' driver process (default 0; 19: it takes only the CPU the node and "
                   "the producer leave, as clients on other machines would; check that its acks/s still hold)")
    p.add_argument("--quiet-seconds", type=float, default=0.5,
                   help="--raw-floor --via consume: the bare server's empty pack per stream every this many seconds "
                   "(default 0.5, the node's consume_quiet_pack_seconds)")
    p.add_argument("--dir", default=None, help="parent of the temporary directories (default: system temp)")
    p.add_argument("--driver", metavar="ADDR", help=argparse.SUPPRESS)  # the ack driver's own process
    args = p.parse_args(argv)
    if min(args.count, args.size, args.groups, args.runs) < 1 or args.interval <= 0:
        p.error("every size and count must be >= 1 and --interval > 0")
    if args.driver:
        return _drive(args)
    prepare_process()
    lat: list[float] = []

    def describe(r: Run) -> str:
        return (f"produce msgs/s: 0 groups {r['produce_none']:,.0f}, {args.groups} groups {r['produce_groups']:,.0f} "
                f"(ratio {r['ratio']:.2f}); acks {r['acks_per_s']:,.0f}/s, errors {r['ack_errors']:.0f}")

    runs = repeat(args, "groups", lambda a, root, i: _one_run(a, root, i, lat), describe)
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    ratio = med["produce_groups"] / med["produce_none"]
    print(f"durable produce, SDK, {args.count:,} x {args.size} B, medians of {len(runs)} runs; "
          f"{args.groups} groups committing every {args.interval} s via {args.via}")
    print("| groups committing | produce msgs/s | node CPU µs/msg | acks/s during produce | ack p50 / p99 |")
    print("|---|---:|---:|---:|---|")
    print(f"| 0 | {med['produce_none']:,.0f} | {med['produce_none_srv_us']:.1f} | - | - |")
    print(f"| {args.groups} | {med['produce_groups']:,.0f} | {med['produce_groups_srv_us']:.1f} | "
          f"{med['acks_per_s']:,.0f} | {_pcts(lat)} |")
    if args.raw_floor:
        offered = args.groups / args.interval
        print(f"node CPU per commit {med['node_us_per_ack']:,.0f} µs against {med['raw_us_per_call']:,.0f} µs "
              f"per call of a bare grpc.aio server under the same driver; {offered:,.0f} commits/s at the raw cost "
              f"alone take {offered * med['raw_us_per_call'] / 1e6:.2f} cores of this machine's {os.cpu_count()}")
    per_run = ", ".join(f"{r['ratio']:.2f}" for r in runs)
    print(f"produce with {args.groups} groups / without: {verdict(ratio, RATIO_TARGET)} (per-run ratios {per_run})")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--raw-server":
        asyncio.run(_raw_server(float(sys.argv[2])))
        sys.exit(0)
    sys.exit(main())
