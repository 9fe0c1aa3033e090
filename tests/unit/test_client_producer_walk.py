"""The producer's sender against a plain model of a node, through seeded random outages.

The fake node keeps a log and the dedup table a real node keeps (a batch whose sequences it stored is
answered with the stored results and written again never).  For each batch written to it, it draws
what happens: stored and answered; refused in band with a transient error, nothing stored
(UNAVAILABLE, REDO, RESOURCE_EXHAUSTED); refused NOT_OWNER (the lease lost: every later batch of the
stream is refused alike, as a node that no longer owns the pchannel does); stored but answered
DEADLINE_EXCEEDED (the fate the node could not tell); the stream broken with the batch stored or not
(the connection lost); or refused before the stream opens.  After a while the outage ends and every batch is stored.

Checked for an idempotent producer, for each seed: every send ends; every acknowledged send is in the
log once, with the id it was acknowledged with; a failed one is there at most once; the log holds the
sends in the order they were made (no duplicate, nothing reordered), and no send fails while the
outage lasts less than ``reconnect_timeout`` except one held back and then overtaken by a later batch
the node stored (it fails rather than land out of order).  For a producer without an id: nothing in
the log twice and the order kept, and a send that was acknowledged is stored."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import grpc
import pytest

from streamingnode.client._producer import Producer
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.wire.codes import to_error_detail
from wal.errors import (
    DeadlineExceededError,
    NotOwnerError,
    RedoError,
    ResourceExhaustedError,
    StreamingError,
    UnavailableError,
)
from wal.message import AppendResult

TRANSIENT = (UnavailableError, RedoError, ResourceExhaustedError)


class _Node:
    """A node's produce path, reduced to what the producer sees; ``faults`` outage steps are left."""

    def __init__(self, rng: random.Random, faults: int, *, sticky: bool = False) -> None:
        self.rng = rng
        self.faults = faults
        self.sticky = sticky
        """A stream's first transient refusal holds for every later batch of that stream (as the
        JetStream backend sends nothing after a write that failed), so no later batch overtakes it."""
        self.log: list[bytes] = []  # payloads, in the order stored; a message's id is its index
        self.stored: dict[int, list[int]] = {}  # first sequence of a stored batch -> its ids
        self.opens = 0

    def fault(self, weights: dict[str, int]) -> str:
        if self.faults <= 0:
            return "ok"
        self.faults -= 1
        kinds = list(weights)
        return self.rng.choices(kinds, weights=[weights[k] for k in kinds])[0]

    def store(self, batch: spb.ProduceBatch, idempotent: bool) -> list[int]:
        first = batch.first_sequence
        if idempotent and first in self.stored:  # dedup: a resend is answered with the first result
            return self.stored[first]
        ids = list(range(len(self.log), len(self.log) + len(batch.columns.payloads)))
        self.log.extend(batch.columns.payloads)
        if idempotent:
            self.stored[first] = ids
        return ids

    def Produce(self) -> _Call:
        return _Call(self)


def _broken() -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                details="Socket closed")


class _Call:
    def __init__(self, node: _Node) -> None:
        self.node = node
        self.responses: asyncio.Queue[spb.ProduceResponse | grpc.aio.AioRpcError] = asyncio.Queue()
        self.broken = False
        self.idempotent = False
        self.not_owner = False
        self.refusing: StreamingError | None = None

    async def write(self, request: spb.ProduceRequest) -> None:
        if self.broken:
            raise _broken()
        node = self.node
        kind = request.WhichOneof("request")
        if kind == "open":
            node.opens += 1
            self.idempotent = bool(request.open.producer_id)
            if node.fault({"ok": 6, "refused": 1}) == "refused":
                self._break()
                return
            nxt = max((s + len(ids) for s, ids in node.stored.items()), default=0) if self.idempotent else 0
            self.responses.put_nowait(spb.ProduceResponse(opened=spb.ProduceOpened(
                pchannel="p", term=1, producer_id=request.open.producer_id, producer_epoch=1, next_sequence=nxt)))
            return
        if kind == "close":
            self.responses.put_nowait(spb.ProduceResponse(closed=spb.ProduceClosed()))
            return
        batch = request.batch
        result = spb.ProduceBatchResult(request_id=batch.request_id)
        if self.refusing is not None:
            result.error.CopyFrom(to_error_detail(self.refusing))
            self.responses.put_nowait(spb.ProduceResponse(result=result))
            return
        what = "not_owner" if self.not_owner else node.fault(
            {"ok": 4, "transient": 3, "not_owner": 1, "unknown": 1, "lost": 1, "broken": 1})
        if node.sticky and what in ("transient", "unknown"):
            self.refusing = UnavailableError("injected: the write before this one failed, so this one was not sent")
        if what == "not_owner":
            self.not_owner = True
            result.error.CopyFrom(to_error_detail(NotOwnerError("injected: the lease was lost")))
        elif what == "transient":
            result.error.CopyFrom(to_error_detail(node.rng.choice(TRANSIENT)("injected: not now")))
        elif what == "unknown":
            node.store(batch, self.idempotent)
            result.error.CopyFrom(to_error_detail(DeadlineExceededError("injected: stored, the answer late")))
        elif what in ("lost", "broken"):
            if what == "lost":
                node.store(batch, self.idempotent)  # stored; the answer never arrives
            self._break()
            return
        else:
            ids = node.store(batch, self.idempotent)
            result.appended.ids.extend(ids)
            result.appended.timeticks.extend(ids)
        self.responses.put_nowait(spb.ProduceResponse(result=result))

    def _break(self) -> None:
        self.broken = True
        self.responses.put_nowait(_broken())

    async def read(self) -> Any:
        item = await self.responses.get()
        if isinstance(item, grpc.aio.AioRpcError):
            self.responses.put_nowait(item)
            raise item
        return item

    async def done_writing(self) -> None:
        self.responses.put_nowait(grpc.aio.EOF)

    def cancel(self) -> None:
        self.broken = True


