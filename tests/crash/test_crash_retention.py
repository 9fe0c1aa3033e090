"""SIGKILL a real node between the two steps of a truncation (snapshot stored, blocks not yet dropped),
right after one, and at a random moment; after each restart the collection, its segments and the
acknowledged rows are all still there, and the Parquet files hold every acknowledged row exactly once.

Every run shares one data directory, so each restart recovers from a log truncated (or about to be)
by the run before.  Retention runs with no time floor and checks every 0.1 s, so it truncates as soon
as the flusher's checkpoint allows.  Each run first opens a new partition and flushes one row: the
segment that gets must have an id above every segment directory already on disk (after a truncation
the next segment id comes from the recovery snapshot, never from the log).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamingnode.client import AsyncClient
from streamingnode.node.retention import KILL_ENV
from tests.crash.evidence import stderr_on_failure
from tests.node_process import NodeProcess, free_port
from tests.waiting import until
from wal.errors import StreamingError, UnavailableError

pytestmark = pytest.mark.crash

SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("s", pa.string())])
RUN_SECONDS = 30.0


def _rows(pks: list[int]) -> pa.RecordBatch:
    return pa.record_batch([pa.array(pks, pa.int64()), pa.array([f"s{k}" for k in pks])], schema=SCHEMA)


def _segment_ids(root: Path) -> set[int]:
    return {int(d.name.split("=", 1)[1]) for d in root.glob("c/partition=*/segment=*") if d.is_dir()}


def _file_pks(root: Path) -> Counter[int]:
    got: Counter[int] = Counter()
    for path in root.glob("c/partition=*/segment=*/*.parquet"):
        got.update(pq.read_table(path, columns=["pk"]).column("pk").to_pylist())
    return got


class _Ledger:
    def __init__(self, seed: int) -> None:
        self.attempted: set[int] = set()
        self.acked: set[int] = set()
        self.next_pk = 0
        self.first_ids: list[int | None] = []
        self.rng = random.Random(seed)

    def take(self, n: int) -> list[int]:
        out = list(range(self.next_pk, self.next_pk + n))
        self.next_pk += n
        self.attempted.update(out)
        return out


def _node(data_dir: Path, port: int, kill_at: str | None) -> NodeProcess:
    env = dict(os.environ)
    env.pop(KILL_ENV, None)
    if kill_at is not None:
        env[KILL_ENV] = kill_at
    return NodeProcess(data_dir, port, "--channels", "p", "--retention-seconds", "0",
                       "--retention-check-seconds", "0.1", env=env)


async def _run(data_dir: Path, port: int, run: int, kill_at: str | None, kill_after: float | None,
               ledger: _Ledger) -> bool:
    """One life of the node; True when it died of the hook (or of ``kill_after``) while working."""
    root = data_dir / "parquet" / "p"
    before = _segment_ids(root)
    node = _node(data_dir, port, kill_at).start()
    started = time.monotonic()
    died = False
    try:
        async with AsyncClient(node.address, timeout=10.0, reconnect_timeout=1.0) as client:
            try:
                with stderr_on_failure(lambda: node.stderr, f"node (run {run})"):
                    await _work(client, root, run, before, started, kill_after, node, ledger)
            except (StreamingError, OSError):
                # The call failed: because the node died of the hook (it exits at once), or not.
                assert node.proc is not None
                with contextlib.suppress(subprocess.TimeoutExpired):
                    await asyncio.to_thread(node.proc.wait, 10)
                if node.proc.poll() is None:
                    raise  # failed while the node lives: not the kill
        assert node.proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(node.proc.wait, 5)
        died = node.proc.poll() == -signal.SIGKILL
    finally:
        node.kill()
    return died


async def _work(client: AsyncClient, root: Path, run: int, before: set[int], started: float,
                kill_after: float | None, node: NodeProcess, ledger: _Ledger) -> None:
    data = client.data("p")
    async def described() -> bool:  # a port just released by the killed node may refuse the first connection
        try:
            ledger.first_ids.append((await client.describe_channels(["p"]))[0].first_id)
        except UnavailableError:
            if node.proc is None or node.proc.poll() is not None:
                raise
            return False
        return True

    await until(described, "the restarted node to answer", timeout=30, interval=0.1)
    if run == 1:  # later lives rely on the collection surviving every truncation
        await data.create_collection("v", "c", SCHEMA, primary_key="pk")
    # A new partition's first segment: its id must be new to the whole Parquet tree.
    part = f"r{run}"
    await data.create_partition("v", "c", part)
    probe = ledger.take(1)
    await data.insert("v", "c", _rows(probe), partition=part)
    ledger.acked.update(probe)
    await data.flush("v")
    (probe_segment,) = {int(d.name.split("=", 1)[1]) for d in (root / "c" / f"partition={part}").glob("segment=*")}
    assert probe_segment not in before and probe_segment > max(before, default=0), (
        f"run {run}: segment id {probe_segment} reused (on disk before: {sorted(before)})")
    i = 0
    while time.monotonic() - started < RUN_SECONDS:
        if kill_after is not None and time.monotonic() - started >= kill_after:
            assert node.proc is not None
            node.proc.send_signal(signal.SIGKILL)
            return
        pks = ledger.take(5)
        await data.insert("v", "c", _rows(pks), partition=ledger.rng.choice(["_default", part]))
        ledger.acked.update(pks)
        i += 1
        if i % 4 == 0:
            await data.flush("v")


@pytest.mark.spark
async def test_sigkill_around_truncation_loses_no_row_and_no_segment_id(
    tmp_path: Path, spark: Any, crash_seed: int,
) -> None:
    data_dir = tmp_path / "data"
    port = free_port()
    ledger = _Ledger(crash_seed)
    rng = ledger.rng
    reached: Counter[str] = Counter()
    run = 0
    for step, nth in (("snapshot", 1), ("truncate", 1), ("snapshot", 2), ("truncate", 2), ("snapshot", 3)):
        run += 1
        reached[step] += await _run(data_dir, port, run, f"{step}:{nth}", None, ledger)
    for _ in range(2):
        run += 1
        await _run(data_dir, port, run, None, rng.uniform(2.0, 6.0), ledger)
    assert reached == {"snapshot": 3, "truncate": 2}, f"hooks not reached: {reached}"

    # A clean life: everything acknowledged goes to files; the log was truncated on the way.
    node = _node(data_dir, port, None).start()
    try:
        async with AsyncClient(node.address, timeout=30.0) as client:
            await client.data("p").flush("v")
            (desc,) = await client.describe_channels(["p"])
    finally:
        assert node.terminate() == 0
    firsts = [f for f in ledger.first_ids if f is not None]
    assert firsts and max(firsts) > 0 and desc.first_id is not None and desc.first_id > 0, ledger.first_ids

    got = _file_pks(data_dir / "parquet" / "p")
    twice = [k for k, n in got.items() if n > 1]
    assert not twice, f"rows written twice: {twice[:10]}"
    lost = ledger.acked - set(got)
    assert not lost, f"acknowledged rows lost: {sorted(lost)[:10]}"
    assert set(got) <= ledger.attempted
    print(f"\nretention crash: {run} runs, {len(ledger.acked)} acknowledged rows, first ids {ledger.first_ids}")

    from flusher.read.spark import read_collection  # noqa: PLC0415

    df = read_collection(spark, str(data_dir / "parquet" / "p"), "c", primary_key="pk")
    spark_pks = Counter(r["pk"] for r in df.select("pk").collect())
    assert df.count() == len(got) and spark_pks == got
