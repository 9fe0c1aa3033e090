"""The group committer on a backend that pipelines its writes (``Backend.pipelined``: JetStream).

Commit N+1 is started while N's store is unconfirmed; each is acknowledged only once its own store is
confirmed, in commit order.  A store that failed for one pchannel fails that pchannel's appends in
it and in every later write in flight, hands their ids back once, and leaves the other pchannels'
appends acknowledged; the next append of the failed pchannel takes the ids from where the stored
ones end, with no id given twice.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator

import pytest

from tests.waiting import loop_turns, until
from wal import Message, MessageType, WALManager
from wal.backend import WriteGroup
from wal.backends.memory import MemoryBackend
from wal.errors import ChannelFencedError, ErrorCode, StreamingError, UnavailableError


class _Pipelined(MemoryBackend):
    """Each started write is stored only when the test settles it, with the failures it names."""

    pipelined = True

    def __init__(self) -> None:
        super().__init__()
        self.started: list[tuple[list[WriteGroup], concurrent.futures.Future[dict[int, BaseException]]]] = []

    def start_write(self, groups: list[WriteGroup]) -> concurrent.futures.Future[dict[int, BaseException]]:
        future: concurrent.futures.Future[dict[int, BaseException]] = concurrent.futures.Future()
        self.started.append((groups, future))
        return future

    def settle(self, index: int, failed: dict[int, BaseException] | None = None) -> None:
        groups, future = self.started[index]
        failed = failed or {}
        stored = [g for g in groups if g.channel_key not in failed]
        if stored:
            MemoryBackend.write(self, stored, True)
        future.set_result(failed)

    def keys(self, index: int) -> set[int]:
        return {g.channel_key for g in self.started[index][0]}


@pytest.fixture
async def manager() -> AsyncIterator[tuple[WALManager, _Pipelined]]:
    backend = _Pipelined()
    m = await WALManager.start(backend)
    try:
        yield m, backend
    finally:
        for _, future in backend.started:  # nothing may wait forever on an unsettled store
            if not future.done():
                future.set_result({})
        await m.aclose()


def _data(payload: bytes) -> Message:
    m = Message(MessageType.DATA, "v", payload)
    m._timetick = 1
    return m


def _appends(wal: object, *payloads: bytes) -> list[asyncio.Future[object]]:
    return [asyncio.ensure_future(wal.append(_data(p))) for p in payloads]  # type: ignore[attr-defined]


async def test_the_next_write_starts_before_the_store_of_the_previous_is_confirmed_and_acks_keep_order(
        manager: tuple[WALManager, _Pipelined]) -> None:
    m, backend = manager
    await m.create_channel("p")
    await m.create_channel("q")
    p, q = await m.open("p"), await m.open("q")
    first = _appends(p, b"a1", b"a2")  # two requests: not a lone append, so the pipelined path
    await until(lambda: len(backend.started) == 1, "the first write started")
    second = _appends(q, b"b1")
    await until(lambda: len(backend.started) == 2, "the second write started while the first is unconfirmed")
    assert not any(f.done() for f in first + second), "an append was acknowledged before its store"
    # Another pchannel's store may be confirmed first; its appends still wait for the earlier commit.
    backend.settle(1)
    # The settled store's completion reaches the loop at once: a wrong acknowledgement follows in these turns.
    await loop_turns()
    assert not any(f.done() for f in first + second), "acknowledged out of commit order"
    backend.settle(0)
    results = await asyncio.wait_for(asyncio.gather(*first, *second), 30)
    assert [r.message_id for r in results] == [0, 1, 0]  # type: ignore[attr-defined]
    assert [x.payload for x in await p.read_stored(0)] == [b"a1", b"a2"]
    assert [x.payload for x in await q.read_stored(0)] == [b"b1"]


async def test_a_failed_store_fails_that_pchannels_appends_in_it_and_in_later_writes_and_ids_stay_unique(
        manager: tuple[WALManager, _Pipelined]) -> None:
    m, backend = manager
    await m.create_channel("p")
    await m.create_channel("q")
    p, q = await m.open("p"), await m.open("q")
    p_key = p._channel_key
    base = p._next_alloc
    first_p, first_q = _appends(p, b"p1"), _appends(q, b"q1")
    await until(lambda: len(backend.started) == 1 and len(backend.keys(0)) == 2, "a write of both pchannels")
    second_p, second_q = _appends(p, b"p2"), _appends(q, b"q2")
    await until(lambda: len(backend.started) == 2, "the second write started")
    backend.settle(0, {p_key: ChannelFencedError("injected: fenced", channel="p")})
    # p's appends of both writes fail now, with the backend's error; q's first is acknowledged.
    for f in first_p + second_p:
        with pytest.raises(StreamingError) as err:
            await asyncio.wait_for(f, 30)
        assert err.value.code is ErrorCode.CHANNEL_FENCED
    assert (await asyncio.wait_for(first_q[0], 30)).message_id is not None  # type: ignore[attr-defined]
    # A longer append of p starts again where p's stored ids end, while the second write is in flight.
    again = _appends(p, b"r1", b"r2", b"r3")
    await until(lambda: len(backend.started) == 3, "the rewrite of p started")
    backend.settle(1, {p_key: UnavailableError("injected: follows a failed write")})
    backend.settle(2)
    stored = [await asyncio.wait_for(f, 30) for f in again + second_q]
    later = _appends(p, b"s1", b"s2")
    await until(lambda: len(backend.started) == 4, "the last write started")
    backend.settle(3)
    stored += [await asyncio.wait_for(f, 30) for f in later]
    ids = [r.message_id for r in stored[:3] + stored[4:]]  # type: ignore[attr-defined]
    assert ids == list(range(base, base + 5)), f"ids of p not dense and unique: {ids}"
    assert [x.payload for x in await p.read_stored(base)] == [b"r1", b"r2", b"r3", b"s1", b"s2"]


async def test_an_unavailable_store_is_not_retried_one_by_one_by_the_redo_step(
        manager: tuple[WALManager, _Pipelined]) -> None:
    m, backend = manager
    await m.create_channel("p")
    wal = await m.open("p")
    appends = _appends(wal, b"a1", b"a2")
    await until(lambda: len(backend.started) == 1, "the write started")
    backend.settle(0, {wal._channel_key: UnavailableError("injected: the window ran out")})
    for f in appends:
        with pytest.raises(StreamingError) as err:
            await asyncio.wait_for(f, 30)
        assert err.value.code is ErrorCode.UNAVAILABLE
        assert err.value.held_seconds is not None  # the redo step passes it through (in order or not at all)
        assert "held_seconds" not in err.value.fields  # an attribute of the node's, never sent to a client


async def test_a_store_that_never_answers_fails_its_appends_after_the_store_timeout(
        manager: tuple[WALManager, _Pipelined]) -> None:
    m, _ = manager
    await m.create_channel("p")
    wal = await m.open("p")
    m._committer.store_timeout = 0.2
    appends = _appends(wal, b"a1", b"a2")
    for f in appends:
        with pytest.raises(StreamingError) as err:
            await asyncio.wait_for(f, 30)
        assert err.value.code is ErrorCode.UNRECOVERABLE
        assert "did not answer" in str(err.value)
