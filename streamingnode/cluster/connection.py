"""The NATS connection of a cluster-mode node and the two KV buckets ownership uses (nodes, leases)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import nats
import nats.errors
import nats.js.errors
import structlog
from nats.js.kv import KeyValue

from streamingnode.cluster.kv import bucket
from wal.errors import UnavailableError

log = structlog.get_logger(__name__)

CONNECT_SECONDS = 15.0
"""How long a starting node tries to reach NATS before it gives up (a wrong address, NATS down)."""


_TRANSIENT_API_CODES = frozenset({
    10008,  # JetStream system temporarily unavailable (no meta leader yet)
    10005,  # insufficient resources: the peers an R3 stream or bucket needs have not all joined yet
    10023,  # insufficient resources
    10074,  # no suitable peers for placement
})


def transient(exc: BaseException) -> bool:
    """A NATS error that a cluster forming, electing or restarting answers for a while, and that the
    same request gets past once it settles: no answer in time (nats-py turns the server's "no
    responders" into ``NoStreamResponseError`` for JetStream calls), the connection being re-made, a
    refused TCP connection, JetStream answering 503 or "temporarily unavailable", a placement that
    lacks the peers not yet joined.  Anything else (a bad request, a wrong address for good) is not."""
    if isinstance(exc, (TimeoutError, ConnectionRefusedError, nats.errors.NoRespondersError,
                        nats.errors.ConnectionReconnectingError, nats.errors.StaleConnectionError,
                        nats.errors.NoServersError, nats.errors.OutboundBufferLimitError,
                        nats.js.errors.NoStreamResponseError,
                        nats.js.errors.ServiceUnavailableError)):
        return True
    if isinstance(exc, nats.js.errors.APIError):
        # Some subclasses (the KV ones) never set the fields their base declares.
        return getattr(exc, "code", None) == 503 or getattr(exc, "err_code", None) in _TRANSIENT_API_CODES
    return False


@dataclass(slots=True)
class ClusterClient:
    """A NATS connection and the two buckets ownership uses."""

    nc: Any
    nodes: KeyValue
    leases: KeyValue

    @classmethod
    async def connect(cls, urls: str, prefix: str, ttl: float, replicas: int = 1) -> ClusterClient:
        """``replicas``: of the two buckets; on the shared log as many as the log's streams, or the loss
        of the one server holding an R1 bucket would stop every lease renewal while the log goes on."""
        servers = [u.strip() for u in urls.split(",") if u.strip()]

        async def quiet(exc: Exception) -> None:
            log.debug("NATS connection error", error=repr(exc))

        try:
            # nats-py retries an unreachable first connect for ever when reconnects are unlimited: bound it,
            # so a node pointed at the wrong servers says so instead of hanging before it serves.
            async with asyncio.timeout(CONNECT_SECONDS):
                # pending_size=0: no buffering while the connection is being re-made, so a heartbeat or
                # renewal then fails at once (a renewal sent late is worth nothing; the lease runs out
                # on this node's clock meanwhile), and a close while NATS is unreachable has nothing
                # to flush into a dead socket (nats-py's close fails half way on that).
                nc = await nats.connect(servers=servers, connect_timeout=2, max_reconnect_attempts=-1,
                                        reconnect_time_wait=0.2, error_cb=quiet, pending_size=0)
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            raise UnavailableError(f"cannot reach the NATS servers {urls[:200]!r} (cluster_nats): {exc!r}",
                                   field="cluster_nats") from None
        try:
            # Every KV call must finish well within a lease: a stuck call would hold the loop past it.
            js = nc.jetstream(timeout=max(0.5, ttl / 3))
            # Heartbeats of nodes gone for good disappear by themselves after a while.
            nodes = await bucket(js, f"{prefix}_nodes", ttl=max(60.0, 6 * ttl), replicas=replicas)
            leases = await bucket(js, f"{prefix}_leases", replicas=replicas)
        except BaseException:
            await nc.close()
            raise
        return cls(nc, nodes, leases)

    async def aclose(self) -> None:
        try:
            await self.nc.close()
        except Exception as exc:  # noqa: BLE001  (NATS gone: what it could not flush is lost either way)
            # Closing flushes what the client still holds; with the servers unreachable that fails, and
            # the node's shutdown (its pchannels, its log) must go on all the same.
            log.warning("closing the NATS connection failed", error=repr(exc))


__all__ = ["CONNECT_SECONDS", "ClusterClient", "transient"]
