"""Durable append through the interceptor chain, measured against the bare WAL in the same process.

    .venv/bin/python bench/append_chain.py [--messages N] [--appenders 16] [--runs 3]

Every run measures, each in a fresh temporary directory and a fresh manager, the chain and the bare
path back to back (which goes first alternates between runs):

* **chain**: ``WALManager.start_rocksdb(dir)`` (Durability.SYNC, ``SyncMethod.FLUSH_WAL``),
  ``open_streaming_wal(manager, "p", ChainConfig())`` and ``await swal.ready()`` (untimed), then
  ``--appenders`` asyncio tasks each calling ``await swal.append_batch(batch)`` until the messages are
  stored.  The path is StreamingWAL → WALAdaptor → dedup → lock → shard → timetick → redo → txn →
  ``WAL.append_batch``; the timetick step's background task (volatile ticks after appends, a persisted
  tick every 0.2 s) runs as it would on a node.
* **bare**: a second fresh manager, ``wal = await manager.open("p")``, the same tasks calling
  ``await wal.append_batch(batch)``.  Messages carry one increasing timetick each (the chain's
  timetick step stamps them on the chain path).

Messages are ``MessageType.DATA`` (plain records, no schema), 1 KiB payloads, vchannel ``f"v{k % 4}"``
for message ``k``; the ``Message`` objects are built inside the timed region on both paths.  Batch
sizes: 1 (``--messages // 10`` messages) and 100 (``--messages``).

One variant at batch 100 appends ``MessageType.INSERT`` rows into a real collection (int64 ``pk``,
16-dim float vector, string), created on each of the four vchannels with ``wal.bodies.create_collection``
before the timed region.  Each INSERT carries 8 rows; its Arrow IPC payload is built once per vchannel
with ``wal.bodies.insert`` (client-side encoding costs about 10 µs and is not the chain's work) and
every timed message is a fresh ``Message`` with that payload and a fresh properties dict.  The shard
step decodes and checks every INSERT against the schema and stamps its segment; the bare WAL stores
the same bytes unchecked.  It has no target: it shows the shard step's cost with real DML.

Per-step cost comes from ``swal.chain.timings`` (each step's own time, inner steps subtracted), as a
difference of snapshots around the timed region, divided by the messages appended.  Own time is wall
time on the event-loop thread: it also holds waits inside a step that are not calls to the next one
(a contended lock, the timetick step's durable window extension) and GIL waits while the writer thread
holds the GIL.  Work outside the steps (the adaptor, StreamingWAL, the tick task) is in no step.

The table shows medians over ``--runs``; ratios are medians of the per-run chain/bare ratios.
``--profile {data,insert}`` runs one chain append (``--messages`` messages, batch ``--profile-batch``,
default 100) under cProfile instead: the event-loop thread, where every chain step runs, by
cumulative then by internal time.  The writer thread's work is the bare path's (see wal_append.py).
Benchmarks are not tests: they assert nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Run as a script from anywhere: the harness makes the repository root importable.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import pyarrow as pa
from _harness import Run, prepare_process, repeat, tmpdir, verdict

from interceptors.recovery.streaming_wal import ChainConfig, StreamingWAL, open_streaming_wal
from wal import Message, MessageType, WALManager, bodies

PCHANNEL = "p"
VCHANNELS = 4
COLLECTION = "bench"
VECTOR_DIM = 16
INSERT_ROWS = 8
STEPS = ("dedup", "lock", "shard", "timetick", "redo", "txn")

TARGET = 0.70  # chain / bare at batch 100, DATA messages

_DATA = MessageType.DATA
_INSERT = MessageType.INSERT
_VCH = [f"v{i}" for i in range(VCHANNELS)]


# --- messages --------------------------------------------------------------------------------------
def insert_schema() -> pa.Schema:
    return pa.schema([
        pa.field("pk", pa.int64(), nullable=False),
        pa.field("vector", pa.list_(pa.float32(), VECTOR_DIM)),
        pa.field("text", pa.string()),
    ])


def _insert_rows(vchannel: str) -> pa.RecordBatch:
    rng = random.Random(vchannel)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(range(INSERT_ROWS), pa.int64()),
            pa.FixedSizeListArray.from_arrays(
                pa.array([rng.random() for _ in range(INSERT_ROWS * VECTOR_DIM)], pa.float32()), VECTOR_DIM
            ),
            pa.array([f"{vchannel}-row-{i:04d}-{rng.getrandbits(32):08x}" for i in range(INSERT_ROWS)]),
        ],
        schema=insert_schema(),
    )


def insert_templates() -> list[Message]:
    """One INSERT of 8 rows per vchannel, built with ``wal.bodies.insert`` (payload reused when timed)."""
    return [bodies.insert(v, COLLECTION, _insert_rows(v)) for v in _VCH]


# One builder per (kind, path): messages start..end-1; ``stamp`` gives the bare path its timeticks.
Builder = Callable[[int, int], list[Message]]


def _data_builder(payload: bytes, stamp: bool) -> Builder:
    vch = _VCH
    if stamp:
        return lambda start, end: [Message(_DATA, vch[k & 3], payload, timetick=k + 1) for k in range(start, end)]
    return lambda start, end: [Message(_DATA, vch[k & 3], payload) for k in range(start, end)]


def _insert_builder(templates: list[Message], stamp: bool) -> Builder:
    tpl = [(t.vchannel, t.payload, t.properties) for t in templates]

    def build(start: int, end: int) -> list[Message]:
        out = []
        for k in range(start, end):
            v, p, props = tpl[k & 3]
            out.append(Message(_INSERT, v, p, dict(props), timetick=k + 1 if stamp else 0))
        return out

    return build


# --- one append run --------------------------------------------------------------------------------
@dataclass
class AppendRun:
    rate: float  # messages per second
    requests: int  # append_batch calls
    commits: int  # group-commit writes
    steps: dict[str, float] = field(default_factory=dict)  # own seconds per step in the timed region
    seals: int = 0  # FLUSH messages the shard step added (INSERT variant)


Append = Callable[[list[Message]], Awaitable[Any]]


async def _drive(n: int, appenders: int, batch: int, build: Builder, append: Append) -> tuple[float, int]:
    next_seq = 0  # next message index to hand to an appender (the loop is single-threaded)
    requests = 0

    async def appender() -> None:
        nonlocal next_seq, requests
        while next_seq < n:
            start = next_seq
            end = min(start + batch, n)
            next_seq = end
            await append(build(start, end))
            requests += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(appender() for _ in range(appenders)))
    return time.perf_counter() - t0, requests


def _step_seconds(swal: StreamingWAL) -> dict[str, float]:
    return {t.name: t.seconds for t in swal.chain.timings}


async def _append_chain(path: str, n: int, appenders: int, batch: int, kind: str, size: int) -> AppendRun:
    manager = await WALManager.start_rocksdb(path)
    try:
        await manager.create_channel(PCHANNEL)
        swal = await open_streaming_wal(manager, PCHANNEL, ChainConfig())
        try:
            await swal.ready()
            if kind == "insert":
                schema = insert_schema()
                await swal.append_batch(
                    [bodies.create_collection(v, COLLECTION, schema, primary_key="pk") for v in _VCH]
                )
                build = _insert_builder(insert_templates(), stamp=False)
            else:
                build = _data_builder(os.urandom(size), stamp=False)
            first = swal.wal.next_id
            seg0 = swal.shard.next_segment_id
            commits0 = manager._committer.commits
            before = _step_seconds(swal)
            gc.collect()
            elapsed, requests = await _drive(n, appenders, batch, build, swal.append_batch)
            after = _step_seconds(swal)
            commits = manager._committer.commits - commits0
            opened = swal.shard.next_segment_id - seg0
            seals = opened - len(swal.shard.growing_segments())
            if swal.wal.next_id - first < n:
                raise RuntimeError(f"chain appended {swal.wal.next_id - first} messages, expected >= {n}")
        finally:
            await swal.aclose()
    finally:
        await manager.aclose()
    steps = {k: after[k] - before.get(k, 0.0) for k in after}
    return AppendRun(n / elapsed, requests, commits, steps, seals)


async def _append_bare(path: str, n: int, appenders: int, batch: int, kind: str, size: int) -> AppendRun:
    manager = await WALManager.start_rocksdb(path)
    try:
        await manager.create_channel(PCHANNEL)
        wal = await manager.open(PCHANNEL)
        build = _insert_builder(insert_templates(), stamp=True) if kind == "insert" else _data_builder(
            os.urandom(size), stamp=True
        )
        first = wal.next_id
        commits0 = manager._committer.commits
        gc.collect()
        elapsed, requests = await _drive(n, appenders, batch, build, wal.append_batch)
        commits = manager._committer.commits - commits0
        if wal.next_id - first != n:
            raise RuntimeError(f"bare appended {wal.next_id - first} messages, expected {n}")
    finally:
        await manager.aclose()
    return AppendRun(n / elapsed, requests, commits)


# --- driver ----------------------------------------------------------------------------------------
def _run(fn: Callable[..., Coroutine[Any, Any, AppendRun]], root: str, name: str, *args: Any) -> AppendRun:
    path = tmpdir(root, name)
    try:
        gc.collect()
        return asyncio.run(fn(path, *args))
    finally:
        shutil.rmtree(path, ignore_errors=True)


# (label key, kind, batch, messages divisor)
CASES = (("b100", "data", 100, 1), ("b1", "data", 1, 10), ("ins", "insert", 100, 1))


def _one_run(args: argparse.Namespace, root: str, index: int) -> dict[str, float]:
    r: dict[str, float] = {}
    chain_first = index % 2 == 0
    for key, kind, batch, div in CASES:
        n = max(args.messages // div, 1)
        params = (n, args.appenders, batch, kind, args.size)
        order = ("chain", "bare") if chain_first else ("bare", "chain")
        res: dict[str, AppendRun] = {}
        for path_kind in order:
            fn = _append_chain if path_kind == "chain" else _append_bare
            res[path_kind] = _run(fn, root, f"{key}-{path_kind}", *params)
        c, b = res["chain"], res["bare"]
        r[f"{key}_chain"] = c.rate
        r[f"{key}_bare"] = b.rate
        r[f"{key}_ratio"] = c.rate / b.rate
        r[f"{key}_n"] = n
        r[f"{key}_coalesce_chain"] = c.requests / max(c.commits, 1)
        r[f"{key}_coalesce_bare"] = b.requests / max(b.commits, 1)
        r[f"{key}_seals"] = c.seals
        for name in STEPS:
            r[f"{key}_step_{name}"] = c.steps.get(name, 0.0) * 1e6 / n  # µs per message
        r[f"{key}_steps_total"] = sum(c.steps.values()) * 1e6 / n
        r[f"{key}_extra"] = 1e6 / c.rate - 1e6 / b.rate  # µs per message the chain path adds
    return r


def _report(args: argparse.Namespace, runs: list[dict[str, float]]) -> None:
    med = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
    print()
    print(
        f"append_chain: {args.size} B DATA messages over {VCHANNELS} vchannels, {args.appenders} appenders, "
        f"FLUSH_WAL, durable; medians of {len(runs)} run(s)"
    )
    rows = [
        ("b100", f"DATA, batch 100 ({int(med['b100_n']):,} msgs)"),
        ("b1", f"DATA, batch 1 ({int(med['b1_n']):,} msgs)"),
        ("ins", f"INSERT 8 rows, batch 100 ({int(med['ins_n']):,} msgs)"),
    ]
    width = max(len(label) for _, label in rows) + 7
    print(f"{'what':<{width}} | {'median msg/s':>12} | each run")
    print(f"{'-' * width}-+-{'-' * 12}-+-{'-' * 40}")
    for key, label in rows:
        for path_kind in ("chain", "bare"):
            k = f"{key}_{path_kind}"
            each = ", ".join(f"{run[k]:,.0f}" for run in runs)
            extra = f"  [{med[f'{key}_coalesce_{path_kind}']:.1f} requests/commit]"
            print(f"{label + ', ' + path_kind:<{width}} | {med[k]:>12,.0f} | {each}{extra}")
    print()
    print("ratios are medians of the per-run ratios (chain / bare measured back to back)")
    for key, batch, target, what in (("b100", 100, TARGET, ""), ("b1", 1, None, ""), ("ins", 100, None, " INSERT")):
        print(
            f"append_chain batch={batch}{what}: chain {med[f'{key}_chain']:,.0f} msg/s | "
            f"bare {med[f'{key}_bare']:,.0f} msg/s | {verdict(med[f'{key}_ratio'], target)}"
        )
    print()
    print("per-step own time (swal.chain.timings), µs per message, medians:")
    head = f"{'case':<22}" + "".join(f"{s:>9}" for s in STEPS) + f"{'sum':>9}{'chain-bare':>12}"
    print(head)
    for key, label in (("b100", "DATA batch 100"), ("b1", "DATA batch 1"), ("ins", "INSERT batch 100")):
        line = f"{label:<22}" + "".join(f"{med[f'{key}_step_{s}']:>9.2f}" for s in STEPS)
        print(line + f"{med[f'{key}_steps_total']:>9.2f}{med[f'{key}_extra']:>12.2f}")
    print(
        "(chain-bare: 1e6/chain_rate - 1e6/bare_rate, the wall time per message the chain path adds; "
        "the rest of it is the adaptor, StreamingWAL, the tick task and the timing wrappers)"
    )
    if med["ins_seals"]:
        print(f"INSERT variant: the shard step sealed {med['ins_seals']:.0f} segment(s) per run (median)")


def _profile(args: argparse.Namespace, kind: str) -> None:
    """cProfile one chain append (the event-loop thread, where the chain runs)."""
    import cProfile  # noqa: PLC0415
    import pstats  # noqa: PLC0415

    root = tempfile.mkdtemp(prefix="append-chain-profile-", dir=args.dir)
    prof = cProfile.Profile()
    try:
        path = tmpdir(root, "chain")
        run = prof.runcall(
            asyncio.run, _append_chain(path, args.messages, args.appenders, args.profile_batch, kind, args.size)
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"chain {kind} append, batch {args.profile_batch}, {args.messages:,} messages, under cProfile: "
        f"{run.rate:,.0f} msg/s (profiling slows it down)"
    )
    print("\n=== event-loop thread, by cumulative time ===")
    pstats.Stats(prof).sort_stats("cumulative").print_stats(40)
    print("=== event-loop thread, by internal time ===")
    pstats.Stats(prof).sort_stats("tottime").print_stats(30)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--messages", type=int, default=200_000, help="messages per batch-100 run (default 200,000)")
    p.add_argument("--size", type=int, default=1024, help="DATA payload bytes (default 1024)")
    p.add_argument("--appenders", type=int, default=16, help="concurrent appender tasks (default 16)")
    p.add_argument("--runs", type=int, default=3, help="runs; the table shows medians (default 3)")
    p.add_argument("--dir", default=None, help="parent of the temporary databases (default: system temp)")
    p.add_argument("--profile", choices=("data", "insert"),
                   help="instead of the comparison, cProfile one chain append (loop thread)")
    p.add_argument("--profile-batch", type=int, default=100, help="batch size of the --profile run (default 100)")
    args = p.parse_args(argv)
    if min(args.messages, args.size, args.appenders, args.runs, args.profile_batch) < 1:
        p.error("every size and count must be >= 1")

    prepare_process()
    if args.profile:
        _profile(args, args.profile)
        return 0

    def describe(r: Run) -> str:
        return (
            f"batch 100 chain {r['b100_chain']:,.0f} / bare {r['b100_bare']:,.0f} = {r['b100_ratio']:.2f}; "
            f"batch 1 chain {r['b1_chain']:,.0f} / bare {r['b1_bare']:,.0f} = {r['b1_ratio']:.2f}; "
            f"INSERT chain {r['ins_chain']:,.0f} / bare {r['ins_bare']:,.0f} = {r['ins_ratio']:.2f}"
        )

    runs = repeat(args, "append-chain", _one_run, describe)
    _report(args, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
