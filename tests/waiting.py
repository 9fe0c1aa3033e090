"""Waiting on a condition with a deadline, never on a fixed amount of time.

A fixed sleep is either too short on a loaded machine (a flaky failure) or too long everywhere (a
slow suite), and it proves nothing about the event it stands for.  ``until`` polls the condition
cheaply and fails with a message that names it once the deadline passes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from interceptors.recovery.streaming_wal import StreamingWAL
    from wal.backend import TickEntry

DEADLINE = 10.0
"""Seconds: generous on a loaded 2-core machine, where the conditions waited on take milliseconds."""


async def until(
    condition: Callable[[], bool | Awaitable[bool]], what: str, *, timeout: float = DEADLINE, interval: float = 0.005,
) -> None:
    """Return as soon as ``condition()`` is true (it may be a coroutine function); fail after ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)


async def loop_turns(turns: int = 50) -> None:
    """Let the event loop go round ``turns`` times, without waiting on the clock.

    The bounded wait on something that must *not* happen, for code that runs on this loop alone (no
    threads, no I/O): a task woken now runs within a turn, and whatever it wakes in the next, so a
    wrong wake-up shows within a few turns however slow the machine is.  Wait first for the later
    event that proves the code under test got that far (``until``), then give it these turns.
    """
    for _ in range(turns):
        await asyncio.sleep(0)


def until_sync(condition: Callable[[], bool], what: str, *, timeout: float = DEADLINE, interval: float = 0.01) -> None:
    """``until`` for synchronous tests and threads."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


async def persisted_tick(swal: StreamingWAL, *, timeout: float = DEADLINE) -> TickEntry:
    """Wait until a TimeTick is persisted after everything written so far; return its time-index entry.

    What reads by time (retention's time bound, ``DeliverPolicy.start_at_time``) sees only persisted
    ticks.  They are persisted every tick interval while data comes in, and appends can all land
    before the first."""
    last = swal.wal.next_id - 1
    backend, key = swal.wal._manager.backend, swal.wal._channel_key
    found: list[TickEntry] = []

    def ticked() -> bool:
        entry = backend.seek_time(key, 2**63 - 1)
        if entry is None or entry.message_id < last:
            return False
        found.append(entry)
        return True

    await until(ticked, f"a persisted TimeTick after id {last}", timeout=timeout)
    return found[-1]


async def ticks_pass(swal: StreamingWAL, n: int, *, timeout: float = DEADLINE) -> None:
    """Wait until ``n`` more TimeTicks were emitted (persisted or not)."""
    seen = [swal.timetick.last_tick]

    def counted() -> bool:
        if swal.timetick.last_tick != seen[-1]:
            seen.append(swal.timetick.last_tick)
        return len(seen) > n

    await until(counted, f"{n} TimeTicks", timeout=timeout, interval=0.001)
