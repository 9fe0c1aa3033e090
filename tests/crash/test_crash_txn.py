"""SIGKILL in the middle of transactions, restart: open transactions are never delivered, committed
ones are delivered whole."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from interceptors.recovery.streaming_wal import ChainConfig, open_streaming_wal
from tests.crash.evidence import stderr_on_failure, tail
from tests.factories import data
from wal import MessageType, WALManager

pytestmark = pytest.mark.crash

CHILD = Path(__file__).with_name("child_txn.py")
REPO = Path(__file__).resolve().parents[2]
TRIALS = max(3, int(os.environ.get("STREAMINGNODE_CRASH_TRIALS", "20")) // 4)


def _run_child(data_dir: Path, seed: int, rng: random.Random, stderr_path: Path) -> bytes:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(data_dir), "p", str(seed)],
            stdout=subprocess.PIPE, stderr=err, cwd=REPO, env=env,
        )
    out = bytearray()
    ready = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        while chunk := proc.stdout.read1(65536):
            out.extend(chunk)
            if b"READY\n" in out:
                ready.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    assert ready.wait(60), f"child never became ready: {bytes(out[-500:])!r}\n{tail(stderr_path.read_bytes())}"
    time.sleep(rng.uniform(0.1, 0.5))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    t.join(10)
    assert proc.stdout is not None
    proc.stdout.close()
    return bytes(out)


async def _check(data_dir: Path, logs: list[bytes]) -> None:
    acked_bodies: dict[int, list[bytes]] = defaultdict(list)
    committed: set[int] = set()
    for log in logs:
        for line in log.split(b"\n")[:-1]:  # the last piece may be cut by the kill
            parts = line.split()
            if parts[0] == b"BODY":
                acked_bodies[int(parts[1])].append(bytes.fromhex(parts[2].decode()))
            elif parts[0] == b"COMMITTED":
                committed.add(int(parts[1]))
    manager = await WALManager.start_rocksdb(data_dir)
    try:
        swal = await open_streaming_wal(manager, "p", ChainConfig(tick_interval=0.01))
        await swal.ready()
        end = (await swal.append(data("end"))).timetick
        delivered: dict[int, list[bytes]] = defaultdict(list)
        framing: dict[int, list[MessageType]] = defaultdict(list)
        async for pack in swal.read():
            for m in pack.messages:
                if m.txn is not None:
                    framing[m.txn.txn_id].append(m.message_type)
                    if m.message_type is MessageType.DATA:
                        delivered[m.txn.txn_id].append(m.payload)
            if pack.end_ts >= end:
                break
        # Every committed transaction is delivered whole: all acknowledged bodies, in order.
        for tid in committed:
            assert delivered[tid] == acked_bodies[tid], f"txn {tid} not delivered whole"
            assert framing[tid][0] is MessageType.BEGIN_TXN and framing[tid][-1] is MessageType.COMMIT_TXN
        # Nothing else is delivered: a delivered transaction is always framed Begin … Commit and holds
        # every body that was acknowledged for it (a kill between its commit and the COMMITTED line
        # may leave bodies written but not yet reported: those come after the acknowledged ones).
        for tid, bodies in delivered.items():
            assert framing[tid][0] is MessageType.BEGIN_TXN, f"txn {tid} delivered without its BeginTxn"
            assert framing[tid][-1] is MessageType.COMMIT_TXN, f"txn {tid} delivered without a commit"
            assert bodies[: len(acked_bodies[tid])] == acked_bodies[tid], f"txn {tid} delivered partly"
        assert any(tid not in delivered for tid in acked_bodies), "no transaction was left open by a kill"
        await swal.aclose()
    finally:
        await manager.aclose()


def test_sigkill_mid_transaction_is_never_delivered(tmp_path: Path, crash_seed: int) -> None:
    rng = random.Random(crash_seed)
    data_dir = tmp_path / "db"
    stderr_paths = [tmp_path / f"child-{k}.stderr" for k in range(TRIALS)]
    logs = [_run_child(data_dir, crash_seed + k, rng, stderr_paths[k]) for k in range(TRIALS)]
    with stderr_on_failure(lambda: "".join(f"[child {k}] {tail(p.read_bytes(), 1500)}\n"
                                           for k, p in enumerate(stderr_paths)), "children"):
        asyncio.run(_check(data_dir, logs))
