"""A node drained and started again on the same port: the SDK's unary calls made at once succeed.
The client's channel is still backing off from the refused connections of the downtime; a call waits
for it to be ready (within its deadline) instead of failing UNAVAILABLE "Connection refused" while the
node already reports SERVING, and reads are retried when the connection drops under them."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from streamingnode.client import AsyncClient
from streamingnode.server import ServerThread
from tests.integration.conftest import node_config
from wal.errors import UnavailableError

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_unary_calls_right_after_a_restart_on_the_same_port_succeed(tmp_path: Path) -> None:
    config = node_config(tmp_path / "data", listen=f"127.0.0.1:{_free_port()}", metrics_listen="")
    srv = ServerThread(config).start()
    try:
        async with AsyncClient(srv.address, timeout=20.0) as client:
            await client.create_channels(["p1"])
            srv.stop()
            # A call during the downtime fails (nothing listens) and leaves the channel backing off.
            client.timeout = 1.0
            with pytest.raises(UnavailableError):
                await client.describe_channels(["p1"])
            client.timeout = 20.0
            srv = ServerThread(config).start()
            (described,) = await client.describe_channels(["p1"])  # a read, at once
            assert described.name == "p1"
            assert await client.create_channels(["p2"]) == ["p2"]  # not a read: it was never sent before
    finally:
        srv.stop()
