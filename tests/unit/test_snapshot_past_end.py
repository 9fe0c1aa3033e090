"""A recovery snapshot whose id lies past the end of the log is passed over, loudly.

A snapshot holds the state after every message below its id.  One past the end of the log (a copy of
another pchannel's meta, a restore of the log without its metas, a bug in whoever wrote it) describes
messages this log never had: imported, recovery would replay nothing after it and serve a state
missing everything written since the last good snapshot.  It is passed over like a damaged one, with a
warning that names its slot, for the one before it.  A snapshot exactly at the end (taken with nothing
written after it) is valid.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
import structlog

from interceptors.recovery.snapshot import (
    PERIODIC_METAS,
    SNAPSHOT_META,
    RecoverySnapshot,
    newest_snapshot,
    store_snapshot,
    stored_snapshots,
)
from streamingnode.node.retention import ChannelRetention, RetentionConfig
from tests.reopening import BY_HAND, SCHEMA, Opened
from tests.waiting import persisted_tick
from wal import Message, MessageType, WALManager, bodies
from wal.wal import WAL

T = TypeVar("T")


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Opened]:
    n = Opened(tmp_path / "db")
    await n.open()
    yield n
    await n.close()


async def _bare(path: Path, body: Callable[[WAL], Awaitable[T]]) -> T:
    """Run ``body(wal)`` on the bare WAL of pchannel ``p`` (no chain: nothing is appended meanwhile)."""
    manager = await WALManager.start_rocksdb(path)
    try:
        wal = await manager.open("p")
        try:
            return await body(wal)
        finally:
            await wal.aclose()
    finally:
        await manager.aclose()


async def test_recovery_passes_over_a_snapshot_past_the_end_for_the_one_before(node: Opened) -> None:
    swal = node.swal
    assert swal is not None
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    older = await ChannelRetention(swal, None, None, BY_HAND).snapshot(force=True)
    assert older is not None
    # Written after the good snapshot: only a replay from it brings these back.
    await swal.append(bodies.create_collection("v", "d", SCHEMA, "pk"))
    for i in range(5):
        await swal.append(Message(MessageType.DATA, "v", f"m{i}".encode()))
    [good_slot] = [n for n, s in (await stored_snapshots(swal.wal)).items() if s.message_id == older.message_id]
    [forged_slot] = [n for n in PERIODIC_METAS if n != good_slot]
    await node.close()

    async def forge(wal: WAL) -> int:
        end = wal.next_id
        # Well formed, checksummed and holding valid state: only its id is wrong.
        await store_snapshot(wal, RecoverySnapshot(end + 40, older.steps), forged_slot)
        return end

    end = await _bare(node.path, forge)
    with structlog.testing.capture_logs() as logs:
        swal = await node.open()
    warned = [e for e in logs if e["log_level"] == "warning" and e.get("snapshot") == forged_slot]
    assert warned, f"no warning named the snapshot past the end: {logs}"
    assert "past the end" in warned[0]["error"]
    assert swal.recovery_replayed == end - older.message_id  # from the good one, to the end
    assert {"c", "d"} <= set(swal.shard.collections("v"))
    # What recovery keeps as its own snapshot lies within the log too.
    assert swal.recovered_snapshot is not None and swal.recovered_snapshot.message_id <= swal.wal.next_id


async def test_at_the_end_is_valid_one_past_it_is_not(tmp_path: Path) -> None:
    opened = Opened(tmp_path / "db")
    swal = await opened.open()
    for i in range(3):
        await swal.append(Message(MessageType.DATA, "v", f"m{i}".encode()))
    await opened.close()

    async def check(wal: WAL) -> None:
        end = wal.next_id
        await store_snapshot(wal, RecoverySnapshot(end, {}), PERIODIC_METAS[0])
        await store_snapshot(wal, RecoverySnapshot(end + 1, {}), PERIODIC_METAS[1])
        with structlog.testing.capture_logs() as logs:
            found = await stored_snapshots(wal)
            newest = await newest_snapshot(wal)
        assert {n: s.message_id for n, s in found.items()} == {PERIODIC_METAS[0]: end}
        assert newest is not None and newest[0] == PERIODIC_METAS[0]
        warned = [e for e in logs if e["log_level"] == "warning" and e.get("snapshot") == PERIODIC_METAS[1]]
        assert warned and f"past the end of the log ({end})" in warned[0]["error"]

    await _bare(opened.path, check)


@pytest.mark.parametrize("periodic", [True, False], ids=["periodic-snapshots", "no-periodic-snapshots"])
async def test_retention_cuts_nothing_at_a_truncation_snapshot_past_the_end_and_says_why(
    node: Opened, periodic: bool
) -> None:
    """The truncation snapshot is the state at the first retained id: one past the end cannot be, and
    retention truncates nothing while it stays (as with a damaged one), with a warning that names it
    at each check instead of holding the log back without a word."""
    swal = node.swal
    assert swal is not None
    for i in range(20):
        await swal.append(Message(MessageType.DATA, "v", f"m{i}".encode()))
    await persisted_tick(swal)
    config = RetentionConfig(retention_seconds=0, check_seconds=3600) if periodic else RetentionConfig(
        retention_seconds=0, check_seconds=3600, snapshot_every_messages=0, snapshot_every_seconds=0)
    retention = ChannelRetention(swal, None, None, config)
    bound, _ = await retention.bound()
    assert bound > swal.wal.first_id  # without the snapshot, this check would truncate
    await store_snapshot(swal.wal, RecoverySnapshot(swal.wal.next_id + 40, {}), SNAPSHOT_META)
    with structlog.testing.capture_logs() as logs:
        assert await retention.check() is None
    assert swal.wal.first_id == 0
    warned = [e for e in logs if e["log_level"] == "warning" and e.get("snapshot") == SNAPSHOT_META]
    assert warned and "past the end" in warned[0]["error"], logs
