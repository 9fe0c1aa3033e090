"""Periodic recovery snapshots are routine work: counted and timed in ``/metrics``
(``streamingnode_recovery_snapshots_total``, ``streamingnode_recovery_snapshot_seconds_total``), logged
at DEBUG only, so a node under bulk load does not print a line every few seconds at INFO."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import structlog

from streamingnode.client import AsyncClient
from streamingnode.observability.logs import configure_logging
from streamingnode.server import ServerThread
from tests.integration.conftest import node_config
from tests.integration.test_metrics import scrape, value
from tests.waiting import until

pytestmark = pytest.mark.integration


async def test_snapshots_are_counted_and_timed_and_not_logged_at_info(tmp_path: Path) -> None:
    out = io.StringIO()
    configure_logging("info", out, cache=False)
    try:
        with ServerThread(node_config(tmp_path / "data", snapshot_every_messages=10,
                                      snapshot_every_seconds=0)) as srv:
            assert srv.metrics_address is not None
            address = srv.metrics_address
            async with AsyncClient(srv.address) as client:
                await client.create_channels(["p"])
                async with client.producer("p") as producer:
                    for i in range(40):
                        await producer.send("v", f"m{i}".encode())

            def stored() -> float:
                return value(scrape(address), "streamingnode_recovery_snapshots_total", pchannel="p")

            # The node's snapshot task takes them (a pass a second at most).  One, not two: a pass after
            # the last message stores one, and nothing written after it makes a second one due.
            await until(lambda: stored() >= 1, "a periodic recovery snapshot counted", interval=0.1)
            samples = scrape(address)
            assert value(samples, "streamingnode_recovery_snapshot_seconds_total", pchannel="p") > 0
            assert stored() == srv.node.channel("p").retention.stats().snapshots_stored  # type: ignore[union-attr]
    finally:
        structlog.reset_defaults()
    events = [json.loads(line)["event"] for line in out.getvalue().splitlines() if line.startswith("{")]
    assert "channels created" in events, events  # the INFO log was captured
    assert "recovery snapshot stored" not in events
