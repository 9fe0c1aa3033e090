"""Cluster membership: this node's id and advertised address, a heartbeat in KV ``<prefix>_nodes``; the
live nodes are those whose heartbeat is younger than the lease TTL.

Clock skew.  A heartbeat carries the node's wall clock (``at_ms``) and JetStream stamps the stored
message with the server's; reading its own heartbeat back (every pass) the node learns how far its
wall clock is from the NATS server's (``clock_skew``: positive when the node's is ahead; low by the
publish's one-way latency, milliseconds).  Leases compare wall clocks across nodes, so beyond
``SKEW_SHARE`` of the TTL the node logs a warning (at most once a minute) and the skew gauge shows it
(docs/cluster.md, "Clock skew", says what happens then).
"""

from __future__ import annotations

import json
import time

import structlog
from nats.js.kv import KeyValue

from streamingnode.cluster.kv import now_ms, read_all
from wal.kv_key import encode_key

log = structlog.get_logger(__name__)

SKEW_SHARE = 0.025
"""The skew (node against the NATS server, either way) tolerated, as a share of the TTL: two nodes within
it of the server are within twice it, ``CLOCK_RATE_MARGIN`` of the TTL, of each other, which is what a
holder cut off from NATS gives up when it stops serving on its own clock."""
SKEW_WARN_EVERY = 60.0
"""Seconds between two warnings of a skew beyond the bound (the gauge shows it all the time)."""


class Membership:
    """This node's heartbeat in ``<prefix>_nodes`` and the set of live nodes."""

    def __init__(self, kv: KeyValue, node_id: str, address: str, ttl: float) -> None:
        self.kv = kv
        self.node_id = node_id
        self.address = address
        self.ttl = ttl
        self.clock_skew: float | None = None
        """Seconds this node's wall clock is ahead of the NATS server's (negative: behind), from its
        last heartbeat read back; None before the first."""
        self._warned_at: float | None = None

    @property
    def skew_bound(self) -> float:
        return self.ttl * SKEW_SHARE

    def _observe_skew(self, at_ms: int, stored: object) -> None:
        if not hasattr(stored, "timestamp"):
            return  # no server time on this entry (a read that is not a watch)
        skew = at_ms / 1000 - stored.timestamp()
        self.clock_skew = skew
        if abs(skew) <= self.skew_bound:
            return
        now = time.monotonic()
        if self._warned_at is None or now - self._warned_at >= SKEW_WARN_EVERY:
            self._warned_at = now
            log.warning("clock skew beyond the bound leases assume: this node's wall clock is off the NATS "
                        "server's; fix its time sync (NTP)", node=self.node_id, skew_seconds=round(skew, 3),
                        bound_seconds=round(self.skew_bound, 3))

    async def heartbeat(self) -> None:
        value = json.dumps({"node": self.node_id, "address": self.address, "at_ms": now_ms()}).encode()
        await self.kv.put(encode_key(self.node_id), value)

    async def live(self) -> dict[str, str]:
        """Live node id -> advertised address: heartbeats younger than the TTL (one sweep of the bucket)."""
        oldest = now_ms() - int(self.ttl * 1000)
        out: dict[str, str] = {}
        for key, entry in (await read_all(self.kv, max(1.0, self.ttl / 3))).items():
            try:
                doc = json.loads(entry.value or b"{}")
                if int(doc["at_ms"]) > oldest:
                    out[str(doc["node"])] = str(doc["address"])
                if doc["node"] == self.node_id:
                    self._observe_skew(int(doc["at_ms"]), entry.created)
            except (ValueError, TypeError, KeyError):
                log.warning("unreadable heartbeat ignored", key=key)
        return out

    async def leave(self) -> None:
        """Remove this node's heartbeat: the others stop counting it at once (a graceful stop)."""
        await self.kv.delete(encode_key(self.node_id))


__all__ = ["SKEW_SHARE", "SKEW_WARN_EVERY", "Membership"]
