"""What refused unary requests cost the node's memory, round after round.

    .venv/bin/python bench/refused_memory.py [--rounds 4] [--concurrency 12] [--mib 60] [--repo PATH]
        [--node-flag=--max-unary-request-bytes=67108864 ...] [--stream]

Two nodes, each a real ``streamingnode serve`` process (its own GC settings and allocator) in a fresh
data directory, one after the other:

* **auth**: with a tokens file.  ``--rounds`` rounds of ``--concurrency`` concurrent DescribeChannels,
  each request ``--mib`` MiB (one channel name that long), with **no token**; then as many rounds with
  a **valid token** (admin and consume on every pchannel).
* **open**: no authentication, the same rounds with no token.

After each round (every call answered), the node's RSS (``/proc/<pid>/status`` VmRSS) once it has
stopped moving for 3 s (``settled_rss_mb``, at most 15 s).  ``--stream``: Produce streams instead, whose open
request is that large (its pchannel name), refused UNAUTHENTICATED once the node has read it, or
PERMISSION_DENIED (the token may not produce), or INVALID_ARGUMENT.  Targets (issue 30): with a
valid token, RSS after the last round within 1.2x of RSS after the first; no unauthenticated round
raises RSS by more than 100 MB.  ``--repo`` runs the node of another checkout (for a before/after
comparison in the same hour).  Benchmarks are not tests: this one asserts nothing, it prints the
figures and the verdicts.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness  # noqa: I001  (puts the repository on sys.path)

import grpc

from streamingnode.server.auth import hash_token
from streamingnode.v1 import streaming_pb2 as spb

TOKEN = "bench-refused-memory-token"
DESCRIBE = "/streamingnode.v1.StreamingNode/DescribeChannels"
PRODUCE = "/streamingnode.v1.StreamingNode/Produce"
ROUND_GROWTH_TARGET_MB = 100.0
PLATEAU_TARGET = 1.2


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """``VmRSS`` (now) or ``VmHWM`` (the most so far) of ``pid``, in MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for {pid}")


def settled_rss_mb(pid: int, most: float = 15.0, still: float = 3.0) -> float:
    """RSS once it stops moving: within 1 MB for ``still`` seconds (readings every 0.25 s; longer than
    the node waits after a burst before it trims, ``_allocator.Trimmer``), at most ``most`` seconds.
    What the node keeps, not a trim or a collection caught before it ran."""
    window = int(still / 0.25) + 1
    readings = [rss_mb(pid)]
    deadline = time.monotonic() + most
    while time.monotonic() < deadline:
        time.sleep(0.25)
        readings.append(rss_mb(pid))
        if len(readings) >= window and max(readings[-window:]) - min(readings[-window:]) <= 1.0:
            break
    return readings[-1]


