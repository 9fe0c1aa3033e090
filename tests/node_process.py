"""Run ``streamingnode serve`` as a real child process (for kill, drain and CLI tests)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
READY = "streamingnode serving on "


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NodeProcess:
    """``serve`` on a fixed port (so a restart keeps the address clients know)."""

    def __init__(self, data_dir: Path, port: int | None = None, *extra: str, env: dict[str, str] | None = None,
                 repo: Path | None = None):
        self.data_dir = data_dir
        self.repo = repo or REPO
        """The checkout whose code runs (a benchmark may compare another one in the same run)."""
        self.port = port or free_port()
        self.extra = extra
        self.env = env
        self.proc: subprocess.Popen[str] | None = None
        self._threads: list[threading.Thread] = []
        self.stderr: list[str] = []
        self.metrics_url: str | None = None
        """``http://host:port/metrics`` of the running node (None when turned off)."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> NodeProcess:
        self.kill()  # a previous run of this node: make sure it is gone and its pipes are closed
        env = dict(os.environ if self.env is None else self.env)
        env["PYTHONPATH"] = str(self.repo)
        env.setdefault("GRPC_VERBOSITY", "ERROR")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamingnode", "serve", "--data-dir", str(self.data_dir),
             "--listen", self.address, "--metrics-listen", "127.0.0.1:0", "--tick-interval", "0.05", *self.extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=self.repo,
        )
        # Keep draining stderr (logs) so the child never blocks on a full pipe.
        assert self.proc.stderr is not None
        self._threads = [threading.Thread(target=self._drain, args=(self.proc.stderr,), daemon=True)]
        self._threads[0].start()
        ready = threading.Event()
        line_box: list[str] = []

        def wait_ready() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                if line.startswith(READY):
                    line_box.append(line)
                    ready.set()
                    return
            ready.set()

        self._threads.append(threading.Thread(target=wait_ready, daemon=True))
        self._threads[-1].start()
        if not ready.wait(timeout) or not line_box:
            self.kill()
            raise AssertionError(f"node did not start; stderr:\n{''.join(self.stderr[-40:])}")
        found = re.search(r"metrics (http://\S+/metrics)", line_box[0])
        self.metrics_url = found.group(1) if found else None
        return self

    def _drain(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.stderr.append(line)

    def _reap(self) -> None:
        # The readers see EOF once the child is gone; close the pipes after them (no ResourceWarning).
        assert self.proc is not None
        for t in self._threads:
            t.join(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self._reap()

    def terminate(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self._reap()
        return code
