"""A write the backend answers UNAVAILABLE is held and written again *exactly as it was*: the same
requests in the same blocks, even when more appends arrived meanwhile.  A backend that cannot tell
whether the first attempt landed (JetStream, after a lost answer) recognises a stored block by its
bytes; a retried write that merged newer appends into it would look like someone else's block."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest

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
    first = asyncio.ensure_future(wal.append(_data(b"first")))
    while not backend.refused.is_set():  # the first attempt was refused: the write is held now
        await asyncio.sleep(0)
    later = [asyncio.ensure_future(wal.append(_data(b"later %d" % i))) for i in range(5)]
    results = await asyncio.wait_for(asyncio.gather(first, *later), 30)
    assert backend.attempts[1] == backend.attempts[0], "the held write was merged with later appends"
    ids = [r.message_id for r in results]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert [mm.payload for mm in await wal.read_stored(ids[0])][:6] == [b"first"] + [b"later %d" % i for i in range(5)]
