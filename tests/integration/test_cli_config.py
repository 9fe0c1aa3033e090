"""The node's configuration as a process sees it: ``serve`` with its settings from the environment,
log format and level, and a node embedded in another program, which must leave its stdout alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

TIMEOUT = 60


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMINGNODE_")}
    return {**env, **extra}


def _serve_until_ready(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[str, str]:
    """Start ``serve``, wait for its ready line, stop it with SIGTERM: (stdout, stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamingnode", "serve", "--data-dir", str(tmp_path / "d"), "--listen",
         "127.0.0.1:0", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline()  # blocks until the node serves (or exits)
        assert ready.startswith("streamingnode serving on"), ready + proc.communicate(timeout=TIMEOUT)[1]
        proc.terminate()
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    return ready + out, err


def test_log_level_and_metrics_from_the_environment(tmp_path: Path) -> None:
    out, err = _serve_until_ready(tmp_path, _env(STREAMINGNODE_LOG_LEVEL="warning",
                                                 STREAMINGNODE_METRICS_LISTEN=""), "--log-format", "json")
    assert "metrics off" in out, "an empty STREAMINGNODE_METRICS_LISTEN turns metrics off"
    levels = {json.loads(line)["level"] for line in err.splitlines() if line.startswith("{")}
    assert "info" not in levels, err

    _, err = _serve_until_ready(tmp_path, _env(STREAMINGNODE_METRICS_LISTEN=""), "--log-format", "json")
    events = [json.loads(line) for line in err.splitlines()]  # every line is JSON
    assert any(e["event"] == "serving" and e["level"] == "info" for e in events), err


def test_log_format_console_is_not_json(tmp_path: Path) -> None:
    _, err = _serve_until_ready(tmp_path, _env(STREAMINGNODE_LOG_FORMAT="console"), "--metrics-listen", "")
    lines = [line for line in err.splitlines() if "serving" in line]
    assert lines and not lines[0].startswith("{"), err


def test_log_level_from_the_toml_file(tmp_path: Path) -> None:
    toml = tmp_path / "node.toml"
    toml.write_text('log_level = "error"\nlog_format = "json"\nmetrics_listen = ""\n')
    _, err = _serve_until_ready(tmp_path, _env(), "--config", str(toml))
    assert err.strip() == "", err


def test_an_embedded_node_logs_to_stderr_never_stdout(tmp_path: Path) -> None:
    code = (
        "from streamingnode.config import NodeConfig\n"
        "from streamingnode.server import ServerThread\n"
        "from streamingnode.client import Client\n"
        "from pathlib import Path\n"
        f"cfg = NodeConfig(data_dir=Path({str(tmp_path / 'd')!r}), listen='127.0.0.1:0', metrics_listen='')\n"
        "with ServerThread(cfg) as srv, Client(srv.address) as c:\n"
        "    c.create_channels(['p'])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT,
                          env=_env(), check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert '"event": "serving"' in proc.stderr
