"""CreateChannels creates every pchannel it names or none: when one fails, those created before it
in the same call are removed again."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from streamingnode.client import AsyncClient
from streamingnode.server import ServerThread
from wal.errors import StreamingError, UnavailableError

pytestmark = pytest.mark.integration


async def test_a_failed_create_removes_the_channels_it_created_before(
        server_thread: ServerThread, monkeypatch: pytest.MonkeyPatch) -> None:
    manager = server_thread.node.manager
    real = manager.create_channel

    async def create_channel(name: str, properties: Any = None) -> Any:
        if name == "second":
            raise UnavailableError("injected: the storage refused the second channel")
        return await real(name, properties)

    monkeypatch.setattr(manager, "create_channel", create_channel)
    async with AsyncClient(server_thread.address, timeout=10.0) as client:
        with pytest.raises(StreamingError, match="injected"):
            await client.create_channels(["first", "second"])
        described = await asyncio.wait_for(client.describe_channels(), 10)
    assert [d.name for d in described] == []
    assert server_thread.run(manager.list_channels()) == []
