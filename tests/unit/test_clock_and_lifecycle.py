"""The hybrid timestamp's one home (wal.clock) and the one way to stop a task (wal.tasks)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from wal.clock import LOGICAL_BITS, LOGICAL_MAX, TIMETICK_MAX, compose, physical_ms, txn_expired, wall_ms, wall_ts
from wal.tasks import cancel_and_wait


def test_layout_is_physical_ms_shifted_by_18() -> None:
    assert LOGICAL_BITS == 18
    assert compose(1, 0) == 1 << 18
    assert compose(5, LOGICAL_MAX) == (6 << 18) - 1
    assert physical_ms(compose(1_700_000_000_000, 12345)) == 1_700_000_000_000
    assert physical_ms(TIMETICK_MAX) == (2**63 - 1) >> 18


def test_wall_ts_is_the_start_of_a_wall_millisecond() -> None:
    before = wall_ms()
    ts = wall_ts()
    assert ts & LOGICAL_MAX == 0
    assert before <= physical_ms(ts) <= wall_ms()


@pytest.mark.parametrize(
    ("keepalive_ms", "idle_ms", "expired"),
    [(100, 100, False), (100, 101, True), (0, 10**9, False), (-1, 10**9, False), (1, 2, True)],
)
def test_txn_expiry_counts_whole_physical_milliseconds(keepalive_ms: int, idle_ms: int, expired: bool) -> None:
    last = compose(1_000, 7)
    # The logical part never matters: only physical milliseconds of idleness do.
    assert txn_expired(keepalive_ms, last, compose(1_000 + idle_ms, 0)) is expired
    assert txn_expired(keepalive_ms, last, compose(1_000 + idle_ms, LOGICAL_MAX)) is expired


def test_writer_and_reader_use_the_one_rule() -> None:
    # Both sides import the same function object: they cannot drift apart.
    from interceptors.txn import claim, session  # noqa: PLC0415
    from wal import scanner  # noqa: PLC0415

    assert session.txn_expired is txn_expired
    assert claim.txn_expired is txn_expired
    assert scanner.txn_expired is txn_expired


async def test_cancel_and_wait_stops_the_task() -> None:
    started = asyncio.Event()
    stopped = asyncio.Event()

    async def worker() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()

    task = asyncio.get_running_loop().create_task(worker())
    await asyncio.wait_for(started.wait(), 10)
    await asyncio.wait_for(cancel_and_wait(task), 10)
    assert stopped.is_set() and task.cancelled()
    await cancel_and_wait(None)
    await cancel_and_wait(task)  # already finished: nothing to do


async def test_cancel_and_wait_raises_the_tasks_own_error() -> None:
    async def fails() -> None:
        raise ValueError("boom")

    task = asyncio.get_running_loop().create_task(fails())
    await asyncio.wait([task], timeout=10)
    with pytest.raises(ValueError, match="boom"):
        await cancel_and_wait(task)


async def test_cancel_and_wait_never_swallows_the_callers_cancellation() -> None:
    """The owner is cancelled while it waits for a slow-stopping task: the owner must end cancelled
    (the old ``suppress(CancelledError)`` pattern let it carry on as if nothing happened)."""
    cleanup_started = asyncio.Event()
    release = asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleanup_started.set()
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()

    carried_on = asyncio.Event()

    async def owner(task: asyncio.Task[None]) -> None:
        await cancel_and_wait(task)
        carried_on.set()

    loop = asyncio.get_running_loop()
    child = loop.create_task(slow_to_stop())
    await asyncio.sleep(0)  # let the child reach its wait
    parent = loop.create_task(owner(child))
    await asyncio.wait_for(cleanup_started.wait(), 10)
    parent.cancel()
    release.set()
    done, _ = await asyncio.wait([parent], timeout=10)
    assert done, "the owner never finished"
    assert parent.cancelled(), "the owner's own cancellation was swallowed"
    assert not carried_on.is_set()


async def test_cleanup_after_the_callers_cancellation_still_waits() -> None:
    """An owner unwinding from its own cancellation stops its helpers in ``finally`` and goes on
    with the rest of its cleanup (the CLI prints its summary there)."""
    started = asyncio.Event()
    cleaned_up = asyncio.Event()

    async def helper() -> None:
        await asyncio.Event().wait()

    async def owner() -> None:
        child = asyncio.get_running_loop().create_task(helper())
        try:
            started.set()
            await asyncio.Event().wait()
        finally:
            await cancel_and_wait(child)
            assert child.cancelled()
            cleaned_up.set()

    task = asyncio.get_running_loop().create_task(owner())
    await asyncio.wait_for(started.wait(), 10)
    task.cancel()
    await asyncio.wait([task], timeout=10)
    assert task.cancelled()
    assert cleaned_up.is_set(), "cleanup after cancel_and_wait never ran"
