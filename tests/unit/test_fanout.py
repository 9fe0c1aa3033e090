"""The fan-out pieces alone: the encoded-pack cache's bound, the per-turn delivery budget, joining
packs that are already in memory, the scanner's non-waiting poll, and a quiet reader's joined ticks."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from streamingnode.config import NodeConfig
from streamingnode.node.node import Node
from streamingnode.server import consume
from streamingnode.server.consume import _cut, _merge
from streamingnode.server.fanout import DeliveryTurns, EncodedPacks, PackCheck, SendingThreads, fanout_of, governed
from streamingnode.wire.packs import MESSAGE_OVERHEAD
from tests.factories import ins, tick
from tests.waiting import until_sync
from wal import WAL, WALManager
from wal.errors import InvalidArgumentError
from wal.message import Message, MessageType, Position
from wal.scanner import MsgPack


def test_the_cache_keeps_at_most_its_bytes_dropping_the_least_recently_used() -> None:
    cache = EncodedPacks(1000)
    ca, cb = PackCheck(1, 2, Position("p", 1, 2), 1, 0, 0), PackCheck(2, 3, Position("p", 2, 3), 1, 1, 1)
    x = (((b"x" * 200,), 1, 200),)
    cache.put(("a",), ca, x)
    cache.put(("b",), cb, (((b"y" * 200,), 1, 200),))
    assert cache.get(("a",)) == (ca, x)  # now "b" is the least recently used
    cache.put(("a",), cb, (((b"o" * 10,), 1, 10),))  # the first entry stands
    assert cache.get(("a",)) == (ca, x)
    for k in "cdef":
        cache.put((k,), cb, (((b"z" * 100, b"z" * 100), 1, 200),))
    assert cache.bytes <= 1000
    assert cache.get(("b",)) is None
    assert cache.get(("a",)) is not None
    cache.put(("big",), cb, (((b"w" * 501,), 1, 501),))  # over half: not kept, nothing evicted for it
    assert cache.get(("big",)) is None
    assert len(cache) == 5 and cache.bytes == 1000


@contextlib.contextmanager
def _loop_turns() -> Iterator[list[int]]:
    """[the event loop's turns so far], counted by a callback that reschedules itself (as requests
    arriving would keep the loop busy)."""
    loop = asyncio.get_running_loop()
    count = [0]

    def tick() -> None:
        count[0] += 1
        handle[0] = loop.call_soon(tick)

    handle = [loop.call_soon(tick)]
    try:
        yield count
    finally:
        handle[0].cancel()


async def test_deliveries_per_loop_turn_are_bounded() -> None:
    turns = DeliveryTurns(per_turn=8)
    passed: list[int] = []
    with _loop_turns() as turn:

        async def deliver() -> None:
            await turns.take()
            passed.append(turn[0])

        await asyncio.wait_for(asyncio.gather(*(deliver() for _ in range(100))), 30)
    per_turn = Counter(passed)
    assert sum(per_turn.values()) == 100
    assert max(per_turn.values()) <= 8
    assert len(per_turn) >= 100 // 8


def _message(i: int, size: int = 100) -> Message:
    m = Message(MessageType.DATA, "v", b"x" * size)
    m._timetick = 100 + i
    m._id = i
    return m


def _packs(sizes: list[int]) -> list[MsgPack]:
    """One pack per message, consecutive as a scanner makes them."""
    return [MsgPack(99 + i, 100 + i, [_message(i)] * (size > 0), Position("p", i, 99 + i),
                    Position("p", i + 1, 100 + i)) for i, size in enumerate(sizes)]


class _Polled:
    def __init__(self, packs: list[MsgPack], caught_up: bool = True) -> None:
        self.packs = packs
        self.caught_up = caught_up

    def poll(self) -> MsgPack | None:
        return self.packs.pop(0) if self.packs else None


def test_packs_in_memory_join_the_first_within_the_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(consume, "MERGE_CUT", 1 << 100)  # no cuts: the limits alone
    first, *rest = _packs([1, 1, 0, 1, 1, 1])
    polled = _Polled(list(rest))
    pack, following = _merge(first, polled, 4, 1 << 20)  # type: ignore[arg-type]
    # Four messages (the empty pack between joins too); the pack of the fifth is handed back.
    assert [m.message_id for m in pack.messages] == [0, 1, 3, 4]
    assert (pack.begin_ts, pack.start_position) == (first.begin_ts, first.start_position)
    assert (pack.end_ts, pack.end_position) == (rest[3].end_ts, rest[3].end_position)
    assert following is rest[4]
    assert polled.packs == []

    one = _packs([1])[0]
    size = len(one.messages[0].payload) + MESSAGE_OVERHEAD
    pack, following = _merge(one, _Polled(_packs([1, 1])[1:]), 100, 2 * size - 1)  # type: ignore[arg-type]
    assert len(pack.messages) == 1 and following is not None  # the bytes limit holds too

    # A read that has not caught up yet keeps its packs as they were made...
    first, *rest = _packs([1, 1, 1])
    assert _merge(first, _Polled(list(rest), caught_up=False), 100, 1 << 20) == (first, None)  # type: ignore[arg-type]
    # ...unless it follows another's response from the same start: then exactly as far as that went.
    for caught_up in (False, True):
        polled = _Polled(list(rest), caught_up=caught_up)
        pack, following = _merge(first, polled, 100, 1 << 20, rest[0].end_position)  # type: ignore[arg-type]
        assert [m.message_id for m in pack.messages] == [0, 1] and following is None
        assert pack.end_position == rest[0].end_position and polled.packs == rest[1:]


def test_readers_that_joined_different_packs_end_a_response_at_the_same_tick_again() -> None:
    packs = _packs([1] * 200)
    assert 10 < sum(map(_cut, packs)) < 190

    def responses(start: int, step: int) -> list[Position]:
        """Where each response ends for a reader from pack ``start`` that joins at most ``step``."""
        polled = _Polled(list(packs[start + 1:]))
        pack: MsgPack | None = packs[start]
        ends = []
        while pack is not None:
            pack, following = _merge(pack, polled, step, 1 << 20)  # type: ignore[arg-type]
            ends.append(pack.end_position)
            pack = following or polled.poll()
        return ends

    a, b = responses(0, 100), responses(1, 100)
    shared = set(a) & set(b)
    # From the first cut both reach, every cut ends a response of each: they share from there on.
    assert len(shared) >= 10
    assert min(shared, key=lambda p: p.timetick).timetick < packs[20].end_ts


async def _wal(manager: WALManager) -> WAL:
    await manager.create_channel("p")
    return await manager.open("p")


async def test_poll_hands_out_what_is_in_memory_and_never_waits(manager: WALManager) -> None:
    wal = await _wal(manager)
    scanner = wal.read()
    await wal.append_batch([ins("v", 1), tick(2)])
    first = await anext(scanner)
    assert [x.timetick for x in first.messages] == [1]
    assert scanner.poll() is None  # nothing more: None at once, not a wait
    await wal.append_batch([ins("v", 3), tick(4), ins("v", 5), tick(6)])
    polled = [scanner.poll(), scanner.poll()]
    assert [[x.timetick for x in p.messages] for p in polled if p is not None] == [[3], [5]]
    assert polled[0] is not None and polled[0].start_position == first.end_position
    assert scanner.poll() is None
    await scanner.aclose()
    assert scanner.poll() is None


def _counting() -> Callable[[], int]:
    """An ``appending`` answer that moves at every accounting: appends go on."""
    counter = itertools.count()
    return lambda: next(counter)


def test_delivery_over_its_share_is_held_until_the_share_of_the_elapsed_time_pays_it_off() -> None:
    # Loop times are given, not read: the accounting alone, whatever the machine's speed.
    turns = DeliveryTurns(share=0.25, window=0.01, appending=_counting())
    allowance = turns.share * turns.window
    assert not turns._over(0.0)  # nothing spent yet
    turns.spent(4 * allowance)  # one delivery worth four windows' share
    assert turns._over(0.001)  # within the window: no accounting, the debt stands
    assert turns._over(0.011)  # one window later: paid a window's share (allowance), three are left
    assert turns._over(0.021)
    assert not turns._over(0.05)  # four windows' share earned since: paid off
    # What is earned in an idle spell is not saved up: spending again is over at once.
    turns.spent(allowance)
    assert turns._over(0.051)


def test_without_appends_delivery_is_never_held_however_much_it_spends() -> None:
    turns = DeliveryTurns(share=0.25, window=0.01, appending=lambda: 7)  # the count never moves
    for k in range(5):
        turns.spent(1.0)
        assert not turns._over(0.02 * k)
    # And with no ``appending`` at all (a share of 1 in the node's settings).
    turns = DeliveryTurns(share=0.25, window=0.01)
    turns.spent(1.0)
    assert not turns._over(1.0)


async def test_while_appends_go_on_deliveries_wait_on_the_loop_clock() -> None:
    loop = asyncio.get_running_loop()
    window = 0.05
    turns = DeliveryTurns(per_turn=4, share=0.25, window=window, appending=_counting())
    granted: list[float] = []

    async def deliver() -> None:
        await turns.take()
        granted.append(loop.time())
        turns.spent(4 * turns.share * window)  # each delivery worth four windows of its share

    await asyncio.wait_for(asyncio.gather(*(deliver() for _ in range(12))), 60)
    assert turns.held_back > 0
    # 48 windows' share spent, at most per_turn granted before it is counted: the last grant comes
    # only once most of it is paid off at the share's rate.  A slower machine only waits longer.
    assert granted[-1] - granted[0] >= 20 * window, granted


async def test_without_appends_deliveries_go_on_every_turn() -> None:
    turns = DeliveryTurns(per_turn=4, share=0.25, window=0.002, appending=lambda: 7)
    at: list[int] = []
    with _loop_turns() as turn:

        async def deliver() -> None:
            await turns.take()
            at.append(turn[0])
            turns.spent(1.0)

        await asyncio.wait_for(asyncio.gather(*(deliver() for _ in range(12))), 30)
    assert turns.held_back == 0
    # Only the per-turn bound: a waiter is granted on the next turn and runs on the one after.
    assert max(b - a for a, b in itertools.pairwise(at)) <= 2, at


async def test_governed_counts_the_time_each_step_runs_and_passes_results_and_errors() -> None:
    turns = DeliveryTurns()
    spent: list[float] = []
    turns.spent = spent.append  # type: ignore[method-assign]

    async def steps(n: int) -> int:
        for _ in range(n):
            await asyncio.sleep(0)
        return n

    assert await governed(steps(3), turns) == 3
    assert len(spent) == 4  # one per step: three suspensions, then the return
    assert all(s >= 0 for s in spent)

    async def fails() -> None:
        await asyncio.sleep(0)
        raise ValueError("x")

    with pytest.raises(ValueError, match="x"):
        await governed(fails(), turns)
    # A cancel goes on into the coroutine, which may clean up.
    cleaned = asyncio.Event()

    async def waits() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            cleaned.set()

    task = asyncio.ensure_future(governed(waits(), turns))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned.is_set()


@pytest.mark.parametrize("share", [0, -0.5, 1.5, float("nan")])
def test_a_delivery_share_outside_0_to_1_is_refused_naming_the_setting(share: float) -> None:
    with pytest.raises(InvalidArgumentError, match="consume_delivery_share must be > 0 and <= 1"):
        NodeConfig(consume_delivery_share=share)


async def test_the_node_bounds_delivery_by_its_setting_and_a_share_of_1_bounds_nothing(tmp_path: Path) -> None:
    node = await Node.start(NodeConfig(data_dir=tmp_path / "a", flusher=False, consume_delivery_share=0.1))
    try:
        turns = fanout_of(node).turns
        assert turns.share == 0.1 and turns._appending is not None
    finally:
        await node.aclose()
    node = await Node.start(NodeConfig(data_dir=tmp_path / "b", flusher=False, consume_delivery_share=1))
    try:
        turns = fanout_of(node).turns
        turns.spent(10.0)
        assert turns._appending is None and not turns._over(asyncio.get_running_loop().time())
    finally:
        await node.aclose()


def test_grpc_threads_sending_is_charged_by_the_bytes_delivery_wrote_against_those_appended() -> None:
    cpu = [0.0]
    appended = [0]
    turns = DeliveryTurns(share=0.25, window=0.01, appending=_counting(), appended_bytes=lambda: appended[0],
                          sending=lambda now: cpu[0])
    allowance = turns.share * turns.window
    turns._over(0.0)
    # gRPC's threads used 6 windows' share while delivery wrote 3 bytes for every byte appended: 3/4 of it
    # is delivery's.
    cpu[0] += 6 * allowance
    appended[0] += 1000
    turns.sent(3000)
    assert turns._over(0.01)  # charged 4.5 windows' share, earned 1
    assert turns._over(0.03)
    assert not turns._over(0.05)  # paid off after four and a half windows
    # Time those threads spent while delivery wrote nothing is the appends' (they receive them there).
    cpu[0] += 100 * allowance
    appended[0] += 1000
    assert not turns._over(0.06)


def test_sending_threads_are_found_by_name_and_their_cpu_time_counted() -> None:
    named = threading.Event()
    stop = threading.Event()
    tid: list[int] = []

    def worker() -> None:
        tid.append(threading.get_native_id())
        # What gRPC's threads are called; a thread may name itself through /proc (Linux).
        with open(f"/proc/self/task/{tid[0]}/comm", "w") as f:
            f.write("event_engine")
        named.set()
        while not stop.is_set():
            sum(range(1000))  # busy: CPU time to count

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    try:
        assert named.wait(10)
        threads = SendingThreads()
        first = threads.cpu(0.0)
        until_sync(lambda: threads.cpu(0.5) - first >= 0.05, "the named thread's CPU time counted")
        assert tid[0] in threads._clocks
        # This thread (not so named) is not counted.
        assert threading.get_native_id() not in threads._clocks
    finally:
        stop.set()
        thread.join(10)
    # A thread that ended is dropped; what was counted stays.  (join returns a moment before the
    # thread is gone from the kernel's list.)
    until_sync(lambda: str(tid[0]) not in os.listdir("/proc/self/task"), "the thread gone from /proc")
    total = threads.total
    assert threads.cpu(0.6) >= total and tid[0] not in threads._clocks


class _Ticks:
    """A scanner's stand-in: the packs given, then StopAsyncIteration."""

    def __init__(self, packs: list[MsgPack]) -> None:
        self.packs = iter(packs)
        self.taken = 0

    def __aiter__(self) -> _Ticks:
        return self

    async def __anext__(self) -> MsgPack:
        self.taken += 1
        try:
            return next(self.packs)
        except StopIteration:
            raise StopAsyncIteration from None


