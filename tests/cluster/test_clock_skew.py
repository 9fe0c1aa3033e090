"""Clock skew is detected: a node whose wall clock is off the NATS server's by more than the bound leases
assume (``SKEW_SHARE`` of the TTL) logs one clear warning (not one per pass) and shows the skew in
``streamingnode_clock_skew_seconds``; within the bound it says nothing.  The node's clock is faked in
process (its ``now_ms``); the server's is real, stamped on the heartbeat JetStream stores.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from structlog.testing import capture_logs

from streamingnode.cluster import membership as membership_module
from streamingnode.cluster.kv import bucket
from streamingnode.cluster.leases import Leases
from streamingnode.cluster.membership import SKEW_SHARE, Membership
from streamingnode.cluster.ownership import CLOCK_RATE_MARGIN, Ownership
from streamingnode.observability.metrics import NodeMetrics
from tests.natscluster import NatsCluster

pytestmark = pytest.mark.integration

TTL = 10.0
_prefixes = itertools.count()


@pytest.fixture
async def kvs(nats_r1: NatsCluster) -> AsyncIterator[tuple[Any, Any]]:
    prefix = f"sk{next(_prefixes)}"
    nc = await nats.connect(nats_r1.url)
    try:
        js = nc.jetstream()
        yield await bucket(js, f"{prefix}_nodes"), await bucket(js, f"{prefix}_leases")
    finally:
        await nc.close()


def _skewed(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """This node's wall clock ``seconds`` ahead of the real one (behind when negative)."""
    monkeypatch.setattr(membership_module, "now_ms", lambda: int((time.time() + seconds) * 1000))


async def _names() -> list[str]:
    return []


async def _take(name: str, term: int) -> int:
    return term


async def _lose(name: str, reason: str) -> None:
    return None


def test_the_bound_is_half_the_share_a_holder_gives_up_to_clocks() -> None:
    # Two nodes each within the bound of the server are within CLOCK_RATE_MARGIN of the TTL of each other.
    assert pytest.approx(CLOCK_RATE_MARGIN) == 2 * SKEW_SHARE


@pytest.mark.parametrize("skew", [3.0, -3.0])
async def test_a_skew_beyond_the_bound_is_logged_once_and_shown_in_the_gauge(
    kvs: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch, skew: float,
) -> None:
    nodes, leases = kvs
    _skewed(monkeypatch, skew)
    membership = Membership(nodes, "a", "addr-a", TTL)
    own = Ownership(membership, Leases(leases, "a", "addr-a", TTL), _names, _take, _lose)
    metrics = NodeMetrics()
    metrics.cluster = own
    assert abs(skew) > membership.skew_bound
    with capture_logs() as logs:
        for _ in range(3):
            await own.step()
    warnings = [e for e in logs if e["event"].startswith("clock skew beyond the bound")]
    assert len(warnings) == 1, logs  # one line, not one per pass
    (line,) = warnings
    assert line["log_level"] == "warning" and line["node"] == "a" and line["bound_seconds"] == TTL * SKEW_SHARE
    # The server stamps the heartbeat a publish's latency after the node read its clock.
    measured = metrics.registry.get_sample_value("streamingnode_clock_skew_seconds")
    assert measured is not None and abs(measured - skew) < TTL * SKEW_SHARE, measured
    assert abs(line["skew_seconds"] - skew) < TTL * SKEW_SHARE


async def test_a_skew_within_the_bound_says_nothing(kvs: tuple[Any, Any]) -> None:
    nodes, leases = kvs
    membership = Membership(nodes, "a", "addr-a", TTL)
    own = Ownership(membership, Leases(leases, "a", "addr-a", TTL), _names, _take, _lose)
    metrics = NodeMetrics()
    metrics.cluster = own
    with capture_logs() as logs:
        await own.step()
    assert not [e for e in logs if e["event"].startswith("clock skew")], logs
    measured = metrics.registry.get_sample_value("streamingnode_clock_skew_seconds")
    assert measured is not None and abs(measured) <= membership.skew_bound, measured
