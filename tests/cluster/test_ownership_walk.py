"""A seeded random walk of the ownership loop against the plain model of placement: nodes start and stop,
leases are stolen (as by a node across a partition), drains take a random while; throughout, no
pchannel is served (``Ownership.serves``) by two nodes at once, and once the walk settles every
pchannel is open on exactly the node rendezvous hashing prefers among the running ones.

The opens and drains are stand-ins; the loops, the leases and the membership are real (one NATS server).
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import nats
import pytest

from streamingnode.cluster.kv import bucket, now_ms
from streamingnode.cluster.leases import Lease, Leases
from streamingnode.cluster.membership import Membership
from streamingnode.cluster.ownership import Ownership, placement
from tests.natscluster import NatsCluster
from tests.seeds import draw_seed
from tests.waiting import until
from wal.kv_key import encode_key

pytestmark = pytest.mark.integration

TTL = 2.0
NAMES = [f"w{i}" for i in range(8)]
NODES = ("a", "b", "c")
_prefixes = itertools.count()


@dataclass
class Stand:
    """Opens at once; drains take ``drain`` seconds (set by the walk)."""

    rng: random.Random
    open: set[str] = field(default_factory=set)

    async def on_take(self, name: str, term: int) -> int:
        self.open.add(name)
        return term

    async def on_lose(self, name: str, reason: str) -> None:
        await asyncio.sleep(self.rng.uniform(0, TTL / 2))  # a drain of some length
        self.open.discard(name)


@dataclass
class Walk:
    nodes_kv: Any
    leases_kv: Any
    rng: random.Random
    running: dict[str, tuple[Ownership, Stand]] = field(default_factory=dict)
    overlaps: list[str] = field(default_factory=list)

    async def start(self, node: str) -> None:
        stand = Stand(self.rng)
        own = Ownership(Membership(self.nodes_kv, node, f"addr-{node}", TTL),
                        Leases(self.leases_kv, node, f"addr-{node}", TTL), self.names, stand.on_take, stand.on_lose)
        self.running[node] = (own, stand)
        own.start()

    async def stop(self, node: str) -> None:
        own, _ = self.running.pop(node)
        await own.stop()

    async def names(self) -> list[str]:
        return list(NAMES)

    async def steal(self, name: str) -> None:
        """Another node (not running here) holds ``name`` for a lease's time."""
        current = await Leases(self.leases_kv, "z", "addr-z", TTL).read(name)
        theirs = Lease(name, "z", "addr-z", current.term + 1, now_ms() + int(TTL * 1000), serving=True)
        await self.leases_kv.put(encode_key(name), theirs.encode())

    async def watch(self) -> None:
        """The invariant, checked at every turn of the loop the nodes run on."""
        while True:
            for name in NAMES:
                serving = [n for n, (own, _) in self.running.items() if own.serves(name)]
                if len(serving) > 1:
                    self.overlaps.append(f"{name} served by {serving}")
            await asyncio.sleep(0)

    def settled(self) -> bool:
        want = placement(NAMES, self.running)
        return all(stand.open == {p for p, n in want.items() if n == node} and set(own.held) == stand.open
                   for node, (own, stand) in self.running.items())


@pytest.fixture
async def walk(nats_r1: NatsCluster, record_property: Any) -> AsyncIterator[Walk]:
    prefix = f"walk{next(_prefixes)}"
    nc = await nats.connect(nats_r1.url)
    js = nc.jetstream()
    state = Walk(await bucket(js, f"{prefix}_nodes", ttl=60.0), await bucket(js, f"{prefix}_leases"),
                 random.Random(draw_seed("OWNERSHIP_WALK_SEED", record_property)))
    try:
        yield state
    finally:
        for node in list(state.running):
            await state.stop(node)
        await nc.close()


async def test_a_random_walk_of_joins_leaves_and_stolen_leases_never_has_two_nodes_serve_a_pchannel(
    walk: Walk,
) -> None:
    rng = walk.rng
    watcher = asyncio.get_running_loop().create_task(walk.watch())
    try:
        await walk.start("a")
        for _ in range(12):
            stopped = [n for n in NODES if n not in walk.running]
            move = rng.choice(["start", "stop", "steal", "settle"])
            if move == "start" and stopped:
                await walk.start(rng.choice(stopped))
            elif move == "stop" and len(walk.running) > 1:
                await walk.stop(rng.choice(sorted(walk.running)))
            elif move == "steal":
                await walk.steal(rng.choice(NAMES))
            else:
                await until(walk.settled, "each pchannel open on its preferred node", timeout=60)
            await asyncio.sleep(rng.uniform(0, TTL / 2))  # the loops run a while before the next move
            assert not walk.overlaps, walk.overlaps[:5]
        await until(walk.settled, "each pchannel open on its preferred node at the end", timeout=60)
        assert not walk.overlaps, walk.overlaps[:5]
    finally:
        watcher.cancel()
