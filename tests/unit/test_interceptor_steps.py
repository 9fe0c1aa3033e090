"""The small steps of the chain on their own: clock, ack manager, lock, redo, dedup, chain builder."""

from __future__ import annotations

import asyncio

import pytest

from interceptors.chain import SAMPLE_EVERY, build_chain
from interceptors.dedup import PROP_PRODUCER, PROP_SEQUENCE, DedupInterceptor
from interceptors.lock import LockInterceptor, RWLock
from interceptors.redo import RedoInterceptor
from interceptors.timetick.ack import AckManager
from tests.factories import ins
from tests.waiting import loop_turns, until
from wal import AppendResult, Message, MessageType, OutOfRangeError, StreamingError
from wal.adaptor import append_deadline
from wal.clock import HybridClock, compose, physical_ms
from wal.errors import ChannelFencedError, ErrorCode, InvalidArgumentError


class FakeNext:
    """A terminal append: records batches, hands out increasing ids, can fail or block."""

    def __init__(self) -> None:
        self.batches: list[list[Message]] = []
        self.next_id = 0
        self.fail_with: list[BaseException] = []
        self.gate: asyncio.Event | None = None
        self.arrived: list[list[Message]] = []  # every batch that reached this step, gate or not

    async def __call__(self, batch: list[Message]) -> list[AppendResult]:
        self.arrived.append(batch)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_with:
            raise self.fail_with.pop(0)
        self.batches.append(list(batch))
        out = [AppendResult(self.next_id + i, m.timetick, None) for i, m in enumerate(batch)]
        self.next_id += len(batch)
        return out


# --- clock -----------------------------------------------------------------------------------------
async def test_clock_is_strictly_increasing_even_when_the_wall_goes_back() -> None:
    wall = [1000]
    stored: list[int] = []

    async def persist(end: int) -> None:
        stored.append(end)

    clock = HybridClock(0, 0, persist, window_ms=50, wall_ms=lambda: wall[0])
    a = await clock.allocate(3)
    assert physical_ms(a) == 1000
    wall[0] = 900  # the wall clock jumps back
    b = await clock.allocate(1)
    assert b == a + 3
    assert stored and stored[-1] > b


async def test_clock_never_reuses_a_timestamp_after_restart() -> None:
    stored: list[int] = []

    async def persist(end: int) -> None:
        stored.append(end)

    clock = HybridClock(0, 0, persist, window_ms=1000, wall_ms=lambda: 5000)
    seen = [await clock.allocate(1) for _ in range(10)]
    # Restart with the same wall time: allocation resumes above the persisted window end.
    window = stored[-1]
    again = HybridClock(seen[-1] + 1, window, persist, window_ms=1000, wall_ms=lambda: 5000)
    nxt = await again.allocate(1)
    assert nxt >= window > seen[-1]


async def test_clock_extends_the_window_before_allocating_past_it() -> None:
    stored: list[int] = []

    async def persist(end: int) -> None:
        stored.append(end)

    wall = [0]
    clock = HybridClock(0, 0, persist, window_ms=10, wall_ms=lambda: wall[0])
    for ms in range(0, 100, 7):
        wall[0] = ms
        ts = await clock.allocate(1)
        assert ts < stored[-1]  # never handed out beyond what is durable
    assert len(stored) > 3


# --- ack manager -----------------------------------------------------------------------------------
async def test_ack_manager_confirms_in_allocation_order() -> None:
    next_id = [10]
    acks = AckManager(lambda: next_id[0])
    a, b, c = acks.register(1), acks.register(2), acks.register(3)
    acks.finish(b, 10)  # b lands first, at id 10
    next_id[0] = 11
    assert acks.confirmed_ts == 0
    assert acks.last_confirmed_id() == 10  # b's id is below next id: readers must start there
    acks.finish(a, 11)
    next_id[0] = 12
    assert acks.confirmed_ts == 2
    waiter = asyncio.create_task(acks.wait_first(c))
    await asyncio.sleep(0)
    assert waiter.done()
    acks.finish(c, None)
    assert acks.confirmed_ts == 3 and acks.inflight == 0 and acks.last_confirmed_id() == 12


# --- lock ------------------------------------------------------------------------------------------
async def test_rwlock_shares_readers_and_is_fair_to_writers() -> None:
    lock = RWLock()
    order: list[str] = []
    await lock.acquire(False)
    w = asyncio.create_task(lock.acquire(True))
    await asyncio.sleep(0)
    r2 = asyncio.create_task(lock.acquire(False))  # arrives after the writer: must wait behind it
    await asyncio.sleep(0)
    assert not w.done() and not r2.done()
    w.add_done_callback(lambda _: order.append("w"))
    r2.add_done_callback(lambda _: order.append("r2"))
    lock.release(False)
    await until(w.done, "the writer takes the lock")
    await loop_turns()  # a reader let in beside the writer would be done by now
    assert order == ["w"]
    lock.release(True)
    await until(r2.done, "the reader takes the lock after the writer")
    assert order == ["w", "r2"]
    lock.release(False)
    assert lock.idle


