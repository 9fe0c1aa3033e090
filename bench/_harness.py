"""What every benchmark here shares: process settings, temporary databases, repeated runs, verdicts,
and the bare gRPC servers that stand for the raw limit."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Run as a script from anywhere: make the repository root importable.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import structlog  # noqa: E402

from streamingnode.node.gc_tuning import tune_gc  # noqa: E402

Run = dict[str, float]


def prepare_process() -> None:
    """The node's process settings (GC thresholds), and quiet logs so the table stays readable."""
    tune_gc()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def serve_bare(handler: Any, options: list[tuple[str, Any]] | None = None) -> None:
    """A bare grpc.aio server with ``handler`` on a free loopback port: prints "ready <address>", serves
    until stdin closes.  What a benchmark's raw limit is measured against (no log, no node: the
    transport alone); ``BareServer`` starts it in its own process."""
    import grpc  # noqa: PLC0415  (only the benchmarks with a raw limit need it here)

    server = grpc.aio.server(options=options)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")  # the port it bound: no other process can take it
    await server.start()
    print(f"ready 127.0.0.1:{port}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(0)


def reap(proc: subprocess.Popen[Any], timeout: float) -> None:
    """Wait up to ``timeout`` for a benchmark's child that was told to stop (SIGKILL after that), then
    close its stdout pipe."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


class BareServer:
    """``script --raw-server *args`` (a benchmark whose raw server calls ``serve_bare``) in its own
    process, once it is ready; stopped by closing its stdin."""

    def __init__(self, script: str, *args: str) -> None:
        env = dict(os.environ, GRPC_VERBOSITY="ERROR", PYTHONPATH=_ROOT)
        self.proc = subprocess.Popen([sys.executable, script, "--raw-server", *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=_ROOT)
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline().split()
        if ready[:1] != ["ready"] or len(ready) != 2:
            self.stop()
            raise RuntimeError(f"the bare server of {script} did not start: {ready!r}")
        self.address = ready[1]

    @property
    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        reap(self.proc, 60)

    def __enter__(self) -> BareServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def tmpdir(root: str, name: str) -> str:
    return tempfile.mkdtemp(prefix=f"{name}-", dir=root)


def verdict(ratio: float, target: float | None) -> str:
    if target is None:
        return f"ratio {ratio:.2f} (no target)"
    return f"ratio {ratio:.2f} (target >= {target:.2f}{'' if ratio >= target else ', MISSED'})"


def repeat(
    args: argparse.Namespace,
    prefix: str,
    one_run: Callable[[argparse.Namespace, str, int], Run],
    describe: Callable[[Run], str],
) -> list[Run]:
    """``args.runs`` runs in a temporary root under ``args.dir``, a progress line each on stderr."""
    root = tempfile.mkdtemp(prefix=f"{prefix}-", dir=args.dir)
    runs: list[Run] = []
    try:
        for i in range(args.runs):
            t0 = time.perf_counter()
            r = one_run(args, root, i)
            runs.append(r)
            print(f"run {i + 1}/{args.runs} ({time.perf_counter() - t0:.1f} s): {describe(r)}",
                  file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return runs
