"""A write the backend answers UNAVAILABLE is held and written again *exactly as it was*: the same
requests in the same blocks, even when more appends arrived meanwhile.  A backend that cannot tell
whether the first attempt landed (JetStream, after a lost answer) recognises a stored block by its
bytes; a retried write that merged newer appends into it would look like someone else's block."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest

from tests.waiting import until
from wal import Message, MessageType, WALManager
from wal.backend import WriteGroup
from wal.backends.memory import MemoryBackend
from wal.errors import UnavailableError


class _OnceUnavailable(MemoryBackend):
    """Refuses its first data write with UNAVAILABLE (nothing stored) and records every attempt."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts: list[list[bytes]] = []
        self.refused = threading.Event()
        self.release = threading.Event()

    def write(self, groups: list[WriteGroup], durable: bool) -> None:
        self.attempts.append([g.block for g in groups])
        if len(self.attempts) == 1:
            self.refused.set()
            # Answered once the test has queued more appends (on the writer thread: the loop goes on).
            self.release.wait(30)
            raise UnavailableError("injected: the backend is unavailable for a moment")
        super().write(groups, durable)


@pytest.fixture
async def manager() -> AsyncIterator[tuple[WALManager, _OnceUnavailable]]:
    backend = _OnceUnavailable()
    m = await WALManager.start(backend)
    try:
        yield m, backend
    finally:
        await m.aclose()


def _data(payload: bytes) -> Message:
    m = Message(MessageType.DATA, "v", payload)
    m._timetick = 1
    return m


async def test_a_held_write_is_written_again_with_the_same_blocks_whatever_arrived_meanwhile(
        manager: tuple[WALManager, _OnceUnavailable]) -> None:
    m, backend = manager
    await m.create_channel("p")
    wal = await m.open("p")
    backend.attempts.clear()
    m._committer.hold_unavailable_seconds = 30.0
    # On the writer thread, never inside submit or on the loop: the refused attempt then waits for the
    # later appends to be queued, so that its retry could merge them (what it must not do).
    m._committer.inline_max_seconds = m._committer.inline_idle_max_seconds = -1.0
    first = asyncio.ensure_future(wal.append(_data(b"first")))
    await until(backend.refused.is_set, "the first attempt under way")
    later = [asyncio.ensure_future(wal.append(_data(b"later %d" % i))) for i in range(5)]
    await until(lambda: len(m._committer._queue) == 5, "the later appends queued behind it")
    backend.release.set()  # refused now: the write is held, and written again
    results = await asyncio.wait_for(asyncio.gather(first, *later), 30)
    assert backend.attempts[1] == backend.attempts[0], "the held write was merged with later appends"
    ids = [r.message_id for r in results]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert [mm.payload for mm in await wal.read_stored(ids[0])][:6] == [b"first"] + [b"later %d" % i for i in range(5)]
