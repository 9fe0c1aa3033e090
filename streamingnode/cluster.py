"""Cluster mode: which node owns which pchannel, by leases in NATS JetStream KV.

Three parts, each usable alone:

- ``Membership``: this node's id and advertised address, a heartbeat in KV ``<prefix>_nodes``; the
  live nodes are those whose heartbeat is younger than the lease TTL.
- ``Leases``: a pchannel's lease in KV ``<prefix>_leases`` (key: the encoded pchannel name), a JSON
  record ``{"node", "address", "term", "expires_ms", "serving"}`` written only by compare-and-set on
  the KV revision: created when absent, updated when free, expired or ours.  Taking bumps the term; a
  release keeps the term and empties the owner, so terms never go back.  ``serving`` turns true with
  the first renewal after the holder opened the pchannel (a lease is taken before the open), which
  is what CreateChannels waits for.
- ``Ownership``: one loop per node, every TTL/3.  For each pchannel, the preferred owner is given by
  rendezvous hashing over the live node ids (``preferred``).  A preferred node takes a free or expired
  lease and opens the channel (``on_take``); a holder that is no longer preferred (a node joined)
  closes the channel (``on_lose``) and releases the lease, so the preferred node takes it at its next
  step; a holder whose renewal finds another owner, or whose lease ran out before a renewal
  succeeded, stops serving at once.

Clocks.  ``expires_ms`` is the holder's wall clock plus the TTL, and a contender compares it with its
own wall clock.  This assumes the nodes' clocks agree to well within a third of the TTL (NTP keeps
them within milliseconds; the default TTL is 10 s).  The holder itself never relies on wall time:
it stops serving once TTL has passed on its monotonic clock since it *sent* its last successful
renewal, which is never later than the moment a contender may see the lease as expired unless the
clocks are skewed by more than that margin.  Should the assumption break, two nodes may both believe
they own a pchannel for a moment; with a shared WAL the fenced appends (the WAL term) decide which
one's writes count, so a skew costs availability, never data.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import nats
import structlog
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, KeyWrongLastSequenceError, NoKeysError
from nats.js.kv import KeyValue

from wal.errors import UnavailableError

log = structlog.get_logger(__name__)

CONNECT_SECONDS = 15.0
"""How long a starting node tries to reach NATS before it gives up (a wrong address, NATS down)."""
REASONS = ("taken", "released", "expired", "lost")
"""Why this node's ownership of a pchannel changed (the ``reason`` label of the changes counter)."""


def encode_key(name: str) -> str:
    """A KV key for any name: KV keys allow only ``[-/_=.a-zA-Z0-9]``, so names are base32 (lower
    case, no padding), which is reversible and keeps distinct names distinct."""
    return base64.b32encode(name.encode()).decode().rstrip("=").lower()


def decode_key(key: str) -> str:
    padded = key.upper() + "=" * (-len(key) % 8)
    return base64.b32decode(padded).decode()


