"""The dedup step's gap rule on its own: what counts as seen, and what a producer it does not know (or
knows only from stored messages) may do."""

from __future__ import annotations

import asyncio

import pytest

from interceptors.dedup import PROP_PRODUCER, PROP_SEQUENCE, DedupInterceptor
from tests.factories import ins
from tests.unit.test_interceptor_steps import FakeNext
from wal.errors import OutOfOrderSequenceError, TxnNotFoundError
from wal.message import Message


def _msgs(pid: str, first: int, n: int = 1) -> list[Message]:
    return [ins("v", 1, f"{pid}:{s}".encode(), **{PROP_PRODUCER: pid, PROP_SEQUENCE: str(s)})
            for s in range(first, first + n)]


async def test_a_gap_refuses_the_whole_batch_and_changes_nothing() -> None:
    step = DedupInterceptor()
    nxt = FakeNext()
    await step.do_append(_msgs("p", 0, 2), nxt)
    # Known sequences, then a fresh one that skips: refused as a whole, even the part that fits.
    with pytest.raises(OutOfOrderSequenceError) as err:
        await step.do_append([*_msgs("p", 1), *_msgs("p", 4)], nxt)
    assert err.value.fields == {"producer_id": "p", "expected": 2, "got": 4}
    with pytest.raises(OutOfOrderSequenceError):
        await step.do_append([*_msgs("p", 2), *_msgs("p", 4)], nxt)  # 3 is missing inside the batch
    assert len(nxt.batches) == 1
    await step.do_append(_msgs("p", 2, 3), nxt)  # the refusals moved nothing: 2 is still next
    assert [m.payload for m in nxt.batches[1]] == [b"p:2", b"p:3", b"p:4"]


async def test_batches_in_flight_count_and_a_failed_one_is_no_gap() -> None:
    step = DedupInterceptor()
    nxt = FakeNext()
    nxt.gate = asyncio.Event()
    first = asyncio.ensure_future(step.do_append(_msgs("p", 0, 2), nxt))
    await asyncio.sleep(0)  # let it enter the step (it then waits at the gate)
    second = asyncio.ensure_future(step.do_append(_msgs("p", 2), nxt))
    await asyncio.sleep(0)
    nxt.gate.set()
    await first
    await second
    nxt.fail_with.append(TxnNotFoundError("no such transaction"))
    with pytest.raises(TxnNotFoundError):
        await step.do_append(_msgs("p", 3), nxt)
    await step.do_append(_msgs("p", 4), nxt)  # 3 was answered (refused): going on after it is fine
    await step.do_append(_msgs("p", 3), nxt)  # and a resend of it is still taken
    assert [m.payload for b in nxt.batches for m in b] == [b"p:0", b"p:1", b"p:2", b"p:4", b"p:3"]


async def test_skip_covers_a_batch_refused_before_the_chain() -> None:
    step = DedupInterceptor()
    nxt = FakeNext()
    await step.do_append(_msgs("p", 0), nxt)
    step.skip("p", 1, 3)
    await step.do_append(_msgs("p", 4), nxt)
    step.skip("p", 9, 1)  # itself beyond a gap: moves nothing
    with pytest.raises(OutOfOrderSequenceError):
        await step.do_append(_msgs("p", 10), nxt)


async def test_an_unknown_or_recovered_producer_may_start_anywhere_then_must_go_on() -> None:
    step = DedupInterceptor()
    nxt = FakeNext()
    await step.do_append(_msgs("new", 500), nxt)
    with pytest.raises(OutOfOrderSequenceError):
        await step.do_append(_msgs("new", 502), nxt)
    stored = [m for b in nxt.batches for m in b]
    for i, m in enumerate(stored):
        m._seal(i)
    # After a restart the table is rebuilt from stored messages, which cannot tell a lost batch from
    # one refused before the restart: the first fresh batch may start anywhere above, duplicates are
    # still answered from the table.
    replayed = DedupInterceptor()
    replayed.replay(stored)
    imported = DedupInterceptor()
    imported.import_state(step.export_state())
    for fresh in (replayed, imported):
        again = await fresh.do_append(_msgs("new", 500), nxt)
        assert again[0].message_id == 0
        await fresh.do_append(_msgs("new", 510), nxt)
        with pytest.raises(OutOfOrderSequenceError):
            await fresh.do_append(_msgs("new", 512), nxt)
