"""Which node a command talks to, and the first call that proves it is there.

Standard library only at module level (see ``streamingnode.cli``).
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamingnode.client import AsyncClient

ADDR_ENV = "STREAMINGNODE_ADDR"
# Equal to streamingnode.config.DEFAULT_ADDR (a test keeps them in step); not imported from there
# because that module pulls in the storage backend, which --help must not load.
DEFAULT_ADDR = "localhost:19530"


def resolve_addr(args: argparse.Namespace) -> str:
    """The node address: ``--addr``, else ``$STREAMINGNODE_ADDR``, else ``DEFAULT_ADDR``."""
    return str(getattr(args, "addr", None) or os.environ.get(ADDR_ENV) or DEFAULT_ADDR)


async def connect(addr: str, pchannel: str | None = None) -> AsyncClient:
    """A client, after one cheap call that fails fast when the node is unreachable or the pchannel is
    missing: streams would otherwise keep reconnecting for their reconnect timeout first."""
    from streamingnode.client import AsyncClient  # noqa: PLC0415

    client = AsyncClient(addr)
    try:
        await client.describe_channels([pchannel] if pchannel else [])
    except BaseException:
        await client.aclose()
        raise
    return client


__all__ = ["ADDR_ENV", "DEFAULT_ADDR", "connect", "resolve_addr"]
