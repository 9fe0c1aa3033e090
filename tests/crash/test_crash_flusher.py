"""SIGKILL the flusher between every two steps of its commit protocol, and at random moments during
ingestion; after a restart, the Parquet files hold exactly the committed rows — none lost, none twice.

Every child run works on the same data directory and output root, so each restart recovers from the
previous crash.  The truth the files are checked against is the WAL itself, read whole by a scanner
(rows of committed transactions at their commit timestamp; rolled-back and orphaned ones never); the
rows and deletes the children saw acknowledged must be among them.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from flusher import Flusher, FlusherConfig
from flusher.commit import KILL_ENV, STEPS
from interceptors.recovery.streaming_wal import open_streaming_wal
from tests.crash.child_flusher import CHAIN
from tests.crash.evidence import stderr_on_failure, tail
from wal import Message, MessageType, WALManager, bodies

pytestmark = pytest.mark.crash

CHILD = Path(__file__).with_name("child_flusher.py")
REPO = Path(__file__).resolve().parents[2]
ROUNDS = max(2, int(os.environ.get("STREAMINGNODE_CRASH_TRIALS", "20")) // 10)
"""Each round kills once at every step (7) and twice at random: 18 runs by default."""


class _Child:
    def __init__(self, data_dir: Path, root: Path, seed: int, kill_at: str | None) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        env.pop(KILL_ENV, None)
        if kill_at is not None:
            env[KILL_ENV] = kill_at
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(data_dir), str(root), str(seed)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=env,
        )
        self.out = bytearray()
        self.err = b""
        self.ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        while chunk := self.proc.stdout.read1(65536):
            self.out.extend(chunk)
            if b"READY\n" in self.out:
                self.ready.set()

    def finish(self) -> bytes:
        self.proc.wait()
        self._reader.join(10)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.proc.stdout.close()
        self.err = err = self.proc.stderr.read()
        self.proc.stderr.close()
        assert self.proc.returncode == -signal.SIGKILL, f"child exited {self.proc.returncode}:\n{tail(err)}"
        return bytes(self.out)


def _run_hooked(data_dir: Path, root: Path, seed: int, step: str, nth: int) -> tuple[bytes, bool, bytes]:
    """Run until the child kills itself at the ``nth`` time it passes ``step``; (stdout, reached, stderr)."""
    child = _Child(data_dir, root, seed, f"{step}:{nth}")
    try:
        child.proc.wait(timeout=60)
        reached = True
    except subprocess.TimeoutExpired:
        os.kill(child.proc.pid, signal.SIGKILL)
        reached = False
    return child.finish(), reached, child.err


def _run_timed(data_dir: Path, root: Path, seed: int, rng: random.Random) -> tuple[bytes, bytes]:
    """Kill the child at a random moment of its ingestion; (stdout, stderr)."""
    child = _Child(data_dir, root, seed, None)
    if not child.ready.wait(60):
        os.kill(child.proc.pid, signal.SIGKILL)
        child.finish()
        raise AssertionError(f"child never became ready: {bytes(child.out[-500:])!r}\n{tail(child.err)}")
    time.sleep(rng.uniform(0.2, 1.5))
    os.kill(child.proc.pid, signal.SIGKILL)
    return child.finish(), child.err


def _acknowledged(logs: list[bytes]) -> tuple[Counter[tuple[str, int]], set[int]]:
    rows: Counter[tuple[str, int]] = Counter()
    deleted: set[int] = set()
    for log in logs:
        for line in log.split(b"\n")[:-1]:  # the last piece may be cut by the kill
            parts = line.decode().split()
            if parts[0] == "ROW":
                rows.update((parts[1], int(k)) for k in parts[2:])
            elif parts[0] == "DEL":
                deleted.update(int(k) for k in parts[1:])
    return rows, deleted


async def _verify(data_dir: Path, root: Path, logs: list[bytes]) -> tuple[int, int]:
    manager = await WALManager.start_rocksdb(data_dir)
    try:
        swal = await open_streaming_wal(manager, "p", CHAIN)
        await swal.ready()
        flusher = Flusher(swal, root, FlusherConfig())
        await flusher.start()
        assert not list(root.rglob(".*.tmp")), "temporaries survive a restart"
        await flusher.flush("")  # everything still buffered goes to files
        await flusher.aclose()

        # What the log says is visible: inserts and deletes, at the timestamp they became visible.
        end = (await swal.append(Message(MessageType.DATA, "v", b"end"))).timetick
        expected_rows: Counter[tuple[str, int, int]] = Counter()
        expected_deletes: Counter[tuple[int, int]] = Counter()
        scanner = swal.read()
        async for pack in scanner:
            commits = {m.txn.txn_id: m.timetick for m in pack.messages
                       if m.message_type is MessageType.COMMIT_TXN and m.txn is not None}
            for m in pack.messages:
                ts = m.timetick if m.txn is None else commits[m.txn.txn_id]
                if m.message_type is MessageType.INSERT:
                    coll = m.properties[bodies.PROP_COLLECTION]
                    expected_rows.update((coll, k, ts) for k in bodies.read_insert(m).column(0).to_pylist())
                elif m.message_type is MessageType.DELETE:
                    expected_deletes.update((k, ts) for k in bodies.read_delete(m).to_pylist())
            if pack.end_ts >= end:
                break
        await scanner.aclose()
        await swal.aclose()
    finally:
        await manager.aclose()

    got_rows: Counter[tuple[str, int, int]] = Counter()
    for coll in ("c", "d"):
        for path in (root / coll).glob("partition=*/segment=*/*.parquet"):
            t = pq.read_table(path, columns=["pk", "_ts"])
            got_rows.update((coll, k, ts) for k, ts in zip(t.column("pk").to_pylist(), t.column("_ts").to_pylist(),
                                                             strict=True))
    got_deletes: Counter[tuple[int, int]] = Counter()
    for path in (root / "_deletes" / "c").glob("*.parquet"):
        t = pq.read_table(path)
        got_deletes.update(zip(t.column("pk").to_pylist(), t.column("_ts").to_pylist(), strict=True))

    twice = [r for r, n in got_rows.items() if n > 1]
    assert not twice, f"rows written twice: {twice[:10]}"
    missing = expected_rows - got_rows
    extra = got_rows - expected_rows
    assert not missing and not extra, f"missing {list(missing)[:10]}, not in the log {list(extra)[:10]}"
    assert got_deletes == expected_deletes
    acked_rows, acked_deletes = _acknowledged(logs)
    assert max(acked_rows.values(), default=1) == 1
    present = {(c, k) for c, k, _ in got_rows}
    assert set(acked_rows) <= present, f"acknowledged rows lost: {list(set(acked_rows) - present)[:10]}"
    assert acked_deletes <= {k for k, _ in got_deletes}
    _LAST_EXPECTED["rows"], _LAST_EXPECTED["deletes"] = expected_rows, expected_deletes
    return sum(got_rows.values()), sum(got_deletes.values())


_LAST_EXPECTED: dict[str, Counter[Any]] = {}


def _visible(
    rows: Counter[tuple[str, int, int]], deletes: Counter[tuple[int, int]], coll: str,
) -> Counter[tuple[int, int]]:
    """The rows a reader sees now: a row stays unless its key was deleted after it was written."""
    last_delete: dict[int, int] = {}
    for k, ts in deletes:
        last_delete[k] = max(ts, last_delete.get(k, -1))
    return Counter({(k, ts): n for (c, k, ts), n in rows.items() if c == coll and last_delete.get(k, -1) <= ts})


@pytest.mark.spark
async def test_sigkill_at_every_commit_step_and_during_ingestion_leaves_exactly_the_committed_rows(
    tmp_path: Path, spark: Any, crash_seed: int,
) -> None:
    data_dir, root = tmp_path / "db", tmp_path / "parquet"
    rng = random.Random(crash_seed)  # where the kills land; the children's own seeds count up
    logs: list[bytes] = []
    errs: list[bytes] = []
    reached: Counter[str] = Counter()
    seed = 0
    for _ in range(ROUNDS):
        for step in STEPS:
            seed += 1
            nth = rng.randrange(1, 4)
            out, ok, err = await asyncio.to_thread(_run_hooked, data_dir, root, seed, step, nth)
            logs.append(out)
            errs.append(err)
            reached[step] += ok
        for _ in range(2):
            seed += 1
            out, err = await asyncio.to_thread(_run_timed, data_dir, root, seed, rng)
            logs.append(out)
            errs.append(err)
    assert set(reached) == set(STEPS) and all(reached.values()), f"steps never reached: {reached}"
    with stderr_on_failure(lambda: b"".join(errs[-3:]), "last three children"):
        rows, deletes = await _verify(data_dir, root, logs)
    files = len(list(root.rglob("*.parquet")))
    print(f"\nflusher crash: {len(logs)} kills, reached {dict(reached)}, {rows} rows, {deletes} deletes, {files} files")
    assert rows > 100 and deletes > 0
    # And once more after a clean restart: nothing changes.
    assert await _verify(data_dir, root, logs) == (rows, deletes)
    # What Spark reads after all the kills: exactly the visible rows, each once.
    from flusher.read.spark import read_collection  # noqa: PLC0415

    for coll in ("c", "d"):
        df = read_collection(spark, str(root), coll, primary_key="pk")
        got = Counter((r["pk"], r["_ts"]) for r in df.select("pk", "_ts").collect())
        want = _visible(_LAST_EXPECTED["rows"], _LAST_EXPECTED["deletes"] if coll == "c" else Counter(), coll)
        assert df.count() == sum(want.values()) and got == want, f"Spark differs for {coll!r}"