class Node:
    """``serve`` of ``repo`` on a free port, logs to a file; stopped with SIGTERM."""

    def __init__(self, repo: Path, root: str, flags: list[str]) -> None:
        self.log_path = os.path.join(root, "node.log")
        self._log = open(self.log_path, "wb")  # noqa: SIM115  (closed in stop)
        env = dict(os.environ, GRPC_VERBOSITY="ERROR", PYTHONPATH=str(repo))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamingnode", "serve", "--data-dir", os.path.join(root, "data"),
             "--listen", "127.0.0.1:0", "--metrics-listen", "", "--no-flusher", "--log-level", "error", *flags],
            stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=str(repo))
        self.address = self._wait_ready()

    def _wait_ready(self) -> str:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with open(self.log_path, errors="replace") as f:
                for line in f:
                    if line.startswith("streamingnode serving on "):
                        return line.split()[3]
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the node did not start:\n{Path(self.log_path).read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        _harness.reap(self.proc, 30)
        self._log.close()


async def one_round(address: str, request: bytes, token: str | None, concurrency: int,
                    stream: bool = False) -> dict[str, int]:
    """``concurrency`` DescribeChannels (``stream``: Produce streams sending ``request`` as their open)
    at once; how many ended with each status code."""
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    async with grpc.aio.insecure_channel(address, options=[("grpc.max_send_message_length", -1)]) as channel:
        method = channel.unary_unary(DESCRIBE)
        produce = channel.stream_stream(PRODUCE)

        async def call() -> str:
            try:
                if stream:
                    async for _ in produce(iter([request]), metadata=metadata, timeout=120):
                        pass
                else:
                    await method(request, metadata=metadata, timeout=120)
            except grpc.aio.AioRpcError as exc:
                return str(exc.code().name)
            return "OK"

        codes = await asyncio.gather(*(call() for _ in range(concurrency)))
    return {code: codes.count(code) for code in sorted(set(codes))}


def run_case(args: argparse.Namespace, name: str, flags: list[str], tokens: list[str | None]) -> list[float]:
    """Rounds against one node; prints a line a round; RSS before the first round, then after each."""
    long_name = "a" * (args.mib << 20)
    request = (spb.ProduceRequest(open=spb.ProduceOpen(pchannel=long_name)) if args.stream
               else spb.DescribeChannelsRequest(channel_names=[long_name])).SerializeToString()
    del long_name
    with tempfile.TemporaryDirectory(prefix="refused-memory-", dir=args.dir) as root:
        if any(t is not None for t in tokens):
            tokens_path = Path(root, "tokens.toml")
            tokens_path.write_text(f'[[token]]\nprincipal = "bench"\nsha256 = "{hash_token(TOKEN)}"\n'
                                   'permissions = ["admin", "consume:*"]\n')
            tokens_path.chmod(0o600)
            flags = ["--auth-tokens", str(tokens_path), *flags]
        node = Node(args.repo, root, flags + args.node_flag)
        try:
            time.sleep(1.0)
            seen = [rss_mb(node.proc.pid)]
            print(f"{name}: start, RSS {seen[0]:.0f} MB", flush=True)
            for index, token in enumerate(tokens):
                codes = asyncio.run(one_round(node.address, request, token, args.concurrency, args.stream))
                seen.append(settled_rss_mb(node.proc.pid))
                who = "valid token" if token else "no token"
                print(f"{name}: round {index % args.rounds + 1} ({who}): RSS {seen[-1]:.0f} MB "
                      f"({seen[-1] - seen[-2]:+.0f}), peak so far {rss_mb(node.proc.pid, 'VmHWM'):.0f} MB, {codes}",
                      flush=True)
        finally:
            node.stop()
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=12)
    parser.add_argument("--mib", type=int, default=60, help="size of each request, MiB")
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the checkout whose node runs (default: this one)")
    parser.add_argument("--node-flag", action="append", default=[], help="a serve flag for both nodes")
    parser.add_argument("--dir", default=None, help="where the temporary data directories go")
    parser.add_argument("--stream", action="store_true",
                        help="Produce streams whose open request is that large, instead of DescribeChannels")
    args = parser.parse_args()
    n = args.rounds
    auth = run_case(args, "auth", [], [None] * n + [TOKEN] * n)
    open_node = run_case(args, "open", [], [None] * n)

    unauthenticated = auth[: n + 1]
    growth = max(b - a for a, b in itertools.pairwise(unauthenticated))
    open_growth = max(b - a for a, b in itertools.pairwise(open_node))
    token = auth[n + 1:]
    print()
    print(f"no token: largest rise in a round {growth:+.0f} MB (target <= {ROUND_GROWTH_TARGET_MB:.0f}: "
          f"{'met' if growth <= ROUND_GROWTH_TARGET_MB else 'MISSED'})")
    print(f"valid token: RSS round {n} / round 1 = {token[-1]:.0f} / {token[0]:.0f} MB = {token[-1] / token[0]:.2f} "
          f"(target <= {PLATEAU_TARGET}: {'met' if token[-1] <= PLATEAU_TARGET * token[0] else 'MISSED'})")
    print(f"no auth: RSS round {n} / round 1 = {open_node[-1]:.0f} / {open_node[1]:.0f} MB = "
          f"{open_node[-1] / open_node[1]:.2f}; largest rise in a round {open_growth:+.0f} MB")


if __name__ == "__main__":
    main()
