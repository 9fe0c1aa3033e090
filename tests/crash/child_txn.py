"""A child process for the transaction crash test: transactions through the chain until SIGKILLed.

Usage::

    python tests/crash/child_txn.py <data_dir> <pchannel> <seed>

Several tasks each run transactions on their own vchannel: BeginTxn, 1..20 bodies (in batches),
then commit — or leave it open and start another.  stdout carries one line per event:

    READY
    BODY <txn_id> <payload hex>     a body was acknowledged
    COMMITTED <txn_id>              the CommitTxn was acknowledged
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

import structlog

from interceptors.recovery.streaming_wal import ChainConfig, open_streaming_wal
from wal import ChannelExistError, Message, MessageType, WALManager

TASKS = 8


def _out(line: str) -> None:
    os.write(1, (line + "\n").encode())


async def _run(data_dir: str, pchannel: str, seed: int) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    manager = await WALManager.start_rocksdb(data_dir)
    with contextlib.suppress(ChannelExistError):
        await manager.create_channel(pchannel)
    swal = await open_streaming_wal(manager, pchannel, ChainConfig(tick_interval=0.01))
    await swal.ready()

    async def task(k: int) -> None:
        rng = random.Random(f"{seed}:{k}")
        vchannel = f"v{k}"
        while True:
            ctx, _ = await swal.begin_txn(vchannel, keepalive_ms=0)
            for _ in range(rng.randrange(1, 5)):
                payloads = [rng.randbytes(rng.randrange(1, 200)) for _ in range(rng.randrange(1, 6))]
                await swal.append_batch([Message(MessageType.DATA, vchannel, p, txn=ctx) for p in payloads])
                os.write(1, "".join(f"BODY {ctx.txn_id} {p.hex()}\n" for p in payloads).encode())
            if rng.random() < 0.7:
                await swal.commit_txn(ctx.txn_id)
                _out(f"COMMITTED {ctx.txn_id}")

    tasks = [asyncio.create_task(task(k)) for k in range(TASKS)]
    _out("READY")
    await asyncio.gather(*tasks)


def main() -> None:
    data_dir, pchannel, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    asyncio.run(_run(data_dir, pchannel, seed))


if __name__ == "__main__":
    main()
