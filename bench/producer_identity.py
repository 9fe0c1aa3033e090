"""What producer identity costs: the dedup step's digest per message, and durable SDK produce with a
``producer_id`` against a node of another checkout, in one run.

    .venv/bin/python bench/producer_identity.py [--baseline DIR] [--runs 5] [--count 100000] [--size 1024]

* **digest**: ``content_digest`` over ``--batch`` messages of ``--size`` bytes (stamped as a produce
  stream stamps them), CPU µs per message; and the dedup step's whole ``do_append`` per message
  (digest, window, in-flight table; the rest of the chain replaced by a stub that gives ids) in a
  child process of each checkout, alternated ``--runs`` times, medians of each side's best of 12.
* **produce A/B** (with ``--baseline``, a checkout of the code to compare, e.g. the main branch): per
  run, one node of this checkout and one of the baseline, each in its own process on a fresh data
  directory (``serve``, durability sync), each fed ``--count`` messages by this checkout's SDK with
  ``producer_id`` set (``send_nowait``, at most ``--window`` unanswered, then ``flush``).  Which goes
  first alternates per run; the figure is the median of the per-run ratios (this / baseline) of
  msgs/s, with the node CPU per message of each side.  The host is shared and noisy: read the ratio
  of alternated runs, not the absolute rates.

Benchmarks are not tests: they assert nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import cpu_seconds, prepare_process, reap

from interceptors.dedup import PROP_PRODUCER, PROP_SEQUENCE, content_digest
from streamingnode.client import AsyncClient
from wal.message import Message, MessageType

ROOT = Path(__file__).resolve().parent.parent
READY = re.compile(r"streamingnode serving on (\S+)")


# The dedup step alone, in a child process of the checkout measured (only names both sides have):
# CPU seconds (process_time: what a loaded host disturbs least) per message, best of 12 rounds of 20
# batches, each message with its own payload as a produce stream's are.
_STEP = """
import asyncio, os, sys, time
from interceptors.dedup import PROP_PRODUCER, PROP_SEQUENCE, DedupInterceptor
from wal.message import AppendResult, Message, MessageType
n, size = int(sys.argv[1]), int(sys.argv[2])
def batch(first):
    return [Message(MessageType.DATA, "v", os.urandom(size), {PROP_PRODUCER: "b", PROP_SEQUENCE: str(first + i)})
            for i in range(n)]
async def main():
    step = DedupInterceptor()
    ids = iter(range(1 << 60))
    async def rest(b):
        return [AppendResult(next(ids), 1, None) for _ in b]
    best, first = float("inf"), 0
    for _ in range(12):
        batches = [batch(first + k * n) for k in range(20)]
        first += 20 * n
        t0 = time.process_time()
        for b in batches:
            await step.do_append(b, rest)
        best = min(best, (time.process_time() - t0) / (20 * n))
    print(best * 1e6)
