"""Renewals before drains: when a node joins and about half of a node's pchannels hand off at once, their
drains (``on_lose``) run beside the ownership loop, so the leases the node keeps are renewed on time
however long the drains take; a pchannel being destroyed drains outside the pass lock too.

The drains here are stand-ins that wait for the test (as slow as it likes); the loop and the leases
are real (one NATS server).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import cast

import nats
import pytest
from nats.js.kv import KeyValue

from streamingnode.cluster.kv import bucket, now_ms
from streamingnode.cluster.leases import Leases
from streamingnode.cluster.membership import Membership
from streamingnode.cluster.ownership import Ownership, placement
from tests.natscluster import NatsCluster
from tests.waiting import until

pytestmark = pytest.mark.integration

_prefixes = itertools.count()
TTL = 3.0
"""Renewed every second: a loaded host keeps two seconds' slack before another node could take a lease."""


@dataclass
class SlowDrains:
    """Opens at once; every drain waits until the test opens ``gate``."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)
    open: set[str] = field(default_factory=set)
    draining: set[str] = field(default_factory=set)
    events: list[tuple[str, str]] = field(default_factory=list)

    async def on_take(self, name: str, term: int) -> int:
        self.open.add(name)
        return term

    async def on_lose(self, name: str, reason: str) -> None:
        self.draining.add(name)
        await self.gate.wait()
        self.open.discard(name)
        self.draining.discard(name)
        self.events.append((name, reason))


@dataclass
class Buckets:
    nodes: KeyValue
    leases: KeyValue

    def ownership(self, node_id: str, fake: SlowDrains, names: list[str]) -> Ownership:
        membership = Membership(self.nodes, node_id, f"addr-{node_id}", TTL)
        leases = Leases(self.leases, node_id, f"addr-{node_id}", TTL)

        async def listed() -> list[str]:
            return list(names)
        return Ownership(membership, leases, listed, fake.on_take, fake.on_lose)


@pytest.fixture
async def buckets(nats_r1: NatsCluster) -> AsyncIterator[Buckets]:
    prefix = f"d{next(_prefixes)}"
    nc = await nats.connect(nats_r1.url)
    try:
        js = nc.jetstream()
        yield Buckets(await bucket(js, f"{prefix}_nodes"), await bucket(js, f"{prefix}_leases"))
    finally:
        await nc.close()


async def test_a_join_that_hands_off_many_pchannels_with_slow_drains_keeps_every_other_lease_renewed(
    buckets: Buckets,
) -> None:
    names = [f"p{i:02}" for i in range(24)]
    a_fake, b_fake = SlowDrains(), SlowDrains()
    b_fake.gate.set()
    a = buckets.ownership("a", a_fake, names)
    b = buckets.ownership("b", b_fake, names)
    reader = Leases(cast(KeyValue, buckets.leases), "reader", "addr-reader", TTL)
    a.start()
    try:
        await until(lambda: a_fake.open == set(names), "a to open every pchannel", timeout=30)
        want = placement(names, ["a", "b"])
        handed = {p for p, n in want.items() if n == "b"}
        kept = set(names) - handed
        assert len(handed) >= 4 and len(kept) >= 4, want
        b.start()  # b joins: a hands off what hashing now gives b, and every drain is slow
        await until(lambda: a_fake.draining == handed, "a to drain every handed-off pchannel at once", timeout=30)
        began_ms = now_ms()
        began = time.monotonic()

        async def kept_renewed_twice() -> bool:
            # Each record read by key: a sweep of the bucket (read_all) taken while the leases are
            # being renewed can come back without a key, which says nothing about the renewals.
            stored = {p: await reader.read(p) for p in names}
            for p in kept:
                lease = stored[p]
                assert lease.node == "a" and lease.held(), (p, lease)
            for p in handed:  # kept by a while it drains: nobody serves a half-drained pchannel
                assert stored[p].node == "a", (p, stored[p])
            return all(stored[p].expires_ms > began_ms + 2 * TTL * 1000 for p in kept)
        await until(kept_renewed_twice, "every kept lease renewed twice over while the drains wait", timeout=30)
        assert time.monotonic() - began > TTL  # the drains outlived a whole lease, and no kept lease went
        assert a_fake.draining == handed and a_fake.events == []
        assert set(a.held) == set(names)

        a_fake.gate.set()  # the drains end: a gives those leases back, b takes them
        await until(lambda: b_fake.open == handed, "b to open every pchannel handed to it", timeout=30)
        await until(lambda: set(a.held) == kept, "a to hold only what it keeps", timeout=30)
        assert sorted(a_fake.events) == sorted((p, "released") for p in handed)
        assert a_fake.open == kept
    finally:
        a_fake.gate.set()
        await b.stop()
        await a.stop()


async def test_a_pchannel_destroyed_while_its_drain_is_slow_holds_up_no_pass(buckets: Buckets) -> None:
    names = ["keep", "gone"]
    fake = SlowDrains()
    own = buckets.ownership("a", fake, names)
    own.start()
    try:
        await until(lambda: fake.open == set(names), "both open", timeout=30)
        forgetting = asyncio.get_running_loop().create_task(own.forget("gone"))
        await until(lambda: fake.draining == {"gone"}, "the destroyed pchannel draining", timeout=30)
        steps = own.steps
        await until(lambda: own.steps >= steps + 2, "two passes while the drain waits", timeout=30)
        assert not forgetting.done() and "keep" in own.held
        names.remove("gone")  # as the node's destroy does once the pchannel is closed: gone from the log
        fake.gate.set()
        await asyncio.wait_for(forgetting, 30)
        assert (await own.leases.read("gone")).revision == 0  # its lease record is removed
        assert fake.events == [("gone", "released")] and set(own.held) == {"keep"}
    finally:
        fake.gate.set()
        await own.stop()
