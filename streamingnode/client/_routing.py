"""Routing: which node a pchannel's calls go to.

A client starts from one or more *seed* addresses.  It keeps one gRPC channel per node it has talked
to and an owner cache per pchannel:

- with a single seed the seed is asked everything (exactly the one-node behaviour), unless a node
  answers NOT_OWNER naming another owner;
- with several seeds the owner comes from ``DescribeChannels`` (asked of the seeds in turn: any node
  of a cluster describes every pchannel), and a NOT_OWNER answer's ``owner`` field replaces it.  A
  single-node ``DescribeChannels`` reports the owner given to ``CreateChannels`` (free text for
  operators), so it is trusted only when there are several seeds, i.e. when the caller said cluster;
- a node that cannot be reached (UNAVAILABLE, ON_SHUTDOWN), or whose call ran out of time
  (DEADLINE_EXCEEDED: a hung node, or one that cannot reach the shared log), is dropped from the
  cache, and the next call resolves the owner again through the seeds;
- a lookup that a seed answers with a transient error (any of those, or a retriable code) asks the
  next seed: DescribeChannels only reads, so asking again is harmless.  When no seed answered, the
  lookup fails with UNAVAILABLE, which a producer or consumer reopening its stream retries until its
  ``reconnect_timeout``.

NOT_OWNER is followed at most ``MAX_HOPS`` times per call: two nodes that each name the other (a
lease changing hands) must not bounce a call forever.  A read-only call answered NOT_OWNER with no
owner (a takeover under way: the old lease expired, nobody has taken it yet) resolves the owner again
after a short pause, for at most ``Router.ownerless_wait`` seconds; a write fails at once (its caller
decides whether to repeat it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception, wait_exponential

from streamingnode.client._calls import READY_WAIT_S, unary
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from wal.error_codes import Behaviour, codes_with
from wal.errors import (
    InvalidArgumentError,
    NotOwnerError,
    StreamingError,
    UnavailableError,
)

MAX_HOPS = 4
"""NOT_OWNER answers followed per call before the last one is raised."""
LOOKUP_TIMEOUT = 5.0
"""Seconds one seed has to answer an owner lookup (or the call's own deadline, when shorter) before the
next seed is asked: a healthy node answers in milliseconds, and a hung one must not hold the lookup
for the call's whole deadline (or forever, without one) while another node could answer."""
OWNERLESS_WAIT = 15.0
"""Seconds a read-only call waits for a pchannel nobody owns to get an owner (a takeover takes about
a lease TTL, 10 s by default, plus a third of it for the taker's next pass)."""

# Errors that say "this node cannot serve you now": forget it as the owner and ask the seeds again.
_NODE_GONE = codes_with(Behaviour.NODE_GONE)
# A call to the node ran out of time: it may be hung or cut off from the log.  Forgotten as the owner
# too (the next call resolves again, and finds a new owner after a takeover), but a call that may
# have taken effect is not repeated here.
_TIMED_OUT = codes_with(Behaviour.OUTCOME_UNKNOWN)
# What makes an owner lookup ask the next seed rather than fail: anything transient.  NOT_OWNER is
# answered on its own (it may name the owner).
_ASK_NEXT_SEED = _NODE_GONE | _TIMED_OUT | codes_with(Behaviour.RETRIABLE)


def parse_addresses(addr: str | Sequence[str]) -> list[str]:
    """Seed addresses from a list or a comma-separated string: stripped, duplicates dropped, in order."""
    parts = addr.split(",") if isinstance(addr, str) else [p for a in addr for p in str(a).split(",")]
    seeds: list[str] = []
    for raw in parts:
        part = raw.strip()
        if part and part not in seeds:
            seeds.append(part)
    if not seeds:
        raise InvalidArgumentError(f"no node address given (got {str(addr)[:200]!r})", field="addr")
    return seeds


class Router:
    """Channels per node and owners per pchannel.  ``open_channel(addr)`` returns (the channel to close,
    what the stub calls through); the Router owns what it returns."""

    def __init__(self, seeds: Sequence[str], open_channel: Callable[[str], tuple[Any, Any]]) -> None:
        self.seeds = list(seeds)
        self._open_channel = open_channel
        self._nodes: dict[str, tuple[Any, sgrpc.StreamingNodeStub]] = {}
        self._owners: dict[str, str] = {}
        self._next_seed = 0
        self.ownerless_wait = OWNERLESS_WAIT
        self.lookup_timeout = LOOKUP_TIMEOUT
        self.resolutions = 0
        """DescribeChannels lookups made to find an owner (for tests and metrics)."""

    @property
    def cluster(self) -> bool:
        return len(self.seeds) > 1

    @property
    def ready_wait(self) -> float:
        """How long a unary call waits for a node it cannot reach (``_calls.unary``): a lone seed may be
        restarting and is waited for briefly; with several, another node can answer at once."""
        return 0.0 if self.cluster else READY_WAIT_S

    def stub_at(self, addr: str) -> sgrpc.StreamingNodeStub:
        node = self._nodes.get(addr)
        if node is None:
            channel, calls = self._open_channel(addr)
            node = self._nodes[addr] = (channel, sgrpc.StreamingNodeStub(calls))
        return node[1]

    def cached_owner(self, pchannel: str) -> str | None:
        return self._owners.get(pchannel)

    async def close(self) -> None:
        nodes, self._nodes = self._nodes, {}
        for channel, _ in nodes.values():
            with contextlib.suppress(Exception):
                await channel.close()

    # --- owners ----------------------------------------------------------------------------------
    async def owner(self, pchannel: str, deadline_s: float | None) -> str:
        """The address to send ``pchannel``'s calls to (resolved and cached on first use)."""
        cached = self._owners.get(pchannel)
        if cached is not None:
            return cached
        if not self.cluster:
            return self.seeds[0]
        addr = await self._resolve(pchannel, deadline_s)
        self._owners[pchannel] = addr
        return addr

    async def _resolve(self, pchannel: str, deadline_s: float | None) -> str:
        """Ask the seeds in turn (starting after the last one asked, so a dead seed is not always
        first) who owns ``pchannel``."""
        self.resolutions += 1
        last: StreamingError | None = None
        n = len(self.seeds)
        start = self._next_seed
        per_seed = self.lookup_timeout if deadline_s is None else min(deadline_s, self.lookup_timeout)
        for i in range(n):
            seed = self.seeds[(start + i) % n]
            try:
                resp = await unary(self.stub_at(seed).DescribeChannels,
                                   spb.DescribeChannelsRequest(channel_names=[pchannel]), per_seed,
                                   ready_wait=self.ready_wait)
            except NotOwnerError as exc:
                owner = str(exc.fields.get("owner") or "")
                if owner:
                    return owner
                raise  # nobody owns it right now: retriable by whoever called
            except StreamingError as exc:
                if exc.code not in _ASK_NEXT_SEED:
                    raise
                last = exc
                self._next_seed = (start + i + 1) % n
                continue
            for d in resp.descriptions:
                if d.channel_name == pchannel and d.owner.address:
                    return str(d.owner.address)
            return seed  # the seed answered without naming another node: it serves the pchannel
        assert last is not None
        raise UnavailableError(f"no seed answered for pchannel {pchannel!r} (tried {', '.join(self.seeds)}): "
                               f"{last}", channel=pchannel) from last

    def learn(self, pchannel: str, addr: str, exc: BaseException) -> bool:
        """Update the cache from a call to ``addr`` on ``pchannel`` that failed with ``exc``; True when a
        new attempt may go elsewhere (NOT_OWNER, or a node gone)."""
        if isinstance(exc, NotOwnerError):
            owner = str(exc.fields.get("owner") or "")
            if owner and owner != addr:
                self._owners[pchannel] = owner
                return True
            # Nobody owns it now (a takeover under way), or a node that names itself: ask again later.
            self._owners.pop(pchannel, None)
            return False
        if isinstance(exc, StreamingError) and exc.code in _NODE_GONE | _TIMED_OUT:
            if self._owners.get(pchannel) == addr:
                del self._owners[pchannel]
            if self.cluster and self.seeds[self._next_seed] == addr:
                # The next lookup starts elsewhere: a hung node would hold it for lookup_timeout.
                self._next_seed = (self._next_seed + 1) % len(self.seeds)
            return self.cluster and exc.code in _NODE_GONE
        return False

    async def call(self, pchannel: str, method: str, request: Any, deadline_s: float | None, *,
                   retry_gone: bool = False) -> Any:
        """A unary call on ``pchannel``'s owner, following NOT_OWNER (it refuses before doing anything,
        so a second attempt is safe).  ``retry_gone``: also try again elsewhere after UNAVAILABLE — only
        for calls that are safe to repeat (reads), since the node may have done the work; those also wait
        up to ``ownerless_wait`` seconds for a pchannel that nobody owns at the moment."""
        loop = asyncio.get_running_loop()
        give_up: list[float] = []  # ownerless_wait after the first answer that nobody owns the pchannel
        backoff = wait_exponential(multiplier=0.05, max=0.5)

        def left() -> float:
            if not give_up:
                give_up.append(loop.time() + self.ownerless_wait)
            return give_up[0] - loop.time()

        retrying = AsyncRetrying(
            # Nobody owns it at the moment (``_follow`` forgot the owner): a read waits (bounded) for the next.
            retry=retry_if_exception(lambda exc: retry_gone and isinstance(exc, NotOwnerError)),
            wait=lambda rs: max(min(backoff(rs), left()), 0.0), stop=lambda _rs: left() <= 0, reraise=True)
        async for attempt in retrying:
            with attempt:
                return await self._follow(pchannel, method, request, deadline_s, retry_gone=retry_gone)
        raise AssertionError("unreachable: tenacity either returns or re-raises")  # pragma: no cover

    async def _follow(self, pchannel: str, method: str, request: Any, deadline_s: float | None, *,
                      retry_gone: bool) -> Any:
        """One try of ``call``: at the owner, following up to ``MAX_HOPS`` moves at once (a redirect,
        not a retry: the answer named where to go)."""
        hops = 0
        while True:
            addr = ""
            try:
                addr = await self.owner(pchannel, deadline_s)
                return await unary(getattr(self.stub_at(addr), method), request, deadline_s,
                                   ready_wait=self.ready_wait)
            except StreamingError as exc:
                moved = self.learn(pchannel, addr, exc) if addr else False
                if moved and hops < MAX_HOPS and (retry_gone or isinstance(exc, NotOwnerError)):
                    hops += 1
                    continue
                if retry_gone and isinstance(exc, NotOwnerError):
                    self._owners.pop(pchannel, None)
                raise

    async def call_any(self, method: str, request: Any, deadline_s: float | None) -> Any:
        """A unary call that any node answers (no pchannel): the seeds in turn until one is reachable."""
        last: StreamingError | None = None
        for seed in self.seeds:
            try:
                return await unary(getattr(self.stub_at(seed), method), request, deadline_s,
                                   ready_wait=self.ready_wait)
            except StreamingError as exc:
                if exc.code not in _NODE_GONE or not self.cluster:
                    raise
                last = exc
        assert last is not None
        raise last


class Route:
    """What a producer or consumer holds: its pchannel's way to the owner.  ``stub()`` resolves (a
    stream's open goes through ``with_reconnect``, so resolution failures are retried like any other);
    ``failed`` tells the Router what a broken stream said."""

    __slots__ = ("_addr", "_router", "_timeout", "pchannel")

    def __init__(self, router: Router, pchannel: str, deadline_s: float | None) -> None:
        self._router = router
        self.pchannel = pchannel
        self._timeout = deadline_s
        self._addr = ""

    @property
    def address(self) -> str:
        """The node the last stream went to."""
        return self._addr

    async def stub(self) -> sgrpc.StreamingNodeStub:
        self._addr = await self._router.owner(self.pchannel, self._timeout)
        return self._router.stub_at(self._addr)

    def failed(self, exc: BaseException) -> None:
        if self._addr:
            self._router.learn(self.pchannel, self._addr, exc)

    async def call(self, method: str, request: Any) -> Any:
        return await self._router.call(self.pchannel, method, request, self._timeout, retry_gone=True)


__all__ = ["LOOKUP_TIMEOUT", "MAX_HOPS", "Route", "Router", "parse_addresses"]
