"""A real ``streamingnode serve`` writes recovery snapshots by itself (``--snapshot-every-messages``),
with retention truncating nothing: after a SIGKILL, the restart replays only what came after the
newest one (the node's "pchannel recovered ... replayed=N" line), and every acknowledged message is
still there; an idempotent producer's resend across the restart is still answered from the dedup
window."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from streamingnode.client import AsyncClient
from tests.node_process import NodeProcess
from tests.waiting import until

pytestmark = pytest.mark.integration

MESSAGES = 600
EVERY = 100


def _events(lines: list[str], event: str) -> list[dict[str, Any]]:
    """The node's log lines (JSON on stderr) of ``event`` on pchannel ``p``."""
    found = []
    for line in list(lines):
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if isinstance(doc, dict) and doc.get("event") == event and doc.get("pchannel") == "p":
                found.append(doc)
    return found


async def test_a_killed_node_restarts_from_its_newest_snapshot(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path / "data", None, "--channels", "p", "--retention-seconds", "-1",
                       "--snapshot-every-messages", str(EVERY), "--snapshot-every-seconds", "0",
                       "--log-level", "debug")  # "recovery snapshot stored" is a DEBUG line
    node.start()
    try:
        async with AsyncClient(node.address, timeout=30.0) as client:
            async with client.producer("p", producer_id="prod", max_batch_messages=10) as producer:
                acked = [await producer.send("v", f"m{i}".encode()) for i in range(MESSAGES)]
            # Snapshots are taken by the node's own task (a pass a second at most), here every 100
            # messages: wait for one past half the log.
            await until(lambda: any(e["snapshot_id"] > MESSAGES // 2
                                    for e in _events(node.stderr, "recovery snapshot stored")),
                        "a snapshot past half the log", timeout=60)
        node.kill()
        node.stderr.clear()
        node.start()
        (recovered,) = _events(node.stderr, "pchannel recovered")
        replayed = recovered["replayed"]
        assert replayed < MESSAGES // 2 + EVERY  # not the whole log (MESSAGES messages and their ticks)
        async with AsyncClient(node.address, timeout=30.0) as client:
            (desc,) = await client.describe_channels(["p"])
            assert desc.first_id == 0  # retention truncated nothing: only the snapshot shortened the replay
            # The dedup window came through the snapshot: the resend of the last batch writes nothing.
            async with client.producer("p", producer_id="prod", first_sequence=MESSAGES - 1) as producer:
                again = await producer.send("v", f"m{MESSAGES - 1}".encode())
            assert again.message_id == acked[-1].message_id
            got: list[bytes] = []
            consumer = client.consumer("p", "v")
            try:
                while len(got) < MESSAGES:
                    pack = await asyncio.wait_for(consumer.__anext__(), 30)
                    got += [m.payload for m in pack.messages if m.payload.startswith(b"m")]
            finally:
                await consumer.aclose()
            assert got == [f"m{i}".encode() for i in range(MESSAGES)]
    finally:
        node.kill()
