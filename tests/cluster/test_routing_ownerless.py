"""The SDK during a takeover's gap (nobody owns the pchannel for a moment): read-only calls wait, bounded,
for the next owner; writes fail at once with NOT_OWNER.  On the routing test's cluster of real nodes
whose ownership the test sets (``tests/cluster/test_client_routing.py``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamingnode.client import AsyncClient
from tests.cluster.test_client_routing import Cluster, ServerThreadClient
from tests.waiting import until
from wal.errors import NotOwnerError

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        for name in ("a", "b"):
            c.start(name)
        with ServerThreadClient(c.address("b")) as create:
            create("pb")
        c.owners.of["pb"] = c.address("b")
        yield c
    finally:
        c.close()


async def test_a_read_during_a_takeover_waits_for_the_next_owner(cluster: Cluster) -> None:
    a, b = cluster.address("a"), cluster.address("b")
    async with AsyncClient([a, b]) as client:
        await client.create_group("pb", "g")
        del cluster.owners.of["pb"]  # the owner's lease expired; nobody has taken it yet
        refused = cluster.refused("a") + cluster.refused("b")
        described = asyncio.create_task(client.describe_groups("pb", ["g"]))
        await until(lambda: cluster.refused("a") + cluster.refused("b") > refused, "the read refused once")
        assert not described.done()  # still waiting, not failed
        cluster.owners.of["pb"] = b  # taken over
        [group] = await asyncio.wait_for(described, 10)
        assert (group.pchannel, group.group) == ("pb", "g")


async def test_reads_wait_a_bounded_time_and_writes_not_at_all_while_nobody_owns_it(cluster: Cluster) -> None:
    a, b = cluster.address("a"), cluster.address("b")
    async with AsyncClient([a, b]) as client:
        del cluster.owners.of["pb"]
        client.router.ownerless_wait = 0.3
        started = time.monotonic()
        with pytest.raises(NotOwnerError):
            await client.latest_position("pb", "v")
        assert time.monotonic() - started >= 0.3
        client.router.ownerless_wait = 60.0  # a write must not wait for it
        started = time.monotonic()
        with pytest.raises(NotOwnerError):
            await client.create_group("pb", "g2")
        assert time.monotonic() - started < 10
