"""dedup: idempotent producers.  A retried message returns its original result and writes nothing.

A message carries ``(producer id, sequence)`` in its properties.  Per producer the last ``window``
sequences and their results are remembered (and at most ``max_producers`` producers, least recently
used first out), so memory is bounded.  A sequence already written returns the stored result; one
still being written waits for it; one older than the window is refused, since its fate is no longer
known.  The table is rebuilt from the stored messages on reopen, so it survives restarts.

A sequence more than one past the highest this step has let through for the producer is refused
(OUT_OF_ORDER_SEQUENCE, the whole batch, nothing written): a batch between was never received, so
writing this one would leave a hole the producer believes filled.  "Let through" counts batches the
chain then refused (their producer heard of the failure and moves on; a resend of them is still
accepted) and batches refused before the chain (``skip``).  The rule is checked only against what
this process saw: a producer it does not know yet -- new, dropped from the table, or known only from
the stored messages after a reopen (which cannot tell a lost batch from one refused before the
restart) -- may start at any sequence, and its first batch sets where it must go on.

It runs first in the chain, before any lock or timestamp is taken for a message that will not be
written.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from interceptors.base import AppendNext
from wal.errors import InvalidArgumentError, OutOfOrderSequenceError, OutOfRangeError
from wal.message import AppendResult, Message

PROP_PRODUCER = "producer_id"
PROP_SEQUENCE = "producer_seq"


class _Producer:
    __slots__ = ("admitted", "inflight", "max_seq", "results")

    def __init__(self) -> None:
        self.results: OrderedDict[int, AppendResult] = OrderedDict()
        self.inflight: dict[int, asyncio.Future[AppendResult]] = {}
        self.max_seq = -1
        # The highest sequence let through (or skipped) since this process knew the producer; -1: none
        # yet, so the next batch may start anywhere.  Never lowered: a batch that failed in the chain
        # was answered, and its producer goes on after it.
        self.admitted = -1


def _key(m: Message) -> tuple[str, int] | None:
    props = m._properties
    if not props:
        return None
    pid = props.get(PROP_PRODUCER)
    if pid is None:
        return None
    raw = props.get(PROP_SEQUENCE)
    try:
        seq = int(raw) if raw is not None else -1
    except ValueError:
        seq = -1
    if seq < 0:
        raise InvalidArgumentError(
            f"message of producer {pid!r} needs a non-negative integer {PROP_SEQUENCE!r}, got {raw!r}",
            producer_id=pid,
        )
    return pid, seq


class DedupInterceptor:
    name = "dedup"

    def __init__(self, *, window: int = 4096, max_producers: int = 10_000) -> None:
        self._window = window
        self._max_producers = max_producers
        self._producers: OrderedDict[str, _Producer] = OrderedDict()

    def _producer(self, pid: str) -> _Producer:
        p = self._producers.get(pid)
        if p is None:
            p = self._producers[pid] = _Producer()
            while len(self._producers) > self._max_producers:
                self._producers.popitem(last=False)
        else:
            self._producers.move_to_end(pid)
        return p

    def _remember(self, p: _Producer, seq: int, result: AppendResult) -> None:
        p.results[seq] = result
        p.max_seq = max(p.max_seq, seq)
        while len(p.results) > self._window:
            p.results.popitem(last=False)

    async def do_append(self, batch: list[Message], append_next: AppendNext) -> list[AppendResult]:
        if not any(m._properties and PROP_PRODUCER in m._properties for m in batch):
            return await append_next(batch)  # no idempotent producer in this batch
        keys = [_key(m) for m in batch]
        known: dict[int, AppendResult | asyncio.Future[AppendResult]] = {}
        fresh: list[int] = []
        seen: set[tuple[str, int]] = set()
        # The highest sequence of each producer once this batch is let through: checked for every
        # message before any is, so a refused batch changes nothing.
        high: dict[str, int] = {}
        for i, k in enumerate(keys):
            if k is None:
                fresh.append(i)
                continue
            if k in seen:
                raise InvalidArgumentError(f"sequence {k[1]} of producer {k[0]!r} appears twice in one batch")
            seen.add(k)
            pid, seq = k
            p = self._producer(pid)
            if seq in p.results:
                known[i] = p.results[seq]
            elif seq in p.inflight:
                known[i] = p.inflight[seq]
            elif seq <= p.max_seq and p.results and seq < next(iter(p.results)):
                raise OutOfRangeError(
                    f"sequence {seq} of producer {pid!r} is older than the dedup window "
                    f"(oldest remembered {next(iter(p.results))})",
                    producer_id=pid,
                )
            else:
                top = high.get(pid, p.admitted)
                if top >= 0 and seq > top + 1:
                    raise OutOfOrderSequenceError(
                        f"sequence {seq} of producer {pid!r} skips ahead: the next expected is {top + 1} "
                        f"(sequences {top + 1}..{seq - 1} never reached the node); nothing of the batch "
                        "was written",
                        producer_id=pid, expected=top + 1, got=seq,
                    )
                high[pid] = max(top, seq)
                fresh.append(i)
        for pid, top in high.items():
            entry = self._producers.get(pid)
            if entry is not None:  # (gone only if this one batch named more producers than the table holds)
                entry.admitted = top
        loop = asyncio.get_running_loop()
        futures: dict[int, asyncio.Future[AppendResult]] = {}
        for i in fresh:
            k = keys[i]
            if k is not None:
                futures[i] = self._producers[k[0]].inflight[k[1]] = loop.create_future()
        try:
            results = await append_next([batch[i] for i in fresh]) if fresh else []
        except BaseException as exc:
            for i, fut in futures.items():
                k = keys[i]
                assert k is not None
                self._producers.get(k[0], _Producer()).inflight.pop(k[1], None)
                if not fut.done():
                    fut.set_exception(exc)
                    fut.exception()  # mark retrieved: nobody may be waiting
            raise
        out: list[AppendResult | None] = [None] * len(batch)
        for i, r in zip(fresh, results, strict=True):
            out[i] = r
            k = keys[i]
            if k is not None:
                p = self._producer(k[0])
                p.inflight.pop(k[1], None)
                self._remember(p, k[1], r)
                futures[i].set_result(r)
        for i, r_or_f in known.items():
            out[i] = await r_or_f if isinstance(r_or_f, asyncio.Future) else r_or_f
        return out  # type: ignore[return-value]

    def skip(self, producer_id: str, first: int, count: int) -> None:
        """Sequences ``first .. first + count - 1`` of ``producer_id`` were refused before the chain
        (a bad batch, answered as such): its producer goes on after them, which is no gap."""
        p = self._producers.get(producer_id)
        if p is not None and p.admitted >= 0 and first <= p.admitted + 1:
            p.admitted = max(p.admitted, first + count - 1)

    def replay(self, batch: list[Message]) -> None:
        for m in batch:
            if not m._properties:  # no producer stamp (most messages): nothing to remember
                continue
            try:
                k = _key(m)
            except InvalidArgumentError:
                continue
            if k is not None and m.message_id is not None:
                txn = m.txn
                self._remember(self._producer(k[0]), k[1],
                               AppendResult(m.message_id, m.timetick, txn.txn_id if txn else None))

    def export_state(self) -> dict[str, Any]:
        """The remembered results per producer, least recently used first (see SnapshotInterceptor)."""
        return {"producers": [
            [pid, p.max_seq, [[seq, r.message_id, r.timetick, r.txn_id] for seq, r in p.results.items()]]
            for pid, p in self._producers.items()
        ]}

    def import_state(self, state: dict[str, Any]) -> None:
        for pid, max_seq, results in state["producers"]:
            p = self._producer(str(pid))
            for seq, mid, ts, txn_id in results:
                self._remember(p, int(seq), AppendResult(int(mid), int(ts), None if txn_id is None else int(txn_id)))
            p.max_seq = max(p.max_seq, int(max_seq))

    async def recovered(self) -> None:
        return None

    async def close(self) -> None:
        self._producers.clear()


def skip_sequences(steps: Iterable[object], producer_id: str, first: int, count: int) -> None:
    """Tell the dedup step among ``steps`` (a chain's interceptors) that a batch of ``producer_id``
    was refused before reaching it (see ``DedupInterceptor.skip``); no dedup step, nothing to do."""
    for step in steps:
        if isinstance(step, DedupInterceptor):
            step.skip(producer_id, first, count)


__all__ = ["PROP_PRODUCER", "PROP_SEQUENCE", "DedupInterceptor", "skip_sequences"]
