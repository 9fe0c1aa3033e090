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


class _DownUntilToldUp(MemoryBackend):
    """Refuses every data write with UNAVAILABLE until ``up`` is set; the first refusal waits for the
    test to queue more appends behind it."""

    def __init__(self) -> None:
        super().__init__()
        self.first = threading.Event()
        self.queued = threading.Event()
        self.up = threading.Event()

    def write(self, groups: list[WriteGroup], durable: bool) -> None:
        if not self.up.is_set():
            if not self.first.is_set():
                self.first.set()
                self.queued.wait(30)
            raise UnavailableError("injected: the backend is down")
        super().write(groups, durable)


async def test_appends_queued_behind_a_write_whose_hold_ran_out_fail_with_it_and_never_overtake_it() -> None:
    """A held write that is given up fails, and so does every append of the same pchannel queued
    behind it: written once the backend is back, they would be stored after one that failed, so a
    producer's batches would land out of order (with a gap). Another pchannel's appends are not
    touched: they are held in their turn and stored once the backend is back."""
    backend = _DownUntilToldUp()
    m = await WALManager.start(backend)
    try:
        await m.create_channel("p")
        await m.create_channel("q")
        wal, other = await m.open("p"), await m.open("q")
        m._committer.hold_unavailable_seconds = 0.3
        m._committer.inline_max_seconds = m._committer.inline_idle_max_seconds = -1.0
        first = asyncio.ensure_future(wal.append(_data(b"first")))
        await until(backend.first.is_set, "the first attempt under way")
        later = [asyncio.ensure_future(wal.append(_data(b"later %d" % i))) for i in range(3)]
        elsewhere = asyncio.ensure_future(other.append(_data(b"elsewhere")))
        await until(lambda: len(m._committer._queue) == 4, "the later appends queued behind it")
        backend.queued.set()
        with pytest.raises(UnavailableError):
            await asyncio.wait_for(first, 30)
        backend.up.set()  # back, the moment the first append was given up
        outcomes = await asyncio.wait_for(asyncio.gather(*later, return_exceptions=True), 30)
        assert all(isinstance(o, UnavailableError) for o in outcomes), outcomes
        assert (await asyncio.wait_for(elsewhere, 30)).message_id is not None
        stored = [mm.payload for mm in await other.read_stored(0)]
        assert b"elsewhere" in stored
        assert wal.next_id == wal.first_id == 0  # nothing of p's stored: none overtook the given-up append
    finally:
        await m.aclose()
