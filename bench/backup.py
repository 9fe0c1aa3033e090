"""What an online backup costs: its throughput against a plain ``cp -r`` of the same data directory, and
the ack p99 of a producer while it runs against the p99 without it.

    .venv/bin/python bench/backup.py [--mib 200] [--runs 3] [--window 4]

1. A node (``streamingnode serve`` in a process of its own, default settings, flusher on) is filled with
   ``--mib`` MiB: 1 KiB messages on pchannel 'p', and a collection whose rows are flushed to Parquet
   (about a tenth of the bytes).
2. Latency: one producer sends one 1 KiB message at a time (each awaited; paced at 1 ms between sends)
   for ``--window`` seconds without a backup, then for as long with backups running back to back (each
   into a new target, so each copies everything) at full speed (``--rate 0``), then paced at 64 MiB/s
   (the command's default) and at 128 MiB/s.
   ack p50/p99 of each window.
3. Throughput: a full backup into a new target (MiB/s of what it wrote), then an incremental one into
   the same target (nothing changed: everything reused), then the node is stopped and ``cp -r`` copies its
   data directory (MiB/s).  Repeated ``--runs`` times (the latency windows too); medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from streamingnode.client import AsyncClient  # noqa: E402
from streamingnode.v1 import streaming_pb2 as spb  # noqa: E402

MIB = 1 << 20
RATES = (64, 128)
"""The paced windows' ``--rate`` (MiB/s): the command's default, and twice it."""
SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("body", pa.binary())])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


async def wait_ready(addr: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            async with AsyncClient(addr, timeout=2) as c:
                await c.describe_channels()
                return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def fill(addr: str, mib: int) -> None:
    async with AsyncClient(addr) as client:
        await client.create_channels(["p"])
        data = client.data("p")
        await data.create_collection("d", "coll", SCHEMA, "pk")
        # Random bytes, different in every message: RocksDB and Parquet compress repeated ones away.
        async with client.producer("p") as producer:
            for _ in range(mib * 9 // 10):
                block = os.urandom(MIB)
                await asyncio.gather(*(producer.send("v", block[i << 10:(i + 1) << 10]) for i in range(1024)))
        pk = 0
        for _ in range(max(mib // 10, 1)):
            n = 1024
            block = os.urandom(MIB)
            batch = pa.record_batch([pa.array(range(pk, pk + n), pa.int64()),
                                     pa.array([block[i << 10:(i + 1) << 10] for i in range(n)])], schema=SCHEMA)
            pk += n
            await data.insert("d", "coll", batch)
        await data.flush("d", "coll")


async def backup_once(addr: str, target: Path, rate: int = 0) -> spb.BackupResult:
    """One backup (``rate``: bytes/s, 0 = unpaced, as the RPC's default)."""
    async with AsyncClient(addr, timeout=None) as client:
        stub = client.router.stub_at(client.seeds[0])
        result = None
        async for update in stub.Backup(spb.BackupRequest(to=str(target), max_bytes_per_second=rate)):
            if update.HasField("result"):
                result = update.result
        assert result is not None
        return result


async def acks(addr: str, seconds: float, background: asyncio.Task[None] | None) -> list[float]:
    out: list[float] = []
    payload = os.urandom(1024)
    async with AsyncClient(addr) as client, client.producer("p", linger=0) as producer:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t = time.perf_counter()
            await producer.send("lat", payload)
            out.append((time.perf_counter() - t) * 1000)
            await asyncio.sleep(0.001)
            if background is not None and background.done():
                background.result()
    return out


async def backups_until(addr: str, base: Path, stop: asyncio.Event, took: list[float], rate: int = 0) -> None:
    n = 0
    while not stop.is_set():
        n += 1
        r = await backup_once(addr, base / f"loop{n}", rate)
        took.append(r.seconds)
        shutil.rmtree(base / f"loop{n}", ignore_errors=True)


def p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(int(len(values) * q), len(values) - 1)]