async def test_rwlock_cancelled_waiter_leaves_no_trace() -> None:
    lock = RWLock()
    await lock.acquire(True)
    waiter = asyncio.create_task(lock.acquire(True))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    lock.release(True)
    assert lock.idle


async def test_lock_serialises_ddl_against_dml_and_reports_exclusive() -> None:
    exclusives: list[tuple[str, MessageType]] = []
    step = LockInterceptor(on_exclusive=lambda v, m: exclusives.append((v, m.message_type)))
    nxt = FakeNext()
    nxt.gate = asyncio.Event()
    dml = asyncio.create_task(step.do_append([ins("v", 1)], nxt))
    await asyncio.sleep(0)
    ddl = asyncio.create_task(step.do_append([Message(MessageType.CREATE_COLLECTION, "v")], nxt))
    other = asyncio.create_task(step.do_append([ins("w", 2)], nxt))  # another vchannel is not blocked
    # The insert on "w", started after the DDL, reaching the next step shows the DDL had its turn.
    await until(lambda: len(nxt.arrived) == 2, "the DML on v and the insert on w at the next step")
    await loop_turns()
    assert exclusives == [] and not ddl.done()  # the DDL still waits for the DML on "v"
    nxt.gate.set()
    await asyncio.gather(dml, ddl, other)
    assert exclusives == [("v", MessageType.CREATE_COLLECTION)]
    assert all(lock.idle for lock in step._locks.values())  # nothing left held


async def test_broadcast_is_exclusive_over_every_vchannel() -> None:
    step = LockInterceptor()
    nxt = FakeNext()
    nxt.gate = asyncio.Event()
    held = asyncio.create_task(step.do_append([ins("a", 1)], nxt))
    await until(lambda: len(nxt.arrived) == 1, "the insert on a at the next step")
    bcast = asyncio.create_task(step.do_append([ins("", 2)], nxt))
    await loop_turns()
    assert not bcast.done() and len(nxt.arrived) == 1  # the broadcast waits for the lock on "a"
    nxt.gate.set()
    await asyncio.gather(held, bcast)
    assert [b[0].vchannel for b in nxt.batches] == ["a", ""]


# --- redo ------------------------------------------------------------------------------------------
async def test_redo_retries_transient_failures_only() -> None:
    step = RedoInterceptor(initial_backoff=0.001)
    nxt = FakeNext()
    nxt.fail_with = [StreamingError("busy", code=ErrorCode.UNAVAILABLE)] * 2
    results = await step.do_append([ins("v", 1)], nxt)
    assert results[0].message_id == 0 and step.redos == 2
    nxt.fail_with = [ChannelFencedError("fenced")]
    with pytest.raises(ChannelFencedError):
        await step.do_append([ins("v", 2)], nxt)
    nxt.fail_with = [InvalidArgumentError("bad")]
    with pytest.raises(InvalidArgumentError):
        await step.do_append([ins("v", 3)], nxt)
    # Retriable for the client, which backs off; not worth holding the append here for seconds.
    nxt.fail_with = [StreamingError("disk full", code=ErrorCode.STORAGE_FULL)] * 10_000
    with pytest.raises(StreamingError, match="disk full"):
        await step.do_append([ins("v", 4)], nxt)
    assert step.redos == 2  # none of them was retried


async def test_redo_stops_at_the_callers_deadline() -> None:
    step = RedoInterceptor(initial_backoff=0.01, max_seconds=30)
    nxt = FakeNext()
    nxt.fail_with = [StreamingError("busy", code=ErrorCode.UNAVAILABLE)] * 10_000
    loop = asyncio.get_running_loop()
    token = append_deadline.set(loop.time() + 0.2)
    start = loop.time()
    try:
        with pytest.raises(StreamingError, match="busy"):
            await step.do_append([ins("v", 1)], nxt)
    finally:
        append_deadline.reset(token)
    assert loop.time() - start < 2.0


# --- dedup -----------------------------------------------------------------------------------------
def _pmsg(pid: str, seq: int, ts: int = 1) -> Message:
    return ins("v", ts, f"{pid}:{seq}".encode(), **{PROP_PRODUCER: pid, PROP_SEQUENCE: str(seq)})


async def test_dedup_returns_original_results_and_writes_nothing() -> None:
    step = DedupInterceptor(window=4)
    nxt = FakeNext()
    first = await step.do_append([_pmsg("p", 0), _pmsg("p", 1), ins("v", 9)], nxt)
    again = await step.do_append([_pmsg("p", 0), _pmsg("p", 1), _pmsg("p", 2)], nxt)
    assert again[:2] == first[:2]
    assert [m.payload for m in nxt.batches[1]] == [b"p:2"]  # only the new one was written


