"""Cluster mode: which node owns which pchannel, by leases in NATS JetStream KV.

One loop per node, every TTL/3. For each pchannel, the preferred owner is given by rendezvous hashing
over the live node ids (``preferred``). A preferred node takes a free or expired lease and opens the
channel (``on_take``); a holder that is no longer preferred (a node joined) closes the channel
(``on_lose``) and releases the lease, so the preferred node takes it at its next step; a holder whose
renewal finds another owner, or whose lease ran out before a renewal succeeded, stops serving at once.
Closes (drains) run as tasks beside the loop, never inside a pass: a hand-off's lease is renewed until
its drain ends and released at the next pass, so the renewals of every other lease never wait behind
drains.  The lease's end on this node's own clock (``Held.valid``, the TTL less ``CLOCK_RATE_MARGIN``
from the renewal's sending) is checked by every call (``serves``) and by a watch of its own, so a
pass stuck on an unanswering NATS does not keep an expired lease served.

It stands on ``Membership`` (``streamingnode.cluster.membership``: the live nodes) and ``Leases``
(``streamingnode.cluster.leases``: a pchannel's lease, by compare-and-set, and the clock assumption
behind expiry); ``ClusterClient`` (``streamingnode.cluster.connection``) opens the NATS connection and
their buckets; ``streamingnode.cluster.kv`` holds the KV sweep both read with.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import structlog

from streamingnode.cluster.leases import Lease, Leases
from streamingnode.cluster.membership import Membership
from wal.errors import UnavailableError
from wal.tasks import cancel_and_wait

log = structlog.get_logger(__name__)

REASONS = ("taken", "released", "expired", "lost")
"""Why this node's ownership of a pchannel changed (the ``reason`` label of the changes counter)."""
BACKOFF_MAX = 60.0
"""Seconds: the longest wait before a node tries again to open a pchannel whose opens keep failing."""
CONCURRENT_WRITES = 64
"""Lease writes (renewals, takes) one pass has in flight at once: pipelined, not one round trip each."""
CLOCK_RATE_MARGIN = 0.05
"""The share of the TTL the holder gives up to clock rates: it serves a lease for ``TTL * (1 -
CLOCK_RATE_MARGIN)`` on its monotonic clock from the moment it sent the renewal, so that a holder whose
clock runs up to 5 % slow against a contender's (real oscillators are off by parts per million; NTP
slews at most 0.05 %) still stops before the contender may see the lease as expired."""


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


OnTake = Callable[[str, int], Awaitable[int]]
"""Open pchannel ``name`` taken with lease term ``term``; return the term it serves with (the WAL's)."""
OnLose = Callable[[str, str], Awaitable[None]]
"""Stop serving pchannel ``name`` (drain and close it); the second argument is the reason."""


