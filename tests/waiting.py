"""Waiting on a condition with a deadline, never on a fixed amount of time.

A fixed sleep is either too short on a loaded machine (a flaky failure) or too long everywhere (a
slow suite), and it proves nothing about the event it stands for.  ``until`` polls the condition
cheaply and fails with a message that names it once the deadline passes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

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


def until_sync(condition: Callable[[], bool], what: str, *, timeout: float = DEADLINE, interval: float = 0.01) -> None:
    """``until`` for synchronous tests and threads."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
