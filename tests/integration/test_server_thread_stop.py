"""``ServerThread.stop`` ends every task still on its loop before it closes the loop.

A task left pending when its loop closes is destroyed later by the garbage collector, and its cleanup
then reaches for the closed loop ("Event loop is closed", raised in whatever runs next).  A NATS client
whose close failed half way (its servers gone at the node's stop) leaves its subscriptions' readers so.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from streamingnode.server import ServerThread
from tests import leaks
from tests.integration.conftest import node_config


async def _leave_a_reader(ended: threading.Event) -> None:
    """Start a task that waits for ever, as a subscription's reader does, and return at once."""

    async def reader() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.set()
            await asyncio.sleep(0)  # its cleanup uses the loop, as a queue's getter does

    asyncio.get_running_loop().create_task(reader(), name="left-behind reader")
    await asyncio.sleep(0)


def test_stop_ends_the_tasks_left_on_the_loop(tmp_path: Path) -> None:
    leaks.collect()  # what came before is not this test's
    ended = threading.Event()
    srv = ServerThread(node_config(tmp_path / "data", flusher=False)).start()
    try:
        srv.run(_leave_a_reader(ended))
        assert not ended.is_set()
    finally:
        srv.stop()
    assert ended.is_set(), "the task left on the loop was not ended by the stop"
    assert leaks.collect() == []