def _tick_pack(begin_ms: int, end_ms: int, messages: list[Message] | None = None) -> MsgPack:
    from wal.clock import compose  # noqa: PLC0415

    return MsgPack(compose(begin_ms), compose(end_ms), messages or [], Position("p", begin_ms, compose(begin_ms)),
                   Position("p", end_ms, compose(end_ms)))


async def test_a_quiet_readers_empty_packs_join_until_a_boundary_of_the_interval_or_a_message() -> None:
    from streamingnode.server.consume import _quiet  # noqa: PLC0415

    # Ticks at 1010, 1050, 1099 ms stay within [1000, 1100): joined; 1120 crosses 1100: sent from 1000.
    ticks = _Ticks([_tick_pack(1010, 1050), _tick_pack(1050, 1099), _tick_pack(1099, 1120), _tick_pack(1120, 1130)])
    got = await _quiet(_tick_pack(1000, 1010), ticks, 100)  # type: ignore[arg-type]
    whole = _tick_pack(1000, 1120)
    assert (got.begin_ts, got.end_ts, got.messages) == (whole.begin_ts, whole.end_ts, [])
    assert (got.start_position, got.end_position) == (whole.start_position, whole.end_position)
    assert ticks.taken == 3
    # A pack with messages ends the joining at once, and keeps the held start.
    m = ins("v", 5)
    ticks = _Ticks([_tick_pack(1210, 1220, [m])])
    got = await _quiet(_tick_pack(1200, 1210), ticks, 100)  # type: ignore[arg-type]
    assert got.messages == [m] and got.start_position == _tick_pack(1200, 1210).start_position
    assert got.end_position == _tick_pack(1210, 1220).end_position
    # A pack that crosses a boundary by itself is sent as it is.
    ticks = _Ticks([])
    alone = _tick_pack(1290, 1300)
    assert await _quiet(alone, ticks, 100) is alone  # type: ignore[arg-type]
    assert ticks.taken == 0


@pytest.mark.parametrize("seconds", [-1.0, 3601.0])
def test_the_quiet_pack_interval_is_checked(seconds: float) -> None:
    with pytest.raises(InvalidArgumentError, match="consume_quiet_pack_seconds must be >= 0 and <= 3600"):
        NodeConfig(consume_quiet_pack_seconds=seconds)


def test_a_thread_id_taken_by_another_thread_is_dropped_not_counted_backwards(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A fake task list holding one "event_engine" thread: this thread's id, so that its clock exists.
    tid = threading.get_native_id()
    (tmp_path / str(tid)).mkdir()
    (tmp_path / str(tid) / "comm").write_text("event_engine\n")
    readings = iter([5.0, 5.0, 7.0, 1.0])  # found, read at once, later, then a new thread's (the id reused)
    monkeypatch.setattr(time, "clock_gettime", lambda clock: next(readings))
    threads = SendingThreads(str(tmp_path))
    assert threads.cpu(0.0) == 0.0  # counted from when it was found
    assert threads.cpu(0.1) == 2.0
    assert threads.cpu(0.2) == 2.0 and tid not in threads._clocks
