"""Soak: the node's resident memory over time next to its throughput, in a steady mixed profile.

    .venv/bin/python bench/soak.py [--minutes 5] [--rate 5000] [--size 1024] [--consumers 6]
                                   [--every 10] [--breakdown] [--tracemalloc] [--node-root DIR]
                                   [--baseline DIR]
                                   [-- <extra serve flags>]

One real ``streamingnode serve`` in its own process on a fresh temporary data directory, with two
pchannels (``p0``, ``p1``), ``--retention-check-seconds 10`` and ``--retention-seconds 30`` (the WAL
keeps about half a minute of appends, ~150 MB at the default rate, plus what the flusher still needs).
One client process drives, for ``--minutes``:

* a producer sending ``--rate`` DATA messages of ``--size`` bytes a second, split over the two
  pchannels (a slot every millisecond, ``send_nowait``);
* one transaction a second on each pchannel (ten body messages, then commit);
* a collection ``soak`` on ``p0`` (an int64 key, a string and a 16-float vector), 100 rows inserted
  every half second, so the flusher buffers rows and writes Parquet;
* ``--consumers`` tailing consumers (DeliverPolicy.latest), spread over the two pchannels, counting
  what they receive.

Every ``--every`` seconds one line: elapsed time, the node's RSS (``/proc/<pid>/status`` VmRSS), the
produced and consumed msgs/s over the interval, and the data directory's bytes on disk.  At the end
the peak and the final RSS, and the RSS plateau (median of the samples after the first minute).

``--breakdown`` runs the node under this script's own wrapper (``--as-node``), which answers
SIGUSR1 by writing where its memory is into a JSON file: ``/proc/self/smaps_rollup``, glibc's malloc
statistics (``mallinfo2``), RocksDB's own properties (memtables, block cache, table readers), each
WAL tail buffer's bytes, each flusher's buffered bytes, pyarrow's pool, and with ``--tracemalloc`` the
top Python allocation sites (tracemalloc slows the node: its throughput figures then do not count).
The breakdown is printed at the end of the run.  ``--node-root`` runs another checkout's node;
``--baseline DIR`` soaks that checkout's node first and this one's after it, and prints the ratio of
their RSS plateaus.

Benchmarks assert nothing.  Target (issue 21): node RSS <= 300 MB in this profile.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

READY = "streamingnode serving on "
PCHANNELS = ("p0", "p1")
TARGET_MB = 300.0


# --- the node side: the wrapper that reports where memory is -------------------------------------
def _breakdown() -> dict[str, Any]:
    """Where this (node) process's memory is, as far as it can tell from inside."""
    import ctypes  # noqa: PLC0415
    import gc  # noqa: PLC0415
    import tracemalloc  # noqa: PLC0415

    out: dict[str, Any] = {}
    with open("/proc/self/smaps_rollup") as f:
        out["smaps_rollup_kB"] = {k.strip(): int(v.split()[0]) for k, v in (line.split(":", 1) for line in f
                                                                          if line[0].isupper() and ":" in line)}

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                     "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Mallinfo2
    mi = libc.mallinfo2()
    out["malloc"] = {"arena_bytes": mi.arena, "mmapped_bytes": mi.hblkhd, "in_use_bytes": mi.uordblks,
                     "free_held_bytes": mi.fordblks}
    from flusher.flusher import Flusher  # noqa: PLC0415
    from wal._tail import TailBuffer  # noqa: PLC0415
    from wal.backends.rocks import RocksBackend  # noqa: PLC0415

    rocks: list[dict[str, Any]] = []
    tails: list[dict[str, int]] = []
    flushers: list[dict[str, Any]] = []
    for obj in gc.get_objects():
        if isinstance(obj, RocksBackend) and not obj._closed:
            props = {}
            for name in ("cur-size-all-mem-tables", "size-all-mem-tables", "num-immutable-mem-table",
                         "block-cache-usage", "block-cache-pinned-usage", "block-cache-capacity",
                         "estimate-table-readers-mem", "total-sst-files-size", "estimate-num-keys"):
                with contextlib.suppress(Exception):
                    props[name] = obj._db.property_int_value("rocksdb." + name)
            rocks.append(props)
        elif isinstance(obj, TailBuffer):
            messages = obj._messages
            tails.append({"counted_bytes": obj._bytes, "max_bytes": obj._max_bytes, "messages": len(messages)})
        elif isinstance(obj, Flusher):
            flushers.append({"buffered_bytes": sum(b.nbytes for b in obj._buffers.values())
                             if hasattr(obj, "_buffers") else None})
    out["rocksdb"] = rocks
    out["tail_buffers"] = tails
    out["flushers"] = flushers
    with contextlib.suppress(ImportError):
        import pyarrow as pa  # noqa: PLC0415

        out["pyarrow_allocated_bytes"] = pa.total_allocated_bytes()
    if tracemalloc.is_tracing():
        snap = tracemalloc.take_snapshot()
        out["python_traced_bytes"] = tracemalloc.get_traced_memory()[0]
        out["python_top"] = [f"{s.size / 1e6:8.1f} MB {s.count:9,} blocks  {s.traceback}"
                             for s in snap.statistics("lineno")[:25]]
    return out


