"""A client seeded with several nodes does not wait on a seed it cannot reach: it asks that seed once
and goes on to the next (a lone seed is waited for, briefly: it may be restarting)."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from streamingnode.client import AsyncClient

pytestmark = pytest.mark.integration


def dead_address() -> str:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


class _Counting:
    """A stub whose every method call is counted (the attempts made on one node)."""

    def __init__(self, stub: Any, counts: dict[str, int]) -> None:
        self._stub = stub
        self._counts = counts

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._stub, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._counts[name] = self._counts.get(name, 0) + 1
            return method(*args, **kwargs)

        return counted


@pytest.mark.parametrize("call", ["describe one pchannel", "describe all"])
async def test_an_unreachable_seed_is_asked_once_and_the_next_one_answers(server: str, call: str) -> None:
    dead = dead_address()
    async with AsyncClient([dead, server], timeout=10.0) as client:
        await client.create_channels(["p"])
        counts: dict[str, int] = {}
        real = client.router.stub_at

        def stub_at(addr: str) -> Any:
            stub = real(addr)
            return _Counting(stub, counts) if addr == dead else stub

        client.router.stub_at = stub_at  # type: ignore[method-assign]
        client.router._owners.clear()
        client.router._next_seed = 0  # the dead seed first
        described = await (client.describe_channels(["p"]) if call == "describe one pchannel"
                           else client.describe_channels())
        assert [d.name for d in described] == ["p"]
        assert counts == {"DescribeChannels": 1}, "the unreachable seed was waited for instead of skipped"
