"""Do retention checks stall appends?  Ack latency of a steady producer, retention off vs checking every second.

    .venv/bin/python bench/retention_stall.py [--rate 5000] [--seconds 20] [--size 1024] [--node-root DIR]

Two real ``streamingnode serve`` processes, one after the other in the same run, each on a fresh
temporary data directory: one with retention off (``--retention-seconds -1``), one truncating as soon
as it may and checking every second (``--retention-seconds 0 --retention-check-seconds 1``).  Against
each, one SDK producer sends ``--rate`` messages of ``--size`` bytes a second for ``--seconds``, on a
fixed schedule (a slot every millisecond, ``send_nowait``); a message's latency runs from its slot to
its acknowledgement, so a stall also counts the messages queued behind it.  The first two seconds
are left out (warm-up).  Reported: ack p50, p99 and max of each, and p99(retention) / p99(off).

Target (issue 20): during checks, the ack p99 stays within 2x of its p99 with retention off.
``--node-root`` runs the node from another checkout (its ``PYTHONPATH``), e.g. the code before a change.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from streamingnode.client import AsyncClient

ROOT = Path(__file__).resolve().parent.parent
READY = "streamingnode serving on "
TARGET = 2.0
WARMUP_SECONDS = 2.0


def start_node(node_root: Path, data_dir: str, log_path: str, extra: list[str]) -> tuple[subprocess.Popen[str], str]:
    env = dict(os.environ, GRPC_VERBOSITY="ERROR", PYTHONPATH=str(node_root))
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamingnode", "serve", "--data-dir", data_dir, "--listen", "127.0.0.1:0",
             "--metrics-listen", "", "--channels", "p", *extra],
            stdout=subprocess.PIPE, stderr=log, env=env, cwd=str(node_root), text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(READY):
            return proc, line[len(READY):].split()[0]
    proc.wait()
    raise RuntimeError(f"node did not start; see {log_path}")


def stop_node(proc: subprocess.Popen[str]) -> None:
    time.sleep(0.5)  # the SIGTERM handler is installed just after the ready line
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


async def steady(address: str, rate: int, seconds: float, size: int) -> list[float]:
    """Latencies (s) of the messages sent after the warm-up."""
    payload = os.urandom(size)
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    async with AsyncClient(address, timeout=60.0) as client:
        producer = client.producer("p", linger=0.001)
        pending: list[asyncio.Future[Any]] = []
        start = loop.time()
        sent = 0
        total = int(rate * seconds)
        while sent < total:
            now = loop.time()
            due = min(total, int((now - start) * rate) + 1)
            while sent < due:
                slot = start + sent / rate
                fut = producer.send_nowait("v", payload)
                if slot - start >= WARMUP_SECONDS:
                    fut.add_done_callback(lambda f, s=slot: f.exception() or latencies.append(loop.time() - s))
                pending.append(fut)
                sent += 1
            await asyncio.sleep(0.001)
        await producer.flush()
        for f in pending:
            f.result()
        await producer.aclose()
    return latencies


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--node-root", type=Path, default=ROOT)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="bench-retention-stall-", dir=args.dir)
    modes = {"off": ["--retention-seconds", "-1"],
             "every 1 s": ["--retention-seconds", "0", "--retention-check-seconds", "1"]}
    p99: dict[str, float] = {}
    try:
        for name, extra in modes.items():
            data_dir = tempfile.mkdtemp(prefix="data-", dir=root)
            proc, address = start_node(args.node_root, data_dir, os.path.join(root, "node.log"), extra)
            try:
                lat = asyncio.run(steady(address, args.rate, args.seconds, args.size))
            finally:
                stop_node(proc)
            with open(os.path.join(root, "node.log"), errors="replace") as f:
                truncations = sum('"wal truncated"' in line for line in f)
            p99[name] = pct(lat, 0.99)
            print(f"retention {name:>9}: {len(lat):,} acks, p50 {statistics.median(lat) * 1e3:.1f} ms, "
                  f"p99 {p99[name] * 1e3:.1f} ms, max {max(lat) * 1e3:.1f} ms "
                  f"(truncations logged so far: {truncations})", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratio = p99["every 1 s"] / p99["off"]
    missed = "" if ratio <= TARGET else ", MISSED"
    print(f"p99 ratio (checks every 1 s / off): {ratio:.2f} (target <= {TARGET}){missed}")


if __name__ == "__main__":
    main()
