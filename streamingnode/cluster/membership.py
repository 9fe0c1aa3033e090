"""Cluster membership: this node's id and advertised address, a heartbeat in KV ``<prefix>_nodes``; the
live nodes are those whose heartbeat is younger than the lease TTL.
"""

from __future__ import annotations

import json

import structlog
from nats.js.kv import KeyValue

from streamingnode.cluster.kv import now_ms, read_all
from wal.kv_key import encode_key

log = structlog.get_logger(__name__)


class Membership:
    """This node's heartbeat in ``<prefix>_nodes`` and the set of live nodes."""

    def __init__(self, kv: KeyValue, node_id: str, address: str, ttl: float) -> None:
        self.kv = kv
        self.node_id = node_id
        self.address = address
        self.ttl = ttl

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
            except (ValueError, TypeError, KeyError):
                log.warning("unreadable heartbeat ignored", key=key)
        return out

    async def leave(self) -> None:
        """Remove this node's heartbeat: the others stop counting it at once (a graceful stop)."""
        await self.kv.delete(encode_key(self.node_id))


__all__ = ["Membership"]
