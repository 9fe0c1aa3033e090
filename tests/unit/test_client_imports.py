"""The client SDK stands apart from the node: importing ``streamingnode.client`` loads nothing of the
server, the node, the interceptor chain, the flusher or a WAL backend.

Checked in a fresh interpreter, because this test process has imported the rest of the tree already.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SERVER_SIDE = (
    "streamingnode.server",
    "streamingnode.node",
    "streamingnode.cluster",
    "streamingnode.cli",
    "streamingnode.offline",
    "streamingnode.observability.tracing",
    "streamingnode.observability.metrics",
    "interceptors",
    "flusher",
    "wal.backends",
    "wal.backend",
    "wal.adaptor",
    "opentelemetry.sdk",
    "prometheus_client",
)
"""Module trees the client must not load (a name and everything below it)."""


def _modules_loaded_by(statement: str) -> list[str]:
    probe = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    loaded: list[str] = json.loads(done.stdout)
    return loaded


@pytest.mark.parametrize("statement", [
    "import streamingnode.client",
    "from streamingnode.client import AsyncClient, Client, message_links",
    "import streamingnode.observability.trace_context",
])
def test_the_client_loads_nothing_of_the_server_or_the_chain(statement: str) -> None:
    loaded = _modules_loaded_by(statement)
    leaked = [m for m in loaded if any(m == top or m.startswith(top + ".") for top in SERVER_SIDE)]
    assert leaked == [], f"{statement!r} loads server-side modules: {leaked}"


def test_the_probe_sees_what_the_server_loads() -> None:
    # The check above proves something only if the probe would see a leak: the server does load these.
    loaded = _modules_loaded_by("import streamingnode.server")
    assert "interceptors.chain" in loaded
    assert "streamingnode.observability.tracing" in loaded
