"""Cluster mode on this machine: durable produce through a node on the shared log (JetStream R1 and
R3) beside a local RocksDB node, the raw JetStream ceilings, and owner failover time.

    .venv/bin/python bench/cluster.py [--runs 3] [--count 50000] [--raw-count 10000] [--kills 10]

One three-server NATS JetStream cluster on loopback (``tests/natscluster.py``: file storage,
``sync_interval: always``, ``max_payload: 8MB``) serves the whole invocation; each run uses fresh
stream and bucket prefixes.  Every node is a real ``serve`` process; the client is this process.
The three servers, the node and the client share the machine's 2 cores, so read ratios.

Per run:

* **node R1 / node R3**: ``serve --wal jetstream --nats-replicas 1|3``; one SDK producer sends
  ``--count`` messages of ``--size`` bytes to one pchannel with ``send_nowait`` (at most ``--window``
  unanswered), then ``flush``; every future must resolve (acknowledged = stored in JetStream).
  Plain producer by default (as bench/produce_consume.py); ``--idempotent`` gives it a producer_id.
* **node RocksDB**: a plain ``serve`` (local RocksDB WAL, ``durability = sync``), the same produce.
* **raw per-message R3**: nats-py ``publish_async`` of ``--raw-count`` messages to an R3 stream, at most
  ``--window`` unacknowledged, every ack awaited (NOTES.md's "per-message publish").
* **raw fenced blocks R3**: ``--count`` messages packed ``--block`` (100 and 1,000) to one JetStream
  message, each publish carrying ``Nats-Expected-Last-Sequence``; awaited one at a time, and with
  ``--blocks-in-flight`` blocks pipelined (each with the sequence its predecessors will get); and,
  like for like, blocks of the mean size the R3 node wrote in the same run (its messages sent over
  the blocks in its stream), awaited one at a time as the node does.

CPU per message: for the node R3 produce and the like-for-like raw block run, the CPU seconds the node
process, this process (the client) and the three NATS servers used (``/proc/<pid>/stat``), over the
messages sent, in µs.  With everything on 2 cores, a path whose CPU per message is C µs cannot pass
2e6 / C msgs/s: the table says which part costs what.

With ``--baseline DIR`` (another checkout of this repository, e.g. a ``git worktree`` of an older
commit), each run also measures the node R3 produce with that checkout's code, right after this one's:
an A/B of a change on the same machine in the same minute.

Once, after the runs: **failover**: two nodes on R3 with ``--lease-seconds`` (short); ``--kills`` times
the owner of a pchannel is SIGKILLed, and the time from the kill to the next acknowledged send (the
SDK producer, seeded with both nodes, buffers meanwhile) is measured; the killed node is started again
before the next kill.  p50 and max.

Targets (issue 14, read as NOTES.md says): node R3 >= 40k msgs/s; node R3 >= 5x raw per-message R3, and
>= 0.6 of raw fenced 1,000-message blocks awaited one at a time; failover p50 <= 5 s.
Benchmarks are not tests: they assert nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

# Run as a script from anywhere: the harness makes the repository root importable.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import Run, prepare_process, repeat

from streamingnode.client import AsyncClient
from tests.natscluster import NatsCluster
from tests.node_process import NodeProcess

PCHANNEL = "bench"
VCHANNEL = "v0"
R3_TARGET = 40_000.0
VS_RAW_MESSAGE_TARGET = 5.0
VS_RAW_BLOCK_TARGET = 0.6
FAILOVER_P50_TARGET = 5.0
_prefixes = itertools.count()


# --- CPU accounting ----------------------------------------------------------------------------------
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / _TICK


class _Cpu:
    """CPU seconds used by the node (if any), this process and the NATS servers between two samples."""

    def __init__(self, nats: NatsCluster, node_pid: int | None = None) -> None:
        self._pids = {"nats": [p.pid for p in nats.procs if p is not None],
                      "node": [node_pid] if node_pid is not None else []}
        self._start = self._sample()

    def _sample(self) -> dict[str, float]:
        own = os.times()
        out = {part: sum(_cpu_seconds(pid) for pid in pids) for part, pids in self._pids.items()}
        out["client"] = own.user + own.system
        return out

    def per_message(self, n: int) -> dict[str, float]:
        """µs of CPU per message of each part since this was made."""
        end = self._sample()
        return {part: (end[part] - self._start[part]) * 1e6 / n for part in end}


# --- the node --------------------------------------------------------------------------------------
def _shared_node(nats: NatsCluster, root: Path, node_id: str, prefix: str, replicas: int, lease: float,
                 port: int | None = None, repo: Path | None = None) -> NodeProcess:
    return NodeProcess(root / node_id, port, "--wal", "jetstream", "--nats", nats.url, "--nats-replicas",
                       str(replicas), "--cluster-prefix", prefix, "--node-id", node_id, "--lease-seconds", str(lease),
                       "--parquet-root", str(root / "parquet"), "--log-level", "warning", repo=repo)


async def _produce(seeds: list[str], n: int, size: int, window: int, create: bool, idempotent: bool) -> float:
    async with AsyncClient(seeds) as client:
        if create:
            await client.create_channels([PCHANNEL])
        payload = os.urandom(size)
        producer_id = uuid.uuid4().hex if idempotent else None
        async with client.producer(PCHANNEL, producer_id=producer_id) as producer:
            await producer.send(VCHANNEL, payload)  # the stream is open and the owner found
            outstanding: collections.deque[asyncio.Future[Any]] = collections.deque()
            t0 = time.perf_counter()
            for _ in range(n):
                outstanding.append(producer.send_nowait(VCHANNEL, payload))
                if len(outstanding) >= window:
                    await outstanding.popleft()
            await producer.flush()
            for f in outstanding:
                f.result()  # every message acknowledged (a failed batch raises here)
            elapsed = time.perf_counter() - t0
    return n / elapsed


def _node_produce(args: argparse.Namespace, nats: NatsCluster, root: Path, replicas: int | None,
                  cpu: dict[str, float] | None = None, repo: Path | None = None) -> tuple[float, float]:
    """Durable produce through one node: on the shared log at ``replicas``, or RocksDB when None.
    Msgs/s, and the mean messages per JetStream message (block) the node wrote (0 for RocksDB); with
    ``cpu``, fills it with the µs of CPU per message of the node, the client and the servers."""
    root.mkdir(parents=True)
    prefix = f"b{next(_prefixes)}"
    if replicas is None:
        node = NodeProcess(root / "rocks", None, "--channels", PCHANNEL, "--log-level", "warning")
    else:
        node = _shared_node(nats, root, "a", prefix, replicas, 10.0, repo=repo)
    node.start()
    try:
        assert node.proc is not None
        meter = _Cpu(nats, node.proc.pid)
        rate = asyncio.run(_produce([node.address], args.count, args.size, args.window, replicas is not None,
                                    args.idempotent))
        if cpu is not None:
            cpu.update(meter.per_message(args.count))
    finally:
        node.kill()
    return rate, (asyncio.run(_mean_block(nats, prefix, args.count + 1)) if replicas is not None else 0.0)


async def _mean_block(nats: NatsCluster, prefix: str, sent: int) -> float:
    """Messages per stored block of the node's pchannel: ``sent`` over its stream's messages, less the
    one fence marker its opening wrote (TimeTicks, a few, ride in the blocks)."""
    import nats as nats_py  # noqa: PLC0415

    nc = await nats_py.connect(nats.urls)
    try:
        found = await nc.jetstream(timeout=10).streams_info()
        streams = [s for s in found if s.config.name.startswith(f"SN_{prefix}_")]
        blocks = sum(s.state.messages for s in streams) - len(streams)
    finally:
        await nc.close()
    return sent / max(blocks, 1)


# --- raw JetStream -----------------------------------------------------------------------------------
async def _stream(nats: NatsCluster, replicas: int) -> tuple[Any, Any, str]:
    import nats as nats_py  # noqa: PLC0415
    from nats.js.api import StreamConfig  # noqa: PLC0415

    nc = await nats_py.connect(nats.urls)  # the servers announce their max_payload (8 MiB)
    name = f"RAW{next(_prefixes)}"
    js = nc.jetstream(timeout=10)
    await js.add_stream(StreamConfig(name=name, subjects=[name.lower()], storage="file", num_replicas=replicas))
    return nc, js, name


async def _raw_messages(nats: NatsCluster, n: int, size: int, window: int) -> float:
    nc, _, name = await _stream(nats, 3)
    try:
        js = nc.jetstream(timeout=10, publish_async_max_pending=window)
        payload = os.urandom(size)
        futures = []
        t0 = time.perf_counter()
        for _ in range(n):
            futures.append(await js.publish_async(name.lower(), payload))
        # nats-py: a future may never complete on a server error, so the wait is bounded.
        await asyncio.wait_for(js.publish_async_completed(), 120)
        elapsed = time.perf_counter() - t0
        for f in futures:
            f.result()
    finally:
        await nc.close()
    return n / elapsed


async def _raw_blocks(nats: NatsCluster, n: int, size: int, block: int, in_flight: int) -> float:
    """``n`` messages in blocks of ``block``, fenced by expected last sequence, ``in_flight`` pipelined."""
    nc, js, name = await _stream(nats, 3)
    subject = name.lower()
    try:
        body = os.urandom(size) * block
        blocks = max(n // block, 1)
        pending: collections.deque[asyncio.Task[Any]] = collections.deque()
        t0 = time.perf_counter()
        for seq in range(blocks):
            # Block seq lands at stream sequence seq + 1 if every block before it did.
            headers = {"Nats-Expected-Last-Sequence": str(seq)}
            pending.append(asyncio.create_task(js.publish(subject, body, headers=headers, timeout=10)))
            if len(pending) >= in_flight:
                await pending.popleft()
        for task in pending:
            await task
        elapsed = time.perf_counter() - t0
    finally:
        await nc.close()
    return blocks * block / elapsed


# --- failover ----------------------------------------------------------------------------------------
async def _failover(args: argparse.Namespace, nats: NatsCluster, root: Path) -> list[float]:
    prefix = f"f{next(_prefixes)}"
    nodes = {n: _shared_node(nats, root, n, prefix, 3, args.lease_seconds) for n in ("a", "b")}
    for node in nodes.values():
        node.start()
    times: list[float] = []
    try:
        seeds = [p.address for p in nodes.values()]
        async with AsyncClient(seeds, reconnect_timeout=120) as client:
            await client.create_channels([PCHANNEL])
            async with client.producer(PCHANNEL, producer_id=uuid.uuid4().hex, linger=0.001) as producer:
                for i in range(args.kills):
                    await producer.send(VCHANNEL, b"before")
                    (desc,) = await client.describe_channels([PCHANNEL])
                    owner = next(n for n, p in nodes.items() if p.address == desc.owner.address)
                    t0 = time.monotonic()
                    nodes[owner].kill()
                    await producer.send(VCHANNEL, b"after")
                    times.append(time.monotonic() - t0)
                    print(f"kill {i + 1}/{args.kills}: node {owner}, appends again after {times[-1]:.2f} s",
                          file=sys.stderr, flush=True)
                    nodes[owner].start()
    finally:
        for node in nodes.values():
            node.kill()
    return times


# --- runs and report ---------------------------------------------------------------------------------
def _one_run(args: argparse.Namespace, nats: NatsCluster, root: str, index: int) -> Run:
    base = Path(root) / f"run{index}"
    r: Run = {}
    r["node_r1"], _ = _node_produce(args, nats, base / "r1", 1)
    cpu: dict[str, float] = {}
    r["node_r3"], r["node_r3_block"] = _node_produce(args, nats, base / "r3", 3, cpu)
    r.update({f"cpu_r3_{part}": us for part, us in cpu.items()})
    if args.baseline is not None:
        r["node_r3_base"], _ = _node_produce(args, nats, base / "r3base", 3, repo=args.baseline)
    r["node_rocks"], _ = _node_produce(args, nats, base / "rocks", None)
    r["raw_msg_r3"] = asyncio.run(_raw_messages(nats, args.raw_count, args.size, args.window))
    # Like for like: blocks of the size the R3 node actually wrote in this run, one at a time as it does.
    meter = _Cpu(nats)
    r["raw_block_node"] = asyncio.run(
        _raw_blocks(nats, args.count, args.size, max(round(r["node_r3_block"]), 1), 1))
    r.update({f"cpu_raw_{part}": us for part, us in meter.per_message(args.count).items() if part != "node"})
    for block in (100, 1000):
        r[f"raw_block{block}"] = asyncio.run(_raw_blocks(nats, args.count, args.size, block, 1))
        r[f"raw_block{block}_pipe"] = asyncio.run(
            _raw_blocks(nats, args.count, args.size, block, args.blocks_in_flight))
    return r


LABELS = {
    "node_r1": "node, JetStream R1 (SDK producer)",
    "node_r3": "node, JetStream R3 (SDK producer)",
    "node_rocks": "node, local RocksDB (SDK producer)",
    "raw_msg_r3": "raw JetStream R3, per-message publish_async",
    "raw_block100": "raw JetStream R3, fenced 100-msg blocks, 1 in flight",
    "raw_block100_pipe": "raw JetStream R3, fenced 100-msg blocks, pipelined",
    "raw_block1000": "raw JetStream R3, fenced 1,000-msg blocks, 1 in flight",
    "raw_block1000_pipe": "raw JetStream R3, fenced 1,000-msg blocks, pipelined",
    "raw_block_node": "raw JetStream R3, fenced blocks of the node R3's mean size, 1 in flight",
    "node_r3_block": "(messages per block the node R3 wrote, mean)",
}
CPU_LABELS = {
    "cpu_r3_node": "node R3: the node",
    "cpu_r3_client": "node R3: the client (SDK)",
    "cpu_r3_nats": "node R3: the three NATS servers",
    "cpu_raw_client": "raw blocks of the node's size: the client (nats-py)",
    "cpu_raw_nats": "raw blocks of the node's size: the three NATS servers",
}


def _report(args: argparse.Namespace, runs: list[Run], failover: list[float]) -> None:
    med = {k: statistics.median(r[k] for r in runs) for k in LABELS}
    if args.baseline is not None:
        ratios = [r["node_r3"] / r["node_r3_base"] for r in runs]
        rates = " · ".join(f"{r['node_r3_base']:,.0f}" for r in runs)
        print(f"\nnode R3, this checkout / {args.baseline}: median {statistics.median(ratios):.2f} "
              f"(each run: {' · '.join(f'{x:.2f}' for x in ratios)}; baseline msgs/s {rates})")
    print(f"\n{args.count:,} x {args.size} B per produce (raw per-message: {args.raw_count:,}); "
          f"medians of {len(runs)} runs, msgs/s\n")
    print("| what | median | each run |\n|---|---:|---|")
    for key, label in LABELS.items():
        print(f"| {label} | {med[key]:,.0f} | {' · '.join(f'{r[key]:,.0f}' for r in runs)} |")
    print("\nCPU per message (µs), medians:\n\n| part | µs | each run |\n|---|---:|---|")
    for key, label in CPU_LABELS.items():
        print(f"| {label} | {statistics.median(r[key] for r in runs):.1f} | "
              f"{' · '.join(f'{r[key]:.1f}' for r in runs)} |")
    node_cpu = statistics.median(r["cpu_r3_node"] + r["cpu_r3_client"] + r["cpu_r3_nats"] for r in runs)
    raw_cpu = statistics.median(r["cpu_raw_client"] + r["cpu_raw_nats"] for r in runs)
    print(f"total: node R3 path {node_cpu:.1f} µs/msg (2 cores: at most {2e6 / node_cpu:,.0f} msgs/s), "
          f"raw blocks {raw_cpu:.1f} µs/msg (at most {2e6 / raw_cpu:,.0f}); ratio of ceilings "
          f"{raw_cpu / node_cpu:.2f}")
    r3 = med["node_r3"]

    def mark(ok: bool) -> str:
        return "met" if ok else "MISSED"

    print(f"\nnode R3 {r3:,.0f} msgs/s (target >= {R3_TARGET:,.0f}: {mark(r3 >= R3_TARGET)})")
    ratio = r3 / med["raw_msg_r3"]
    print(f"node R3 / raw per-message R3 = {ratio:.2f} (target >= {VS_RAW_MESSAGE_TARGET}: "
          f"{mark(ratio >= VS_RAW_MESSAGE_TARGET)})")
    ratio = r3 / med["raw_block1000"]
    print(f"node R3 / raw fenced 1,000-msg blocks = {ratio:.2f} (target >= {VS_RAW_BLOCK_TARGET}: "
          f"{mark(ratio >= VS_RAW_BLOCK_TARGET)}); / pipelined = {r3 / med['raw_block1000_pipe']:.2f}")
    print(f"node R3 / raw fenced blocks of its own mean size ({med['node_r3_block']:,.0f} msgs) = "
          f"{r3 / med['raw_block_node']:.2f}")
    print(f"node R3 / node RocksDB = {r3 / med['node_rocks']:.2f}; node R1 / R3 = {med['node_r1'] / r3:.2f}")
    if failover:
        p50 = statistics.median(failover)
        print(f"failover ({len(failover)} owner SIGKILLs, lease {args.lease_seconds} s): p50 {p50:.2f} s, "
              f"max {max(failover):.2f} s (target p50 <= {FAILOVER_P50_TARGET} s: {mark(p50 <= FAILOVER_P50_TARGET)}); "
              f"each: {', '.join(f'{t:.2f}' for t in failover)}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--count", type=int, default=50_000, help="messages per node produce and block run (default 50,000)")
    p.add_argument("--raw-count", type=int, default=10_000, help="messages of the per-message publish (default 10,000)")
    p.add_argument("--size", type=int, default=1024, help="payload bytes (default 1024)")
    p.add_argument("--runs", type=int, default=3, help="runs; figures are medians (default 3)")
    p.add_argument("--window", type=int, default=8000, help="unanswered sends / publishes at most (default 8000)")
    p.add_argument("--blocks-in-flight", type=int, default=4, help="pipelined fenced blocks (default 4)")
    p.add_argument("--idempotent", action="store_true",
                   help="node produce with a producer_id (fewer batches in flight: the dedup window bounds them)")
    p.add_argument("--kills", type=int, default=10, help="owner SIGKILLs for the failover time (0: skip; default 10)")
    p.add_argument("--lease-seconds", type=float, default=2.0, help="nodes' lease in the failover part (default 2)")
    p.add_argument("--baseline", type=Path, default=None,
                   help="another checkout whose node R3 produce is measured too, in each run (an A/B)")
    p.add_argument("--nats-gomaxprocs", type=int, default=None,
                   help="GOMAXPROCS of each nats-server (default: Go's, one per core)")
    p.add_argument("--dir", default=None, help="parent of the temporary directories (default: system temp)")
    args = p.parse_args(argv)
    if min(args.count, args.raw_count, args.size, args.runs, args.window, args.blocks_in_flight) < 1:
        p.error("every size and count must be >= 1")

    prepare_process()
    with tempfile.TemporaryDirectory(prefix="cluster-bench-", dir=args.dir) as tmp:
        nats = NatsCluster(Path(tmp) / "nats", 3, gomaxprocs=args.nats_gomaxprocs)
        with nats:
            asyncio.run(nats.ready())

            def describe(r: Run) -> str:
                return ", ".join(f"{k} {v:,.0f}" for k, v in r.items())

            runs = repeat(args, "cluster", lambda a, root, i: _one_run(a, nats, root, i), describe)
            failover = asyncio.run(_failover(args, nats, Path(tmp) / "failover")) if args.kills else []
    _report(args, runs, failover)
    return 0


if __name__ == "__main__":
    sys.exit(main())
