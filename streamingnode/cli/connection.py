"""Which node a command talks to, with which credentials, and the first call that proves it is there.

Standard library only at module level (see ``streamingnode.cli``).
"""

from __future__ import annotations

import argparse
import contextvars
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

# Standard library only, like this module.
from streamingnode.wire.defaults import NODE_ADDR, RECONNECT_TIMEOUT

if TYPE_CHECKING:
    from streamingnode.client import AsyncClient

ADDR_ENV = "STREAMINGNODE_ADDR"
TOKEN_ENV = "STREAMINGNODE_TOKEN"  # noqa: S105  (the variable's name, not a secret)
DEFAULT_ADDR = NODE_ADDR


def resolve_addr(args: argparse.Namespace) -> str:
    """The node addresses, comma-separated: every ``--addr`` (repeatable, each a comma list too), else
    ``$STREAMINGNODE_ADDR``, else ``DEFAULT_ADDR``.  Several are seeds of a cluster (see AsyncClient)."""
    given = getattr(args, "addr", None)
    if isinstance(given, list):
        given = ",".join(given)
    return str(given or os.environ.get(ADDR_ENV) or DEFAULT_ADDR)


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a command presents to the node: a bearer token and TLS files (all optional)."""

    token: str | None = field(default=None, repr=False)  # never printed
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None


# Set by ``entry.run`` for the command it runs: the command handlers take (args, addr), and every one of
# them connects through ``connect`` below, which is where the credentials are needed.
_credentials: contextvars.ContextVar[Credentials | None] = contextvars.ContextVar("credentials", default=None)


def resolve_credentials(args: argparse.Namespace) -> Credentials:
    """``--token`` (else ``$STREAMINGNODE_TOKEN``, which the SDK reads itself) and the TLS files."""
    return Credentials(getattr(args, "token", None), getattr(args, "tls_ca", None), getattr(args, "tls_cert", None),
                       getattr(args, "tls_key", None))


def use_credentials(credentials: Credentials) -> None:
    """Make ``connect`` present ``credentials`` (in this context: the command about to run)."""
    _credentials.set(credentials)


async def connect(
    addr: str, pchannel: str | None = None, *, reconnect_timeout: float = RECONNECT_TIMEOUT,
) -> AsyncClient:
    """A client, after one cheap call that fails fast when the node is unreachable or the pchannel is
    missing: streams would otherwise keep reconnecting for their reconnect timeout first."""
    from streamingnode.client import AsyncClient  # noqa: PLC0415

    c = _credentials.get() or Credentials()
    client = AsyncClient(addr, token=c.token, tls_ca=c.tls_ca, tls_cert=c.tls_cert, tls_key=c.tls_key,
                         reconnect_timeout=reconnect_timeout)
    try:
        await client.describe_channels([pchannel] if pchannel else [])
    except BaseException:
        await client.aclose()
        raise
    return client


__all__ = ["ADDR_ENV", "DEFAULT_ADDR", "TOKEN_ENV", "Credentials", "connect", "resolve_addr", "resolve_credentials",
           "use_credentials"]
