"""Insert -> Parquet latency of an idle insert on a real node with the default limits.

    .venv/bin/python bench/freshness.py [--runs 3] [--dir /tmp]

One node (``ServerThread``, ``NodeConfig`` defaults but for a temporary data directory and free
loopback ports) serves the whole benchmark.  Each run creates a fresh collection on its own vchannel
with the sync ``Client``, inserts one row, and then writes nothing more: no flush, no second insert,
nothing that would seal its segment.  The sample is from just before ``data.insert`` until a Parquet
file holding the row is visible under the collection's directory (polled every 20 ms), so it is what
``flush_max_age_seconds`` (the flusher writes a buffer once its first row is that old) plus a tick and
the commit protocol cost.  With the old default of 600 s each sample would take ten minutes: pass
``--age`` to run with another limit.  Benchmarks are not tests: this asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Run as a script from anywhere: the harness makes the repository root importable.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import pyarrow as pa
from _harness import prepare_process

from streamingnode.client import Client
from streamingnode.config import NodeConfig
from streamingnode.server import ServerThread

SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("v", pa.string())])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the temporary data directory goes")
    parser.add_argument("--age", type=float, default=None, help="flush_max_age_seconds (default: the node's)")
    args = parser.parse_args()
    prepare_process()
    overrides = {} if args.age is None else {"flush_max_age_seconds": args.age}
    with tempfile.TemporaryDirectory(prefix="freshness-", dir=args.dir) as tmp:
        config = NodeConfig(data_dir=Path(tmp) / "data", listen="127.0.0.1:0", metrics_listen="127.0.0.1:0",
                            **overrides)  # type: ignore[arg-type]
        samples: list[float] = []
        with ServerThread(config) as srv, Client(srv.address) as client:
            client.create_channels(["p"])
            data = client.data("p")
            root = srv.node.config.parquet_root / "p"
            for i in range(args.runs):
                name = f"c{i}"
                data.create_collection(f"v{i}", name, SCHEMA, primary_key="pk")
                t0 = time.perf_counter()
                data.insert(f"v{i}", name, pa.record_batch([pa.array([i], pa.int64()), pa.array(["x"])],
                                                           schema=SCHEMA))
                while not any((root / name).glob("partition=*/segment=*/*.parquet")):
                    time.sleep(0.02)
                samples.append(time.perf_counter() - t0)
                print(f"run {i + 1}/{args.runs}: {samples[-1]:.2f} s", file=sys.stderr, flush=True)
            data.close()
    print(f"idle insert -> Parquet, flush_max_age_seconds={config.flush_max_age_seconds:g}, "
          f"tick_interval={config.tick_interval:g}: median {statistics.median(samples):.2f} s, "
          f"max {max(samples):.2f} s over {len(samples)} runs")


if __name__ == "__main__":
    main()
