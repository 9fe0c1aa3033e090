"""Where a node's CPU goes during a durable SDK produce (or, with ``--consume``, a catch-up consume of
it from a restarted node): per thread, user and system time per message, for one tree or several
alternated.

    .venv/bin/python bench/node_threads.py [--count 200000] [--runs 3] [--consume] [TREE ...]

Each TREE (default: this checkout) gets its own node process (``python -m streamingnode serve`` with
that tree on PYTHONPATH, embedded defaults, one pchannel) and its own SDK producer (a client process
running that tree's SDK: ``linger`` 5 ms, 1 MiB batches, 8,000 unanswered at most, 1 KiB payloads).
Threads are told apart by name: the node runs with ``bench/_thread_names`` on its PYTHONPATH, whose
``sitecustomize`` gives every Python thread its name at the OS level (``wal-writer_0``,
``wal-reader_1``, ``asyncio_0`` for ``asyncio.to_thread``'s workers, ``MainThread`` is the event
loop; ``rocksdb:low`` and ``rocksdb:high`` are RocksDB's compaction and flush threads).

Read it as shares, not seconds: CPU time per message moves with the host's load, but a thread busy
in one tree and idle in the other (a reader pool during a pure produce, compaction three times as
busy) is visible whatever the load, and that is how the bulk regression after e366985 was found.
With several trees the runs alternate (tree A, tree B, tree A, ...), and the table gives medians.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
TICKS = os.sysconf("SC_CLK_TCK")

_CLIENT = r"""
import asyncio, collections, os, sys, time
import streamingnode.client as sdk

async def main(addr: str, n: int) -> None:
    client = sdk.AsyncClient(addr)
    producer = client.producer("bench", linger=0.005, max_batch_bytes=1 << 20)
    payload = os.urandom(1024)
    out = collections.deque()
    t0 = time.perf_counter()
    for _ in range(n):
        out.append(producer.send_nowait("v0", payload))
        if len(out) >= 8000:
            await out.popleft()
    await producer.flush()
    for f in out:
        f.result()
    print(f"RATE {n / (time.perf_counter() - t0):.0f}")
    await producer.aclose()
    await client.aclose()

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""

