"""The trimmer behind large requests: one trim for a burst, after it; one more for drops during a trim;
and a trim even while drops never stop (the longest wait)."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest

from streamingnode.node import memory_trim
from streamingnode.node.memory_trim import Trimmer
from tests.waiting import until


async def test_a_burst_of_drops_is_one_trim(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(memory_trim, "trim", lambda: calls.append(1) or True)
    trimmer = Trimmer(delay=0.01)
    for _ in range(12):
        trimmer.soon()
    await until(lambda: trimmer.trims == 1, "the burst's trim")
    assert calls == [1]
    trimmer.soon()
    await until(lambda: trimmer.trims == 2, "a later drop's trim")


async def test_a_drop_during_a_trim_asks_for_one_more(monkeypatch: pytest.MonkeyPatch) -> None:
    running, release = threading.Event(), threading.Event()

    def slow_trim() -> bool:
        running.set()
        release.wait(30)
        return True

    monkeypatch.setattr(memory_trim, "trim", slow_trim)
    trimmer = Trimmer(delay=0.0)
    trimmer.soon()
    await asyncio.to_thread(running.wait, 30)
    trimmer.soon()
    trimmer.soon()  # both join the one trim that follows
    release.set()
    await until(lambda: trimmer.trims == 2, "the trim asked for during the first")
    await asyncio.sleep(0)
    assert trimmer.trims == 2


async def test_drops_that_never_stop_still_trim(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(memory_trim, "trim", lambda: calls.append(1) or True)
    trimmer = Trimmer(delay=2.0, longest=0.1)

    async def drop_forever() -> None:
        while True:
            trimmer.soon()
            await asyncio.sleep(0.002)  # always well within ``delay`` of the last drop

    dropping = asyncio.get_running_loop().create_task(drop_forever())
    try:
        await until(lambda: trimmer.trims >= 2, "trims while the drops go on")
    finally:
        dropping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await dropping


def test_trim_runs_here() -> None:
    assert memory_trim.trim()  # glibc on this platform
