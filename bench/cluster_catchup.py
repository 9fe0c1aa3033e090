"""Cluster mode catch-up read: a pchannel's whole log read from earliest through a node that did not
write it (its owner was SIGKILLed and it took over, so nothing of the log is in its memory), against
nats-py reading the same JetStream stream in the same run.

    .venv/bin/python bench/cluster_catchup.py [--runs 3] [--count 10000] [--senders 8] [--baseline DIR]

One three-server NATS JetStream cluster on loopback (``tests/natscluster.py``: file storage,
``sync_interval: always``) serves the whole invocation; each run uses a fresh prefix.  Per run:

* two ``serve --wal jetstream --nats-replicas 3`` nodes; ``--senders`` SDK sends in flight, each
  awaited before the next (as an idempotent producer paced by its caller writes: small blocks, a
  few messages each), ``--count`` messages of 32 bytes to one pchannel;
* the owner is SIGKILLed and the other node takes the pchannel over;
* **ours**: an SDK consumer seeded with that node alone reads the pchannel from earliest to the
  last message;
* **backend**: the same stream read by the JetStream WAL backend alone (a fresh instance in a process
  of its own, ``read_blocks`` from id 0, everything at once): blocks per second and the CPU of that
  process per block (its NATS client included); with ``--baseline``, that checkout's backend too;
* **raw**: a nats-py pull consumer (``fetch`` of 1,000, no acks) reads the pchannel's stream, every
  stored block, from its first sequence to its last.

Both figures are messages of the log per second (the raw read's time over the same ``--count``
messages: it reads the blocks that hold them).  With ``--baseline DIR`` (another checkout, e.g. a
``git worktree`` of an older commit) each run also measures ours with that checkout's nodes, on a log
of its own written the same way: an A/B in the same minute.  The servers, the nodes and this process
share the machine's 2 cores: read the ratios.  Benchmarks are not tests: nothing here asserts speed.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nats
from _harness import prepare_process
from nats.js import api

from streamingnode.client import AsyncClient, DeliverPolicy, UnavailableError
from tests.natscluster import NatsCluster
from tests.node_process import NodeProcess

PCHANNEL = "catchup"
LEASE = 2.0
_prefixes = itertools.count()


async def _served(address: str) -> None:
    """Until ``address`` serves the pchannel (it took it over after its owner died)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            async with AsyncClient(address, timeout=5) as client:
                await client.latest_position(PCHANNEL)
            return
        except UnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _write(seeds: list[str], count: int, senders: int) -> str:
    """Create the pchannel, write ``count`` messages with ``senders`` awaited sends in flight; the
    owner's address."""
    async with AsyncClient(seeds, timeout=30) as client:
        await client.create_channels([PCHANNEL])
        async with client.producer(PCHANNEL, linger=0.0) as producer:
            await producer.send("v", b"first")
            left = itertools.count(count - 1, -1)

            async def sender() -> None:
                while next(left) > 0:
                    await producer.send("v", b"m" * 32)

            await asyncio.gather(*(sender() for _ in range(senders)))
        [desc] = await client.describe_channels([PCHANNEL])
        return desc.owner.address


async def _read_ours(address: str) -> tuple[int, float]:
    async with AsyncClient(address, timeout=60) as client:
        last, _ = await client.latest_position(PCHANNEL)
        assert last is not None
        n = 0
        t0 = time.perf_counter()
        async with client.consumer(PCHANNEL, policy=DeliverPolicy.all()) as consumer:
            async for pack in consumer:
                n += len(pack.messages)
                if pack.end_ts >= last.timetick:
                    break
        return n, time.perf_counter() - t0


async def _read_raw(url: str, prefix: str) -> tuple[int, float]:
    """Every block of the pchannel's stream through a pull consumer: (blocks, seconds)."""
    nc = await nats.connect(url.split(","))
    try:
        js = nc.jetstream(timeout=30)
        names = [s.config.name for s in await js.streams_info() if s.config.name.startswith(f"SN_{prefix}_")]
        [stream] = names  # one pchannel per prefix
        info = await js.stream_info(stream)
        want = int(info.state.messages)
        subject = info.config.subjects[0]
        t0 = time.perf_counter()
        sub = await js.pull_subscribe(subject, durable=None, stream=stream, config=api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.ALL, ack_policy=api.AckPolicy.NONE))
        got = 0
        while got < want:
            got += len(await sub.fetch(1000, timeout=10))
        elapsed = time.perf_counter() - t0
        await sub.unsubscribe()
        return got, elapsed
    finally:
        await nc.close()


_BACKEND_READ = """
import json, sys, time
from wal.backends.jetstream import JetStreamBackend
backend = JetStreamBackend(sys.argv[1], prefix=sys.argv[2], replicas=3)
try:
    t0, c0 = time.perf_counter(), time.process_time()
    blocks = backend.read_blocks(int(sys.argv[3]), 0, 1 << 40)
    print(json.dumps([len(blocks), time.perf_counter() - t0, time.process_time() - c0]))
finally:
    backend.close()
"""
"""Run in a process of its own, in the checkout measured (its directory first on the path): read the
whole stream through a fresh backend and print (blocks, seconds, CPU seconds) as JSON."""