@dataclass(slots=True)
class Held:
    lease: Lease
    valid_until: float
    """Monotonic time from which this node must not serve it without a renewal (the renewal's send time
    plus the TTL less ``CLOCK_RATE_MARGIN``)."""
    serving_term: int = 0
    opening: asyncio.Task[int | None] | None = None
    """The open (``on_take``) of the pchannel, running beside the loop; None once the loop saw it end."""
    lost: str = ""
    """Why the lease went while the open still ran (the pchannel is closed as soon as it ends)."""
    draining: asyncio.Task[None] | None = None
    """The hand-off's drain (``on_lose``), running beside the loop, which renews the lease meanwhile and
    releases it at the first pass after the drain ended."""

    def is_opening(self) -> bool:
        return self.opening is not None and not self.opening.done()

    def valid(self, now: float) -> bool:
        """Still this node's to serve at monotonic time ``now``: the one check of the lease by the
        holder's own clock (the loop's expiry, the watch and every call go through it)."""
        return now < self.valid_until


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
        self._closing: dict[str, asyncio.Task[None]] = {}
        """Pchannels whose lease went (lost, expired, destroyed) and whose close (``on_lose``) still runs,
        beside the loop: not taken again before it ends."""
        self._watch: asyncio.Task[None] | None = None
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

    @property
    def serve_for(self) -> float:
        """Seconds a renewal lets this node serve, on its monotonic clock, counted from its sending."""
        return self.ttl * (1 - CLOCK_RATE_MARGIN)

    def serves(self, name: str) -> bool:
        """This node may serve ``name`` now: it holds the lease, by its own clock, and is not handing
        it off.  Checked on every call, so a holder cut off from NATS refuses calls from the moment
        its lease runs out on its clock, whatever the loop is waiting on."""
        held = self.held.get(name)
        return held is not None and held.draining is None and held.valid(time.monotonic())

    def is_opening(self, name: str) -> bool:
        held = self.held.get(name)
        return held is not None and held.is_opening()

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
            self._lost(name, "released")
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
                    self._lost(name, "lost")
                    return ""
                mine.lease = seen  # our own write whose answer we missed: same owner and term
            if mine.draining is not None:
                if not mine.draining.done():
                    return "renew"  # kept while the drain runs: nobody else serves it half-drained
                # Drained: give the lease back (here, in the pass, as every lease write of this node).
                self.held.pop(name, None)
                released = await self.leases.release(mine.lease)
                if released is not None:
                    self.view.leases[name] = released
                return ""
            if best is not None and best != self.node_id and not mine.is_opening():
                # A node joined that hashing prefers: drain beside the loop (a drain must never hold up
                # the renewals of the leases this node keeps), then release so it can take at once.
                mine.draining = self._spawn_close(name, "released")
                return "renew"
            return "renew"
        if seen.held() and seen.node != self.node_id and seen.serving:
            self.backoff.pop(name, None)  # another node serves it: this node's failed opens are moot
        if (best != self.node_id or (seen.held() and seen.node != self.node_id) or name in self._orphans
                or name in self._closing):
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
        renewed = await self.leases.renew(held.lease, held.serving_term,
                                          serving=not held.is_opening() and held.draining is None)
        if self.held.get(name) is not held:
            return
        if renewed is None:
            self._lost(name, "lost")
            return
        held.lease, held.valid_until = renewed, sent + self.serve_for
        self.view.leases[name] = renewed

    async def _take(self, name: str) -> None:
        sent = time.monotonic()
        taken = await self.leases.take(self.view.leases.get(name) or Lease(name))
        if taken is None:
            return
        self.view.leases[name] = taken
        held = self.held[name] = Held(taken, sent + self.serve_for, taken.term)
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

    def _lost(self, name: str, reason: str) -> None:
        """The lease of ``name`` is no longer this node's: stop serving it (after its open, if running).
        The close runs beside the loop; ``serves`` says no from now on."""
        held = self.held.get(name)
        if held is not None and held.is_opening():
            del self.held[name]
            held.lost = reason
            self._orphans[name] = held
            return
        self._drop(name, reason)

    def _drop(self, name: str, reason: str) -> None:
        held = self.held.pop(name, None)
        if held is not None and held.draining is not None:
            # Already draining (a hand-off) when the lease went: that close goes on, not a second one.
            self._closing[name] = held.draining
            held.draining.add_done_callback(lambda t: self._closed(name, t))
            return
        self._closing[name] = self._spawn_close(name, reason)
        self._closing[name].add_done_callback(lambda t: self._closed(name, t))

    def _spawn_close(self, name: str, reason: str) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(self._close(name, reason), name=f"close {name}")

    async def _close(self, name: str, reason: str) -> None:
        """Stop serving ``name`` (``on_lose``: drain and close), beside the loop."""
        try:
            await self._on_lose(name, reason)
        except Exception as exc:  # noqa: BLE001  (it is no longer this node's either way)
            log.warning("closing a pchannel whose lease went failed", pchannel=name, reason=reason, error=repr(exc))
        finally:
            self._changed(name, reason)
            self._wake.set()  # a hand-off's lease goes back at the next pass, at once

    def _closed(self, name: str, task: asyncio.Task[None]) -> None:
        if self._closing.get(name) is task:
            del self._closing[name]
        self._wake.set()

    async def closes(self) -> None:
        """Wait for every close (and hand-off drain) running beside the loop."""
        running = [*self._closing.values(), *(h.draining for h in self.held.values() if h.draining is not None)]
        if running:
            await asyncio.wait(running)

    async def forget(self, name: str) -> None:
        """``name`` is being destroyed: stop serving it if held here, and remove its lease record."""
        async with self._pass_lock:  # not in the middle of a pass that may be renewing it
            if name in self.held:
                self._lost(name, "released")
            closing = self._closing.get(name)
        if closing is not None:
            # Drained outside the pass lock: the other leases' renewals go on meanwhile.
            await asyncio.wait([closing])
        async with self._pass_lock:
            await self.leases.remove(name)
            self.view.leases.pop(name, None)
            self.backoff.pop(name, None)

    async def refresh(self, names: Iterable[str]) -> None:
        """Read the leases of ``names`` again into the view (what DescribeChannels reports): one sweep.
        While NATS cannot answer (an outage, a cluster electing), UNAVAILABLE: the caller tries again
        or asks another node, where a raw NATS error would reach clients as an internal one."""
        try:
            seen = await self.leases.read_all()
        except Exception as exc:
            from streamingnode.cluster.connection import transient  # noqa: PLC0415  (imports nats-py)

            if transient(exc):
                raise UnavailableError(f"the cluster's lease records cannot be read now ({exc!r}): "
                                       f"NATS is unreachable or electing; try again") from exc
            raise
        for name in names:
            self.view.leases[name] = seen.get(name, Lease(name))

    async def expire_overdue(self) -> None:
        """Stop serving every lease whose TTL ran out on this node's clock without a renewal."""
        now = time.monotonic()
        for name, held in list(self.held.items()):
            if not held.valid(now):
                self._lost(name, "expired")

    async def _watch_expiry(self) -> None:
        """Expire leases on this node's clock the moment they run out, whatever the loop waits on (a
        pass stuck on an unanswering NATS holds the pass lock for up to a request timeout or more)."""
        while not self._stopping:
            await self.expire_overdue()
            now = time.monotonic()
            deadlines = [h.valid_until - now for h in self.held.values()]
            await asyncio.sleep(max(min([self.interval, *deadlines]), 0.0))

    # --- the loop --------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="ownership")
        self._watch = asyncio.get_running_loop().create_task(self._watch_expiry(), name="lease expiry")

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
        if self._watch is not None:
            await cancel_and_wait(self._watch)
            self._watch = None
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
        leases = {name: held.lease for name, held in self.held.items()}
        for name, held in list(self.held.items()):
            if held.opening is not None and (held.opening.cancelled() or held.opening.result() is None):
                self.held.pop(name, None)
            else:
                self._drop(name, "released")
        await self.closes()  # every pchannel closed before its lease goes back
        for name, lease in leases.items():
            try:
                await self.leases.release(lease)
            except Exception as exc:  # noqa: BLE001  (the lease then expires by itself)
                log.warning("could not release the lease", pchannel=name, error=repr(exc))


__all__ = ["BACKOFF_MAX", "CLOCK_RATE_MARGIN", "REASONS", "Backoff", "Held", "Ownership", "OwnershipView", "placement",
           "preferred"]