async def test_dedup_waits_for_an_inflight_original() -> None:
    step = DedupInterceptor()
    nxt = FakeNext()
    nxt.gate = asyncio.Event()
    original = asyncio.create_task(step.do_append([_pmsg("p", 5)], nxt))
    await asyncio.sleep(0)
    retry = asyncio.create_task(step.do_append([_pmsg("p", 5)], nxt))
    await asyncio.sleep(0)
    nxt.gate.set()
    assert await original == await retry
    assert len(nxt.batches) == 1


async def test_dedup_window_is_bounded_and_old_sequences_refused() -> None:
    step = DedupInterceptor(window=3)
    nxt = FakeNext()
    for seq in range(10):
        await step.do_append([_pmsg("p", seq)], nxt)
    assert len(step._producers["p"].results) == 3
    with pytest.raises(OutOfRangeError, match="older than the dedup window"):
        await step.do_append([_pmsg("p", 2)], nxt)
    with pytest.raises(InvalidArgumentError, match="non-negative integer"):
        await step.do_append([ins("v", 1, **{PROP_PRODUCER: "p", PROP_SEQUENCE: "x"})], nxt)
    with pytest.raises(InvalidArgumentError, match="twice in one batch"):
        await step.do_append([_pmsg("q", 1), _pmsg("q", 1)], nxt)
    assert len(nxt.batches) == 10


async def test_dedup_replay_restores_the_window() -> None:
    step = DedupInterceptor()
    nxt = FakeNext()
    await step.do_append([_pmsg("p", 0), _pmsg("p", 1)], nxt)
    stored = [m for b in nxt.batches for m in b]
    for i, m in enumerate(stored):
        m._seal(i)
    fresh = DedupInterceptor()
    fresh.replay(stored)
    again = await fresh.do_append([_pmsg("p", 1)], nxt)
    assert again[0].message_id == 1 and len(nxt.batches) == 1