asyncio.run(main())
"""


def step_us(repo: Path, batch: int, size: int) -> float:
    """The dedup step's CPU µs per message in ``repo``'s code."""
    env = dict(os.environ, PYTHONPATH=str(repo))
    out = subprocess.run([sys.executable, "-c", _STEP, str(batch), str(size)], env=env, cwd=str(repo),
                         capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def digest_us(batch: int, size: int) -> float:
    """``content_digest`` CPU µs per message (distinct payloads), best of 7."""
    msgs = [Message(MessageType.DATA, "v", os.urandom(size), {PROP_PRODUCER: "b", PROP_SEQUENCE: str(i)})
            for i in range(batch)]
    best = float("inf")
    for _ in range(7):
        t0 = time.process_time()
        for _ in range(20):
            for m in msgs:
                content_digest(m)
        best = min(best, (time.process_time() - t0) / (20 * batch))
    return best * 1e6


class _Node:
    def __init__(self, repo: Path, data_dir: str) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="node-", suffix=".log", delete=False)  # noqa: SIM115
        env = dict(os.environ, GRPC_VERBOSITY="ERROR", PYTHONPATH=str(repo))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamingnode", "serve", "--data-dir", data_dir, "--listen", "127.0.0.1:0",
             "--metrics-listen", "127.0.0.1:0", "--channels", "bench", "--log-level", "warning"],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=str(repo))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = READY.search(Path(self.log.name).read_text(errors="replace"))
            if found:
                self.address = found.group(1)
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"node of {repo} did not start: {Path(self.log.name).read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        reap(self.proc, 30)
        self.log.close()
        os.unlink(self.log.name)


async def _produce(address: str, n: int, size: int, window: int) -> float:
    async with AsyncClient(address) as client:
        producer = client.producer("bench", producer_id="bench-producer")
        payload = os.urandom(size)
        outstanding: collections.deque[asyncio.Future[Any]] = collections.deque()
        t0 = time.perf_counter()
        for _ in range(n):
            outstanding.append(producer.send_nowait("v", payload))
            if len(outstanding) >= window:
                await outstanding.popleft()
        await producer.flush()
        for f in outstanding:
            f.result()
        elapsed = time.perf_counter() - t0
        await producer.aclose()
    return n / elapsed


def _side(repo: Path, root: str, args: argparse.Namespace) -> tuple[float, float]:
    """(msgs/s, node CPU µs per message) of one node of ``repo``."""
    node = _Node(repo, tempfile.mkdtemp(prefix="data-", dir=root))
    try:
        c0 = cpu_seconds(node.proc.pid)
        rate = asyncio.run(_produce(node.address, args.count, args.size, args.window))
        return rate, (cpu_seconds(node.proc.pid) - c0) / args.count * 1e6
    finally:
        node.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", type=Path, default=None, help="a checkout to compare durable produce with")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--count", type=int, default=100_000, help="messages per produce (default 100,000)")
    p.add_argument("--size", type=int, default=1024, help="payload bytes (default 1024)")
    p.add_argument("--batch", type=int, default=1000, help="messages per batch of the digest figures")
    p.add_argument("--window", type=int, default=8000, help="unanswered SDK sends at most (default 8000)")
    p.add_argument("--dir", default=None, help="parent of the temporary directories")
    args = p.parse_args(argv)
    prepare_process()
    print(f"content_digest: {digest_us(args.batch, args.size):.3f} µs CPU/msg ({args.size} B payloads)")
    if args.baseline is None:
        print(f"dedup step: {step_us(ROOT, args.batch, args.size):.3f} µs CPU/msg "
              f"({args.batch} x {args.size} B per batch)")
        return 0
    steps: dict[str, list[float]] = {"this": [], "baseline": []}
    for i in range(args.runs):
        sides = [("this", ROOT), ("baseline", args.baseline.resolve())]
        for name, repo in sides if i % 2 == 0 else sides[::-1]:
            steps[name].append(step_us(repo, args.batch, args.size))
    this_step, base_step = statistics.median(steps["this"]), statistics.median(steps["baseline"])
    print(f"dedup step ({args.batch} x {args.size} B per batch, {args.runs} alternated runs): this "
          f"{this_step:.3f} µs CPU/msg, baseline {base_step:.3f}, difference {this_step - base_step:+.3f}")
    root = tempfile.mkdtemp(prefix="producer-identity-", dir=args.dir)
    ratios: list[float] = []
    ours: list[tuple[float, float]] = []
    base: list[tuple[float, float]] = []
    for i in range(args.runs):
        sides = [("this", ROOT), ("baseline", args.baseline.resolve())]
        got: dict[str, tuple[float, float]] = {}
        for name, repo in sides if i % 2 == 0 else sides[::-1]:
            got[name] = _side(repo, root, args)
        ours.append(got["this"])
        base.append(got["baseline"])
        ratios.append(got["this"][0] / got["baseline"][0])
        print(f"run {i + 1}/{args.runs}: this {got['this'][0]:,.0f} msgs/s ({got['this'][1]:.1f} µs node CPU/msg), "
              f"baseline {got['baseline'][0]:,.0f} ({got['baseline'][1]:.1f}), ratio {ratios[-1]:.3f}",
              file=sys.stderr, flush=True)
    print(f"durable SDK produce with producer_id, {args.count:,} x {args.size} B, {args.runs} alternated runs: "
          f"this {statistics.median(r for r, _ in ours):,.0f} msgs/s "
          f"({statistics.median(c for _, c in ours):.1f} µs node CPU/msg), baseline "
          f"{statistics.median(r for r, _ in base):,.0f} ({statistics.median(c for _, c in base):.1f}); "
          f"median ratio {statistics.median(ratios):.3f} (target >= 0.95), per run "
          f"{', '.join(f'{r:.3f}' for r in ratios)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
