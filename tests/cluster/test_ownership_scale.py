"""The ownership loop at scale and under slow or failing opens, on a real NATS (one server): a pass
reads the leases and the nodes in one sweep each, whatever the number of pchannels; a pchannel whose
open fails backs off (exponentially, capped, reset by a success) without holding the others up; an
open slower than the lease keeps its lease, and one whose lease goes anyway is closed once it ends.

The opens here are stand-ins (``FakeNode``): what is under test is the loop over real KV leases.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import nats
import pytest
from nats.js.kv import KeyValue
from structlog.testing import capture_logs

from streamingnode.cluster.kv import bucket
from streamingnode.cluster.leases import Lease, Leases
from streamingnode.cluster.membership import Membership
from streamingnode.cluster.ownership import Ownership, placement
from tests.natscluster import NatsCluster
from tests.waiting import until
from wal.kv_key import encode_key

pytestmark = pytest.mark.integration

_prefixes = itertools.count()
READS = ("get", "keys", "watch", "watchall", "history")


class CountingKV:
    """A KV bucket whose read calls are counted (a sweep of the whole bucket counts as one)."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv
        self.reads = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.kv, name)
        if name not in READS:
            return attr

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.reads += 1
            return await attr(*args, **kwargs)
        return counted


@dataclass
class FakeNode:
    """Opens that succeed at once, fail (``failing``) or wait for the test (``gates``)."""

    failing: set[str] = field(default_factory=set)
    gates: dict[str, asyncio.Event] = field(default_factory=dict)
    open: set[str] = field(default_factory=set)
    attempts: dict[str, list[float]] = field(default_factory=dict)
    events: list[tuple[str, str]] = field(default_factory=list)

    async def on_take(self, name: str, term: int) -> int:
        self.attempts.setdefault(name, []).append(time.monotonic())
        if name in self.failing:
            raise RuntimeError(f"damaged channel record of {name}")
        gate = self.gates.get(name)
        if gate is not None:
            await gate.wait()  # a recovery that takes as long as the test says
        self.open.add(name)
        self.events.append((name, "opened"))
        return term

    async def on_lose(self, name: str, reason: str) -> None:
        self.open.discard(name)
        self.events.append((name, reason))


@dataclass
class Setup:
    nc: Any
    nodes_kv: CountingKV
    leases_kv: CountingKV
    prefix: str

    def ownership(self, node_id: str, fake: FakeNode, names: Callable[[], Awaitable[list[str]]], ttl: float,
                  **kwargs: Any) -> Ownership:
        address = f"addr-{node_id}"
        membership = Membership(cast(KeyValue, self.nodes_kv), node_id, address, ttl)
        leases = Leases(cast(KeyValue, self.leases_kv), node_id, address, ttl)
        return Ownership(membership, leases, names, fake.on_take, fake.on_lose, **kwargs)

    @property
    def reads(self) -> int:
        return self.nodes_kv.reads + self.leases_kv.reads


@pytest.fixture
async def setup(nats_r1: NatsCluster) -> AsyncIterator[Setup]:
    prefix = f"s{next(_prefixes)}"
    nc = await nats.connect(nats_r1.url)
    try:
        js = nc.jetstream()
        nodes, leases = await bucket(js, f"{prefix}_nodes"), await bucket(js, f"{prefix}_leases")
        yield Setup(nc, CountingKV(nodes), CountingKV(leases), prefix)
    finally:
        await nc.close()


def listing(names: list[str]) -> Callable[[], Awaitable[list[str]]]:
    async def names_now() -> list[str]:
        return list(names)
    return names_now


async def test_a_hundred_pchannels_are_placed_and_balanced_with_a_bounded_number_of_reads_per_pass(
    setup: Setup,
) -> None:
    names = [f"p{i:03}" for i in range(100)]
    fakes = {n: FakeNode() for n in ("a", "b")}
    owners = {n: setup.ownership(n, fakes[n], listing(names), 30.0) for n in fakes}
    for own in owners.values():
        await own.membership.heartbeat()  # both live from the first pass: no churn while settling
    want = placement(names, owners)

    async def settled() -> bool:
        for own in owners.values():
            await own.step()
        return all(fakes[n].open == {p for p, o in want.items() if o == n} for n in owners)
    await until(settled, "each of the 100 pchannels open on its preferred node", timeout=30)
    share = len(fakes["a"].open)
    assert 30 <= share <= 70 and share + len(fakes["b"].open) == 100  # placement spreads them
    # A settled pass renews 50 leases per node: its reads are one sweep of each bucket, not one per lease.
    for own in owners.values():
        before = setup.reads
        await own.step()
        assert setup.reads - before <= 2, f"{setup.reads - before} KV reads in one pass over 100 pchannels"
    stored = await owners["a"].leases.read_all()
    assert {p: (lease.node, lease.serving) for p, lease in stored.items()} == {p: (want[p], True) for p in names}
    for n, own in owners.items():
        assert set(own.held) == fakes[n].open