_CONSUMER = r"""
import asyncio, sys, time
import streamingnode.client as sdk
try:
    from streamingnode.client import DeliverPolicy, MessageType
except ImportError:  # older trees export them from the WAL only
    from wal.options import DeliverPolicy
    from wal.message import MessageType

async def main(addr: str, n: int) -> None:
    client = sdk.AsyncClient(addr)
    seen = 0
    t0 = time.perf_counter()
    async with client.consumer("bench", vchannel="", policy=DeliverPolicy.all()) as consumer:
        async for pack in consumer:
            seen += sum(1 for m in pack.messages if m.message_type is MessageType.DATA)
            if seen >= n:
                break
    print(f"RATE {n / (time.perf_counter() - t0):.0f}")
    await client.aclose()

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def threads(pid: int) -> dict[str, list[float]]:
    """Thread name -> [user s, system s, voluntary switches, involuntary switches, threads]."""
    out: dict[str, list[float]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                status = f.read()
        except OSError:
            continue  # the thread ended
        if int(tid) == pid:
            name = "MainThread"
        name = re.sub(r"_\d+$", "", name)  # one line per pool
        row = out.setdefault(name, [0.0, 0.0, 0, 0, 0])
        row[0] += int(fields[11]) / TICKS
        row[1] += int(fields[12]) / TICKS
        row[2] += int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]
        row[3] += int(re.search(r"^nonvoluntary_ctxt_switches:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]
        row[4] += 1
    return out


def _start(tree: str, root: str, env: dict[str, str], log_path: str) -> tuple[subprocess.Popen[bytes], str]:
    start = os.path.getsize(log_path)
    with open(log_path, "ab") as log:
        node = subprocess.Popen(
            [sys.executable, "-m", "streamingnode", "serve", "--data-dir", os.path.join(root, "data"),
             "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--channels", "bench",
             "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tree)
    deadline = time.monotonic() + 120
    while True:
        with open(log_path, errors="replace") as f:
            f.seek(start)
            text = f.read()
        found = re.search(r"serving on (\S+)", text)
        if found:
            return node, found.group(1)
        if node.poll() is not None or time.monotonic() > deadline:
            node.kill()
            raise RuntimeError(f"the node of {tree} did not start:\n{text[-2000:]}")
        time.sleep(0.05)


def one(tree: str, count: int, consume: bool = False) -> tuple[float, dict[str, float]]:
    """One run: (the SDK's msgs/s, thread name -> CPU µs per message); "TOTAL" is the whole node.
    ``consume``: the node is restarted on the log the produce wrote, and what is measured is one SDK
    consumer reading it all from the start (from storage, as a consumer that fell behind)."""
    root = tempfile.mkdtemp(prefix="node-threads-")
    env = dict(os.environ, GRPC_VERBOSITY="ERROR", PYTHONPATH=f"{tree}{os.pathsep}{_HERE / '_thread_names'}")
    log_path = os.path.join(root, "node.log")
    open(log_path, "wb").close()
    node, addr = _start(tree, root, env, log_path)
    try:
        before = threads(node.pid)
        done = subprocess.run([sys.executable, "-c", _CLIENT, addr, str(count)], env=env, cwd=tree,
                              capture_output=True, text=True, timeout=900, check=True)
        after = threads(node.pid)
        if consume:
            node.terminate()
            node.wait(60)
            node, addr = _start(tree, root, env, log_path)
            before = threads(node.pid)
            done = subprocess.run([sys.executable, "-c", _CONSUMER, addr, str(count)], env=env, cwd=tree,
                                  capture_output=True, text=True, timeout=900, check=True)
            after = threads(node.pid)
    finally:
        node.terminate()
        node.wait(60)
        shutil.rmtree(root, ignore_errors=True)
    per = {name: ((row[0] + row[1]) - sum(before.get(name, [0.0, 0.0])[:2])) / count * 1e6
           for name, row in after.items()}
    per["TOTAL"] = sum(per.values())
    rate = float(re.search(r"RATE (\d+)", done.stdout).group(1))  # type: ignore[union-attr]
    return rate, per


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("trees", nargs="*", help="checkouts to measure (default: this one)")
    p.add_argument("--count", type=int, default=200_000, help="messages per run (default 200,000)")
    p.add_argument("--runs", type=int, default=3, help="runs per tree, alternated (default 3)")
    p.add_argument("--consume", action="store_true", help="measure a catch-up consume of what was produced, "
                   "from a restarted node, instead of the produce")
    args = p.parse_args(argv)
    trees = [str(Path(t).resolve()) for t in args.trees] or [str(_HERE.parent)]
    results: dict[str, list[tuple[float, dict[str, float]]]] = {t: [] for t in trees}
    for run in range(args.runs):
        for tree in trees if run % 2 == 0 else trees[::-1]:
            rate, per = one(tree, args.count, args.consume)
            results[tree].append((rate, per))
            print(f"run {run + 1} {tree}: {rate:,.0f} msgs/s, node {per['TOTAL']:.2f} µs/msg", flush=True)
    names = sorted({n for rs in results.values() for _, per in rs for n in per},
                   key=lambda n: (n == "TOTAL", -max(statistics.median(per.get(n, 0.0) for _, per in rs)
                                                     for rs in results.values())))
    what = "SDK catch-up consume from a restarted node" if args.consume else "durable SDK produce"
    print(f"\nnode CPU per message (µs, median of {args.runs}), {args.count:,} x 1 KiB {what}")
    print(f"{'thread':<22}" + "".join(f" | {Path(t).name[-14:]:>14}" for t in trees))
    for name in names:
        meds = [statistics.median(per.get(name, 0.0) for _, per in results[t]) for t in trees]
        if max(meds) >= 0.05:
            print(f"{name:<22}" + "".join(f" | {m:>14.2f}" for m in meds))
    print(f"{'SDK msgs/s':<22}" + "".join(f" | {statistics.median(r for r, _ in results[t]):>14,.0f}" for t in trees))
    return 0


if __name__ == "__main__":
    sys.exit(main())
