"""What the range checks of group commits cost, in process: rounds of 1,000 concurrent commits on
1,000 groups of one pchannel (a RocksDB WAL holding 2,000 messages), as seeks (the pchannel's range)
and as acks (also a stream's ceiling, its vchannel, and the group's position).

    .venv/bin/python bench/group_checks.py [--rounds 20] [--runs 3]

Run it with ``PYTHONPATH`` set to another tree to compare (an older tree has no ack form: it prints
the seek form only).  Prints the median over runs of the total time of the rounds, per form.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import statistics
import tempfile
import time
from pathlib import Path

from streamingnode.node.groups import ConsumerGroups
from wal import Message, MessageType, Position, WALManager


async def _run(rounds: int, ack: bool) -> float:
    with tempfile.TemporaryDirectory() as d:
        manager = await WALManager.start_rocksdb(Path(d) / "db")
        try:
            await manager.create_channel("p")
            wal = await manager.open("p")
            await wal.append_batch([Message(MessageType.INSERT, "v", b"row", {}, timetick=10 * i + 10)
                                    for i in range(2000)])
            groups = await ConsumerGroups.load(wal)
            for i in range(1000):
                await groups.create(f"g{i}")
            total = 0.0
            for r in range(rounds):
                k = r + 1
                position = [("v", Position("p", k, 10 * k))]
                t0 = time.perf_counter()
                if ack:
                    await asyncio.gather(*(groups.commit(f"g{i}", position, ceiling=(2000, 20_000), reads="v")
                                           for i in range(1000)))
                else:
                    await asyncio.gather(*(groups.commit(f"g{i}", position) for i in range(1000)))
                total += time.perf_counter() - t0
            return total
        finally:
            await manager.aclose()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=20, help="rounds of 1,000 commits (default 20)")
    p.add_argument("--runs", type=int, default=3, help="runs; the median is printed (default 3)")
    args = p.parse_args()
    forms = [False]
    if "ceiling" in inspect.signature(ConsumerGroups.commit).parameters:
        forms.append(True)
    for ack in forms:
        times = [asyncio.run(_run(args.rounds, ack)) for _ in range(args.runs)]
        per = statistics.median(times) / (args.rounds * 1000) * 1e6
        print(f"{'acks' if ack else 'seeks'}: {args.rounds} rounds of 1,000 commits, "
              f"median {statistics.median(times):.3f} s (runs {', '.join(f'{t:.3f}' for t in times)}), "
              f"{per:.1f} µs a commit")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
