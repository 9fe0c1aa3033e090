"""A child process for the flusher crash test: ingestion through the chain with a flusher running,
until SIGKILLed — by the parent, or by itself at a commit step (``STREAMINGNODE_FLUSHER_KILL_AT``).

Usage::

    python tests/crash/child_flusher.py <data_dir> <root> <seed>

Collections ``c`` (partitions ``_default`` and ``p1``, vchannel ``v``; plain inserts, deletes and
manual flushes) and ``d`` (vchannel ``w``; transactions that commit, roll back or stay open).  Each
run picks its own flusher limits from the seed, so a replay cuts files at other boundaries than the
run that crashed.  stdout carries one line per event:

    READY
    ROW <collection> <pk>...      rows whose insert (or whose transaction's commit) was acknowledged
    DEL <pk>...                   keys whose delete was acknowledged
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import sys
from pathlib import Path

# Run as a script: make the repository root importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pyarrow as pa
import structlog

from flusher import Flusher, FlusherConfig
from interceptors.recovery.streaming_wal import ChainConfig, open_streaming_wal
from wal import ChannelExistError, CollectionExistError, PartitionExistError, WALManager, bodies

SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("s", pa.string())])
CHAIN = ChainConfig(tick_interval=0.01, segment_max_rows=150)


def _out(line: str) -> None:
    os.write(1, (line + "\n").encode())


def batch(pks: list[int]) -> pa.RecordBatch:
    return pa.record_batch([pa.array(pks, pa.int64()), pa.array([f"s{k}" for k in pks])], schema=SCHEMA)


async def _run(data_dir: str, root: str, seed: int) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    rng = random.Random(seed)
    manager = await WALManager.start_rocksdb(data_dir)
    with contextlib.suppress(ChannelExistError):
        await manager.create_channel("p")
    swal = await open_streaming_wal(manager, "p", CHAIN)
    await swal.ready()
    for v, c in (("v", "c"), ("w", "d")):
        with contextlib.suppress(CollectionExistError):
            await swal.append(bodies.create_collection(v, c, SCHEMA, "pk"))
    with contextlib.suppress(PartitionExistError):
        await swal.append(bodies.create_partition("v", "c", "p1"))
    flusher = Flusher(swal, root, FlusherConfig(
        max_rows=rng.choice([7, 23, 61]), memory_cap_bytes=rng.choice([4096, 16384, 1 << 20]),
        max_age_seconds=rng.choice([0.05, 0.3]), checkpoint_interval_seconds=0.05))
    await flusher.start()
    next_pk = seed * 10_000_000

    def take(n: int) -> list[int]:
        nonlocal next_pk
        out = list(range(next_pk, next_pk + n))
        next_pk += n
        return out

    async def plain() -> None:
        while True:
            pks = take(rng.randrange(1, 9))
            await swal.append(bodies.insert("v", "c", batch(pks), partition=rng.choice(["_default", "p1"])))
            _out("ROW c " + " ".join(map(str, pks)))
            r = rng.random()
            if r < 0.15:
                gone = pks[: rng.randrange(1, len(pks) + 1)]
                await swal.append(bodies.delete("v", "c", gone))
                _out("DEL " + " ".join(map(str, gone)))
            elif r < 0.2:
                await flusher.flush("v", rng.choice([None, "c"]))

    async def txns() -> None:
        while True:
            ctx, _ = await swal.begin_txn("w", keepalive_ms=0)
            pks: list[int] = []
            for _ in range(rng.randrange(1, 4)):
                part = take(rng.randrange(1, 6))
                await swal.append(bodies.insert("w", "d", batch(part)).with_txn(ctx))
                pks += part
            r = rng.random()
            if r < 0.7:
                await swal.commit_txn(ctx.txn_id)
                _out("ROW d " + " ".join(map(str, pks)))
            elif r < 0.9:
                await swal.rollback_txn(ctx.txn_id)
            # else: left open; the next owner of the pchannel rolls it back

    tasks = [asyncio.create_task(plain()), asyncio.create_task(txns())]
    _out("READY")
    await asyncio.gather(*tasks)


def main() -> None:
    data_dir, root, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    asyncio.run(_run(data_dir, root, seed))


if __name__ == "__main__":
    main()
