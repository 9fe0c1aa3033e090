"""A real node per test: RocksDB in a temporary directory, gRPC on a free port of 127.0.0.1.

The node runs on its own event loop thread (``ServerThread``), so async tests (grpc.aio stubs, the
AsyncClient) and sync tests (the sync Client, the CLI in a subprocess) can all talk to it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from streamingnode.config import NodeConfig
from streamingnode.server import ServerThread
from streamingnode.v1 import streaming_pb2_grpc

pytestmark = pytest.mark.integration


def node_config(data_dir: Path, **overrides: object) -> NodeConfig:
    """Test defaults: a free port, quick ticks (delivery waits for a tick), short drain."""
    base: dict[str, object] = {
        "data_dir": data_dir, "listen": "127.0.0.1:0", "metrics_listen": "127.0.0.1:0", "tick_interval": 0.05,
        "drain_seconds": 2.0,
    }
    base.update(overrides)
    return NodeConfig(**base)  # type: ignore[arg-type]


@pytest.fixture
def server_thread(tmp_path: Path) -> Iterator[ServerThread]:
    srv = ServerThread(node_config(tmp_path / "data"))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def server(server_thread: ServerThread) -> str:
    """The address ("127.0.0.1:PORT") of a fresh node."""
    return server_thread.address


@pytest.fixture
async def stub(server: str) -> AsyncIterator[streaming_pb2_grpc.StreamingNodeStub]:
    """A raw grpc.aio stub: what any generated client in any language would use."""
    async with grpc.aio.insecure_channel(server) as channel:
        yield streaming_pb2_grpc.StreamingNodeStub(channel)
