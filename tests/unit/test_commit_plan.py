"""The group committer's planner (wal._commit_plan) and its slots, on plain values: no backend, no
thread, no write.  Which requests a write takes, the ids they get, the mode that carries them, how
they are sealed into blocks, and what a failed write gives back."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from wal import Message, MessageType
from wal import _commit_plan as plan
from wal._commit_modes import Slots
from wal._commit_plan import InFlight, Mode, Request
from wal.errors import ChannelFencedError, StreamingError


class _Wal:
    """The fields of a WAL the planner reads and writes."""

    def __init__(self, key: int, refusal: StreamingError | None = None) -> None:
        self._channel_key = key
        self.pchannel = f"p{key}"
        self.term = 3
        self._next_alloc = 100 * key
        self._written_max_ts = 0
        self.refusal = refusal

    def _write_refusal(self) -> StreamingError | None:
        return self.refusal


class _Future:
    def __init__(self, done: bool = False) -> None:
        self._done = done

    def done(self) -> bool:
        return self._done


def _req(wal: _Wal, n: int = 1, nbytes: int = 100, done: bool = False, ts: int = 1) -> Request:
    msgs = [Message(MessageType.DATA, "v", b"x", timetick=ts + i) for i in range(n)]
    return Request(wal, msgs, nbytes, _Future(done))  # type: ignore[arg-type]


def test_take_fills_a_write_up_to_the_limit_and_always_takes_one() -> None:
    w = _Wal(1)
    q = [_req(w, nbytes=400), _req(w, nbytes=400), _req(w, nbytes=400)]
    taken, rest = plan.take(q, 0, 1000)
    assert taken == q[:2] and rest == q[2:]
    big = [_req(w, nbytes=5000), _req(w, nbytes=1)]
    taken, rest = plan.take(big, 0, 1000)
    assert taken == big[:1] and rest == big[1:], "one request over the limit still goes alone"
    assert plan.take([], 0, 1000) == ([], [])


def test_a_held_write_is_taken_exactly_as_it_was() -> None:
    w = _Wal(1)
    q = [_req(w, nbytes=10) for _ in range(5)]
    taken, rest = plan.take(q, 2, 1 << 30)
    assert taken == q[:2] and rest == q[2:], "no newer request merged into the held ones"


def test_ids_are_dense_per_wal_refused_and_abandoned_requests_take_none() -> None:
    a, b = _Wal(1), _Wal(2)
    fenced = _Wal(3, ChannelFencedError("fenced"))
    reqs = [_req(a, 2), _req(b, 3), _req(fenced, 1), _req(a, 1, done=True), _req(a, 4)]
    out, refused = plan.assign_ids(reqs, held=False)
    assert out == [reqs[0], reqs[1], reqs[4]]
    assert [r.first_id for r in out] == [100, 200, 102]
    assert a._next_alloc == 106 and b._next_alloc == 203 and fenced._next_alloc == 300
    assert [(r, type(e)) for r, e in refused] == [(reqs[2], ChannelFencedError)]
    # A held write is written again whole, a caller that gave up included.
    out, _ = plan.assign_ids([_req(a, 1, done=True)], held=True)
    assert len(out) == 1 and out[0].first_id == 106


@pytest.mark.parametrize(("lone", "inline_ok", "pipelined", "split", "mode"), [
    (True, True, False, True, Mode.INLINE),
    (True, False, False, True, Mode.LONE_THREAD),
    (True, True, True, False, Mode.INLINE),
    (False, True, True, True, Mode.PIPELINED),
    (False, True, False, True, Mode.SPLIT),
    (False, True, False, False, Mode.WHOLE),
])
def test_the_write_mode(lone: bool, inline_ok: bool, pipelined: bool, split: bool, mode: Mode) -> None:
    assert plan.choose_mode(lone=lone, inline_ok=inline_ok, pipelined=pipelined, split_sync=split) is mode


def test_lone_means_one_small_request_nothing_queued_no_ack_pending() -> None:
    w = _Wal(1)
    assert plan.is_lone([_req(w)], 0, False)
    assert not plan.is_lone([_req(w), _req(w)], 0, False)
    assert not plan.is_lone([_req(w)], 1, False)
    assert not plan.is_lone([_req(w)], 0, True)
    assert not plan.is_lone([_req(w, nbytes=plan.LONE_BYTES + 1)], 0, False)


def test_seal_stamps_ids_and_terms_and_cuts_blocks_per_wal() -> None:
    a, b = _Wal(1), _Wal(2)
    big = plan.BLOCK_TARGET_BYTES
    reqs = [_req(a, 2, nbytes=big, ts=5), _req(b, 1, ts=9), _req(a, 1, ts=7)]
    out, _ = plan.assign_ids(reqs, held=False)
    commits, groups = plan.seal(out)
    assert [(c.wal, c.first_id, len(c.messages)) for c in commits] == [(a, 100, 2), (b, 200, 1), (a, 102, 1)]
    assert sorted(g.first_id for g in groups) == [100, 102, 200]
    assert [m._id for r in reqs for m in r.messages] == [100, 101, 200, 102]
    assert {m._term for r in reqs for m in r.messages} == {3}
    assert a._written_max_ts == 7 and b._written_max_ts == 9
    plan.give_back(out)
    assert a._next_alloc == 100 and b._next_alloc == 200
    assert all(m._id is None for r in reqs for m in r.messages)


def test_a_failed_store_prunes_its_pchannel_from_this_and_later_writes() -> None:
    a, b = _Wal(1), _Wal(2)
    first = [_req(a), _req(b)]
    later = [_req(a), _req(b)]
    for reqs in (first, later):
        out, _ = plan.assign_ids(reqs, held=False)
        plan.seal(out)
    e1, e2 = InFlight(list(first), []), InFlight(list(later), [])
    bad = plan.prune_failed([e1, e2], e1, {1: RuntimeError("store failed")})
    assert bad == [first[0], later[0]]
    assert e1.reqs == [first[1]] and e2.reqs == [later[1]]
    assert a._next_alloc == 100, "ids given back once, from the failed write"
    assert first[0].messages[0]._id is None and later[0].messages[0]._id is None


def test_take_and_assign_against_a_model_in_a_seeded_walk() -> None:
    """Random queues, limits, holds and refusals: every id handed out once, dense per WAL, in queue
    order; a write never exceeds the limit unless it is a single request or a held write."""
    rng = random.Random(35)
    for _ in range(300):
        wals = [_Wal(k) for k in range(1, 4)]
        expected = {id(w): w._next_alloc for w in wals}
        queue = [_req(rng.choice(wals), rng.randint(1, 5), rng.randint(1, 500), done=rng.random() < 0.1)
                 for _ in range(rng.randint(0, 30))]
        while queue:
            held = rng.choice([0, 0, 0, rng.randint(1, 4)])
            limit = rng.randint(1, 2000)
            taken, rest = plan.take(queue, held, limit)
            assert taken + rest == queue and taken
            if held:
                assert len(taken) == min(held, len(queue))
            elif len(taken) > 1:
                assert sum(r.nbytes for r in taken) <= limit
            out, refused = plan.assign_ids(taken, bool(held))
            assert not refused
            for r in taken:
                if r in out:
                    w: Any = r.wal
                    assert r.first_id == expected[id(w)]
                    expected[id(w)] += len(r.messages)
                else:
                    assert r.future.done() and not held
            queue = rest
        assert all(w._next_alloc == expected[id(w)] for w in wals)


async def test_a_slot_is_released_once_whoever_releases_it() -> None:
    slots = Slots(1)
    slot = await slots.acquire()
    moved = slot.hand_off()
    slot.release()  # spent: the permit moved
    waiter = asyncio.ensure_future(slots.acquire())
    await asyncio.sleep(0)
    assert not waiter.done()
    moved.release()
    moved.release()  # idempotent
    second = await asyncio.wait_for(waiter, 10)
    second.release()
    third = await asyncio.wait_for(slots.acquire(), 10)
    fourth = asyncio.ensure_future(slots.acquire())
    await asyncio.sleep(0)
    assert not fourth.done(), "the double release above did not add a permit"
    third.release()
    (await asyncio.wait_for(fourth, 10)).release()
