"""Transactions through the whole chain on a real WAL, checked against a model.

A ``RuleBasedStateMachine`` drives ``open_streaming_wal`` over a ``MemoryBackend``: begin, bodies
(also to finished, expired, unknown transactions and on the wrong vchannel), commit, rollback, plain
appends, mixed batches, waiting past a keepalive, and reopening the pchannel over the same data.  The
model knows, per transaction, its state and its acknowledged bodies, and predicts every answer of
the chain (accepted, or the exact error class).  Expiry is measured on message timestamps, which
follow the wall clock: when the wall clock cannot tell whether a transaction is still alive, either
answer is accepted and the model learns from the one given.

The log is checked (by a rule, and at teardown) by reading the whole pchannel with a Scanner up to a
fresh plain marker, and by a live Scanner that tails the current term from its start (it sees the
volatile TimeTicks, so reader-side expiry runs while transactions idle): every committed transaction
delivered exactly once and whole, contiguous, in the pack of its commit; nothing of any other
transaction; every plain message exactly once, with its acknowledged id and timestamp; packs in
timestamp order, their end timestamps strictly increasing; and the reader's resume position held
back by every open transaction without keepalive, but by none whose end is in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from interceptors.recovery.streaming_wal import ChainConfig, StreamingWAL, open_streaming_wal
from tests.factories import data, packs_until
from tests.waiting import until
from wal import (
    AppendResult,
    DeliverPolicy,
    InvalidArgumentError,
    InvalidTxnStateError,
    Message,
    MessageType,
    MsgPack,
    Position,
    ReadOption,
    Scanner,
    StreamingError,
    TxnContext,
    TxnExpiredError,
    TxnNotFoundError,
    WALManager,
)
from wal.backends import MemoryBackend

T = TypeVar("T")

PCHANNEL = "p"
VCHANNELS = ("v1", "v2")
KEEPALIVE_MS = 50
LONG_SLEEP_SECONDS = 0.07  # past the keepalive, plus a few ticks
SHORT_SLEEP_SECONDS = 0.03  # most of the keepalive: a transaction stays alive through it
MARGIN_MS = 2  # slack on the wall-clock bound below (it is sound without it)
UNKNOWN_TXN = 1_000_000  # never allocated

Outcome = type[StreamingError] | None
ACCEPTED: frozenset[Outcome] = frozenset({None})
MAYBE_EXPIRED: frozenset[Outcome] = frozenset({None, TxnExpiredError})
ENDED_SOMEHOW: frozenset[Outcome] = frozenset({InvalidTxnStateError, TxnExpiredError})


def wall_ms() -> int:
    """The wall clock as the hybrid clock reads it."""
    return time.time_ns() // 1_000_000


def only(exc: type[StreamingError]) -> frozenset[Outcome]:
    return frozenset({exc})


@dataclass
class Txn:
    """What the model knows of one transaction.

    ``state``: open | committed | rolled_back | expired | closed.  ``closed`` is a transaction rolled
    back while it may already have expired: its RollbackTxn is written, but the writer may call it
    rolled back (InvalidTxnStateError) or expired (TxnExpiredError).  ``open`` with a keepalive may
    likewise have expired silently (on a TimeTick): ``alive_for_sure`` tells.
    """

    vchannel: str
    keepalive_ms: int
    begin: AppendResult
    active_wall_ms: int
    """Wall ms read before the last accepted BeginTxn or body: its timestamp's physical ms is at least
    this, and every later timestamp's at most max(that, the wall clock then).  So while
    ``wall_ms() - active_wall_ms <= keepalive_ms`` the transaction cannot have expired."""
    term: int
    """The term (count of opens) it began in."""
    state: str = "open"
    rollback_written: bool = False
    bodies: list[tuple[bytes, AppendResult]] = field(default_factory=list)
    commit: AppendResult | None = None

    def alive_for_sure(self, now_wall_ms: int) -> bool:
        return self.keepalive_ms == 0 or now_wall_ms - self.active_wall_ms <= self.keepalive_ms - MARGIN_MS


_rarely = st.sampled_from([False] * 4 + [True])
_sometimes = st.sampled_from([False] * 2 + [True])


class ChainTxnMachine(RuleBasedStateMachine):
    """begin / body / commit / rollback / plain / batch / sleep / reopen over a real WAL."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.config = ChainConfig(tick_interval=0.01)
        self.backend = MemoryBackend()
        self.manager: WALManager | None = None
        self.swal: StreamingWAL | None = None
        self.txns: dict[int, Txn] = {}
        self.plain: dict[bytes, tuple[AppendResult, int]] = {}  # payload -> (ack, term)
        self.live: Scanner | None = None
        self.follower: asyncio.Task[None] | None = None
        self.live_packs: list[MsgPack] = []
        self.refused: set[bytes] = set()  # payloads of bodies and batches that were refused
        self.counter = 0
        self.max_txn_id = 0
        self.terms = 1
        self.clean = False  # the last rule ran to its end (teardown checks the log only then)

    # --- plumbing --------------------------------------------------------------------------------
    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def attempt(self, coro: Coroutine[Any, Any, T]) -> tuple[T | None, StreamingError | None, int]:
        """Run an append; return (result, error, wall ms before it)."""
        before = wall_ms()
        try:
            return self.call(coro), None, before
        except StreamingError as exc:
            return None, exc, before

    @property
    def wal(self) -> StreamingWAL:
        assert self.swal is not None
        return self.swal

    async def _open(self, *, create: bool = False) -> None:
        self.manager = await WALManager.start(self.backend)
        if create:
            await self.manager.create_channel(PCHANNEL)
        self.swal = await open_streaming_wal(self.manager, PCHANNEL, self.config)
        await self.swal.ready()
        self.live_packs = []
        self.live = self.swal.read(ReadOption(deliver_policy=DeliverPolicy.latest()))
        self.follower = asyncio.get_running_loop().create_task(self._follow(self.live))

    async def _close(self) -> None:
        if self.follower is not None:
            self.follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.follower
            self.follower = None
        if self.live is not None:
            await self.live.aclose()
            self.live = None
        if self.swal is not None:
            await self.swal.aclose()
            self.swal = None
        if self.manager is not None:
            await self.manager.aclose()
            self.manager = None

    def payload(self, kind: str) -> bytes:
        self.counter += 1
        return f"{kind}-{self.counter}".encode()

    def pick(self, data_: st.DataObject) -> int:
        """Mostly a transaction that is open, or expired with its closing rollback not written yet (where
        the answers depend on the state); also finished ones and an id never allocated."""
        kind = data_.draw(st.sampled_from(["open"] * 9 + ["expired"] * 3 + ["any"] * 3 + ["unknown"]), label="pick")
        # Drawn the same way whatever the state: which transactions are open or expired depends on the
        # wall clock, and hypothesis refuses a replay whose draws differ from the first run's.
        index = data_.draw(st.integers(0, 63), label="txn")
        by_kind = {
            "open": [tid for tid, t in self.txns.items() if t.state == "open"],
            "expired": [tid for tid, t in self.txns.items() if t.state == "expired" and not t.rollback_written],
            "any": list(self.txns),
        }
        if kind != "unknown":
            ids = by_kind[kind] or by_kind["open"] + by_kind["expired"] or by_kind["any"]
            if ids:
                return sorted(ids)[index % len(ids)]
        return UNKNOWN_TXN

    def vchannel_for(self, tid: int, wrong: bool) -> str:
        t = self.txns.get(tid)
        right = t.vchannel if t is not None else VCHANNELS[0]
        if not wrong:
            return right
        return VCHANNELS[1] if right == VCHANNELS[0] else VCHANNELS[0]

    def context(self, tid: int) -> TxnContext:
        t = self.txns.get(tid)
        return TxnContext(tid, t.keepalive_ms if t is not None else 0)

    # --- expectations ----------------------------------------------------------------------------
    def expect_body_or_commit(self, tid: int, vchannel: str, now: int, *, alive: bool = False) -> frozenset[Outcome]:
        """The answers allowed for a body or a commit (rule order of ``TxnManager._refuse``)."""
        t = self.txns.get(tid)
        if t is None:
            return only(TxnNotFoundError)
        if vchannel != t.vchannel:
            return only(InvalidArgumentError)
        if t.state == "open":
            return ACCEPTED if alive or t.alive_for_sure(now) else MAYBE_EXPIRED
        if t.state == "expired":
            return only(TxnExpiredError)
        if t.state == "closed":
            return ENDED_SOMEHOW
        return only(InvalidTxnStateError)  # committed, rolled back

    def expect_rollback(self, tid: int, vchannel: str) -> frozenset[Outcome]:
        """``_check_rollback``: an open session (even one idle past its keepalive) takes a rollback; an
        expired one takes one closing rollback."""
        t = self.txns.get(tid)
        if t is None:
            return only(TxnNotFoundError)
        if vchannel != t.vchannel:
            return only(InvalidArgumentError)
        if t.state == "open" or (t.state == "expired" and not t.rollback_written):
            return ACCEPTED
        return only(InvalidTxnStateError)

    @staticmethod
    def check(kind: str, allowed: frozenset[Outcome], err: StreamingError | None) -> None:
        got = None if err is None else type(err)
        event(f"{kind}: {'accepted' if got is None else got.__name__}{' (uncertain)' if len(allowed) > 1 else ''}")
        assert got in allowed, f"{kind}: expected one of {sorted(map(str, allowed))}, got {err!r}"

    # --- rules -----------------------------------------------------------------------------------
    @initialize(short_window=st.booleans(), vchannel=st.sampled_from(VCHANNELS),
                keepalive_ms=st.sampled_from([0, KEEPALIVE_MS]))
    def start(self, short_window: bool, vchannel: str, keepalive_ms: int) -> None:
        """Open the pchannel and begin a first transaction.

        After a reopen the clock resumes above the persisted timestamp window, which may lie ahead of
        the wall clock: with the default window (3 s) no keepalive runs out for a while after a reopen,
        with a short one it does.
        """
        if short_window:
            self.config = ChainConfig(tick_interval=0.01, ts_window_ms=20)
        self.call(self._open(create=True))
        self.begin(vchannel, keepalive_ms, 1, "open")

    @rule(vchannel=st.sampled_from(VCHANNELS), keepalive_ms=st.sampled_from([0, KEEPALIVE_MS]),
          bodies=st.integers(0, 2), end=st.sampled_from(["open", "open", "commit", "slow commit"]))
    def begin(self, vchannel: str, keepalive_ms: int, bodies: int, end: str) -> None:
        """Begin a transaction, append its first ``bodies`` bodies (one append each), maybe commit it.

        A slow commit pauses for most of the keepalive, appends one more body, pauses again and
        commits: longer than the keepalive in all, never that long idle.  Readers must keep it.
        """
        self.clean = False
        before = wall_ms()
        ctx, result = self.call(self.wal.begin_txn(vchannel, keepalive_ms))
        assert ctx.txn_id > self.max_txn_id, (ctx, self.max_txn_id)  # never reused, not even after reopen
        assert result.txn_id == ctx.txn_id
        self.max_txn_id = ctx.txn_id
        self.txns[ctx.txn_id] = Txn(vchannel, keepalive_ms, result, before, self.terms)
        for _ in range(bodies):
            self.append_body(ctx.txn_id, vchannel)
        if end == "slow commit":
            self.call(asyncio.sleep(SHORT_SLEEP_SECONDS))
            self.append_body(ctx.txn_id, vchannel)
            self.call(asyncio.sleep(SHORT_SLEEP_SECONDS))
        if end != "open":
            self.commit_txn(ctx.txn_id, vchannel, wrong_vchannel=False)
        self.clean = True

    @rule(data_=st.data(), wrong_vchannel=_rarely, count=st.integers(1, 3))
    def body(self, data_: st.DataObject, wrong_vchannel: bool, count: int) -> None:
        """Append ``count`` bodies, one append each, to a transaction (any state, or unknown)."""
        self.clean = False
        tid = self.pick(data_)
        vchannel = self.vchannel_for(tid, wrong_vchannel)
        for _ in range(count):
            self.append_body(tid, vchannel)
        self.clean = True

    def append_body(self, tid: int, vchannel: str) -> None:
        payload = self.payload("body")
        msg = Message(MessageType.DATA, vchannel, payload, txn=self.context(tid))
        result, err, before = self.attempt(self.wal.append(msg))
        allowed = self.expect_body_or_commit(tid, vchannel, wall_ms())
        self.check("body", allowed, err)
        if len(allowed) > 1 and self.terms > 1 and isinstance(err, TxnExpiredError):
            event(f"body: keepalive ran out after a reopen (window {self.config.ts_window_ms} ms)")
        t = self.txns.get(tid)
        if err is None:
            assert t is not None and result is not None
            assert result.txn_id == tid
            t.bodies.append((payload, result))
            t.active_wall_ms = before
        else:
            self.refused.add(payload)
            if t is not None and t.state == "open" and isinstance(err, TxnExpiredError):
                t.state = "expired"

    @rule(data_=st.data(), wrong_vchannel=_rarely)
    def commit(self, data_: st.DataObject, wrong_vchannel: bool) -> None:
        self.clean = False
        tid = self.pick(data_)
        self.commit_txn(tid, self.vchannel_for(tid, wrong_vchannel), wrong_vchannel=wrong_vchannel)
        self.clean = True

    def commit_txn(self, tid: int, vchannel: str, *, wrong_vchannel: bool) -> None:
        if wrong_vchannel:  # commit_txn always uses the session's vchannel: send the framing by hand
            msg = Message(MessageType.COMMIT_TXN, vchannel, txn=self.context(tid))
            result, err, _ = self.attempt(self.wal.append(msg))
        else:
            result, err, _ = self.attempt(self.wal.commit_txn(tid))
        allowed = self.expect_body_or_commit(tid, vchannel, wall_ms())
        self.check("commit", allowed, err)
        t = self.txns.get(tid)
        if err is None:
            assert t is not None and result is not None
            assert result.txn_id == tid
            t.state, t.commit = "committed", result
        elif t is not None and t.state == "open" and isinstance(err, TxnExpiredError):
            t.state = "expired"

    @rule(data_=st.data(), wrong_vchannel=_rarely)
    def rollback(self, data_: st.DataObject, wrong_vchannel: bool) -> None:
        self.clean = False
        tid = self.pick(data_)
        vchannel = self.vchannel_for(tid, wrong_vchannel)
        if wrong_vchannel:
            msg = Message(MessageType.ROLLBACK_TXN, vchannel, txn=self.context(tid))
            _, err, _ = self.attempt(self.wal.append(msg))
        else:
            _, err, _ = self.attempt(self.wal.rollback_txn(tid))
        allowed = self.expect_rollback(tid, vchannel)
        self.check("rollback", allowed, err)
        t = self.txns.get(tid)
        if err is None:
            assert t is not None
            if t.state == "expired":
                t.rollback_written = True
            elif t.alive_for_sure(wall_ms()):
                t.state, t.rollback_written = "rolled_back", True
            else:  # rolled back, or expired and closed by this rollback: the writer knows which
                t.state, t.rollback_written = "closed", True
        self.clean = True

    @rule(vchannel=st.sampled_from(VCHANNELS))
    def plain_append(self, vchannel: str) -> None:
        self.clean = False
        payload = self.payload("plain")
        result = self.call(self.wal.append(data(vchannel, payload)))
        assert result.txn_id is None
        self.plain[payload] = (result, self.terms)
        self.clean = True

    @rule(data_=st.data(), size=st.integers(2, 4))
    def batch(self, data_: st.DataObject, size: int) -> None:
        """Plain messages and bodies mixed in one append: all of it is written, or none of it."""
        self.clean = False
        items: list[tuple[int | None, str, bytes]] = []  # (txn id or None, vchannel, payload)
        for _ in range(size):
            if data_.draw(st.booleans(), label="is_body"):
                tid = self.pick(data_)
                vchannel = self.vchannel_for(tid, data_.draw(_rarely, label="wrong_vchannel"))
                items.append((tid, vchannel, self.payload("bbody")))
            else:
                items.append((None, data_.draw(st.sampled_from(VCHANNELS), label="vchannel"), self.payload("bplain")))
        msgs = [
            Message(MessageType.DATA, vc, p, txn=self.context(tid) if tid is not None else None)
            for tid, vc, p in items
        ]
        results, err, before = self.attempt(self.wal.append_batch(msgs))
        now = wall_ms()
        # Validated in order; the first refusal fails the whole batch.  A transaction's later bodies
        # in the batch share the first one's physical ms, so they are alive when it was.
        allowed: list[frozenset[Outcome]] = []
        seen: set[int] = set()
        for tid, vc, _ in items:
            if tid is None:
                allowed.append(ACCEPTED)
                continue
            allowed.append(self.expect_body_or_commit(tid, vc, now, alive=tid in seen))
            seen.add(tid)
        got = None if err is None else type(err)
        candidates = []
        for i, a in enumerate(allowed):
            if got is not None and got in a:
                candidates.append(i)
            if None not in a:
                break
        assert (got is None and all(None in a for a in allowed)) or candidates, (
            f"batch {items}: allowed {allowed}, got {err!r}")
        if err is None:
            assert results is not None and len(results) == len(items)
            for (tid, _, p), r in zip(items, results, strict=True):
                if tid is None:
                    assert r.txn_id is None
                    self.plain[p] = (r, self.terms)
                else:
                    assert r.txn_id == tid
                    self.txns[tid].bodies.append((p, r))
                    self.txns[tid].active_wall_ms = before
        else:
            self.refused.update(p for _, _, p in items)
            if len(candidates) == 1 and isinstance(err, TxnExpiredError):
                tid = items[candidates[0]][0]
                assert tid is not None
                if self.txns[tid].state == "open":
                    self.txns[tid].state = "expired"
        self.clean = True

    @rule(past_keepalive=st.booleans())
    def sleep(self, past_keepalive: bool) -> None:
        """Let time pass, TimeTicks running: past the keepalive (open transactions with one may expire),
        or a good part of it (they stay alive, and readers must keep them)."""
        self.clean = False
        self.call(asyncio.sleep(LONG_SLEEP_SECONDS if past_keepalive else SHORT_SLEEP_SECONDS))
        self.clean = True

    @rule(go=_sometimes)
    def reopen(self, go: bool) -> None:
        """Close the WAL and the manager, then open the pchannel again over the same data."""
        if not go:
            return
        self.clean = False
        self.call(self._close())
        self.backend = self.backend.reopen()
        self.call(self._open())
        self.terms += 1
        for t in self.txns.values():
            if t.state == "open":  # the previous owner's: recovery rolls it back, it is expired now
                t.state, t.rollback_written = "expired", True
            elif t.state == "expired":
                if t.rollback_written:  # replay sees only the RollbackTxn
                    t.state = "rolled_back"
                t.rollback_written = True
            elif t.state == "closed":
                t.state = "rolled_back"
        self.clean = True

    @rule()
    def read_everything(self) -> None:
        self.clean = False
        self.check_log()
        self.clean = True

    # --- the log ---------------------------------------------------------------------------------
    async def _follow(self, scanner: Scanner) -> None:
        """The live reader of the current term: tails the log, sees the volatile TimeTicks too."""
        async for pack in scanner:
            self.live_packs.append(pack)

    async def _read_all(self, marker: Message) -> tuple[AppendResult, list[MsgPack], Position]:
        result = await self.wal.append(marker)
        scanner = self.wal.read()
        try:
            packs = await packs_until(scanner, result.timetick, timeout=10)
            position = scanner.position
        finally:
            await scanner.aclose()

        def followed() -> bool:
            assert self.follower is not None and not self.follower.done(), self.follower
            return bool(self.live_packs) and self.live_packs[-1].end_ts >= result.timetick

        await until(followed, "the live reader past the marker", interval=0.002)
        return result, packs, position

    def check_log(self) -> None:
        """Read everything from the start of the log, and what the live reader of this term got."""
        payload = self.payload("marker")
        marker, packs, position = self.call(self._read_all(data(VCHANNELS[0], payload)))
        self.plain[payload] = (marker, self.terms)
        self.check_packs("whole log", packs, self.plain, self.txns)
        term = self.terms
        self.check_packs(
            f"live reader of term {term}", self.live_packs,
            {p: v for p, v in self.plain.items() if v[1] == term},
            {tid: t for tid, t in self.txns.items() if t.term == term},
        )
        # Where the reader would resume: at or before every transaction it must still deliver whole
        # (open, no keepalive); not held back by any transaction whose end is in the log.
        must_hold = [t.begin.message_id for t in self.txns.values() if t.state == "open" and t.keepalive_ms == 0]
        may_hold = [
            t.begin.message_id for t in self.txns.values()
            if t.state == "open" or (t.state == "expired" and not t.rollback_written)
        ]
        assert position.message_id <= min(must_hold, default=position.message_id), (position, must_hold)
        assert position.message_id >= min([*may_hold, marker.message_id + 1]), (
            f"{position}: held back by a transaction that is over (open ones begin at {may_hold})")

    def check_packs(
        self, who: str, packs: list[MsgPack], plain: dict[bytes, tuple[AppendResult, int]], txns: dict[int, Txn],
    ) -> None:
        prev_end = -1
        plain_seen: Counter[bytes] = Counter()
        txn_msgs: dict[int, list[tuple[int, int, Message]]] = {}  # txn id -> (pack, index, message)
        for pi, pack in enumerate(packs):
            assert pack.end_ts > prev_end, f"{who}: pack {pi} ends at {pack.end_ts}, the one before at {prev_end}"
            prev_end = pack.end_ts
            keys: list[int] = []  # the timestamp each delivered unit is ordered by
            for mi, m in enumerate(pack.messages):
                assert m.message_id is not None
                if m.txn is None:
                    assert m.message_type is MessageType.DATA, (who, m)
                    want = plain.get(m.payload)
                    assert want is not None, f"{who}: delivered a plain message it should not have: {m!r}"
                    assert (m.message_id, m.timetick) == (want[0].message_id, want[0].timetick), (who, m, want)
                    assert pack.begin_ts < m.timetick <= pack.end_ts, (who, m, pack.begin_ts, pack.end_ts)
                    plain_seen[m.payload] += 1
                    keys.append(m.timetick)
                    continue
                txn_msgs.setdefault(m.txn.txn_id, []).append((pi, mi, m))
                if m.message_type is MessageType.COMMIT_TXN:
                    assert pack.begin_ts < m.timetick <= pack.end_ts, (who, m, pack.begin_ts, pack.end_ts)
                    keys.append(m.timetick)
            assert keys == sorted(keys), f"{who}: pack {pi} is not in timestamp order: {keys}"

        assert plain_seen == Counter(dict.fromkeys(plain, 1)), (
            f"{who}: plain messages missing {set(plain) - set(plain_seen)}, "
            f"repeated {[p for p, n in plain_seen.items() if n > 1]}")

        for tid, t in txns.items():
            got = txn_msgs.pop(tid, [])
            if t.state != "committed":
                assert not got, f"{who}: transaction {tid} ({t.state}) was delivered: {[m for _, _, m in got]}"
                continue
            assert t.commit is not None
            want_msgs = [(MessageType.BEGIN_TXN, b"", t.begin.message_id)]
            want_msgs += [(MessageType.DATA, p, r.message_id) for p, r in t.bodies]
            want_msgs.append((MessageType.COMMIT_TXN, b"", t.commit.message_id))
            assert [(m.message_type, m.payload, m.message_id) for _, _, m in got] == want_msgs, (
                f"{who}: committed transaction {tid} not delivered exactly once and whole")
            pis = {pi for pi, _, _ in got}
            assert len(pis) == 1, f"{who}: transaction {tid} spread over packs {sorted(pis)}"
            mis = [mi for _, mi, _ in got]
            assert mis == list(range(mis[0], mis[0] + len(mis))), f"{who}: transaction {tid} interleaved: {mis}"
            assert got[-1][2].timetick == t.commit.timetick
        assert not txn_msgs, f"{who}: delivered transactions it should not have: {sorted(txn_msgs)}"
        delivered = {m.payload for p in packs for m in p.messages}
        assert not (delivered & self.refused), f"{who}: refused payloads delivered: {delivered & self.refused}"

    # --- end -------------------------------------------------------------------------------------
    def teardown(self) -> None:
        try:
            if self.clean and self.swal is not None:  # the final invariant; skipped when a rule failed
                self.check_log()
        finally:
            try:
                self.call(self._close())
                pending = asyncio.all_tasks(self.loop)
                for task in pending:
                    task.cancel()
                if pending:
                    self.call(asyncio.gather(*pending, return_exceptions=True))
            finally:
                self.loop.close()


TestChainTxnMachine = ChainTxnMachine.TestCase
TestChainTxnMachine.settings = settings(
    max_examples=40, stateful_step_count=20, deadline=None, suppress_health_check=[HealthCheck.too_slow],
)
