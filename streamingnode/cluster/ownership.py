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

Scale.  A pass reads the whole nodes bucket and the whole leases bucket once each (``read_all``: one
ordered consumer over the bucket, its last value per key pushed by the server, a few round trips
whatever the number of keys), never a read per pchannel; its writes (renewals, takes) go out
concurrently.  Opens run as tasks beside the loop: the passes keep renewing a lease whose pchannel
is still opening (its record says ``serving: false`` until the open ends), so a recovery slower than
the lease keeps it; should the lease go anyway (expired, or found taken), the pchannel is closed the
moment its open ends.  A pchannel whose open fails is released and not taken again by this node
before a back-off (the pass interval, doubling per consecutive failure, capped at ``BACKOFF_MAX``;
reset by a successful open); each failure is logged once, with its reason, and ``problems`` names
it (DescribeChannels shows it).

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
import contextlib
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import nats
import structlog
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from wal.errors import UnavailableError
from wal.kv_key import decode_key, encode_key
from wal.tasks import cancel_and_wait

log = structlog.get_logger(__name__)

CONNECT_SECONDS = 15.0
"""How long a starting node tries to reach NATS before it gives up (a wrong address, NATS down)."""
REASONS = ("taken", "released", "expired", "lost")
"""Why this node's ownership of a pchannel changed (the ``reason`` label of the changes counter)."""
BACKOFF_MAX = 60.0
"""Seconds: the longest wait before a node tries again to open a pchannel whose opens keep failing."""
CONCURRENT_WRITES = 64
"""Lease writes (renewals, takes) one pass has in flight at once: pipelined, not one round trip each."""


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


async def read_all(kv: KeyValue, within: float) -> dict[str, KeyValue.Entry]:
    """Every key's current entry (deleted and purged keys left out), in one sweep: an ordered consumer
    over the bucket delivering the last value per key, stopped at the server's "no more pending"
    marker.  A few round trips whatever the number of keys, where ``keys()`` then ``get()`` each is
    one per key.  The consumer is ephemeral and goes away soon after (``inactive_threshold``)."""
    out: dict[str, KeyValue.Entry] = {}
    # Setting the watch up is bounded by the JetStream context's request timeout; not cancelled from
    # here, since a watch cancelled half set up would leave its subscription behind.
    watcher = await kv.watchall(inactive_threshold=max(2.0, within))
    try:
        async with asyncio.timeout(within):
            async for entry in watcher:
                if entry is None:
                    # nats-py's "no more pending" marker.  It can come before any entry of a bucket that
                    # is not empty: it is decided from the consumer's pending count, which is 0 once the
                    # server has sent everything, whether or not the client has taken any of it yet.
                    # Only an empty bucket ends the sweep here; otherwise its entries are on their way.
                    if (await kv.status()).values == 0:
                        break
                    continue
                if entry.operation in (KV_DEL, KV_PURGE):
                    out.pop(entry.key, None)
                else:
                    out[entry.key] = entry
                if entry.delta == 0:  # nothing pending after it: the end of what the bucket held
                    break
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]  # nats-py leaves it unannotated
    return out


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
    opening: asyncio.Task[int | None] | None = None
    """The open (``on_take``) of the pchannel, running beside the loop; None once the loop saw it end."""
    lost: str = ""
    """Why the lease went while the open still ran (the pchannel is closed as soon as it ends)."""

    def is_opening(self) -> bool:
        return self.opening is not None and not self.opening.done()


@dataclass(slots=True)
class Backoff:
    """A pchannel whose opens failed on this node: not taken again here before ``retry_at``."""

    failures: int
    retry_at: float
    """Monotonic."""
    reason: str


@dataclass(slots=True)
class OwnershipView:
    """What routing reads without a KV round trip: the last lease read of each pchannel."""

    leases: dict[str, Lease] = field(default_factory=dict)
    live: dict[str, str] = field(default_factory=dict)