def _as_node(argv: list[str], report: str, trace: bool) -> None:
    """Run ``streamingnode`` with ``argv``, writing ``_breakdown()`` to ``report`` on SIGUSR1."""
    import tracemalloc  # noqa: PLC0415

    if trace:
        tracemalloc.start(1)

    def dump(*_: object) -> None:
        with open(report + ".tmp", "w") as f:
            json.dump(_breakdown(), f, indent=1, default=str)
        os.replace(report + ".tmp", report)

    signal.signal(signal.SIGUSR1, dump)
    from streamingnode.__main__ import main  # noqa: PLC0415

    sys.exit(main(argv))


# --- the driver ---------------------------------------------------------------------------------
def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def dir_bytes(path: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(dirpath, name))
    return total


def start_node(
    args: argparse.Namespace, data_dir: str, log_path: str, report: str,
) -> tuple[subprocess.Popen[str], str]:
    env = dict(os.environ, GRPC_VERBOSITY="ERROR", PYTHONPATH=str(args.node_root))
    serve = ["serve", "--data-dir", data_dir, "--listen", "127.0.0.1:0", "--metrics-listen", "",
             "--channels", ",".join(PCHANNELS), "--retention-check-seconds", "10",
             "--retention-seconds", str(args.retention_seconds), *args.extra]
    if args.breakdown:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--as-node", "--report", report,
               *(["--tracemalloc"] if args.tracemalloc else []), "--", *serve]
    else:
        cmd = [sys.executable, "-m", "streamingnode", *serve]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env=env, cwd=str(args.node_root), text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(READY):
            return proc, line[len(READY):].split()[0]
    proc.wait()
    raise RuntimeError(f"node did not start; see {log_path}")


