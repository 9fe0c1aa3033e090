"""Restart time against retained log length: process start to SERVING of a real ``streamingnode serve``.

    .venv/bin/python bench/recovery.py [--runs 3] [--cases 100000x1024,1000000x1024,10000x65536]

For each case (``COUNTxSIZE``), in a fresh temporary data directory: a node is started (default
settings: retention keeps a day, so nothing is truncated; periodic recovery snapshots at their
defaults), COUNT DATA messages of SIZE bytes are produced through the SDK as fast as it goes, and the
node is SIGKILLed right after the last acknowledgement.  Then, timed from ``Popen`` to the node's
"serving on" line on stdout, ``--runs`` restarts after a crash (each killed once serving, so each
finds the same state: the periodic snapshots written while producing), then, after one clean stop,
``--runs`` restarts after a clean stop (SIGTERM: the node stores a last snapshot as it closes).
Reported: the median of each, and how many messages recovery replayed each time (from the node's
"pchannel recovered" line).

Targets (issue 20): the 1M restart takes at most 1.2x the 100k restart, and at most 2 s.  Check free
disk first: 1M x 1 KiB is about 1 GiB (the directory is deleted afterwards).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import reap  # the harness also makes the repository root importable

from streamingnode.client import AsyncClient

ROOT = Path(__file__).resolve().parent.parent
READY = "streamingnode serving on "
PCHANNEL = "p"
RATIO_TARGET = 1.2
SECONDS_TARGET = 2.0


class Node:
    """``streamingnode serve`` on a free port; stdout is watched for the ready line, logs go to a file."""

    def __init__(self, data_dir: str, log_path: str) -> None:
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115  (closed in stop)
        env = dict(os.environ, GRPC_VERBOSITY="ERROR", PYTHONPATH=str(ROOT))
        argv = [sys.executable, "-m", "streamingnode", "serve", "--data-dir", data_dir, "--listen", "127.0.0.1:0",
                "--metrics-listen", "", "--channels", PCHANNEL]
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._log, env=env, cwd=str(ROOT),
                                     text=True)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # blocks until the ready line (or the end of the output)
            if line.startswith(READY):
                self.ready_seconds = time.perf_counter() - self.started
                self.address = line[len(READY):].split()[0]
                return
        self.stop()
        raise RuntimeError(f"node did not start; see {log_path}")

    def stop(self, *, kill: bool = False) -> None:
        if not kill:
            # serve() installs its SIGTERM handler just after printing the ready line: a SIGTERM sent
            # at once can still find the default action (an abrupt exit, no clean close).
            time.sleep(0.5)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        reap(self.proc, 60)
        self._log.close()


def last_replayed(log_path: str) -> int | None:
    """``replayed`` of the last "pchannel recovered" line of pchannel ``p`` in the node's log."""
    found = None
    with open(log_path, errors="replace") as f:
        for line in f:
            if '"pchannel recovered"' not in line:
                continue
            try:
                doc: dict[str, Any] = json.loads(line)
            except ValueError:
                continue
            if doc.get("pchannel") == PCHANNEL:
                found = int(doc["replayed"])
    return found


async def produce(address: str, count: int, size: int) -> float:
    """``count`` messages of ``size`` bytes, at most 2,000 unanswered; msgs/s."""
    payload = os.urandom(size)
    async with AsyncClient(address, timeout=60.0) as client:
        producer = client.producer(PCHANNEL, max_batch_bytes=1 << 20)
        outstanding: collections.deque[asyncio.Future[Any]] = collections.deque()
        t0 = time.perf_counter()
        for _ in range(count):
            outstanding.append(producer.send_nowait("v", payload))
            if len(outstanding) >= 2000:
                await outstanding.popleft()
        await producer.flush()
        for f in outstanding:
            f.result()
        elapsed = time.perf_counter() - t0
        await producer.aclose()
    return count / elapsed


def one_case(root: str, count: int, size: int, runs: int) -> dict[str, Any]:
    data_dir = tempfile.mkdtemp(prefix=f"recovery-{count}x{size}-", dir=root)
    log_path = os.path.join(data_dir, "node.log")
    data = os.path.join(data_dir, "data")
    try:
        node = Node(data, log_path)
        try:
            rate = asyncio.run(produce(node.address, count, size))
        finally:
            node.stop(kill=True)  # a crash right after the last ack: only the periodic snapshots exist
        out: dict[str, Any] = {"count": count, "size": size, "produce_rate": rate}
        for kind in ("crash", "clean"):
            if kind == "clean":
                Node(data, log_path).stop()  # a clean stop stores a last snapshot
            times: list[float] = []
            replayed: list[int | None] = []
            for _ in range(runs):
                node = Node(data, log_path)
                times.append(node.ready_seconds)
                node.stop(kill=kind == "crash")  # killed at once: the next start finds the same state
                replayed.append(last_replayed(log_path))
            out[kind] = {"times": times, "median": statistics.median(times), "replayed": replayed}
        return out
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="restarts per case (the median is reported)")
    parser.add_argument("--cases", default="100000x1024,1000000x1024,10000x65536", help="COUNTxSIZE,...")
    parser.add_argument("--dir", default=None, help="where the temporary data directories go")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="bench-recovery-", dir=args.dir)
    results = []
    try:
        for case in args.cases.split(","):
            count, size = (int(x) for x in case.split("x"))
            r = one_case(root, count, size, args.runs)
            results.append(r)
            print(f"{count:>9,} x {size:>6,} B: produce {r['produce_rate']:,.0f} msg/s", flush=True)
            for kind in ("crash", "clean"):
                k = r[kind]
                print(f"    restart after {kind}: median {k['median']:.2f} s "
                      f"({', '.join(f'{t:.2f}' for t in k['times'])}); replayed {k['replayed']}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for kind in ("crash", "clean"):
        by = {(r["count"], r["size"]): r[kind]["median"] for r in results}
        small, large = by.get((100_000, 1024)), by.get((1_000_000, 1024))
        if small and large:
            ratio = large / small
            ok = ratio <= RATIO_TARGET and large <= SECONDS_TARGET
            print(f"after {kind}: 1M / 100k restart {ratio:.2f} (target <= {RATIO_TARGET}); 1M restart "
                  f"{large:.2f} s (target <= {SECONDS_TARGET} s): {'met' if ok else 'MISSED'}")


if __name__ == "__main__":
    main()