def _backend(url: str, prefix: str, repo: Path | None) -> tuple[float, float]:
    """(blocks/s, CPU µs per block) of ``repo``'s backend (None: this checkout) reading the stream."""
    key = asyncio.run(_stream_key(url, prefix))
    checkout = repo or Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", _BACKEND_READ, url, prefix, str(key)], cwd=checkout,
                         env={**os.environ, "PYTHONPATH": str(checkout)}, capture_output=True, text=True,
                         check=True, timeout=600).stdout
    blocks, seconds, cpu = json.loads(out.strip().splitlines()[-1])
    return blocks / seconds, cpu * 1e6 / blocks


async def _stream_key(url: str, prefix: str) -> int:
    nc = await nats.connect(url.split(","))
    try:
        streams = await nc.jetstream().streams_info()
        [name] = [s.config.name for s in streams if s.config.name.startswith(f"SN_{prefix}_")]
        return int(name.rsplit("_", 1)[1])
    finally:
        await nc.close()


def _one(args: argparse.Namespace, natsc: NatsCluster, root: Path, repo: Path | None,
         backends: bool = True) -> dict[str, Any]:
    prefix = f"cu{next(_prefixes)}"
    common = ("--wal", "jetstream", "--nats", natsc.url, "--nats-replicas", "3", "--cluster-prefix", prefix,
              "--lease-seconds", str(LEASE), "--parquet-root", str(root / prefix / "parquet"),
              "--log-level", "warning")
    nodes = {n: NodeProcess(root / prefix / n, None, "--node-id", n, *common, repo=repo).start() for n in "ab"}
    try:
        t0 = time.perf_counter()
        owner = asyncio.run(_write([p.address for p in nodes.values()], args.count, args.senders))
        write_s = time.perf_counter() - t0
        [killed] = [n for n, p in nodes.items() if p.address == owner]
        nodes[killed].kill()
        [survivor] = [p.address for n, p in nodes.items() if n != killed]
        asyncio.run(_served(survivor))
        n, ours_s = asyncio.run(_read_ours(survivor))
        blocks, raw_s = asyncio.run(_read_raw(natsc.url, prefix))
        be_rate, be_cpu = _backend(natsc.url, prefix, None) if backends else (0.0, 0.0)
        base_be = _backend(natsc.url, prefix, args.baseline) if backends and args.baseline is not None else None
    finally:
        for p in nodes.values():
            p.kill()
    out = {"messages": n, "blocks": blocks, "write_s": write_s, "ours": n / ours_s, "raw": args.count / raw_s,
           "be_rate": be_rate, "be_cpu": be_cpu}
    if base_be is not None:
        out["base_be_rate"], out["base_be_cpu"] = base_be
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--count", type=int, default=10_000)
    p.add_argument("--senders", type=int, default=8)
    p.add_argument("--baseline", type=Path, default=None,
                   help="another checkout whose nodes are measured the same way in each run")
    args = p.parse_args()
    prepare_process()
    root = Path(tempfile.mkdtemp(prefix="bench-catchup-"))
    natsc = NatsCluster(root / "nats", 3)
    natsc.start()
    rows: list[dict[str, Any]] = []
    try:
        asyncio.run(natsc.ready())
        for run in range(args.runs):
            r = _one(args, natsc, root, None)
            if args.baseline is not None:
                r["base"] = _one(args, natsc, root, args.baseline, backends=False)["ours"]
            rows.append(r)
            print(f"run {run + 1}: {r['messages']} messages in {r['blocks']} blocks (written in "
                  f"{r['write_s']:.1f} s); ours {r['ours']:,.0f} msgs/s, raw fetch {r['raw']:,.0f} msgs/s"
                  + (f", baseline {r['base']:,.0f} msgs/s" if "base" in r else "")
                  + f"; backend {r['be_rate']:,.0f} blocks/s, {r['be_cpu']:.0f} µs CPU/block"
                  + (f" (baseline {r['base_be_rate']:,.0f} blocks/s, {r['base_be_cpu']:.0f} µs)"
                     if "base_be_rate" in r else ""), flush=True)
    finally:
        natsc.stop()
    med = {k: statistics.median(r[k] for r in rows) for k in ("ours", "raw")}
    ratios = [r["ours"] / r["raw"] for r in rows]
    print(f"\nmedian of {len(rows)} runs: ours {med['ours']:,.0f} msgs/s, raw fetch {med['raw']:,.0f} msgs/s, "
          f"ours / raw {statistics.median(ratios):.2f}")
    if args.baseline is not None:
        base = [r["ours"] / r["base"] for r in rows]
        print(f"this checkout / {args.baseline}: median {statistics.median(base):.1f} "
              f"(baseline median {statistics.median(r['base'] for r in rows):,.0f} msgs/s)")
        print(f"backend alone, this checkout / baseline: blocks/s "
              f"{statistics.median(r['be_rate'] / r['base_be_rate'] for r in rows):.1f}x, CPU per block "
              f"{statistics.median(r['be_cpu'] for r in rows):.0f} µs vs "
              f"{statistics.median(r['base_be_cpu'] for r in rows):.0f} µs")
    else:
        print(f"backend alone: median {statistics.median(r['be_rate'] for r in rows):,.0f} blocks/s, "
              f"{statistics.median(r['be_cpu'] for r in rows):.0f} µs CPU per block")


if __name__ == "__main__":
    main()
