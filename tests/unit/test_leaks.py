"""The leak check blames the test that left a task past its loop, not the next test's setup."""

from __future__ import annotations

import asyncio

from tests import leaks


def _leave_a_task_past_its_loop() -> None:
    """What a NATS connection never closed leaves: a pending task whose loop is closed, whose
    coroutine, when the collector closes it, awaits again in its ``finally``."""
    loop = asyncio.new_event_loop()

    async def reader() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0)  # a client's cleanup reaching for its loop

    async def start() -> None:
        asyncio.get_running_loop().create_task(reader())
        await asyncio.sleep(0)

    loop.run_until_complete(start())
    loop.close()


def test_a_finalizer_exception_is_returned_by_collect() -> None:
    leaks.collect()  # whatever came before is not this test's
    _leave_a_task_past_its_loop()
    found = leaks.collect()
    assert any("reader" in f and "GeneratorExit" in f for f in found), found


def test_nothing_left_collects_to_nothing() -> None:
    leaks.collect()
    assert leaks.collect() == []
