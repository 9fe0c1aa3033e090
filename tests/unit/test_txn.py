"""The txn step: sessions, validation, commit waiting for bodies, expiry on timestamps, recovery."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from interceptors.base import Interceptor, RecoverableInterceptor
from interceptors.chain import build_chain
from interceptors.txn import TxnInterceptor, TxnManager, TxnSession, TxnState, commit_message, rollback_message
from tests.factories import PHYS, flat, packs_until
from wal import (
    WAL,
    AppendResult,
    InvalidArgumentError,
    Message,
    MessageType,
    StreamingError,
    TxnContext,
    WALManager,
    decode_block,
    new_time_tick,
)
from wal.backends import MemoryBackend
from wal.errors import ErrorCode, InvalidTxnStateError, TxnExpiredError, TxnNotFoundError

# --- harness -------------------------------------------------------------------------------------


class Clock:
    """Hands out strictly increasing hybrid timestamps, as the timetick step would."""

    def __init__(self, ms: int = 1000) -> None:
        self.ms = ms
        self.logical = 0

    def ts(self) -> int:
        self.logical += 1
        return self.ms * PHYS + self.logical

    def advance(self, ms: int) -> None:
        self.ms += ms
        self.logical = 0


class FakeNext:
    """The rest of the chain: records batches, gives ids in order; can fail or block a call."""

    def __init__(self) -> None:
        self.batches: list[list[Message]] = []
        self.next_id = 0
        self.fail: BaseException | None = None
        self.gates: list[tuple[asyncio.Event, BaseException | None]] = []
        self.calls = 0

    def block_next(self, fail: BaseException | None = None) -> asyncio.Event:
        """The next call waits for the returned event (then fails with ``fail`` if given)."""
        ev = asyncio.Event()
        self.gates.append((ev, fail))
        return ev

    @property
    def log(self) -> list[Message]:
        return [m for b in self.batches for m in b]

    async def __call__(self, batch: list[Message]) -> list[AppendResult]:
        self.calls += 1
        fail = None
        if self.gates:
            gate, fail = self.gates.pop(0)
            await gate.wait()
        if fail is None:
            fail, self.fail = self.fail, None
        if fail is not None:
            raise fail
        out = []
        for m in batch:
            m._seal(self.next_id)
            out.append(AppendResult(self.next_id, m.timetick, m.txn.txn_id if m.txn else None))
            self.next_id += 1
        self.batches.append(list(batch))
        return out


class Harness:
    def __init__(self) -> None:
        self.clock = Clock()
        self.fake = FakeNext()
        self.mgr = TxnManager()
        self.icpt = TxnInterceptor(self.mgr)

    def stamp(self, msgs: list[Message]) -> list[Message]:
        for m in msgs:
            m.with_timetick(self.clock.ts())
        return msgs

    async def append(self, *msgs: Message) -> list[AppendResult]:
        return await self.icpt.do_append(self.stamp(list(msgs)), self.fake)

    def task(self, *msgs: Message) -> asyncio.Task[list[AppendResult]]:
        batch = self.stamp(list(msgs))
        return asyncio.ensure_future(self.icpt.do_append(batch, self.fake))

    async def begin(self, vchannel: str = "v", keepalive_ms: int = 0) -> TxnContext:
        msg = self.mgr.begin_message(vchannel, keepalive_ms)
        await self.append(msg)
        assert msg.txn is not None
        return msg.txn

    def session(self, ctx: TxnContext) -> TxnSession:
        s = self.mgr.get(ctx.txn_id)
        assert s is not None
        return s


def body(ctx: TxnContext, vchannel: str = "v", payload: bytes = b"row") -> Message:
    return Message(MessageType.INSERT, vchannel, payload, txn=ctx)


def commit(ctx: TxnContext, vchannel: str = "v") -> Message:
    return Message(MessageType.COMMIT_TXN, vchannel, txn=ctx)


def rollback(ctx: TxnContext, vchannel: str = "v") -> Message:
    return Message(MessageType.ROLLBACK_TXN, vchannel, txn=ctx)


def plain(vchannel: str = "v", payload: bytes = b"p") -> Message:
    return Message(MessageType.INSERT, vchannel, payload)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


# --- the happy paths -----------------------------------------------------------------------------


async def test_plain_batches_pass_through_untouched() -> None:
    h = Harness()
    res = await h.append(plain(), plain("w"))
    assert [r.message_id for r in res] == [0, 1]
    assert h.mgr.open_sessions() == []


async def test_is_a_recoverable_interceptor_and_runs_in_a_chain() -> None:
    h = Harness()
    assert isinstance(h.icpt, Interceptor)
    assert isinstance(h.icpt, RecoverableInterceptor)
    chain = build_chain([h.icpt], h.fake)
    ctx = h.mgr.begin("v", 0)
    msgs = h.stamp([Message(MessageType.BEGIN_TXN, "v", txn=ctx), body(ctx), commit(ctx)])
    res = await chain.append(msgs)
    assert [r.txn_id for r in res] == [ctx.txn_id] * 3
    assert chain.timings[0].name == "txn"
    assert h.session(ctx).state is TxnState.COMMITTED


async def test_begin_bodies_commit_across_batches() -> None:
    h = Harness()
    ctx = await h.begin(keepalive_ms=100)
    s = h.session(ctx)
    assert (s.state, s.begin_id, s.vchannel, s.keepalive_ms) == (TxnState.IN_FLIGHT, 0, "v", 100)
    assert h.mgr.min_open_begin_id() == 0
    assert h.mgr.open_sessions() == [s]
    await h.append(body(ctx))
    h.clock.advance(50)
    r = await h.append(body(ctx), plain())
    assert s.last_ts == r[0].timetick and s.inflight == 0
    h.clock.advance(100)  # exactly keepalive_ms idle: still alive (expiry needs more than that)
    await h.append(commit(ctx))
    assert s.state is TxnState.COMMITTED
    assert h.mgr.open_sessions() == [] and h.mgr.min_open_begin_id() is None
    assert [m.message_type for m in h.fake.log] == [
        MessageType.BEGIN_TXN, MessageType.INSERT, MessageType.INSERT, MessageType.INSERT, MessageType.COMMIT_TXN]


async def test_one_batch_mixes_transactions_and_plain_messages() -> None:
    h = Harness()
    b = await h.begin("w")
    a_begin = h.mgr.begin_message("v", 0)
    assert a_begin.txn is not None
    a = a_begin.txn
    c = await h.begin("v")
    res = await h.append(plain(), a_begin, body(a), body(b, "w"), commit(a), rollback(c), plain("w"))
    assert [r.txn_id for r in res] == [None, a.txn_id, a.txn_id, b.txn_id, a.txn_id, c.txn_id, None]
    sa = h.session(a)
    assert (sa.state, sa.begin_id) == (TxnState.COMMITTED, res[1].message_id)
    assert h.session(b).state is TxnState.IN_FLIGHT and h.session(b).last_ts == res[3].timetick
    assert h.session(c).state is TxnState.ROLLED_BACK
    assert [s.txn_id for s in h.mgr.open_sessions()] == [b.txn_id]


async def test_txn_ids_increase_and_begin_needs_an_allocated_id() -> None:
    h = Harness()
    ids = [h.mgr.begin("v", 0).txn_id for _ in range(3)]
    assert ids == sorted(ids) and len(set(ids)) == 3
    with pytest.raises(TxnNotFoundError):
        await h.append(Message(MessageType.BEGIN_TXN, "v", txn=TxnContext(999, 0)))
    with pytest.raises(InvalidArgumentError):  # the allocation was for vchannel "v"
        await h.append(Message(MessageType.BEGIN_TXN, "w", txn=TxnContext(ids[0], 0)))
    with pytest.raises(InvalidArgumentError):
        h.mgr.begin("", 0)
    with pytest.raises(InvalidArgumentError):
        h.mgr.begin("v", -1)
    ctx = await h.begin()
    with pytest.raises(InvalidTxnStateError):
        await h.append(Message(MessageType.BEGIN_TXN, "v", txn=ctx))
    assert h.fake.calls == 1


# --- every error, and nothing written ------------------------------------------------------------


async def _refused(h: Harness, exc: type[StreamingError], *msgs: Message, match: str | None = None) -> StreamingError:
    calls = h.fake.calls
    with pytest.raises(exc, match=match) as info:
        await h.append(*msgs)
    assert h.fake.calls == calls, "nothing may reach the rest of the chain"
    return info.value


async def test_not_found() -> None:
    h = Harness()
    await _refused(h, TxnNotFoundError, body(TxnContext(42, 0)))
    await _refused(h, TxnNotFoundError, commit(TxnContext(42, 0)))
    await _refused(h, TxnNotFoundError, rollback(TxnContext(42, 0)))
    pending = h.mgr.begin("v", 0)  # allocated, BeginTxn not written
    err = await _refused(h, TxnNotFoundError, body(pending), match="has not begun")
    assert err.code is ErrorCode.TXN_NOT_FOUND and err.fields["txn_id"] == pending.txn_id


async def test_expired_on_message_timestamps() -> None:
    h = Harness()
    ctx = await h.begin(keepalive_ms=10)
    h.clock.advance(10)
    await h.append(body(ctx))  # idle exactly 10 ms: fine, and it moves the clock of the session
    h.clock.advance(11)
    await _refused(h, TxnExpiredError, body(ctx))
    assert h.session(ctx).state is TxnState.EXPIRED
    h.clock.advance(-30)  # even a message stamped earlier: the session is expired for good
    await _refused(h, TxnExpiredError, body(ctx))
    await _refused(h, TxnExpiredError, commit(ctx))
    never = await h.begin(keepalive_ms=0)
    h.clock.advance(10**6)
    await h.append(body(never), commit(never))


async def test_committed_and_rolled_back_refuse_everything() -> None:
    h = Harness()
    done = await h.begin()
    await h.append(commit(done))
    for m in (body(done), commit(done), rollback(done)):
        await _refused(h, InvalidTxnStateError, m, match="committed")
    gone = await h.begin()
    await h.append(rollback(gone))
    for m in (body(gone), commit(gone), rollback(gone)):
        await _refused(h, InvalidTxnStateError, m, match="rolled back")


async def test_failed_by_fail_vchannel_names_the_reason() -> None:
    h = Harness()
    a, other = await h.begin("v"), await h.begin("w")
    failed = h.mgr.fail_vchannel("v", "DROP_COLLECTION on vchannel 'v'")
    assert [s.txn_id for s in failed] == [a.txn_id]
    s = h.session(a)
    assert s.state is TxnState.ROLLED_BACK and s.failure is not None
    err = await _refused(h, InvalidTxnStateError, body(a), match="DROP_COLLECTION")
    assert err.fields["reason"] == s.failure
    await _refused(h, InvalidTxnStateError, commit(a), match="DROP_COLLECTION")
    await h.append(body(other, "w"), commit(other, "w"))
    # The lock step's callback: a broadcast fails every vchannel.
    x, y = await h.begin("v"), await h.begin("w")
    h.mgr.on_exclusive("", Message(MessageType.MANUAL_FLUSH, ""))
    assert h.session(x).state is h.session(y).state is TxnState.ROLLED_BACK


async def test_wrong_vchannel_and_malformed_messages() -> None:
    h = Harness()
    ctx = await h.begin("v")
    await _refused(h, InvalidArgumentError, body(ctx, "w"))
    await _refused(h, InvalidArgumentError, commit(ctx, "w"))
    await _refused(h, InvalidArgumentError, rollback(ctx, "w"))
    await _refused(h, InvalidArgumentError, Message(MessageType.COMMIT_TXN, "v"))  # framing without context
    await _refused(h, InvalidArgumentError, Message(MessageType.CREATE_COLLECTION, "v", txn=ctx))
    assert h.session(ctx).state is TxnState.IN_FLIGHT


async def test_all_or_nothing_batch() -> None:
    h = Harness()
    ctx = await h.begin()
    s = h.session(ctx)
    last = s.last_ts
    new_begin = h.mgr.begin_message("v", 0)
    assert new_begin.txn is not None
    # Valid messages first, then an invalid one: nothing written, nothing claimed.
    await _refused(h, TxnNotFoundError, plain(), new_begin, body(ctx), commit(ctx), body(TxnContext(99, 0)))
    assert (s.state, s.last_ts, s.inflight) == (TxnState.IN_FLIGHT, last, 0)
    assert h.mgr.get(new_begin.txn.txn_id) is None
    # The same transaction refuses a body after its commit inside one batch.
    await _refused(h, InvalidTxnStateError, commit(ctx), body(ctx))
    await _refused(h, InvalidTxnStateError, rollback(ctx), rollback(ctx))
    # And everything still works afterwards, including the BeginTxn that was refused with its batch.
    retry = Message(MessageType.BEGIN_TXN, "v", txn=new_begin.txn)
    await h.append(retry, body(new_begin.txn), body(ctx), commit(ctx))
    assert s.state is TxnState.COMMITTED and h.session(new_begin.txn).state is TxnState.IN_FLIGHT


# --- commit and bodies in flight -----------------------------------------------------------------


async def test_commit_waits_for_the_body_in_flight_and_refuses_later_bodies() -> None:
    h = Harness()
    ctx = await h.begin()
    gate = h.fake.block_next()
    body_task = h.task(body(ctx, payload=b"slow"))
    await settle()
    assert h.session(ctx).inflight == 1
    commit_task = h.task(commit(ctx))
    await settle()
    assert not commit_task.done() and h.session(ctx).state is TxnState.ON_COMMIT
    assert h.fake.calls == 2  # the BeginTxn and the blocked body: the commit has not gone down the chain
    await _refused(h, InvalidTxnStateError, body(ctx), match="being committed")
    await _refused(h, InvalidTxnStateError, commit(ctx), match="being committed")
    await _refused(h, InvalidTxnStateError, rollback(ctx), match="being committed")
    h.mgr.expire(h.clock.ts() + 10**9 * PHYS)  # a commit in progress is not expired under it
    gate.set()
    await asyncio.wait_for(asyncio.gather(body_task, commit_task), 1)
    assert [m.payload for m in h.fake.log[1:]] == [b"slow", b""]  # the body is written before the commit
    assert h.session(ctx).state is TxnState.COMMITTED


async def test_commit_fails_when_the_body_it_waits_for_fails() -> None:
    h = Harness()
    ctx = await h.begin()
    gate = h.fake.block_next(fail=StreamingError("disk gone", code=ErrorCode.UNAVAILABLE))
    body_task = h.task(body(ctx))
    await settle()
    commit_task = h.task(commit(ctx))
    await settle()
    gate.set()
    with pytest.raises(StreamingError, match="disk gone"):
        await asyncio.wait_for(body_task, 1)
    with pytest.raises(InvalidTxnStateError, match="body"):
        await asyncio.wait_for(commit_task, 1)
    s = h.session(ctx)
    assert (s.state, s.inflight) == (TxnState.IN_FLIGHT, 0)  # the client decides: resend, then commit
    await h.append(body(ctx), commit(ctx))
    assert s.state is TxnState.COMMITTED


async def test_commit_stamped_before_a_body_in_flight_is_refused() -> None:
    h = Harness()
    ctx = await h.begin()
    early = h.clock.ts()  # the commit got its timestamp first but arrives here second
    gate = h.fake.block_next()
    body_task = h.task(body(ctx))
    await settle()
    with pytest.raises(InvalidTxnStateError, match="not after"):
        await asyncio.wait_for(h.icpt.do_append([commit(ctx).with_timetick(early)], h.fake), 1)
    assert h.session(ctx).state is TxnState.IN_FLIGHT
    gate.set()
    await asyncio.wait_for(body_task, 1)
    await h.append(commit(ctx))
    assert h.session(ctx).state is TxnState.COMMITTED


async def test_fail_vchannel_fails_a_waiting_commit() -> None:
    h = Harness()
    ctx = await h.begin()
    gate = h.fake.block_next()
    body_task = h.task(body(ctx))
    await settle()
    commit_task = h.task(commit(ctx))
    await settle()
    h.mgr.fail_vchannel("v", "CREATE_PARTITION")
    with pytest.raises(InvalidTxnStateError, match="CREATE_PARTITION"):
        await asyncio.wait_for(commit_task, 1)
    gate.set()
    await asyncio.wait_for(body_task, 1)
    assert h.session(ctx).state is TxnState.ROLLED_BACK


async def test_a_commit_being_written_is_not_failed_under_it() -> None:
    h = Harness()
    ctx = await h.begin()
    gate = h.fake.block_next()
    commit_task = h.task(commit(ctx))
    await settle()
    assert h.mgr.fail_vchannel("v", "DROP_COLLECTION") == []  # its commit is already going down
    gate.set()
    await asyncio.wait_for(commit_task, 1)
    assert h.session(ctx).state is TxnState.COMMITTED


async def test_a_begin_being_written_cannot_be_sent_twice() -> None:
    h = Harness()
    ctx = h.mgr.begin("v", 0)
    gate = h.fake.block_next()
    first = h.task(Message(MessageType.BEGIN_TXN, "v", txn=ctx))
    await settle()
    await _refused(h, InvalidTxnStateError, Message(MessageType.BEGIN_TXN, "v", txn=ctx), match="being written")
    await _refused(h, TxnNotFoundError, body(ctx), match="not begun")  # not begun until it is durable
    gate.set()
    await asyncio.wait_for(first, 1)
    await h.append(body(ctx), commit(ctx))


async def test_cancelled_commit_releases_its_claim() -> None:
    h = Harness()
    ctx = await h.begin()
    gate = h.fake.block_next()
    body_task = h.task(body(ctx))
    await settle()
    commit_task = h.task(commit(ctx))
    await settle()
    commit_task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await commit_task
    assert h.session(ctx).state is TxnState.IN_FLIGHT
    gate.set()
    await asyncio.wait_for(body_task, 1)
    await h.append(commit(ctx))


async def test_failed_writes_can_be_retried() -> None:
    h = Harness()
    begin = h.mgr.begin_message("v", 0)
    assert begin.txn is not None
    ctx = begin.txn
    batch = h.stamp([begin, body(ctx)])
    h.fake.fail = StreamingError("try again", code=ErrorCode.UNAVAILABLE)
    with pytest.raises(StreamingError):
        await h.icpt.do_append(batch, h.fake)
    assert h.mgr.get(ctx.txn_id) is None
    await h.icpt.do_append(batch, h.fake)  # what redo does: the same batch, the same timestamps
    c = h.stamp([commit(ctx)])
    h.fake.fail = StreamingError("try again", code=ErrorCode.UNAVAILABLE)
    with pytest.raises(StreamingError):
        await h.icpt.do_append(c, h.fake)
    assert h.session(ctx).state is TxnState.IN_FLIGHT
    await h.icpt.do_append(c, h.fake)
    assert h.session(ctx).state is TxnState.COMMITTED


# --- expiry, closing rollbacks -------------------------------------------------------------------


async def test_expire_marks_idle_sessions_only() -> None:
    h = Harness()
    short, long_, forever = await h.begin(keepalive_ms=5), await h.begin(keepalive_ms=50), await h.begin()
    first_begin = h.session(short).begin_id
    assert h.mgr.min_open_begin_id() == first_begin
    h.clock.advance(5)  # idle exactly keepalive_ms: not yet
    assert h.mgr.expire(h.clock.ts()) == []
    h.clock.advance(1)
    assert [s.txn_id for s in h.mgr.expire(h.clock.ts())] == [short.txn_id]
    assert h.mgr.expire(h.clock.ts()) == []
    assert h.mgr.min_open_begin_id() == h.session(long_).begin_id
    h.clock.advance(100)
    assert [s.txn_id for s in h.mgr.expire(h.clock.ts())] == [long_.txn_id]
    assert [s.txn_id for s in h.mgr.open_sessions()] == [forever.txn_id]
    await _refused(h, TxnExpiredError, body(short))
    await _refused(h, TxnExpiredError, commit(long_))


async def test_expire_leaves_a_session_with_a_body_in_flight() -> None:
    h = Harness()
    ctx = await h.begin(keepalive_ms=5)
    h.clock.advance(5)
    gate = h.fake.block_next()
    task = h.task(body(ctx))
    await settle()
    h.clock.advance(3)  # idle 8 ms since the BeginTxn, but the body in flight is 3 ms old
    assert h.mgr.expire(h.clock.ts()) == []
    gate.set()
    await asyncio.wait_for(task, 1)
    await h.append(commit(ctx))
    assert h.session(ctx).state is TxnState.COMMITTED


async def test_expired_or_failed_session_takes_one_closing_rollback() -> None:
    h = Harness()
    exp = await h.begin(keepalive_ms=1)
    h.clock.advance(2)
    h.mgr.expire(h.clock.ts())
    await h.append(rollback(exp))
    s = h.session(exp)
    assert s.state is TxnState.EXPIRED and s.rollback_written
    await _refused(h, InvalidTxnStateError, rollback(exp))
    await _refused(h, TxnExpiredError, body(exp))
    bad = await h.begin("w")
    h.mgr.fail_vchannel("w", "DROP_PARTITION")
    await h.append(rollback(bad, "w"))
    await _refused(h, InvalidTxnStateError, rollback(bad, "w"))
    await _refused(h, InvalidTxnStateError, commit(bad, "w"), match="DROP_PARTITION")


# --- recovery ------------------------------------------------------------------------------------


def _reopen(log: list[Message], chunk: int = 3) -> TxnInterceptor:
    icpt = TxnInterceptor(TxnManager())
    for i in range(0, len(log), chunk):
        icpt.replay(log[i : i + chunk])
    return icpt


async def test_replay_rebuilds_sessions_and_orphans_are_expired() -> None:
    h = Harness()
    done, gone, open_ = await h.begin(), await h.begin(), await h.begin("w", keepalive_ms=1000)
    await h.append(body(done), commit(done), rollback(gone), body(open_, "w"))
    icpt = _reopen(h.fake.log)
    await icpt.recovered()
    mgr = icpt.manager
    assert mgr.next_txn_id == open_.txn_id + 1
    assert mgr.get(done.txn_id).state is TxnState.COMMITTED  # type: ignore[union-attr]
    assert mgr.get(gone.txn_id).state is TxnState.ROLLED_BACK  # type: ignore[union-attr]
    orphans = mgr.take_orphans()
    assert [(o.txn_id, o.state, o.vchannel, o.begin_id) for o in orphans] == [
        (open_.txn_id, TxnState.EXPIRED, "w", h.session(open_).begin_id)]
    assert mgr.take_orphans() == [] and mgr.open_sessions() == [] and mgr.min_open_begin_id() is None
    h.mgr, h.icpt = mgr, icpt
    await _refused(h, TxnExpiredError, body(open_, "w"))
    await _refused(h, TxnExpiredError, commit(open_, "w"))
    rb = rollback_message(orphans[0])
    assert (rb.message_type, rb.vchannel, rb.txn) == (MessageType.ROLLBACK_TXN, "w", open_)
    await h.append(rb)
    # A second reopen finds the rollback: no orphan any more.
    again = _reopen(h.fake.log)
    await again.recovered()
    assert again.manager.take_orphans() == []
    assert again.manager.get(open_.txn_id).state is TxnState.ROLLED_BACK  # type: ignore[union-attr]


async def test_ids_allocated_before_reopen_are_not_begun_after() -> None:
    h = Harness()
    await h.begin()
    lost = h.mgr.begin("v", 0)  # its BeginTxn never made it to the log
    icpt = _reopen(h.fake.log)
    await icpt.recovered()
    h.mgr, h.icpt = icpt.manager, icpt
    await _refused(h, TxnNotFoundError, Message(MessageType.BEGIN_TXN, "v", txn=lost))
    assert h.mgr.begin("v", 0).txn_id == lost.txn_id  # reused: it was never written, never seen


# --- end to end through a real WAL ---------------------------------------------------------------


async def _stored(wal: WAL) -> list[Message]:
    out: list[Message] = []
    nid = wal.first_id
    while nid < wal.next_id:
        for first, block, _ in await wal._read_storage(nid, 1 << 20):
            msgs = decode_block(block, first, nid)
            out.extend(msgs)
            nid = first + len(msgs) if first >= nid else nid + len(msgs)
    return out


async def test_end_to_end_through_a_real_wal() -> None:
    manager = await WALManager.start(MemoryBackend())
    try:
        await manager.create_channel("p")
        wal = await manager.open("p")
        clock = Clock()
        txns = TxnManager()
        icpt = TxnInterceptor(txns)

        async def append(*msgs: Message, into: WAL = wal, via: TxnInterceptor = icpt) -> list[AppendResult]:
            for m in msgs:
                m.with_timetick(clock.ts())
            return await via.do_append(list(msgs), into.append_batch)

        async def begin(mgr: TxnManager, **kw: object) -> TxnContext:
            msg = mgr.begin_message("v", 0)
            await append(msg, **kw)  # type: ignore[arg-type]
            assert msg.txn is not None
            return msg.txn

        a = await begin(txns)
        await append(body(a, payload=b"a1"))
        await append(plain(payload=b"x"))
        b = await begin(txns)
        await append(body(b, payload=b"b1"), body(a, payload=b"a2"))
        c = await begin(txns)  # never finished: the process "dies" with it open
        await append(body(c, payload=b"c1"))
        await append(commit(a))
        await append(rollback(b))
        t1 = clock.ts()
        await wal.append_batch([new_time_tick(t1)])
        got = flat(await packs_until(wal.read(), t1))
        assert [m.payload for m in got if m.message_type is MessageType.INSERT] == [b"x", b"a1", b"a2"]
        assert [m.message_type for m in got if m.txn] == [
            MessageType.BEGIN_TXN, MessageType.INSERT, MessageType.INSERT, MessageType.COMMIT_TXN]

        # Reopen: a new term, sessions rebuilt from storage; the open transaction becomes an orphan.
        stored = await _stored(wal)
        wal2 = await manager.open("p")
        icpt2 = TxnInterceptor(TxnManager())
        icpt2.replay(stored)
        await icpt2.recovered()
        orphans = icpt2.manager.take_orphans()
        assert [o.txn_id for o in orphans] == [c.txn_id]
        await append(*[rollback_message(o) for o in orphans], into=wal2, via=icpt2)
        with pytest.raises(TxnExpiredError):
            await append(body(c, payload=b"late"), into=wal2, via=icpt2)
        d = await begin(icpt2.manager, into=wal2, via=icpt2)
        assert d.txn_id > c.txn_id
        s = icpt2.manager.get(d.txn_id)
        assert s is not None
        await append(body(d, payload=b"d1"), commit_message(s), into=wal2, via=icpt2)
        t2 = clock.ts()
        await wal2.append_batch([new_time_tick(t2)])
        got = flat(await packs_until(wal2.read(), t2))
        inserts = [m.payload for m in got if m.message_type is MessageType.INSERT]
        assert inserts == [b"x", b"a1", b"a2", b"d1"]  # b rolled back, c rolled back at recovery
        assert {m.txn.txn_id for m in got if m.txn} == {a.txn_id, d.txn_id}
    finally:
        await manager.aclose()


# --- a model-checked state machine ---------------------------------------------------------------


@dataclass
class Model:
    vchannel: str
    keepalive_ms: int
    last_ms: int
    begin_id: int
    state: str = "open"  # open | committed | rolled_back | failed | expired
    rollback_written: bool = False


_IMPL_STATE = {
    "open": TxnState.IN_FLIGHT,
    "committed": TxnState.COMMITTED,
    "rolled_back": TxnState.ROLLED_BACK,
    "failed": TxnState.ROLLED_BACK,
    "expired": TxnState.EXPIRED,
}
UNKNOWN = 10**9


@dataclass
class Pending:
    ctx: TxnContext
    vchannel: str
    generation: int


@dataclass
class _Env:
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)


_rarely = st.sampled_from([False] * 7 + [True])
_sometimes = st.sampled_from([False] * 3 + [True])


class TxnMachine(RuleBasedStateMachine):
    """begin / body / commit / rollback / fail / advance+expire / reopen against a per-txn model."""

    def __init__(self) -> None:
        super().__init__()
        self.env = _Env()
        self.clock = Clock()
        self.fake = FakeNext()
        self.icpt = TxnInterceptor(TxnManager())
        self.txns: dict[int, Model] = {}
        self.pending: list[Pending] = []
        self.generation = 0
        self.max_id = 0

    def teardown(self) -> None:
        self.env.loop.close()

    @property
    def mgr(self) -> TxnManager:
        return self.icpt.manager

    def run(self, *msgs: Message, fail: BaseException | None = None) -> BaseException | None:
        for m in msgs:
            m.with_timetick(self.clock.ts())
        self.fake.fail = fail
        try:
            self.env.loop.run_until_complete(self.icpt.do_append(list(msgs), self.fake))
        except StreamingError as exc:
            return exc
        finally:
            self.fake.fail = None
        return None

    def pick(self, data: st.DataObject) -> int:
        """Mostly a transaction that is still open (that is where the interesting answers are)."""
        open_ids = sorted(tid for tid, t in self.txns.items() if t.state == "open")
        kind = data.draw(st.sampled_from(["open"] * 6 + ["any"] * 3 + ["unknown"]))
        if kind == "open" and open_ids:
            return data.draw(st.sampled_from(open_ids))
        if kind != "unknown":
            return data.draw(st.sampled_from(sorted(self.txns)))
        return UNKNOWN

    def expect(self, tid: int, vchannel: str, ts_ms: int, kind: str) -> type[StreamingError] | None:
        """What the step must answer, applying the model's side effects for refusals."""
        t = self.txns.get(tid)
        if t is None:
            return TxnNotFoundError
        if vchannel != t.vchannel:
            return InvalidArgumentError
        if kind == "rollback":
            if t.state == "open":
                return None
            if t.state in ("expired", "failed") and not t.rollback_written:
                return None
            return InvalidTxnStateError
        if t.state == "expired":
            return TxnExpiredError
        if t.state != "open":
            return InvalidTxnStateError
        if t.keepalive_ms and ts_ms > t.last_ms + t.keepalive_ms:
            t.state = "expired"
            return TxnExpiredError
        return None

    def apply(self, tid: int, kind: str) -> None:
        t = self.txns[tid]
        if kind == "body":
            t.last_ms = max(t.last_ms, self.clock.ms)
        elif kind == "commit":
            t.state = "committed"
        elif t.state == "open":
            t.state, t.rollback_written = "rolled_back", True
        else:
            t.rollback_written = True

    def _begin(self, vchannel: str, keepalive_ms: int) -> None:
        msg = self.mgr.begin_message(vchannel, keepalive_ms)
        assert msg.txn is not None
        tid = msg.txn.txn_id
        assert tid > self.max_id
        self.max_id = tid
        assert self.run(msg) is None
        assert msg.message_id is not None
        self.txns[tid] = Model(vchannel, keepalive_ms, self.clock.ms, msg.message_id)

    @initialize()
    def start(self) -> None:
        self._begin("a", 5)

    @rule(vchannel=st.sampled_from(["a", "b"]), keepalive_ms=st.sampled_from([0, 5, 20]))
    def begin(self, vchannel: str, keepalive_ms: int) -> None:
        self._begin(vchannel, keepalive_ms)

    @rule(vchannel=st.sampled_from(["a", "b"]))
    def allocate_only(self, vchannel: str) -> None:
        ctx = self.mgr.begin(vchannel, 0)
        assert ctx.txn_id > self.max_id
        self.max_id = ctx.txn_id
        self.pending.append(Pending(ctx, vchannel, self.generation))

    @rule(data=st.data())
    def begin_pending(self, data: st.DataObject) -> None:
        if not self.pending:
            return
        p = self.pending.pop(data.draw(st.integers(0, len(self.pending) - 1)))
        msg = Message(MessageType.BEGIN_TXN, p.vchannel, txn=p.ctx)
        err = self.run(msg)
        if p.generation != self.generation:
            # Allocated before the reopen and never written: unknown now, unless the new manager
            # handed the same id out again (ids never written are not seen by replay).
            reused = p.ctx.txn_id in self.txns or any(
                q.ctx.txn_id == p.ctx.txn_id for q in self.pending if q.generation == self.generation)
            if not reused:
                assert isinstance(err, TxnNotFoundError), err
            elif err is None:
                assert msg.message_id is not None
                self.txns[p.ctx.txn_id] = Model(p.vchannel, p.ctx.keepalive_ms, self.clock.ms, msg.message_id)
                self.pending = [q for q in self.pending if q.ctx.txn_id != p.ctx.txn_id]
            return
        assert err is None
        assert msg.message_id is not None
        self.txns[p.ctx.txn_id] = Model(p.vchannel, p.ctx.keepalive_ms, self.clock.ms, msg.message_id)

    @rule(vchannel=st.sampled_from(["a", "b"]), keepalive_ms=st.sampled_from([0, 5, 20]),
          bodies=st.integers(0, 3), end=st.sampled_from(["commit", "rollback", "open"]), poison=_rarely)
    def whole_transaction_in_one_batch(self, vchannel: str, keepalive_ms: int, bodies: int, end: str,
                                       poison: bool) -> None:
        begin = self.mgr.begin_message(vchannel, keepalive_ms)
        ctx = begin.txn
        assert ctx is not None and ctx.txn_id > self.max_id
        self.max_id = ctx.txn_id
        batch = [begin, plain(vchannel)] + [body(ctx, vchannel) for _ in range(bodies)]
        if end == "commit":
            batch.append(commit(ctx, vchannel))
        elif end == "rollback":
            batch.append(rollback(ctx, vchannel))
        if poison:
            batch.append(body(TxnContext(UNKNOWN, 0), vchannel))
        err = self.run(*batch)
        if poison:  # nothing written: the id stays allocated, its BeginTxn may come later
            assert isinstance(err, TxnNotFoundError), err
            self.pending.append(Pending(ctx, vchannel, self.generation))
            return
        assert err is None, err
        assert begin.message_id is not None
        t = self.txns[ctx.txn_id] = Model(vchannel, keepalive_ms, self.clock.ms, begin.message_id)
        if end == "commit":
            t.state = "committed"
        elif end == "rollback":
            t.state, t.rollback_written = "rolled_back", True

    @rule(data=st.data(), wrong_vchannel=_rarely, inject_failure=_rarely)
    def send_body(self, data: st.DataObject, wrong_vchannel: bool, inject_failure: bool) -> None:
        self.send(data, "body", wrong_vchannel, inject_failure)

    @rule(data=st.data(), wrong_vchannel=_rarely, inject_failure=_rarely)
    def send_commit(self, data: st.DataObject, wrong_vchannel: bool, inject_failure: bool) -> None:
        self.send(data, "commit", wrong_vchannel, inject_failure)

    @rule(data=st.data(), wrong_vchannel=_rarely, inject_failure=_rarely)
    def send_rollback(self, data: st.DataObject, wrong_vchannel: bool, inject_failure: bool) -> None:
        self.send(data, "rollback", wrong_vchannel, inject_failure)

    def send(self, data: st.DataObject, kind: str, wrong_vchannel: bool, inject_failure: bool) -> None:
        tid = self.pick(data)
        t = self.txns.get(tid)
        vchannel = t.vchannel if t is not None else "a"
        if wrong_vchannel:
            vchannel = "b" if vchannel == "a" else "a"
        ctx = TxnContext(tid, t.keepalive_ms if t is not None else 0)
        mtype = {"body": MessageType.INSERT, "commit": MessageType.COMMIT_TXN,
                 "rollback": MessageType.ROLLBACK_TXN}[kind]
        # The timestamp the message will get: the clock's current millisecond.
        want = self.expect(tid, vchannel, self.clock.ms, kind)
        injected = StreamingError("injected", code=ErrorCode.UNAVAILABLE) if inject_failure else None
        err = self.run(Message(mtype, vchannel, b"x", txn=ctx), fail=injected)
        if want is not None:
            assert type(err) is want, (kind, want, err)
        elif injected is not None:
            assert err is injected  # validated, claimed, failed below: the model does not change
        else:
            assert err is None, err
            self.apply(tid, kind)

    @rule(ms=st.integers(1, 15))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule()
    def expire(self) -> None:
        got = self.mgr.expire(self.clock.ms * PHYS + self.clock.logical)
        want = [tid for tid, t in self.txns.items()
                if t.state == "open" and t.keepalive_ms and self.clock.ms > t.last_ms + t.keepalive_ms]
        assert sorted(s.txn_id for s in got) == sorted(want)
        for tid in want:
            self.txns[tid].state = "expired"

    @rule(vchannel=st.sampled_from(["a", "b"]), go=_sometimes)
    def fail_vchannel(self, vchannel: str, go: bool) -> None:
        if not go:  # rarer than the other rules: it ends every open transaction of the vchannel
            return
        got = self.mgr.fail_vchannel(vchannel, "DDL")
        want = [tid for tid, t in self.txns.items() if t.state == "open" and t.vchannel == vchannel]
        assert sorted(s.txn_id for s in got) == sorted(want)
        for tid in want:
            self.txns[tid].state = "failed"

    @rule(write_rollbacks=st.booleans(), go=_sometimes)
    def reopen(self, write_rollbacks: bool, go: bool) -> None:
        if not go:  # rarer than the other rules: it ends every open transaction
            return
        self.icpt = _reopen(self.fake.log, chunk=4)
        self.env.loop.run_until_complete(self.icpt.recovered())
        self.generation += 1
        orphans = self.mgr.take_orphans()
        want = []
        for tid, t in self.txns.items():
            if t.state in ("rolled_back", "committed"):
                continue
            if t.rollback_written:  # an expired or failed session closed by a rollback: replay sees it
                t.state = "rolled_back"
                continue
            want.append(tid)
            t.state = "expired"
        assert sorted(o.txn_id for o in orphans) == sorted(want)
        assert all(o.state is TxnState.EXPIRED for o in orphans)
        self.max_id = max(self.txns, default=0)
        assert self.mgr.next_txn_id == self.max_id + 1
        if write_rollbacks and orphans:
            assert self.run(*[rollback_message(o) for o in orphans]) is None
            for o in orphans:
                self.txns[o.txn_id].rollback_written = True

    @invariant()
    def sessions_match_the_model(self) -> None:
        open_ids = sorted(tid for tid, t in self.txns.items() if t.state == "open")
        assert sorted(s.txn_id for s in self.mgr.open_sessions()) == open_ids
        want_min = min((self.txns[tid].begin_id for tid in open_ids), default=None)
        assert self.mgr.min_open_begin_id() == want_min
        for tid, t in self.txns.items():
            s = self.mgr.get(tid)
            assert s is not None
            assert s.state is _IMPL_STATE[t.state], (tid, t, s)
            assert s.inflight == 0
            if t.state == "open":
                assert s.last_ts >> 18 == t.last_ms


TestTxnMachine = TxnMachine.TestCase
TestTxnMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
