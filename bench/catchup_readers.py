"""Many readers catching up together from storage: each block decoded once for all, or once per reader.

    .venv/bin/python bench/catchup_readers.py [--messages 100000] [--size 1024] [--readers 1,10,50] [--runs 3]

In one process, over ``WALManager.start_rocksdb``: ``--messages`` messages of ``--size`` bytes are
appended (a TimeTick every 1,000), then the manager is reopened so the tail buffer is empty and every
read comes from storage (one untimed read first, so no case pays for the page cache's warm-up).  For
each reader count N, N scanners (``ReadOption()``, from the start) run concurrently on the event loop
until each has seen every message; reported is the total messages delivered per second (N x messages
/ elapsed) and the process's CPU per delivered message.

Each case runs twice in the same run, in alternating order: with the WAL's shared cache of blocks
decoded from storage (``wal._tail.StoredBlocks``, a quarter of ``tail_buffer_bytes``), and with it off
(every reader decodes for itself, as before the cache).  The ratio is shared / per-reader, per run.
Benchmarks are not tests: they assert nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import Run, prepare_process, repeat, tmpdir

from wal import Message, MessageType, ReadOption, WALManager, new_time_tick

PCHANNEL = "catchup"
TICK_EVERY = 1000


async def _fill(path: str, messages: int, size: int) -> None:
    manager = await WALManager.start_rocksdb(path)
    try:
        await manager.create_channel(PCHANNEL)
        wal = await manager.open(PCHANNEL)
        payload = b"x" * size
        ts = 1
        for start in range(0, messages, TICK_EVERY):
            batch = [Message(MessageType.DATA, "v", payload, timetick=ts + i)
                     for i in range(min(TICK_EVERY, messages - start))]
            ts += len(batch)
            batch.append(new_time_tick(ts))
            ts += 1
            await wal.append_batch(batch)
    finally:
        await manager.aclose()


async def _read(path: str, messages: int, readers: int, shared: bool) -> tuple[float, float]:
    """(messages delivered per second in all, CPU µs per delivered message) for ``readers`` at once."""
    manager = await WALManager.start_rocksdb(path)
    try:
        wal = await manager.open(PCHANNEL)
        if not shared:
            wal._stored.max_bytes = 0

        async def one() -> None:
            seen = 0
            scanner = wal.read(ReadOption())
            try:
                async for pack in scanner:
                    seen += sum(1 for m in pack.messages if m.message_type is MessageType.DATA)
                    if seen >= messages:
                        return
            finally:
                await scanner.aclose()

        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(one() for _ in range(readers)))
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        await manager.aclose()
    return readers * messages / elapsed, cpu / (readers * messages) * 1e6


def _one_run(args: argparse.Namespace, root: str, index: int) -> Run:
    path = tmpdir(root, "wal")
    asyncio.run(_fill(path, args.messages, args.size))
    asyncio.run(_read(path, args.messages, 1, False))  # untimed: the first read pays for a cold cache
    r: Run = {}
    for n in args.readers:
        for shared in ((True, False) if index % 2 == 0 else (False, True)):
            key = f"{n}_{'shared' if shared else 'own'}"
            r[key], r[key + "_cpu"] = asyncio.run(_read(path, args.messages, n, shared))
        r[f"{n}_ratio"] = r[f"{n}_shared"] / r[f"{n}_own"]
    return r


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--messages", type=int, default=100_000, help="messages in the log (default 100,000)")
    p.add_argument("--size", type=int, default=1024, help="payload bytes (default 1024)")
    p.add_argument("--readers", default="1,10,50", help="concurrent reader counts (default 1,10,50)")
    p.add_argument("--runs", type=int, default=3, help="runs; figures are medians (default 3)")
    p.add_argument("--dir", default=None, help="parent of the temporary directories (default: system temp)")
    args = p.parse_args(argv)
    args.readers = [int(x) for x in args.readers.split(",")]
    if min(args.messages, args.size, args.runs, *args.readers) < 1:
        p.error("every size and count must be >= 1")
    prepare_process()
    runs = repeat(args, "catchup", _one_run,
                  lambda r: ", ".join(f"{k} {v:,.2f}" for k, v in r.items() if not k.endswith("_cpu")))

    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    print(f"\ncatch-up from storage, {args.messages:,} x {args.size} B, N readers at once, medians of {args.runs} runs")
    print(f"{'readers':>8} | {'shared msgs/s':>14} | {'own msgs/s':>12} | {'ratio':>6} | "
          f"{'CPU µs/msg shared / own':>24}")
    for n in args.readers:
        print(f"{n:>8} | {med(f'{n}_shared'):>14,.0f} | {med(f'{n}_own'):>12,.0f} | {med(f'{n}_ratio'):>6.2f} | "
              f"{med(f'{n}_shared_cpu'):>10.1f} / {med(f'{n}_own_cpu'):<10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