class Ownership:
    """The per-node loop that takes, renews, hands off and releases pchannel leases."""

    def __init__(self, membership: Membership, leases: Leases, names: Callable[[], Awaitable[list[str]]],
                 on_take: OnTake, on_lose: OnLose, *,
                 on_change: Callable[[str, str], None] | None = None,
                 backoff_first: float | None = None, backoff_max: float = BACKOFF_MAX) -> None:
        self.membership = membership
        self.leases = leases
        self.node_id = membership.node_id
        self.ttl = leases.ttl
        self._names = names
        self._on_take = on_take
        self._on_lose = on_lose
        self._on_change = on_change
        self.backoff_first = self.interval if backoff_first is None else backoff_first
        self.backoff_max = backoff_max
        self.held: dict[str, Held] = {}
        self.backoff: dict[str, Backoff] = {}
        """Pchannels whose last open here failed: how often in a row, why, and when to try again."""
        self._orphans: dict[str, Held] = {}
        """Opens still running whose lease went meanwhile: closed when they end, not taken again before."""
        self.view = OwnershipView()
        self._task: asyncio.Task[None] | None = None
        self._pass_lock = asyncio.Lock()
        """One pass at a time: every lease write of this node happens inside a pass."""
        self._wake = asyncio.Event()
        """Set when an open ends: the loop's next pass runs at once (the lease then says serving)."""
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

    def problems(self, name: str) -> list[str]:
        """What keeps this node from serving ``name`` for a while (its failed opens), for the status."""
        backoff = self.backoff.get(name)
        if backoff is None:
            return []
        wait = max(backoff.retry_at - time.monotonic(), 0.0)
        return [f"open failed {backoff.failures} time(s) in a row on node {self.node_id!r}, next try in "
                f"{wait:.1f} s: {backoff.reason}"]

    # --- one pass --------------------------------------------------------------------------------
    async def step(self) -> None:
        """One pass; then, while opens it started still run, a pass every interval (their leases and
        the others' are renewed meanwhile).  On return every open begun here has ended and its lease
        says serving (or the pchannel was given back).  Not to be called while the loop runs."""
        await self._pass()
        while not self._stopping and (begun := [h.opening for h in self.held.values() if h.opening is not None]):
            if running := [t for t in begun if t is not None and not t.done()]:
                await asyncio.wait(running, timeout=self.interval)
            await self._pass()

    async def _pass(self) -> None:
        async with self._pass_lock:
            await self._pass_locked()
        self.steps += 1

    async def _pass_locked(self) -> None:
        """Heartbeat, read the live nodes and every lease (one sweep each), then take, renew or give up
        each pchannel."""
        await self.expire_overdue()
        await self.membership.heartbeat()
        live = await self.membership.live()
        live[self.node_id] = self.membership.address  # this node is alive, whatever a slow read says
        self.view.live = live
        listed = set(await self._names())
        seen = await self.leases.read_all()
        for name in [n for n in self.held if n not in listed]:
            # Destroyed by another node (shared log): stop serving it; its lease record went with it.
            await self._lost(name, "released")
        self.view.leases = {name: seen.get(name, Lease(name)) for name in listed}
        for name, held in list(self.held.items()):
            if held.opening is not None and held.opening.done():
                await self._opened(name, held)
        renew: list[str] = []
        take: list[str] = []
        for name in sorted(listed):
            if self._stopping:
                return
            try:
                what = await self._decide(name, seen.get(name, Lease(name)), preferred(name, live))
            except (asyncio.CancelledError, KeyboardInterrupt):
                raise
            except Exception as exc:  # noqa: BLE001  (one pchannel's trouble must not stop the others')
                log.warning("ownership step failed", pchannel=name, error=repr(exc))
                continue
            (renew if what == "renew" else take if what == "take" else []).append(name)
        gate = asyncio.Semaphore(CONCURRENT_WRITES)

        async def one(name: str, act: Callable[[str], Awaitable[None]]) -> None:
            async with gate:
                try:
                    await act(name)
                except (asyncio.CancelledError, KeyboardInterrupt):
                    raise
                except Exception as exc:  # noqa: BLE001  (NATS slow or gone: the lease expires locally)
                    log.warning("ownership step failed", pchannel=name, error=repr(exc))
        await asyncio.gather(*(one(n, self._renew) for n in renew), *(one(n, self._take) for n in take))

    async def _decide(self, name: str, seen: Lease, best: str | None) -> str:
        """What this pass does with ``name`` given its lease as just read: "renew", "take" or ""
        (nothing, or already done here: a loss, a hand-off)."""
        mine = self.held.get(name)
        if mine is not None:
            if seen.revision > mine.lease.revision or seen.revision == 0:
                if seen.node != self.node_id or seen.term != mine.lease.term:
                    await self._lost(name, "lost")
                    return ""
                mine.lease = seen  # our own write whose answer we missed: same owner and term
            if best is not None and best != self.node_id and not mine.is_opening():
                # A node joined that hashing prefers: drain, then release so it can take at once.
                await self._drop(name, "released")
                released = await self.leases.release(mine.lease)
                if released is not None:
                    self.view.leases[name] = released
                return ""
            return "renew"
        if seen.held() and seen.node != self.node_id and seen.serving:
            self.backoff.pop(name, None)  # another node serves it: this node's failed opens are moot
        if best != self.node_id or (seen.held() and seen.node != self.node_id) or name in self._orphans:
            return ""
        backoff = self.backoff.get(name)
        if backoff is not None and time.monotonic() < backoff.retry_at:
            return ""
        return "take"

    async def _renew(self, name: str) -> None:
        held = self.held.get(name)
        if held is None:
            return
        sent = time.monotonic()
        renewed = await self.leases.renew(held.lease, held.serving_term, serving=not held.is_opening())
        if self.held.get(name) is not held:
            return
        if renewed is None:
            await self._lost(name, "lost")
            return
        held.lease, held.valid_until = renewed, sent + self.ttl
        self.view.leases[name] = renewed

    async def _take(self, name: str) -> None:
        sent = time.monotonic()
        taken = await self.leases.take(self.view.leases.get(name) or Lease(name))
        if taken is None:
            return
        self.view.leases[name] = taken
        held = self.held[name] = Held(taken, sent + self.ttl, taken.term)
        held.opening = asyncio.get_running_loop().create_task(self._open(name, held), name=f"open {name}")

    async def _open(self, name: str, held: Held) -> int | None:
        """The open of a pchannel just taken, beside the loop: the term it serves with, or None when it
        failed (noted for back-off here and logged once; the loop's next pass gives the lease back).
        A lease lost while this ran is closed at once."""
        try:
            term = await self._on_take(name, held.lease.term)
        except Exception as exc:  # noqa: BLE001  (whatever keeps it from opening: back off, try later)
            previous = self.backoff.get(name)
            failures = 1 if previous is None else previous.failures + 1
            wait = min(self.backoff_first * 2 ** (failures - 1), self.backoff_max)
            reason = repr(exc)[:200]
            self.backoff[name] = Backoff(failures, time.monotonic() + wait, reason)
            log.warning("pchannel taken but not opened; lease released, next try after a back-off",
                        pchannel=name, failures=failures, retry_in=round(wait, 3), error=reason)
            self._orphans.pop(name, None)
            self._wake.set()
            return None
        self.backoff.pop(name, None)
        if held.lost:
            # The lease went while it opened: another node may hold it now, so close what was opened.
            self._orphans.pop(name, None)
            log.warning("pchannel opened after its lease was lost; closing it", pchannel=name, reason=held.lost)
            await self._on_lose(name, held.lost)
        else:
            self._changed(name, "taken")
        self._wake.set()
        return term

    async def _opened(self, name: str, held: Held) -> None:
        """The loop's side of an ended open: serve with the WAL's term, or give the lease back."""
        task, held.opening = held.opening, None
        assert task is not None
        if task.cancelled() or task.result() is None:
            self.held.pop(name, None)
            released = await self.leases.release(held.lease)
            if released is not None:
                self.view.leases[name] = released
            return
        # Open now: the next renewal (this pass) says serving and reports the WAL's term, the fencing term.
        held.serving_term = task.result() or held.serving_term

    async def _lost(self, name: str, reason: str) -> None:
        """The lease of ``name`` is no longer this node's: stop serving it (after its open, if running)."""
        held = self.held.get(name)
        if held is not None and held.is_opening():
            del self.held[name]
            held.lost = reason
            self._orphans[name] = held
            return
        await self._drop(name, reason)

    async def _drop(self, name: str, reason: str) -> None:
        self.held.pop(name, None)
        try:
            await self._on_lose(name, reason)
        finally:
            self._changed(name, reason)

    async def forget(self, name: str) -> None:
        """``name`` is being destroyed: stop serving it if held here, and remove its lease record."""
        async with self._pass_lock:  # not in the middle of a pass that may be renewing it
            if name in self.held:
                await self._lost(name, "released")
            await self.leases.remove(name)
            self.view.leases.pop(name, None)
            self.backoff.pop(name, None)

    async def refresh(self, names: Iterable[str]) -> None:
        """Read the leases of ``names`` again into the view (what DescribeChannels reports): one sweep."""
        seen = await self.leases.read_all()
        for name in names:
            self.view.leases[name] = seen.get(name, Lease(name))

    async def expire_overdue(self) -> None:
        """Stop serving every lease whose TTL ran out on this node's clock without a renewal."""
        now = time.monotonic()
        for name, held in list(self.held.items()):
            if now >= held.valid_until:
                await self._lost(name, "expired")

    # --- the loop --------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="ownership")

    async def _run(self) -> None:
        while not self._stopping:
            started = time.monotonic()
            self._wake.clear()
            try:
                await self._pass()
            except (asyncio.CancelledError, KeyboardInterrupt):
                raise
            except Exception as exc:  # noqa: BLE001  (NATS unreachable: keep trying; leases expire locally)
                log.warning("ownership pass failed", error=repr(exc))
            # Wake early enough to stop serving a lease the moment it runs out, should renewals fail,
            # and at once when an open ends (its lease then says serving, or goes back).
            wait = self.interval - (time.monotonic() - started)
            deadlines = [h.valid_until - time.monotonic() for h in self.held.values()]
            wait = max(min([wait, *deadlines]), 0.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    async def stop(self) -> None:
        """Graceful: leave the membership first (so the others prefer someone else at once), then close
        and release every held pchannel (opens still running get a lease's time to end)."""
        self._stopping = True
        if self._task is not None:
            # Waits for the loop's end; a cancel of stop() itself is never swallowed here.
            await cancel_and_wait(self._task)
            self._task = None
        try:
            await self.membership.leave()
        except Exception as exc:  # noqa: BLE001  (NATS gone: the heartbeat ages out instead)
            log.warning("could not leave the membership", error=repr(exc))
        opening = [h.opening for h in (*self.held.values(), *self._orphans.values())
                   if h.opening is not None and not h.opening.done()]
        if opening:
            _, late = await asyncio.wait(opening, timeout=self.ttl)
            for task in late:
                task.cancel()
            await asyncio.wait(opening)
        self._orphans.clear()
        for name, held in list(self.held.items()):
            if held.opening is not None and (held.opening.cancelled() or held.opening.result() is None):
                self.held.pop(name, None)
            else:
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


__all__ = ["BACKOFF_MAX", "REASONS", "Backoff", "ClusterClient", "Lease", "Leases", "Membership", "Ownership",
           "OwnershipView", "bucket", "decode_key", "encode_key", "placement", "preferred", "read_all"]