async def test_a_pchannel_whose_open_fails_backs_off_and_does_not_starve_the_others(setup: Setup) -> None:
    names = [f"q{i}" for i in range(8)]
    fake = FakeNode(failing={"q3"})
    own = setup.ownership("a", fake, listing(names), 30.0, backoff_first=0.05, backoff_max=0.4)
    with capture_logs() as logs:
        await own.step()
        assert fake.open == set(names) - {"q3"}  # the others opened in the same pass
        passes = 0

        async def tried_five_times() -> bool:
            nonlocal passes
            await own.step()
            passes += 1
            return len(fake.attempts["q3"]) >= 5
        await until(tried_five_times, "five tries to open q3", timeout=30)
    tries = fake.attempts["q3"]
    # Exponential and capped: each wait at least the last one doubled (up to the cap), measured from
    # the moment the failure was noted, which is after the try began.
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    for i, gap in enumerate(gaps):
        assert gap >= min(0.05 * 2 ** i, 0.4), (i, gaps)
    assert passes > 2 * len(tries), "a failing open is retried on every pass"
    failures = [e for e in logs if e["event"].startswith("pchannel taken but not opened")]
    assert len(failures) == len(tries), "one log line per failed try"
    assert [e["failures"] for e in failures] == list(range(1, len(tries) + 1))
    assert all("damaged channel record of q3" in e["error"] for e in failures)
    # The status names it; the lease is free for any other node meanwhile.
    assert own.backoff["q3"].failures == len(tries)
    (problem,) = own.problems("q3")
    assert "damaged channel record of q3" in problem and f"{len(tries)} time(s)" in problem
    lease = await own.leases.read("q3")
    assert lease.node == "" and not lease.held()
    # A pchannel created meanwhile opens on the next pass, back-off or not.
    names.append("q8")
    await own.step()
    assert "q8" in fake.open
    # Repaired: it opens at its next try, and its back-off is forgotten.
    fake.failing.clear()

    async def opened() -> bool:
        await own.step()
        return "q3" in fake.open
    await until(opened, "q3 to open once repaired", timeout=30)
    assert "q3" not in own.backoff and own.problems("q3") == []
    assert (await own.leases.read("q3")).serving
    await own.stop()


async def test_an_open_slower_than_the_lease_keeps_the_lease_and_ends_open_on_the_same_node(setup: Setup) -> None:
    # Renewed every third of it: 3 s leaves a loaded host (the suite on 2 workers) two seconds' slack
    # before another node could take the lease (with 1 s, a renewal late by 0.7 s failed the test).
    ttl = 3.0
    fake = FakeNode(gates={"slow": asyncio.Event()})
    own = setup.ownership("a", fake, listing(["slow", "quick"]), ttl)
    contender = Leases(cast(KeyValue, setup.leases_kv), "b", "addr-b", ttl)
    own.start()
    try:
        await until(lambda: "quick" in fake.open and "slow" in fake.attempts, "both taken, slow opening")
        first = await contender.read("slow")
        assert first.node == "a" and not first.serving

        async def lease_outlived_twice() -> bool:
            lease = await contender.read("slow")
            assert lease.node == "a" and lease.term == first.term, lease
            assert await contender.take(lease) is None, "another node could take the lease of an opening pchannel"
            return lease.expires_ms > first.expires_ms + 2 * ttl * 1000
        await until(lease_outlived_twice, "the opening pchannel's lease renewed past two TTLs", timeout=30)
        assert "slow" not in fake.open and (await contender.read("slow")).serving is False
        fake.gates["slow"].set()  # recovery ends

        async def serving() -> bool:
            return (await contender.read("slow")).serving
        await until(serving, "the lease to say serving once open")
        lease = await contender.read("slow")
        assert (lease.node, lease.term) == ("a", first.term)
        assert fake.open == {"slow", "quick"} and set(own.held) == {"slow", "quick"}
        assert [e for e in fake.events if e[1] != "opened"] == []  # never closed, never lost
    finally:
        await own.stop()


async def test_a_lease_lost_while_its_pchannel_opens_closes_the_pchannel_once_the_open_ends(setup: Setup) -> None:
    ttl = 1.0
    fake = FakeNode(gates={"slow": asyncio.Event()})
    own = setup.ownership("a", fake, listing(["slow"]), ttl)
    own.start()
    try:
        await until(lambda: "slow" in fake.attempts, "slow taken and opening")
        taken = await own.leases.read("slow")
        # Another node holds it now (as after a partition that outlived the lease).
        theirs = Lease("slow", "b", "addr-b", taken.term + 1, taken.expires_ms + 60_000, serving=True)
        await setup.leases_kv.put(encode_key("slow"), theirs.encode())
        await until(lambda: "slow" not in own.held, "a to see the lease gone")
        fake.gates["slow"].set()
        await until(lambda: ("slow", "lost") in fake.events, "the half-open pchannel closed")
        assert fake.events == [("slow", "opened"), ("slow", "lost")] and fake.open == set()
        # It does not take the lease back nor write over it.
        steps = own.steps
        await until(lambda: own.steps >= steps + 2, "two more passes")
        stored = await own.leases.read("slow")
        assert json.loads(stored.encode()) == json.loads(theirs.encode())
        assert "slow" not in own.held
    finally:
        await own.stop()
