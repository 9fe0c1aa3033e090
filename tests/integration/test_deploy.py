"""The container's health check script against a real node: healthy while serving, not otherwise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.node_process import REPO, NodeProcess, free_port

pytestmark = pytest.mark.integration

SCRIPT = REPO / "deploy" / "docker" / "grpc_health_check.py"


def check(address: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), address], capture_output=True, text=True, timeout=60,
                          check=False)


def test_health_check_script(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path / "data").start()
    try:
        serving = check(node.address)
        assert serving.returncode == 0, serving.stderr
    finally:
        assert node.terminate() == 0
    # Nobody listens there any more: the same check reports the node unhealthy.
    gone = check(node.address)
    assert gone.returncode == 1 and "unhealthy" in gone.stderr, gone.stderr
    nothing = check(f"127.0.0.1:{free_port()}")
    assert nothing.returncode == 1
