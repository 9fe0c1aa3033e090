"""Which node a command talks to, with which credentials, and the first call that proves it is there.

Standard library only at module level (see ``streamingnode.cli``).
"""

from __future__ import annotations

import argparse
import contextvars
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamingnode.client import AsyncClient

ADDR_ENV = "STREAMINGNODE_ADDR"
TOKEN_ENV = "STREAMINGNODE_TOKEN"  # noqa: S105  (the variable's name, not a secret)
# Equal to streamingnode.config.DEFAULT_ADDR (a test keeps them in step); not imported from there
# because that module pulls in the storage backend, which --help must not load.
DEFAULT_ADDR = "localhost:19530"


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


async def connect(addr: str, pchannel: str | None = None, *, reconnect_timeout: float = 30.0) -> AsyncClient:
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
