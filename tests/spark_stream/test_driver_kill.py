"""A driver SIGKILLed mid-query (its process group: the Python driver and its JVM), restarted from the
checkpoint: the union of what its micro-batches wrote holds every message exactly once, in order per
vchannel, and a batch run again after the kill held the same rows as its first run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from streamingnode.client import Client
from streamingnode.server import ServerThread
from tests.node_process import REPO
from tests.spark_stream.test_source import _produce
from tests.waiting import until_sync

pytestmark = pytest.mark.integration


class Driver:
    """``stream_driver`` in its own session (process group), so a kill reaches its JVM too."""

    def __init__(self, addr: str, checkpoint: Path, out: Path, log: Path) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO), PYSPARK_PYTHON=sys.executable)
        self._log = log.open("a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.spark_stream.stream_driver", addr, str(checkpoint), str(out)],
            stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=out.parent, start_new_session=True)

    def check_alive(self, log: Path) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"the driver exited with {self.proc.returncode}: {log.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._reap_group()
        self._log.close()

    def _reap_group(self) -> None:
        # The JVM may outlive the Python driver by a moment: kill what is left of the group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


def _batches(out: Path) -> dict[str, list[list[object]]]:
    return {p.name: json.loads(p.read_text()) for p in out.glob("batch-*.json")}


def _union(out: Path) -> list[list[object]]:
    firsts = {int(n.split("-")[1].removesuffix(".json")): rows for n, rows in _batches(out).items() if "rerun" not in n}
    return [r for b in sorted(firsts) for r in firsts[b]]


def test_a_sigkilled_driver_restarts_from_its_checkpoint_exactly_once(node: ServerThread, tmp_path: Path) -> None:
    with Client(node.address) as client:
        client.create_channels(["p1"])
    _produce(node.address, 0, 160)
    out, checkpoint, log = tmp_path / "out", tmp_path / "checkpoint", tmp_path / "driver.log"
    out.mkdir()
    driver = Driver(node.address, checkpoint, out, log)
    try:
        def two_batches() -> bool:
            driver.check_alive(log)
            return len(_batches(out)) >= 2

        until_sync(two_batches, "two micro-batch files", timeout=120)
    finally:
        driver.kill()
    assert driver.proc.returncode == -signal.SIGKILL
    assert len(_union(out)) < 160, "killed mid-way: more was still to come"
    _produce(node.address, 160, 40)  # written while the driver is down
    driver = Driver(node.address, checkpoint, out, log)
    try:
        def everything() -> bool:
            driver.check_alive(log)
            return len(_union(out)) >= 200

        until_sync(everything, "all 200 messages in the batch files", timeout=120)
        (out / "STOP").touch()
        driver.proc.wait(timeout=60)
        assert driver.proc.returncode == 0, log.read_text()[-3000:]
    finally:
        driver.kill()
    rows = _union(out)
    assert sorted(str(p) for _, p, _ in rows) == sorted(f"m{i}" for i in range(200))
    for v in ("v0", "v1"):
        got = [int(str(p)[1:]) for vc, p, _ in rows if vc == v]
        assert got == sorted(got), f"order of {v}"
    batches = _batches(out)
    for name, again in batches.items():
        if "rerun" in name:
            first = name.split(".rerun")[0] + ".json"
            assert again == batches[first], f"{name} differs from its first run"
