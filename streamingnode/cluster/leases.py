"""Pchannel leases: a pchannel's lease in KV ``<prefix>_leases`` (key: the encoded pchannel name), a JSON
record ``{"node", "address", "term", "expires_ms", "serving"}`` written only by compare-and-set on the
KV revision: created when absent, updated when free, expired or ours. Taking bumps the term; a release
keeps the term and empties the owner, so terms never go back. ``serving`` turns true with the first
renewal after the holder opened the pchannel (a lease is taken before the open), which is what
CreateChannels waits for.

Clocks.  ``expires_ms`` is the holder's wall clock plus the TTL, and a contender compares it with its
own wall clock.  This assumes the nodes' clocks agree to within ``CLOCK_RATE_MARGIN`` (5 %) of the TTL
(NTP keeps them within milliseconds; the default TTL is 10 s).  The holder itself never relies on wall time:
it stops serving once the TTL less ``CLOCK_RATE_MARGIN`` (5 %) has passed on its monotonic clock since
it *sent* its last successful renewal, which is never later than the moment a contender may see the
lease as expired unless the clocks are skewed by more than that margin (``membership`` measures each
node's skew against the NATS server and warns beyond half of it).  Should the assumption break, two
nodes may both believe they own a pchannel for a moment; with a shared WAL the fenced appends (the
WAL term) decide which one's writes count, so a skew costs availability, never data.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, replace

import structlog
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from streamingnode.cluster.kv import now_ms, read_all
from wal.kv_key import decode_key, encode_key

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Lease:
    """A pchannel's lease as read from KV; ``revision`` 0 when the key does not exist yet."""

    pchannel: str
    node: str = ""
    address: str = ""
    term: int = 0
    expires_ms: int = 0
    revision: int = 0
    serving: bool = False
    """The holder has opened the pchannel (False between the take and the end of the open)."""

    def held(self, at_ms: int | None = None) -> bool:
        """Someone holds it and it has not expired (by this node's wall clock)."""
        return bool(self.node) and self.expires_ms > (now_ms() if at_ms is None else at_ms)

    def encode(self) -> bytes:
        return json.dumps({"node": self.node, "address": self.address, "term": self.term,
                           "expires_ms": self.expires_ms, "serving": self.serving}).encode()

    @classmethod
    def decode(cls, pchannel: str, value: bytes | None, revision: int) -> Lease:
        try:
            doc = json.loads(value or b"{}")
            return cls(pchannel, str(doc.get("node", "")), str(doc.get("address", "")), int(doc.get("term", 0)),
                       int(doc.get("expires_ms", 0)), revision, doc.get("serving") is True)
        except (ValueError, TypeError, AttributeError):
            # A record nobody here wrote: treated as free, and overwritten by CAS on its revision.
            log.warning("unreadable lease record, treated as free", pchannel=pchannel, revision=revision)
            return cls(pchannel, revision=revision)


class Leases:
    """Take, renew, release and read pchannel leases in ``<prefix>_leases``, by CAS on the revision."""

    def __init__(self, kv: KeyValue, node_id: str, address: str, ttl: float) -> None:
        self.kv = kv
        self.node_id = node_id
        self.address = address
        self.ttl = ttl

    async def read(self, pchannel: str) -> Lease:
        try:
            entry = await self.kv.get(encode_key(pchannel))
        except KeyNotFoundError:
            return Lease(pchannel)
        return Lease.decode(pchannel, entry.value, entry.revision or 0)

    async def read_all(self) -> dict[str, Lease]:
        """Every lease record, by pchannel name, in one sweep of the bucket (``read_all``); a pchannel
        without a record is absent (``Lease(name)`` stands for it).  Keys that do not decode to a
        name (written by something else) are skipped."""
        out: dict[str, Lease] = {}
        for key, entry in (await read_all(self.kv, max(1.0, self.ttl / 3))).items():
            try:
                name = decode_key(key)
            except (ValueError, UnicodeDecodeError):
                log.warning("lease key that is no pchannel name ignored", key=key[:200])
                continue
            out[name] = Lease.decode(name, entry.value, entry.revision or 0)
        return out

    async def _cas(self, lease: Lease, new: Lease) -> Lease | None:
        """Write ``new`` if the key is still at ``lease.revision``; None when someone wrote first."""
        key = encode_key(lease.pchannel)
        try:
            if lease.revision == 0:
                revision = await self.kv.create(key, new.encode())
            else:
                revision = await self.kv.update(key, new.encode(), last=lease.revision)
        except KeyWrongLastSequenceError:
            return None
        return replace(new, revision=revision)

    def _expiry(self) -> int:
        return now_ms() + int(self.ttl * 1000)

    async def take(self, current: Lease) -> Lease | None:
        """Take ``current`` (as just read) when it is free, expired or this node's: the term goes up
        by one.  None when it is held by another node, or someone wrote it first."""
        if current.held() and current.node != self.node_id:
            return None
        new = Lease(current.pchannel, self.node_id, self.address, current.term + 1, self._expiry())
        return await self._cas(current, new)

    async def renew(self, current: Lease, term: int | None = None, *, serving: bool = True) -> Lease | None:
        """Push this node's lease's expiry out by the TTL (and raise its term to ``term``, when given
        and higher); None when the lease changed since it was read (another node took it).
        ``serving``: the holder has opened the pchannel (False while its open is still running)."""
        if current.node != self.node_id:
            return None
        new = replace(current, expires_ms=self._expiry(), term=max(current.term, term or 0), revision=0,
                      serving=serving)
        return await self._cas(current, new)

    async def release(self, current: Lease) -> Lease | None:
        """Give this node's lease up: no owner, term kept (the next taker bumps it)."""
        if current.node != self.node_id:
            return None
        return await self._cas(current, Lease(current.pchannel, term=current.term))

    async def remove(self, pchannel: str) -> None:
        """Remove the lease record of a destroyed pchannel (a holder's next CAS on it fails)."""
        with contextlib.suppress(KeyNotFoundError):
            await self.kv.purge(encode_key(pchannel))


__all__ = ["Lease", "Leases"]
