"""dedup: idempotent producers.  The node owns a producer's identity: its epoch and its sequences.

**Epochs.**  Every open of a Produce stream with a producer id goes through ``open_producer``: an open
that presents no epoch (a new producer instance, or a client that predates epochs) gets a new one, one
above the last; an open that presents the current epoch (the same instance reconnecting) keeps it; an
older one is refused (PRODUCER_FENCED).  From a bump on, every batch of an older epoch is fenced here,
in the chain, before anything of it is written: the stream's claim (``PRODUCER_CLAIM``, a context
variable the stream's reader task sets once, so every append it starts carries it) is checked against
the table, so even a batch queued before the bump cannot slip through after it.  Epochs are stored
synced in the pchannel's metadata (``producer_epochs.<bucket>``, 64 buckets by CRC-32 of the id, each
a JSON object of the table's producers that hash to it) before an open is answered: they hold across a
restart, an owner change (cluster metadata lives in the shared KV) and retention (metadata is never
truncated).  A bucket is read the first time an id of it opens in this process.

**Sequences.**  A message carries ``(producer id, sequence)`` in its properties.  Per producer the
last ``window`` sequences are remembered with their results and a digest of the content (CRC-32 of
type, vchannel, payload and the properties other than these two), and at most ``max_producers``
producers (least recently used first out), so memory is bounded.  A sequence already written returns
the stored result when the resend carries the same digest, and is refused (DUPLICATE_SEQUENCE_MISMATCH,
the whole batch, nothing written) when it does not: a reused sequence with new content would otherwise
be acknowledged and never stored.  One still being written waits for it (same check); one older than
the window is refused (OUT_OF_RANGE), since its fate is no longer known.  Sequences and digests are
rebuilt from the stored messages (and recovery snapshots) on reopen, so they survive restarts and
retention.  ``open_producer`` answers the next sequence the node expects: one past the highest let
through or stored.

An evicted producer (more than ``max_producers`` distinct ids on one pchannel) is forgotten whole:
its window (a resend of its old batches is written again), its ``admitted`` mark, and its epoch (its
bucket is rewritten without it at the bucket's next write; a stream of it still open, or an open that
presents its epoch, is taken as current again).

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
import contextvars
import json
import zlib
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, Protocol

from interceptors.base import AppendNext
from wal import bodies
from wal.errors import (
    CorruptedError,
    DuplicateSequenceMismatchError,
    InvalidArgumentError,
    OutOfOrderSequenceError,
    OutOfRangeError,
    ProducerFencedError,
)
from wal.message import AppendResult, Message, MessageType, content_fields, has_property, written_with

PROP_PRODUCER = "producer_id"
PROP_SEQUENCE = "producer_seq"
_STAMPS = frozenset((PROP_PRODUCER, PROP_SEQUENCE))
DEFAULT_WINDOW = 4096
"""Sequences per producer remembered by default (``ChainConfig.dedup_window``; the client SDK, which
may not import the chain, keeps an equal ``NODE_DEDUP_WINDOW`` that a test holds to this)."""

PRODUCER_CLAIM: contextvars.ContextVar[tuple[str, int] | None] = contextvars.ContextVar(
    "producer_claim", default=None)
"""``(producer id, epoch)`` of the stream whose appends run in this context (set once by the stream's
reader task: the chain's tasks copy it).  Unset: no epoch check (embedded callers, replays)."""

EPOCH_BUCKETS = 64
"""Metadata values the epochs are spread over: a bump rewrites one, about 1/64 of the table."""
MAX_EPOCH = 1 << 62
"""The largest epoch an open may present.  A node that does not know the producer (new to it, or
evicted) takes a presented epoch as current, and the next open without one gets it plus one: a
client's 2^63-1 would overflow the int64 of ProduceOpened.producer_epoch and break the id for good.
Epochs move by one per open, so no real producer gets near this."""

EPOCH_META = "producer_epochs.{}"
"""The metadata name of bucket ``n`` (``EPOCH_META.format(n)``)."""


class EpochStore(Protocol):
    """Where epochs are kept: the pchannel's WAL (``put_meta`` is synced before it returns)."""

    async def put_meta(self, name: str, value: bytes) -> None: ...

    async def get_meta(self, name: str) -> bytes | None: ...


def content_digest(m: Message) -> int:
    """CRC-32 of a producer's message (one stamped with both ``PROP_PRODUCER`` and ``PROP_SEQUENCE``):
    its type, vchannel, payload and other properties, what a resend under the same sequence must
    repeat.  Computed where the message enters the chain (``do_append`` inlines it) and again when it
    is replayed from storage, without what the chain stamps on row messages (``_ROW_STAMPS``).  Per
    message: a CRC over the payload started from the vchannel's, XOR the type; properties, which most
    messages do not carry, only when there are more than the two stamps."""
    props, vchannel, payload, message_type = content_fields((m,))[0]
    d = zlib.crc32(payload, zlib.crc32(vchannel.encode())) ^ message_type
    if len(props) > len(_STAMPS):
        d = _properties_digest(props, d, message_type)
    return d


_ROW_STAMPS = _STAMPS | {bodies.PROP_SEGMENT, bodies.PROP_ROWS}
"""What a row message's properties carry once the shard step stamped it (beside the producer's):
its segment and row count, and its partition (``_default`` when the producer named none)."""


def _properties_digest(props: dict[str, str], d: int, message_type: int) -> int:
    """The properties' part of ``content_digest``: as the producer sent them, so that a message
    digested where it enters the chain and the same message replayed from storage agree."""
    rows = message_type in bodies.ROW_TYPES
    skip = _ROW_STAMPS if rows else _STAMPS
    for k in sorted(props):
        if k in skip:
            continue
        v = props[k]
        if rows and k == bodies.PROP_PARTITION and v == bodies.DEFAULT_PARTITION:
            continue  # the shard step's default: the same as naming none
        d = zlib.crc32(f"{len(k)}:{k}{len(v)}:{v}".encode(), d)
    return d


def epoch_bucket(producer_id: str) -> int:
    return zlib.crc32(producer_id.encode()) % EPOCH_BUCKETS


_UNSETTLED_BYTES = 16 << 20
"""Payload bytes of replayed messages a replay keeps undigested at most (see ``replay``)."""
_VCHANNEL_CRCS = 4096
"""vchannel CRCs the dedup step keeps (cleared when full): most producers write to a few vchannels."""


class _Producer:
    __slots__ = ("admitted", "epoch", "inflight", "max_seq", "results")

    def __init__(self) -> None:
        # Per sequence: its result and its content digest (None: remembered from a snapshot that
        # predates digests, so a resend cannot be checked and is answered as before; a Message: replayed
        # and not digested yet, see ``DedupInterceptor.replay``).
        self.results: OrderedDict[int, tuple[AppendResult, int | Message | None]] = OrderedDict()
        # Per sequence being written: the future of its batch's results, its place in them, its digest
        # (one future per batch, not per message).
        self.inflight: dict[int, tuple[asyncio.Future[list[AppendResult]], int, int]] = {}
        self.max_seq = -1
        # The highest sequence let through (or skipped) since this process knew the producer; -1: none
        # yet, so the next batch may start anywhere.  Never lowered: a batch that failed in the chain
        # was answered, and its producer goes on after it.
        self.admitted = -1
        self.epoch = 0
        """The current epoch (0: never opened, or forgotten)."""

    def next_sequence(self) -> int:
        return max(self.admitted, self.max_seq) + 1


_NOBODY = _Producer()
"""A placeholder before the first producer of a batch is looked up."""


def _mismatch(pid: str, seq: int) -> DuplicateSequenceMismatchError:
    return DuplicateSequenceMismatchError(
        f"sequence {seq} of producer {pid!r} is already stored with other content (type, vchannel, payload "
        f"or properties): a resend must repeat its batch exactly, and new messages need new sequences "
        f"(open without first_sequence to continue from the node's); nothing of the batch was written",
        producer_id=pid, sequence=seq)


class DedupInterceptor:
    name = "dedup"
    replay_types: frozenset[MessageType] = frozenset()
    """Replay acts only on messages with properties (a producer's stamp): see ``plain_skipping_types``."""

    def __init__(
        self, *, window: int = DEFAULT_WINDOW, max_producers: int = 10_000, store: EpochStore | None = None,
    ) -> None:
        self._window = window
        self._max_producers = max_producers
        self._producers: OrderedDict[str, _Producer] = OrderedDict()
        self._store = store
        """Where epochs are kept (None: in memory only, as for a replay that never opens producers)."""
        self._buckets: dict[int, set[str]] = {}
        """Loaded epoch buckets: the ids each one stored (pruned of evicted ids when rewritten)."""
        self._vchannel_crcs: dict[str, int] = {}
        self._unsettled: set[str] = set()
        """Producers with replayed messages not digested yet (see ``replay``)."""
        self._unsettled_bytes = 0
        self._opening = asyncio.Lock()
        """One open at a time: an epoch bump reads, rewrites and stores its bucket."""

    def _producer(self, pid: str) -> _Producer:
        p = self._producers.get(pid)
        if p is None:
            p = self._producers[pid] = _Producer()
            while len(self._producers) > self._max_producers:
                self._producers.popitem(last=False)
        else:
            self._producers.move_to_end(pid)
        return p

    def _remember(self, p: _Producer, seq: int, result: AppendResult, digest: int | Message | None) -> None:
        p.results[seq] = (result, digest)
        p.max_seq = max(p.max_seq, seq)
        while len(p.results) > self._window:
            p.results.popitem(last=False)

    # --- epochs ------------------------------------------------------------------------------------
    def epoch(self, producer_id: str) -> int:
        """The producer's current epoch as this step knows it (0: none)."""
        p = self._producers.get(producer_id)
        return 0 if p is None else p.epoch

    async def open_producer(self, producer_id: str, epoch: int | None) -> tuple[int, int]:
        """A Produce stream of ``producer_id`` opens, presenting ``epoch`` (None: a new instance).

        Returns ``(epoch, next sequence)``; the epoch is durable before this returns.  Raises
        ProducerFencedError when ``epoch`` is not the current one (a newer open took over)."""
        if epoch is not None and not 1 <= epoch <= MAX_EPOCH:
            raise InvalidArgumentError(f"producer_epoch must be between 1 and {MAX_EPOCH} when set, got {epoch}",
                                       field="producer_epoch")
        async with self._opening:
            await self._load_bucket(producer_id)
            current = self._producer(producer_id).epoch
            if epoch is None:
                new = current + 1
            elif current in (epoch, 0):
                new = epoch  # the instance reconnects (or the node forgot the producer: its epoch stands)
            else:
                raise ProducerFencedError(
                    f"producer {producer_id!r} of epoch {epoch} is fenced: a newer open of the id holds epoch "
                    f"{current}", producer_id=producer_id, epoch=epoch, current_epoch=current)
            if new != current:
                await self._store_epoch(producer_id, new)
            p = self._producer(producer_id)  # (the await may have let the table evict it)
            if p.epoch > new:  # a stream of a forgotten epoch was taken as current meanwhile
                raise ProducerFencedError(
                    f"producer {producer_id!r} of epoch {new} is fenced by epoch {p.epoch}",
                    producer_id=producer_id, epoch=new, current_epoch=p.epoch)
            p.epoch = new
            return new, p.next_sequence()

    async def _load_bucket(self, producer_id: str) -> None:
        b = epoch_bucket(producer_id)
        if b in self._buckets:
            return
        ids: set[str] = set()
        raw = await self._store.get_meta(EPOCH_META.format(b)) if self._store is not None else None
        if raw is not None:
            try:
                stored = {str(k): int(v) for k, v in json.loads(raw).items()}
            except (ValueError, TypeError, AttributeError) as exc:
                # Refused, not guessed: taking the epochs as lost could hand a zombie its epoch back.
                raise CorruptedError(f"stored producer epochs {EPOCH_META.format(b)!r} are unreadable: {exc!r}",
                                     meta=EPOCH_META.format(b)) from None
            for pid, e in stored.items():
                p = self._producers.get(pid)
                if p is None:
                    if len(self._producers) >= self._max_producers:
                        continue  # a full table forgets it, as if it had been evicted
                    p = self._producers[pid] = _Producer()
                    self._producers.move_to_end(pid, last=False)  # opened, not used, in this process
                p.epoch = max(p.epoch, e)
                ids.add(pid)
        self._buckets.setdefault(b, ids)

    async def _store_epoch(self, producer_id: str, epoch: int) -> None:
        b = epoch_bucket(producer_id)
        ids = self._buckets.setdefault(b, set())
        doc: dict[str, int] = {}
        for pid in ids:
            p = self._producers.get(pid)
            if p is not None and p.epoch > 0:  # evicted ids leave the bucket here
                doc[pid] = p.epoch
        doc[producer_id] = epoch
        if self._store is not None:
            await self._store.put_meta(EPOCH_META.format(b), json.dumps(doc, separators=(",", ":")).encode())
        ids.intersection_update(doc)
        ids.add(producer_id)

    # --- the chain -----------------------------------------------------------------------------------
    async def do_append(self, batch: list[Message], append_next: AppendNext) -> list[AppendResult]:
        if not has_property(batch, PROP_PRODUCER):
            return await append_next(batch)  # no idempotent producer in this batch
        claim = PRODUCER_CLAIM.get()
        if claim is not None:
            cpid, cepoch = claim
            claimed = self._producers.get(cpid)
            current = 0 if claimed is None else claimed.epoch
            if current > cepoch:
                raise ProducerFencedError(
                    f"producer {cpid!r} of epoch {cepoch} is fenced: a newer open of the id holds epoch {current}; "
                    "nothing of the batch was written", producer_id=cpid, epoch=cepoch, current_epoch=current)
        known: dict[int, AppendResult | tuple[asyncio.Future[list[AppendResult]], int]] = {}
        fresh: list[int] = []
        # The producers' fresh messages: (place among the fresh, producer, sequence, digest).
        stamped: list[tuple[int, _Producer, int, int]] = []
        # Every producer's sequences in the batch, checked for repeats once the loop is through.
        sequences: dict[str, list[int]] = {}
        # The highest sequence of each producer once this batch is let through: checked for every
        # message before any is, so a refused batch changes nothing.
        high: dict[str, int] = {}
        crc = zlib.crc32
        vcrcs = self._vchannel_crcs
        last_pid: str | None = None
        p = _NOBODY
        seqs: list[int] = []
        # The fields read in one pass (wal.message.content_fields), then the producer stamp and sequence
        # read inline (per message: no call per message).
        for i, (props, vchannel, payload, mtype) in enumerate(content_fields(batch)):
            pid = props.get(PROP_PRODUCER) if props else None
            if pid is None:
                fresh.append(i)
                continue
            raw = props.get(PROP_SEQUENCE)
            try:
                seq = int(raw) if raw is not None else -1
            except ValueError:
                seq = -1
            if seq < 0:
                raise InvalidArgumentError(
                    f"message of producer {pid!r} needs a non-negative integer {PROP_SEQUENCE!r}, got {raw!r}",
                    producer_id=pid)
            if pid != last_pid:  # a batch is mostly one producer's: one table lookup for it
                p = self._producer(pid)
                last_pid = pid
                seqs = sequences.setdefault(pid, [])
            seqs.append(seq)
            # content_digest, inlined with the vchannel's CRC cached: this runs for every message.
            vc = vcrcs.get(vchannel)
            if vc is None:
                if len(vcrcs) >= _VCHANNEL_CRCS:
                    vcrcs.clear()
                vc = vcrcs[vchannel] = crc(vchannel.encode())
            digest = crc(payload, vc) ^ mtype
            if len(props) > len(_STAMPS):
                digest = _properties_digest(props, digest, mtype)
            stored = p.results.get(seq)
            if stored is not None:
                was = stored[1]
                if was is not None:
                    if was.__class__ is not int:  # replayed, not digested yet
                        was = self._settle(p, seq, stored)
                    if was != digest:
                        raise _mismatch(pid, seq)
                known[i] = stored[0]
            elif seq in p.inflight:
                fut, pos, was = p.inflight[seq]
                if was != digest:
                    raise _mismatch(pid, seq)
                known[i] = (fut, pos)
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
                stamped.append((len(fresh), p, seq, digest))
                fresh.append(i)
        for pid, seqs in sequences.items():
            if len(set(seqs)) != len(seqs):
                twice = next(q for j, q in enumerate(seqs) if q in seqs[:j])
                raise InvalidArgumentError(f"sequence {twice} of producer {pid!r} appears twice in one batch")
        if claim is not None:
            claimed = self._producers.get(claim[0])
            if claimed is not None and claimed.epoch < claim[1]:
                claimed.epoch = claim[1]  # forgotten (evicted) meanwhile: the open stream's epoch stands
        for pid, top in high.items():
            entry = self._producers.get(pid)
            if entry is not None:  # (gone only if this one batch named more producers than the table holds)
                entry.admitted = top
        written: asyncio.Future[list[AppendResult]] = asyncio.get_running_loop().create_future()
        for pos, q, seq, digest in stamped:
            q.inflight[seq] = (written, pos, digest)
        try:
            results = await append_next([batch[i] for i in fresh]) if fresh else []
        except BaseException as exc:
            for _, q, seq, _ in stamped:
                q.inflight.pop(seq, None)
            written.set_exception(exc)
            written.exception()  # mark retrieved: nobody may be waiting
            raise
        out: list[AppendResult | None] = [None] * len(batch)
        for i, r in zip(fresh, results, strict=True):
            out[i] = r
        window = self._window
        for pos, q, seq, digest in stamped:
            q.inflight.pop(seq, None)
            # _remember, inlined (per message)
            results_of = q.results
            results_of[seq] = (results[pos], digest)
            if seq > q.max_seq:  # noqa: PLR1730  (no call of max() per message)
                q.max_seq = seq
            if len(results_of) > window:
                results_of.popitem(last=False)
        written.set_result(results)
        for pid in high:  # recently used: once per producer and batch, not per message
            if pid in self._producers:
                self._producers.move_to_end(pid)
        for i, r_or_f in known.items():
            if isinstance(r_or_f, AppendResult):
                out[i] = r_or_f
            else:  # the original is still being written: its batch's result
                out[i] = (await r_or_f[0])[r_or_f[1]]
        return out  # type: ignore[return-value]

    def skip(self, producer_id: str, first: int, count: int) -> None:
        """Sequences ``first .. first + count - 1`` of ``producer_id`` were refused before the chain
        (a bad batch, answered as such): its producer goes on after them, which is no gap."""
        p = self._producers.get(producer_id)
        if p is not None and p.admitted >= 0 and first <= p.admitted + 1:
            p.admitted = max(p.admitted, first + count - 1)

    def replay(self, batch: list[Message]) -> None:
        """Remember the stored producers' messages.  Their digests are taken lazily: a replay (at
        recovery, and the shadow replays of periodic snapshots, which follow every message written)
        keeps the message itself, and the digest is computed only for what is still remembered when
        it is needed -- a resend, an export, the end of recovery, or more than ``_UNSETTLED_BYTES``
        of payload held -- not for the many messages the window drops meanwhile."""
        # The stamps, _producer and _remember inlined, the producer looked up once per run of its messages:
        # the shadow replays of periodic snapshots run this for every message written.
        window = self._window
        last_pid: str | None = None
        p = _NOBODY
        nbytes = 0
        # The written messages with a producer stamp, their results and sizes read in one pass.
        for props, result, size, m in written_with(batch, PROP_PRODUCER):
            pid = props[PROP_PRODUCER]
            raw = props.get(PROP_SEQUENCE)
            try:
                seq = int(raw) if raw is not None else -1
            except ValueError:
                continue
            if seq < 0:
                continue  # not something the dedup step would have let through
            if pid != last_pid:
                p = self._producer(pid)
                last_pid = pid
                self._unsettled.add(pid)
            results = p.results
            results[seq] = (result, m)
            if seq > p.max_seq:  # noqa: PLR1730  (no call of max() per message)
                p.max_seq = seq
            if len(results) > window:
                results.popitem(last=False)
            nbytes += size
        self._unsettled_bytes += nbytes
        if self._unsettled_bytes > _UNSETTLED_BYTES:
            self._settle_all()

    def _settle(self, p: _Producer, seq: int, entry: tuple[AppendResult, int | Message | None]) -> int:
        """The digest of a replayed entry, computed now and kept."""
        m = entry[1]
        assert isinstance(m, Message)
        digest = content_digest(m)
        p.results[seq] = (entry[0], digest)
        return digest

    def _settle_all(self) -> None:
        """Digest every replayed message still remembered, and let the messages go."""
        for pid in self._unsettled:
            p = self._producers.get(pid)
            if p is None:
                continue
            for seq, entry in p.results.items():
                if isinstance(entry[1], Message):
                    p.results[seq] = (entry[0], content_digest(entry[1]))
        self._unsettled.clear()
        self._unsettled_bytes = 0

    def export_state(self) -> dict[str, Any]:
        """The remembered results and digests per producer, least recently used first (see
        SnapshotInterceptor).  Epochs are not in it: they live in the pchannel's metadata."""
        self._settle_all()
        return {"producers": [
            [pid, p.max_seq, [[seq, r.message_id, r.timetick, r.txn_id, d] for seq, (r, d) in p.results.items()]]
            for pid, p in self._producers.items()
        ]}

    def import_state(self, state: dict[str, Any]) -> None:
        for pid, max_seq, results in state["producers"]:
            p = self._producer(str(pid))
            for entry in results:
                seq, mid, ts, txn_id = entry[:4]
                digest = entry[4] if len(entry) > 4 else None  # a snapshot from before digests
                self._remember(p, int(seq), AppendResult(int(mid), int(ts), None if txn_id is None else int(txn_id)),
                               None if digest is None else int(digest))
            p.max_seq = max(p.max_seq, int(max_seq))

    async def recovered(self) -> None:
        self._settle_all()

    async def close(self) -> None:
        self._producers.clear()
        self._buckets.clear()


def dedup_step(steps: Iterable[object]) -> DedupInterceptor | None:
    """The dedup step among ``steps`` (a chain's interceptors), if any."""
    for step in steps:
        if isinstance(step, DedupInterceptor):
            return step
    return None


def skip_sequences(steps: Iterable[object], producer_id: str, first: int, count: int) -> None:
    """Tell the dedup step among ``steps`` (a chain's interceptors) that a batch of ``producer_id``
    was refused before reaching it (see ``DedupInterceptor.skip``); no dedup step, nothing to do."""
    for step in steps:
        if isinstance(step, DedupInterceptor):
            step.skip(producer_id, first, count)


__all__ = [
    "EPOCH_BUCKETS",
    "EPOCH_META",
    "MAX_EPOCH",
    "PRODUCER_CLAIM",
    "PROP_PRODUCER",
    "PROP_SEQUENCE",
    "DedupInterceptor",
    "EpochStore",
    "content_digest",
    "dedup_step",
    "epoch_bucket",
    "skip_sequences",
]