# --- chain builder ---------------------------------------------------------------------------------
class _Clock:
    """The chain's ``time.perf_counter`` in these tests: it moves only when a step works."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr("interceptors.chain.time.perf_counter", fake)
    return fake


class _Working:
    """A step that works ``cost`` seconds of the fake clock before passing the batch on."""

    def __init__(self, name: str, cost: float, clock: _Clock) -> None:
        self.name = name
        self.cost = cost
        self.clock = clock
        self.closed = False

    async def do_append(self, batch: list[Message], append_next):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0)
        self.clock.now += self.cost
        return await append_next(batch)

    async def close(self) -> None:
        self.closed = True


async def test_chain_times_each_step_on_its_own(clock: _Clock) -> None:
    outer, inner = _Working("outer", 0.0, clock), _Working("inner", 0.05, clock)
    chain = build_chain([outer, inner], FakeNext())
    await chain.append([ins("v", 1), ins("v", 2)])
    t_outer, t_inner = chain.timings
    assert (t_outer.name, t_inner.name) == ("outer", "inner")
    assert t_inner.seconds == pytest.approx(0.05) and t_outer.seconds == pytest.approx(0.0)  # not the outer's
    assert (t_inner.batches, t_inner.messages) == (1, 2)
    await chain.close()
    assert outer.closed and inner.closed


async def test_chain_times_one_batch_in_sample_every_and_counts_every_batch(clock: _Clock) -> None:
    step = _Working("inner", 0.01, clock)
    chain = build_chain([step], FakeNext())
    totals = []
    for k in range(SAMPLE_EVERY + 1):
        await chain.append([ins("v", k), ins("v", k + 100)])
        totals.append(chain.timings[0].seconds)
    t = chain.timings[0]
    assert (t.batches, t.messages) == (SAMPLE_EVERY + 1, 2 * (SAMPLE_EVERY + 1))
    assert totals == sorted(totals)  # a counter: never goes back
    # The first batch is timed, then the 17th, which also counts for the 15 untimed ones before it.
    assert totals[0] == pytest.approx(0.01) and totals[-2] == totals[0]
    assert totals[-1] == pytest.approx(0.01 * (SAMPLE_EVERY + 1))
    await chain.close()


def test_compose_and_physical() -> None:
    assert physical_ms(compose(1234, 7)) == 1234


async def test_clock_extends_ahead_so_allocation_does_not_wait() -> None:
    stored: list[int] = []

    async def persist(end: int) -> None:
        stored.append(end)

    wall = [1000]
    clock = HybridClock(0, 0, persist, window_ms=100, wall_ms=lambda: wall[0])
    await clock.allocate(1)
    wall[0] = 1060  # more than half the window used
    assert clock.wants_extension()
    await clock.extend_ahead()
    assert stored[-1] >= compose(1060 + 100)
    assert clock.try_allocate(1) is not None  # no wait needed
    assert not clock.wants_extension()


async def test_lock_table_stays_bounded_over_many_vchannels() -> None:
    step = LockInterceptor()
    nxt = FakeNext()
    for i in range(5000):
        await step.do_append([ins(f"v{i}", 1)], nxt)
    assert len(step._locks) <= 4097


# --- arrival order ---------------------------------------------------------------------------------
async def test_rwlock_a_later_reader_does_not_overtake_a_granted_waiter() -> None:
    lock = RWLock()
    order: list[str] = []
    await lock.acquire(True)

    async def reader(name: str) -> None:
        await lock.acquire(False)
        order.append(name)

    first = asyncio.create_task(reader("first"))
    await asyncio.sleep(0)  # waits behind the writer
    lock.release(True)  # grants it; it has not run yet
    await reader("later")  # the uncontended path, in this task
    await first
    assert order == ["first", "later"]


class _FakeWAL:
    pchannel = "p"
    next_id = 0
    last_timetick = 0

    async def get_meta(self, name: str) -> bytes | None:
        return None

    async def put_meta(self, name: str, value: bytes) -> None:
        return None


async def test_batches_waiting_for_a_new_clock_window_keep_their_order() -> None:
    from interceptors.timetick.interceptor import TimeTickInterceptor  # noqa: PLC0415

    tt = TimeTickInterceptor(_FakeWAL(), interval=60, window_ms=10, wall_ms=lambda: 1000)  # type: ignore[arg-type]
    await tt.start()
    gate = asyncio.Event()
    persist = tt.clock._persist

    async def slow_persist(end: int) -> None:
        await gate.wait()
        await persist(end)

    tt.clock._persist = slow_persist
    try:
        extender = asyncio.create_task(tt.clock.extend_ahead())  # holds the window lock, persisting
        await asyncio.sleep(0)
        early, late = Message(MessageType.DATA, "v", b"1"), Message(MessageType.DATA, "v", b"2")
        first = asyncio.create_task(tt._allocate([early]))
        for _ in range(3):
            await asyncio.sleep(0)  # the window is used up: it waits for the extension
        gate.set()
        # Created before the extension finishes, so it runs after the window is extended but
        # before the waiting batch resumes: it must still come second.
        second = asyncio.create_task(tt._allocate([late]))
        await asyncio.gather(extender, first, second)
        assert 0 < early.timetick < late.timetick
    finally:
        gate.set()
        await tt.close()


class _GatedWAL(_FakeWAL):
    """A WAL whose persisted ticks are written only when ``gate`` opens (or fail with ``fail``)."""

    prompt_readers = 0
    tick_wanted = None

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.writing = asyncio.Event()
        self.fail: BaseException | None = None
        self.ticks: list[Message] = []

    async def append_batch(self, batch: list[Message]) -> list[AppendResult]:
        self.writing.set()
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        self.ticks.extend(batch)
        return [AppendResult(0, m.timetick, None) for m in batch]


async def test_data_finished_while_a_persisted_tick_is_written_is_still_dirty() -> None:
    # The tick covers what finished before it was allocated, not what finishes while it is written:
    # a lone append can complete inside its caller's turn, before the tick's task resumes, and a
    # flag cleared after the write dropped it (no persisted tick followed it until the next data).
    from interceptors.timetick.interceptor import TimeTickInterceptor  # noqa: PLC0415

    wal = _GatedWAL()
    tt = TimeTickInterceptor(wal, interval=3600)  # type: ignore[arg-type]
    await tt.start()
    try:
        await tt.do_append([ins("v", 0, b"before")], FakeNext())
        assert tt._dirty
        wal.gate.set()
        await asyncio.wait_for(tt.emit_tick(persist=True), 10)
        assert not tt._dirty, "a persisted tick covers what finished before it"
        await tt.do_append([ins("v", 0, b"before")], FakeNext())
        wal.gate, wal.writing = asyncio.Event(), asyncio.Event()
        tick = asyncio.create_task(tt.emit_tick(persist=True))
        await asyncio.wait_for(wal.writing.wait(), 10)
        await tt.do_append([ins("v", 0, b"during")], FakeNext())
        wal.gate.set()
        await asyncio.wait_for(tick, 10)
        assert len(wal.ticks) == 2
        assert tt._dirty, "the append that finished during the tick's write must get a persisted tick"
        # A failed tick leaves what it would have covered dirty.
        wal.gate, wal.writing, wal.fail = asyncio.Event(), asyncio.Event(), OSError("disk gone")
        tt._dirty = True
        wal.gate.set()
        with pytest.raises(OSError, match="disk gone"):
            await asyncio.wait_for(tt.emit_tick(persist=True), 10)
        assert tt._dirty
    finally:
        wal.gate.set()
        await tt.close()