@pytest.fixture(autouse=True)
def no_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backoffs are taken at once (their lengths are the routing tests' business)."""
    real = asyncio.sleep

    async def sleep(delay: float, *args: Any) -> Any:
        return await real(0, *args)

    monkeypatch.setattr(asyncio, "sleep", sleep)


Outcomes = list[AppendResult | BaseException]


async def _walk(seed: int, producer_id: str | None, *, sticky: bool = False) -> tuple[_Node, list[bytes], Outcomes]:
    rng = random.Random(seed)
    node = _Node(rng, faults=rng.randrange(20, 120), sticky=sticky)
    producer = Producer(node, "p", producer_id=producer_id, linger=0, max_batch_messages=rng.choice([1, 3, 10]),
                        max_in_flight=rng.choice([1, 2, 4]), reconnect_timeout=1_000.0)
    sent: list[bytes] = []
    futures = []
    for step in range(rng.randrange(30, 80)):
        for _ in range(rng.randrange(1, 12)):
            payload = f"{seed}:{len(sent)}".encode()
            sent.append(payload)
            futures.append(producer.send_nowait("v", payload))
        if rng.random() < 0.5:
            await asyncio.sleep(0)
        if step % 10 == 9:
            await asyncio.wait(futures[-1:])
    async with asyncio.timeout(60):
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        await producer.aclose()
    return node, sent, outcomes


def _in_send_order(log: list[bytes], sent: list[bytes]) -> bool:
    where = {p: i for i, p in enumerate(sent)}
    positions = [where[p] for p in log]
    return positions == sorted(positions)


@pytest.mark.parametrize("seed", range(40))
async def test_an_idempotent_producer_through_random_outages(seed: int) -> None:
    node, sent, outcomes = await _walk(seed, "walk")
    assert len(node.log) == len(set(node.log)), "a send stored twice"
    assert _in_send_order(node.log, sent), "sends stored out of order"
    for payload, outcome in zip(sent, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            # Only a batch held back and overtaken fails: with its transient (or unknown-fate) error.
            assert isinstance(outcome, StreamingError) and isinstance(
                outcome, (*TRANSIENT, NotOwnerError, DeadlineExceededError)), outcome
        else:
            assert node.log[outcome.message_id] == payload, "acknowledged with another message's id"
    failed = sum(isinstance(o, BaseException) for o in outcomes)
    assert failed <= len(sent) // 2, f"{failed} of {len(sent)} sends failed"


@pytest.mark.parametrize("seed", range(40))
async def test_an_idempotent_producer_loses_nothing_when_no_batch_overtakes_a_refused_one(seed: int) -> None:
    # What the node's log promises in cluster mode (nothing is written after a write that failed on the
    # stream): then every send is delivered, exactly once, in order, whatever the outage did.
    node, sent, outcomes = await _walk(seed, "walk", sticky=True)
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    assert failed == [], f"{len(failed)} sends failed: {failed[:2]}"
    assert node.log == sent
    assert [o.message_id for o in outcomes if isinstance(o, AppendResult)] == list(range(len(sent)))


@pytest.mark.parametrize("seed", range(20))
async def test_a_plain_producer_through_random_outages(seed: int) -> None:
    node, sent, outcomes = await _walk(seed, None)
    assert len(node.log) == len(set(node.log)), "a send stored twice"
    assert _in_send_order(node.log, sent), "sends stored out of order"
    for payload, outcome in zip(sent, outcomes, strict=True):
        if not isinstance(outcome, BaseException):
            assert node.log[outcome.message_id] == payload


async def test_the_walks_meet_every_fault() -> None:
    """The model is not idle: over the seeds, every kind of fault is drawn and resends happen."""
    seen: set[str] = set()
    real = _Node.fault

    def counting(self: _Node, weights: dict[str, int]) -> str:
        kind = real(self, weights)
        seen.add(kind)
        return kind

    _Node.fault = counting  # type: ignore[method-assign]
    try:
        for seed in range(5):
            node, _, _ = await _walk(seed, "walk")
            assert node.opens > 1
    finally:
        _Node.fault = real  # type: ignore[method-assign]
    assert seen >= {"ok", "transient", "not_owner", "unknown", "lost", "broken", "refused"}