def _score(node: str, pchannel: str) -> int:
    digest = hashlib.blake2b(f"{node}\x00{pchannel}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def preferred(pchannel: str, nodes: Iterable[str]) -> str | None:
    """The rendezvous (highest random weight) owner of ``pchannel`` among ``nodes``; None when there
    are none.  When a node joins it becomes preferred for about 1/N of the pchannels and the others
    keep theirs; when one leaves only its pchannels move."""
    best: tuple[int, str] | None = None
    for node in nodes:
        key = (_score(node, pchannel), node)
        if best is None or key > best:
            best = key
    return None if best is None else best[1]


def placement(pchannels: Iterable[str], nodes: Iterable[str]) -> dict[str, str | None]:
    """``preferred`` for every pchannel."""
    ids = sorted(set(nodes))
    return {p: preferred(p, ids) for p in pchannels}


def now_ms() -> int:
    return int(time.time() * 1000)


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


async def bucket(js: Any, name: str, *, ttl: float | None = None, replicas: int = 1) -> KeyValue:
    """Open KV bucket ``name``, creating it when missing (two nodes creating it at once with the same
    settings both succeed: JetStream treats an identical stream creation as a no-op)."""
    try:
        kv: KeyValue = await js.key_value(name)
    except BucketNotFoundError:
        kv = await js.create_key_value(bucket=name, history=1, ttl=ttl, replicas=replicas)
    return kv


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
        """Live node id -> advertised address: heartbeats younger than the TTL."""
        try:
            keys = await self.kv.keys()
        except NoKeysError:
            return {}
        oldest = now_ms() - int(self.ttl * 1000)
        out: dict[str, str] = {}
        for key in keys:
            try:
                entry = await self.kv.get(key)
                doc = json.loads(entry.value or b"{}")
                if int(doc["at_ms"]) > oldest:
                    out[str(doc["node"])] = str(doc["address"])
            except KeyNotFoundError:
                continue  # left between listing and reading
            except (ValueError, TypeError, KeyError):
                log.warning("unreadable heartbeat ignored", key=key)
        return out

    async def leave(self) -> None:
        """Remove this node's heartbeat: the others stop counting it at once (a graceful stop)."""
        await self.kv.delete(encode_key(self.node_id))


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

    async def renew(self, current: Lease, term: int | None = None) -> Lease | None:
        """Push this node's lease's expiry out by the TTL (and raise its term to ``term``, when given
        and higher); None when the lease changed since it was read (another node took it).  Only a
        holder that opened the pchannel renews, so the renewed lease says ``serving``."""
        if current.node != self.node_id:
            return None
        new = replace(current, expires_ms=self._expiry(), term=max(current.term, term or 0), revision=0,
                      serving=True)
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


OnTake = Callable[[str, int], Awaitable[int]]
"""Open pchannel ``name`` taken with lease term ``term``; return the term it serves with (the WAL's)."""
OnLose = Callable[[str, str], Awaitable[None]]
"""Stop serving pchannel ``name`` (drain and close it); the second argument is the reason."""


@dataclass(slots=True)
class Held:
    lease: Lease
    valid_until: float
    """Monotonic time after which this node must not serve it without a renewal."""
    serving_term: int = 0


@dataclass(slots=True)
class OwnershipView:
    """What routing reads without a KV round trip: the last lease read of each pchannel."""

    leases: dict[str, Lease] = field(default_factory=dict)
    live: dict[str, str] = field(default_factory=dict)


class Ownership:
    """The per-node loop that takes, renews, hands off and releases pchannel leases."""

    def __init__(self, membership: Membership, leases: Leases, names: Callable[[], Awaitable[list[str]]],
                 on_take: OnTake, on_lose: OnLose, *,
                 on_change: Callable[[str, str], None] | None = None) -> None:
        self.membership = membership
        self.leases = leases
        self.node_id = membership.node_id
        self.ttl = leases.ttl
        self._names = names
        self._on_take = on_take
        self._on_lose = on_lose
        self._on_change = on_change
        self.held: dict[str, Held] = {}
        self.view = OwnershipView()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.steps = 0
        """Completed passes over every pchannel (tests wait on it)."""

    @property
    def interval(self) -> float:
        return self.ttl / 3

    def _changed(self, name: str, reason: str) -> None:
        log.info("pchannel ownership changed", pchannel=name, reason=reason, node=self.node_id)
        if self._on_change is not None:
            self._on_change(name, reason)

    # --- one pass --------------------------------------------------------------------------------
    async def step(self) -> None:
        """Heartbeat, read the live nodes, then take, renew or give up each pchannel."""
        await self.expire_overdue()
        await self.membership.heartbeat()
        live = await self.membership.live()
        live[self.node_id] = self.membership.address  # this node is alive, whatever a slow read says
        self.view.live = live
        listed = set(await self._names())
        for name in [n for n in self.held if n not in listed]:
            # Destroyed by another node (shared log): stop serving it; its lease record went with it.
            await self._drop(name, "released")
        for name in [n for n in self.view.leases if n not in listed]:
            del self.view.leases[name]
        names = sorted(listed)
        for name in names:
            if self._stopping:
                return
            try:
                await self._step(name, preferred(name, live))
            except (asyncio.CancelledError, KeyboardInterrupt):
                raise
            except Exception as exc:  # noqa: BLE001  (one pchannel's trouble must not stop the others')
                log.warning("ownership step failed", pchannel=name, error=repr(exc))
        self.steps += 1

    async def _step(self, name: str, best: str | None) -> None:
        lease = await self.leases.read(name)
        self.view.leases[name] = lease
        mine = self.held.get(name)
        if mine is not None:
            if lease.node != self.node_id or lease.term != mine.lease.term:
                await self._drop(name, "lost")
                return
            mine.lease = lease  # our own write whose answer we may have missed: same owner and term
            if best is not None and best != self.node_id:
                # A node joined that hashing prefers: drain, then release so it can take at once.
                await self._drop(name, "released")
                released = await self.leases.release(lease)
                if released is not None:
                    self.view.leases[name] = released
                return
            sent = time.monotonic()
            renewed = await self.leases.renew(lease, mine.serving_term)
            if renewed is None:
                await self._drop(name, "lost")
                return
            mine.lease, mine.valid_until = renewed, sent + self.ttl
            self.view.leases[name] = renewed
            return
        if best != self.node_id or (lease.held() and lease.node != self.node_id):
            return
        sent = time.monotonic()
        taken = await self.leases.take(lease)
        if taken is None:
            return
        self.view.leases[name] = taken
        held = self.held[name] = Held(taken, sent + self.ttl, taken.term)
        try:
            held.serving_term = await self._on_take(name, taken.term)
        except Exception as exc:  # noqa: BLE001  (it could not open: give the lease back, try again later)
            log.warning("pchannel taken but not opened; lease released", pchannel=name, error=repr(exc))
            self.held.pop(name, None)
            released = await self.leases.release(taken)
            if released is not None:
                self.view.leases[name] = released
            return
        self._changed(name, "taken")
        # Open now: the lease says so (serving), and reports the WAL's term, the fencing term, from now
        # on.  Should this write lose a race, the next pass's renewal says it.
        renewed = await self.leases.renew(taken, held.serving_term)
        if renewed is not None:
            held.lease = renewed
            self.view.leases[name] = renewed

    async def _drop(self, name: str, reason: str) -> None:
        self.held.pop(name, None)
        try:
            await self._on_lose(name, reason)
        finally:
            self._changed(name, reason)

    async def forget(self, name: str) -> None:
        """``name`` is being destroyed: stop serving it if held here, and remove its lease record."""
        if name in self.held:
            await self._drop(name, "released")
        await self.leases.remove(name)
        self.view.leases.pop(name, None)

    async def refresh(self, names: Iterable[str]) -> None:
        """Read the leases of ``names`` again into the view (what DescribeChannels reports)."""
        for name in names:
            self.view.leases[name] = await self.leases.read(name)

    async def expire_overdue(self) -> None:
        """Stop serving every lease whose TTL ran out on this node's clock without a renewal."""
        now = time.monotonic()
        for name, held in list(self.held.items()):
            if now >= held.valid_until:
                await self._drop(name, "expired")

    # --- the loop --------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="ownership")

    async def _run(self) -> None:
        while not self._stopping:
            started = time.monotonic()
            try:
                await self.step()
            except (asyncio.CancelledError, KeyboardInterrupt):
                raise
            except Exception as exc:  # noqa: BLE001  (NATS unreachable: keep trying; leases expire locally)
                log.warning("ownership pass failed", error=repr(exc))
            # Wake early enough to stop serving a lease the moment it runs out, should renewals fail.
            wait = self.interval - (time.monotonic() - started)
            deadlines = [h.valid_until - time.monotonic() for h in self.held.values()]
            wait = min([wait, *deadlines])
            await asyncio.sleep(max(wait, 0.0))

    async def stop(self) -> None:
        """Graceful: leave the membership first (so the others prefer someone else at once), then close
        and release every held pchannel."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            await self.membership.leave()
        except Exception as exc:  # noqa: BLE001  (NATS gone: the heartbeat ages out instead)
            log.warning("could not leave the membership", error=repr(exc))
        for name, held in list(self.held.items()):
            await self._drop(name, "released")
            try:
                await self.leases.release(held.lease)
            except Exception as exc:  # noqa: BLE001  (the lease then expires by itself)
                log.warning("could not release the lease", pchannel=name, error=repr(exc))


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
                nc = await nats.connect(servers=servers, connect_timeout=2, max_reconnect_attempts=-1,
                                        reconnect_time_wait=0.2, error_cb=quiet)
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
        await self.nc.close()


__all__ = ["REASONS", "ClusterClient", "Lease", "Leases", "Membership", "Ownership", "OwnershipView", "bucket",
           "decode_key", "encode_key", "placement", "preferred"]