async def measure(addr: str, targets: Path, mib: int, window: float) -> dict[str, float]:
    await wait_ready(addr)
    await fill(addr, mib)
    quiet = await acks(addr, window, None)
    stop = asyncio.Event()
    took: list[float] = []
    loop_task = asyncio.create_task(backups_until(addr, targets / "loop", stop, took))
    busy = await acks(addr, window, loop_task)
    stop.set()
    await loop_task
    paced: dict[int, list[float]] = {}
    for rate in RATES:
        stop = asyncio.Event()
        loop_task = asyncio.create_task(backups_until(addr, targets / f"paced{rate}", stop, [], rate * MIB))
        paced[rate] = await acks(addr, window, loop_task)
        stop.set()
        await loop_task
    full = await backup_once(addr, targets / "target")
    incr = await backup_once(addr, targets / "target")
    return {
        "backup_mib": full.bytes_copied / MIB, "backup_s": full.seconds,
        "backup_mib_s": full.bytes_copied / MIB / full.seconds,
        "incr_s": incr.seconds, "incr_copied": incr.files_copied, "incr_reused": incr.files_reused,
        "quiet_p50": p(quiet, 0.5), "quiet_p99": p(quiet, 0.99), "busy_p50": p(busy, 0.5), "busy_p99": p(busy, 0.99),
        "busy_acks": len(busy), "backups_during": len(took),
        **{f"paced{r}_p50": p(v, 0.5) for r, v in paced.items()},
        **{f"paced{r}_p99": p(v, 0.99) for r, v in paced.items()},
    }


def one_run(work: Path, mib: int, window: float, targets: Path) -> dict[str, float]:
    data = work / "data"
    addr = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "GRPC_VERBOSITY": "ERROR"}
    node = subprocess.Popen([sys.executable, "-m", "streamingnode", "serve", "--data-dir", str(data), "--listen", addr,
                             "--metrics-listen", "", "--log-level", "warning"], cwd=ROOT, env=env)
    try:
        out = asyncio.run(measure(addr, targets, mib, window))
    finally:
        node.send_signal(signal.SIGTERM)
        node.wait(60)
    size = tree_bytes(data)
    t = time.perf_counter()
    subprocess.run(["cp", "-r", str(data), str(work / "cp")], check=True)
    subprocess.run(["sync"], check=True)
    cp_s = time.perf_counter() - t
    return {"data_mib": size / MIB, **out, "cp_s": cp_s, "cp_mib_s": size / MIB / cp_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=200)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--window", type=float, default=4.0)
    ap.add_argument("--target-dir", help="where backups go (default: beside the data directory, same volume)")
    args = ap.parse_args()
    runs = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="bench-backup-") as tmp, \
                tempfile.TemporaryDirectory(prefix="bench-backup-to-", dir=args.target_dir) as to:
            r = one_run(Path(tmp), args.mib, args.window, Path(to))
        runs.append(r)
        print(f"run {i + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()), flush=True)
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print("\nmedians:")
    print(f"  data dir {med['data_mib']:.0f} MiB; full backup wrote {med['backup_mib']:.0f} MiB in "
          f"{med['backup_s']:.2f} s = {med['backup_mib_s']:.0f} MiB/s; "
          f"cp -r {med['cp_s']:.2f} s = {med['cp_mib_s']:.0f} MiB/s "
          f"(backup/cp {med['backup_mib_s'] / med['cp_mib_s']:.2f})")
    print(f"  incremental (nothing changed): {med['incr_s']:.2f} s, {med['incr_copied']:.0f} files copied, "
          f"{med['incr_reused']:.0f} reused")
    print(f"  ack p50/p99 without a backup {med['quiet_p50']:.2f}/{med['quiet_p99']:.2f} ms; with backups running "
          f"{med['busy_p50']:.2f}/{med['busy_p99']:.2f} ms (p99 ratio {med['busy_p99'] / med['quiet_p99']:.2f}; "
          f"{med['backups_during']:.0f} backups during the window, --rate 0)")
    for r in RATES:
        p50, p99 = med[f"paced{r}_p50"], med[f"paced{r}_p99"]
        print(f"  with backups paced at --rate {r}: {p50:.2f}/{p99:.2f} ms (p99 ratio {p99 / med['quiet_p99']:.2f})")


if __name__ == "__main__":
    main()