def stop_node(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


async def drive(args: argparse.Namespace, address: str, proc: subprocess.Popen[str], data_dir: str) -> list[float]:
    import pyarrow as pa  # noqa: PLC0415

    from streamingnode.client import AsyncClient, DeliverPolicy  # noqa: PLC0415

    payload = os.urandom(args.size)
    loop = asyncio.get_running_loop()
    counts = {"produced": 0, "consumed": 0, "txns": 0, "rows": 0}
    stop = asyncio.Event()
    schema = pa.schema([pa.field("pk", pa.int64(), nullable=False), ("s", pa.string()),
                        ("v", pa.list_(pa.float32(), 16))])

    async with AsyncClient(address, timeout=60.0) as client:
        async def consume(pchannel: str) -> None:
            consumer = client.consumer(pchannel, "", policy=DeliverPolicy.latest())
            try:
                async for pack in consumer:
                    counts["consumed"] += len(pack.messages)
                    if stop.is_set():
                        break
            finally:
                await consumer.aclose()

        async def produce() -> None:
            producers = [client.producer(p, linger=0.002) for p in PCHANNELS]
            pending: list[asyncio.Future[Any]] = []
            start = loop.time()
            sent = 0
            while not stop.is_set():
                due = int((loop.time() - start) * args.rate) + 1
                while sent < due:
                    pending.append(producers[sent % 2].send_nowait(f"v{sent % 4}", payload))
                    sent += 1
                if len(pending) > 4 * args.rate:  # keep the futures list short: wait for the oldest
                    await pending[0]
                    done = [f for f in pending if f.done()]
                    counts["produced"] += len(done)
                    pending = [f for f in pending if not f.done()]
                    for f in done:
                        f.result()
                await asyncio.sleep(0.001)
                done_n = 0
                while done_n < len(pending) and pending[done_n].done():
                    pending[done_n].result()
                    done_n += 1
                counts["produced"] += done_n
                del pending[:done_n]
            for p in producers:
                await p.flush()
                await p.aclose()

        async def transactions() -> None:
            while not stop.is_set():
                for p in PCHANNELS:
                    async with client.txn(p, "vt") as tx:
                        for _ in range(10):
                            tx.send_nowait(payload)
                    counts["txns"] += 1
                await asyncio.sleep(1.0)

        async def collection() -> None:
            data = client.data(PCHANNELS[0])
            await data.create_collection("vc", "soak", schema, primary_key="pk")
            pk = 0
            while not stop.is_set():
                n = 100
                batch = pa.record_batch([
                    pa.array(range(pk, pk + n), pa.int64()), pa.array([f"row {i}" for i in range(pk, pk + n)]),
                    pa.array([[float(i)] * 16 for i in range(n)], pa.list_(pa.float32(), 16))], schema=schema)
                await data.insert("vc", "soak", batch)
                pk += n
                counts["rows"] += n
                await asyncio.sleep(0.5)

        tasks = [loop.create_task(consume(PCHANNELS[i % 2])) for i in range(args.consumers)]
        tasks += [loop.create_task(produce()), loop.create_task(transactions()), loop.create_task(collection())]
        samples: list[float] = []
        t0 = last_t = loop.time()
        last = dict(counts)
        try:
            while loop.time() - t0 < args.minutes * 60:
                await asyncio.sleep(args.every)
                for t in tasks:
                    if t.done() and t.exception() is not None:
                        raise t.exception()  # type: ignore[misc]
                now = loop.time()
                rss = rss_bytes(proc.pid)
                samples.append(rss / 1e6)
                dt = now - last_t
                produced = (counts["produced"] - last["produced"]) / dt
                print(f"{now - t0:7.0f} s  RSS {rss / 1e6:7.1f} MB  produce {produced:8,.0f}"
                      f" msgs/s  consume {(counts['consumed'] - last['consumed']) / dt:9,.0f} msgs/s  txns "
                      f"{counts['txns']:6,}  rows {counts['rows']:8,}  disk {dir_bytes(data_dir) / 1e6:6.1f} MB",
                      flush=True)
                last, last_t = dict(counts), now
        finally:
            stop.set()
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--rate", type=int, default=5000, help="DATA msgs/s over both pchannels")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--consumers", type=int, default=6)
    parser.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--retention-seconds", type=float, default=30.0)
    parser.add_argument("--breakdown", action="store_true")
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--node-root", type=Path, default=ROOT)
    parser.add_argument("--baseline", type=Path, default=None,
                        help="also soak this checkout's node first, in the same run (e.g. the tree before a change)")
    parser.add_argument("--dir", default=None)
    parser.add_argument("--as-node", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--report", default="", help=argparse.SUPPRESS)
    parser.add_argument("extra", nargs="*", help="more flags for `streamingnode serve` (after --)")
    args = parser.parse_args()
    if args.as_node:
        _as_node(args.extra, args.report, args.tracemalloc)
        return
    plateaus: dict[str, float] = {}
    roots = {"baseline": args.baseline, "ours": args.node_root} if args.baseline else {"ours": args.node_root}
    for label, node_root in roots.items():  # the baseline first, then ours, in the same run
        print(f"--- {label}: the node of {node_root}", flush=True)
        plateaus[label] = one_run(argparse.Namespace(**{**vars(args), "node_root": node_root}))
    if args.baseline:
        print(f"RSS plateau ours / baseline: {plateaus['ours']:.1f} / {plateaus['baseline']:.1f} MB = "
              f"{plateaus['ours'] / plateaus['baseline']:.2f}")


def one_run(args: argparse.Namespace) -> float:
    """One soak of ``args.node_root``'s node; its RSS plateau in MB (printed with the peak and the end)."""
    root = tempfile.mkdtemp(prefix="bench-soak-", dir=args.dir)
    report = os.path.join(root, "breakdown.json")
    try:
        data_dir = os.path.join(root, "data")
        proc, address = start_node(args, data_dir, os.path.join(root, "node.log"), report)
        print(f"node pid {proc.pid} on {address}; {args.rate:,} msgs/s of {args.size} B over {len(PCHANNELS)} "
              f"pchannels, {args.consumers} tailing consumers, txns and a collection, {args.minutes:g} min",
              flush=True)
        try:
            samples = asyncio.run(drive(args, address, proc, data_dir))
            if args.breakdown:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(report)
                proc.send_signal(signal.SIGUSR1)
                deadline = time.monotonic() + 120
                while not os.path.exists(report) and time.monotonic() < deadline:
                    time.sleep(0.2)
                with open(report) as f:
                    print(json.dumps(json.load(f), indent=1))
        finally:
            stop_node(proc)
        after = [s for i, s in enumerate(samples) if (i + 1) * args.every > 60] or samples
        plateau = statistics.median(after)
        print(f"node RSS: peak {max(samples):.1f} MB, final {samples[-1]:.1f} MB, plateau (median after the first "
              f"minute) {plateau:.1f} MB (target <= {TARGET_MB:.0f} MB{'' if plateau <= TARGET_MB else ', MISSED'})",
              flush=True)
        return plateau
    finally:
        shutil.rmtree(root, ignore_errors=True)

if __name__ == "__main__":
    main()
