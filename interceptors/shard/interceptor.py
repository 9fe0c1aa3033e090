"""shard: the collection/partition registry and segment assignment of one pchannel.

Every batch is checked whole before anything goes down the chain: DDL against the registry as the
batch's earlier messages leave it (so create-then-insert works in one batch), DML against the
collection's schema, and one invalid message fails the batch with nothing written.  The registry
changes only once the write succeeded.

Inserts and upserts get the ``segment`` (and ``rows``) property: the current growing segment of their
(vchannel, collection, partition).  A segment is sealed by a FLUSH message written in the same batch
right after the message that caused it — when it reaches ``max_rows`` or ``max_bytes`` (an insert
that would overflow it goes to a new segment instead), when an insert finds it older than
``max_age_seconds``, and on MANUAL_FLUSH.  Drops seal the dropped collection's or partition's
segments with FLUSH messages written right *before* the drop, so nothing a reader sees names a
collection after its drop.  ``seal_expired`` hands a timer the FLUSH messages of aged segments to
append through the chain.  Results returned to the caller leave out the injected FLUSH messages.

Segment bookkeeping is reserved when a batch is planned, so concurrent DML batches share segments
correctly; a failed write gives the reservation back.  Consumers must accept rows for a segment after
its FLUSH: a transaction body is delivered at its commit, and a retried batch can land after a seal
planned later — a seal means no new rows are *assigned*, not that none are still on their way.

DDL relies on the lock step before this one: it runs alone on its vchannel.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from interceptors.base import AppendNext
from interceptors.shard.segments import Segment, SegmentInfo, SegmentState, SegmentTable
from wal import bodies, columns, names
from wal.bodies import DEFAULT_PARTITION, PROP_COLLECTION, PROP_PARTITION, PROP_PRIMARY_KEY, PROP_ROWS
from wal.clock import LOGICAL_BITS
from wal.errors import (
    CollectionExistError,
    CollectionNotExistError,
    InvalidArgumentError,
    PartitionExistError,
    PartitionNotExistError,
    SchemaMismatchError,
    StreamingError,
)
from wal.message import BROADCAST_VCHANNEL, AppendResult, Message, MessageType

_T = MessageType
_DDL = frozenset({_T.CREATE_COLLECTION, _T.DROP_COLLECTION, _T.CREATE_PARTITION, _T.DROP_PARTITION})
_NO_TXN = _DDL | {_T.MANUAL_FLUSH, _T.FLUSH}


@dataclass(frozen=True, slots=True)
class CollectionInfo:
    """A read-only view of a collection on one vchannel."""

    vchannel: str
    name: str
    schema: pa.Schema
    primary_key: str
    partitions: frozenset[str]
    dropped: bool = False


@dataclass(frozen=True, slots=True)
class _Collection:
    info: CollectionInfo
    rows: columns.RowCheck

    @classmethod
    def new(cls, vchannel: str, name: str, schema: pa.Schema, primary_key: str) -> _Collection:
        info = CollectionInfo(vchannel, name, schema, primary_key, frozenset({DEFAULT_PARTITION}))
        return cls(info, columns.RowCheck(schema, primary_key, name))

    def with_partitions(self, partitions: frozenset[str]) -> _Collection:
        return replace(self, info=replace(self.info, partitions=partitions))

    def as_dropped(self) -> _Collection:
        return replace(self, info=replace(self.info, dropped=True))


class _Plan:
    """One batch on its way down: what to write and how to undo the segment reservations."""

    __slots__ = ("created", "index", "now", "out", "overlay", "reserved", "sealed", "stamped")

    def __init__(self) -> None:
        self.out: list[Message] = []
        self.index: list[int] = []  # out position of each caller message
        self.overlay: dict[tuple[str, str], _Collection] = {}
        self.reserved: list[tuple[Segment, int, int]] = []
        self.sealed: list[tuple[Segment, SegmentState]] = []
        self.stamped: list[tuple[Message, dict[str, str]]] = []
        self.created: list[Segment] = []
        self.now: float | None = None


def _prop(m: Message, key: str) -> str:
    value = m.properties.get(key)
    if value is None:
        # Named as the property a client forgot, not as a name "None" that fails the naming rules.
        raise InvalidArgumentError(f"{m.message_type.name} needs the {key!r} property", property=key)
    return value


class ShardInterceptor:
    """The shard step.  See the module docstring."""

    name = "shard"
    replay_types: frozenset[MessageType] = frozenset()
    """Set below, from the replay handlers: the types ``replay`` acts on."""

    def __init__(
        self,
        *,
        max_rows: int = 1_000_000,
        max_bytes: int = 64 << 20,
        max_age_seconds: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if max_rows < 1 or max_bytes < 1 or not max_age_seconds > 0:
            raise InvalidArgumentError("max_rows, max_bytes and max_age_seconds must be positive")
        self._max_rows = max_rows
        self._max_bytes = max_bytes
        self._max_age = max_age_seconds
        self._clock = clock
        self._wall_clock = wall_clock  # only to carry a segment's age across a restart (from timeticks)
        self._registry: dict[str, dict[str, _Collection]] = {}
        self._segments = SegmentTable()
        self._replay_sealed: set[int] = set()

    # --- views -----------------------------------------------------------------------------------
    def collections(self, vchannel: str) -> dict[str, CollectionInfo]:
        """The live (not dropped) collections of ``vchannel`` by name."""
        return {n: c.info for n, c in self._registry.get(vchannel, {}).items() if not c.info.dropped}

    def growing_segments(self) -> list[SegmentInfo]:
        """Segments not yet sealed by a written FLUSH, in id order."""
        return self._segments.infos()

    @property
    def next_segment_id(self) -> int:
        return self._segments.next_id

    def seal_expired(self, now: float | None = None) -> list[Message]:
        """FLUSH messages (reason ``age``) for segments older than ``max_age_seconds``.

        Append them through the chain.  The segments take no new rows from now on and leave the
        table once their FLUSH is written; if that write fails they are returned again next time.
        """
        now = self._clock() if now is None else now
        out = []
        for seg in self._segments.select():
            if seg.state is not SegmentState.FLUSHING and now - seg.created_at >= self._max_age:
                seg.state = SegmentState.SEALING
                out.append(self._flush_message(seg, bodies.SEAL_AGE))
        return out

    # --- append ----------------------------------------------------------------------------------
    async def do_append(self, batch: list[Message], append_next: AppendNext) -> list[AppendResult]:
        if _SHARD_TYPES.isdisjoint({m._type for m in batch}):
            return await append_next(batch)  # plain records: nothing to check or assign
        plan = _Plan()
        try:
            for m in batch:
                self._plan_one(plan, m)
        except BaseException:
            self._undo(plan)
            raise
        try:
            results = await append_next(plan.out)
        except BaseException:
            self._undo(plan)
            raise
        self._commit(plan)
        if len(plan.out) == len(batch):
            return results
        return [results[i] for i in plan.index]

    def _plan_one(self, plan: _Plan, m: Message) -> None:
        t = m.message_type
        if t not in _SHARD_TYPES:
            plan.index.append(len(plan.out))
            plan.out.append(m)
            return
        if m.txn is not None and t in _NO_TXN:
            raise InvalidArgumentError(f"{t.name} cannot be part of a transaction", txn_id=m.txn.txn_id)
        if t is _T.CREATE_SEGMENT:
            raise InvalidArgumentError("segments are created by the shard step, not by messages")
        if m.vchannel == BROADCAST_VCHANNEL and t is not _T.MANUAL_FLUSH:
            raise InvalidArgumentError(f"{t.name} needs a vchannel, not a broadcast")
        # The registry is keyed by vchannel: embedded callers get the rule the service applies.
        names.VCHANNEL.check(m.vchannel, "vchannel", allow_empty=True)
        before: list[Message] = []
        after: list[Message] = []
        _HANDLERS[t](self, plan, m, before, after)
        plan.out.extend(before)
        plan.index.append(len(plan.out))
        plan.out.append(m)
        plan.out.extend(after)

    def _lookup(self, plan: _Plan, vchannel: str, name: str) -> _Collection | None:
        c = plan.overlay.get((vchannel, name))
        return c if c is not None else self._registry.get(vchannel, {}).get(name)

    def _same_name(self, plan: _Plan, name: str) -> list[CollectionInfo]:
        """Every collection called ``name`` on any vchannel, dropped ones included (DDL only: a scan)."""
        found = {v: c for v, by_name in self._registry.items() if (c := by_name.get(name)) is not None}
        found.update({v: c for (v, n), c in plan.overlay.items() if n == name})
        return [c.info for c in found.values()]

    def _live(self, plan: _Plan, m: Message) -> _Collection:
        name = _prop(m, PROP_COLLECTION)
        c = self._lookup(plan, m.vchannel, name)
        if c is None or c.info.dropped:
            bodies.validate_name("collection", name)  # a hostile name is refused as such, not quoted
            state = "was dropped" if c is not None else "does not exist"
            raise CollectionNotExistError(f"collection {name!r} {state} on vchannel {m.vchannel!r}",
                                          collection=name, vchannel=m.vchannel)
        return c

    def _partition(self, c: _Collection, m: Message, default: str | None = None) -> str:
        p = m.properties.get(PROP_PARTITION, default)
        if p is None:
            raise InvalidArgumentError(f"{m.message_type.name} needs the {PROP_PARTITION!r} property",
                                       property=PROP_PARTITION)
        if p not in c.info.partitions:
            bodies.validate_name("partition", p)
            raise PartitionNotExistError(f"partition {p!r} of collection {c.info.name!r} does not exist",
                                         collection=c.info.name, partition=p)
        return p

    def _seal(self, plan: _Plan, seg: Segment, reason: str, into: list[Message]) -> None:
        plan.sealed.append((seg, seg.state))
        seg.state = SegmentState.FLUSHING
        into.append(self._flush_message(seg, reason))

    @staticmethod
    def _flush_message(seg: Segment, reason: str) -> Message:
        return bodies.flush_segment(seg.vchannel, seg.collection, seg.partition, seg.segment_id, reason)

    def _seal_all(self, plan: _Plan, segs: list[Segment], reason: str, into: list[Message]) -> None:
        for seg in segs:
            if seg.state is not SegmentState.FLUSHING:
                self._seal(plan, seg, reason, into)

    # --- one handler per message type; each raises before changing anything it cannot undo ---------
    def _create_collection(self, plan: _Plan, m: Message, before: list[Message], after: list[Message]) -> None:
        name = bodies.validate_name("collection", _prop(m, PROP_COLLECTION))
        schema = bodies.read_schema(m)
        pk = _prop(m, PROP_PRIMARY_KEY)
        columns.validate_schema(schema, pk, collection=name)
        c = self._lookup(plan, m.vchannel, name)
        if c is not None and not c.info.dropped:
            raise CollectionExistError(f"collection {name!r} already exists on vchannel {m.vchannel!r}",
                                       collection=name, vchannel=m.vchannel)
        # The flusher keeps one table (one directory) per collection name and pchannel: the same name on
        # several vchannels (its shards), or created again after a drop, adds to that table.  So it must
        # keep the table's schema and key, or readers would find files that cannot be read together.
        for other in self._same_name(plan, name):
            if other.primary_key != pk or not columns.same_columns(other.schema, schema):
                was = "was dropped" if other.dropped else "exists"
                raise SchemaMismatchError(
                    f"collection {name!r} {was} on vchannel {other.vchannel!r} with another schema or primary key; "
                    f"a name is one table per pchannel, so a collection of that name must keep its schema and "
                    f"primary key {other.primary_key!r} (or take another name)",
                    collection=name, vchannel=m.vchannel)
        plan.overlay[(m.vchannel, name)] = _Collection.new(m.vchannel, name, schema, pk)

    def _drop_collection(self, plan: _Plan, m: Message, before: list[Message], after: list[Message]) -> None:
        c = self._live(plan, m)
        self._seal_all(plan, self._segments.select(m.vchannel, c.info.name), bodies.SEAL_DROP, before)
        plan.overlay[(m.vchannel, c.info.name)] = c.as_dropped()

    def _create_partition(self, plan: _Plan, m: Message, before: list[Message], after: list[Message]) -> None:
        c = self._live(plan, m)
        p = bodies.validate_name("partition", _prop(m, PROP_PARTITION))
        if p in c.info.partitions:
            raise PartitionExistError(f"partition {p!r} of collection {c.info.name!r} already exists",
                                      collection=c.info.name, partition=p)
        plan.overlay[(m.vchannel, c.info.name)] = c.with_partitions(c.info.partitions | {p})

    def _drop_partition(self, plan: _Plan, m: Message, before: list[Message], after: list[Message]) -> None:
        c = self._live(plan, m)
        if m.properties.get(PROP_PARTITION) == DEFAULT_PARTITION:
            raise InvalidArgumentError(f"the default partition of {c.info.name!r} cannot be dropped",
                                       collection=c.info.name, partition=DEFAULT_PARTITION)
        p = self._partition(c, m)
        self._seal_all(plan, self._segments.select(m.vchannel, c.info.name, p), bodies.SEAL_DROP, before)
        plan.overlay[(m.vchannel, c.info.name)] = c.with_partitions(c.info.partitions - {p})

    def _insert(self, plan: _Plan, m: Message, before: list[Message], after: list[Message]) -> None:
        """An INSERT, or an UPSERT (rows too: the same checks and segment, and no key twice)."""
        c = self._live(plan, m)
        p = self._partition(c, m, DEFAULT_PARTITION)
        batch = bodies.read_rows(m)
        rows = c.rows.check_insert(batch) if m._type is _T.INSERT else c.rows.check_upsert(batch)
        size = len(m.payload)
        if plan.now is None:
            plan.now = self._clock()
        key = (m.vchannel, c.info.name, p)
        seg = self._segments.current(key)
        if seg is not None:
            reason = (bodies.SEAL_AGE if plan.now - seg.created_at >= self._max_age
                      else bodies.SEAL_ROWS if seg.rows + rows > self._max_rows
                      else bodies.SEAL_BYTES if seg.bytes + size > self._max_bytes
                      else None)
            if reason is not None:
                self._seal(plan, seg, reason, after)
                seg = None
        if seg is None:
            seg = self._segments.open(key, plan.now)
            plan.created.append(seg)
        seg.rows += rows
        seg.bytes += size
        plan.reserved.append((seg, rows, size))
        old = m.properties
        props = dict(old)  # a caller may share one properties dict between messages
        props[PROP_PARTITION] = p
        props[bodies.PROP_SEGMENT] = str(seg.segment_id)
        props[PROP_ROWS] = str(rows)
        m._check_mutable()
        m._properties = props
        plan.stamped.append((m, old))
        if seg.rows >= self._max_rows:
            self._seal(plan, seg, bodies.SEAL_ROWS, after)
        elif seg.bytes >= self._max_bytes:
            self._seal(plan, seg, bodies.SEAL_BYTES, after)

    def _delete(self, plan: _Plan, m: Message, before: list[Message], after: list[Message]) -> None:
        c = self._live(plan, m)
        if PROP_PARTITION in m.properties:
            self._partition(c, m)
        c.rows.check_delete(bodies.read_delete(m))

    def _manual_flush(self, plan: _Plan, m: Message, before: list[Message], after: list[Message]) -> None:
        collection = m.properties.get(PROP_COLLECTION)
        vchannel = None if m.vchannel == BROADCAST_VCHANNEL else m.vchannel
        if vchannel is not None and collection is not None:
            self._live(plan, m)
        self._seal_all(plan, self._segments.select(vchannel, collection), bodies.SEAL_MANUAL, after)

    def _flush(self, plan: _Plan, m: Message, before: list[Message], after: list[Message]) -> None:
        sid = bodies.read_segment(m)
        seg = self._segments.get(sid)
        if seg is None or seg.key != (m.vchannel, m.properties.get(PROP_COLLECTION),
                                      m.properties.get(PROP_PARTITION)):
            raise InvalidArgumentError(
                f"segment {sid} is not a growing segment of vchannel {m.vchannel!r}, collection "
                f"{m.properties.get(PROP_COLLECTION)!r}, partition {m.properties.get(PROP_PARTITION)!r}",
                segment=sid,
            )
        if seg.state is SegmentState.FLUSHING:
            raise InvalidArgumentError(f"segment {sid} is already being sealed", segment=sid)
        plan.sealed.append((seg, seg.state))
        seg.state = SegmentState.FLUSHING

    # --- outcome ---------------------------------------------------------------------------------
    def _undo(self, plan: _Plan) -> None:
        table = self._segments
        for seg, rows, size in reversed(plan.reserved):
            seg.rows -= rows
            seg.bytes -= size
        for seg, prev in reversed(plan.sealed):
            if table.contains(seg):
                seg.state = prev
        for seg, _, _ in plan.reserved:
            if seg.rows == 0 and table.contains(seg):
                table.remove(seg)  # nothing of it was written (every written insert has rows)
        # Hand back the ids on top that this batch allocated and nobody wrote: the WAL stores all of
        # a batch or nothing, so the log never names them.
        unused = {seg.segment_id for seg in plan.created if not table.contains(seg)}
        while table.next_id - 1 in unused:
            table.next_id -= 1
        for m, props in reversed(plan.stamped):
            m._properties = props

    def _commit(self, plan: _Plan) -> None:
        for seg, _ in plan.sealed:
            self._segments.remove(seg)
        for (vchannel, name), c in plan.overlay.items():
            self._registry.setdefault(vchannel, {})[name] = c

    # --- recovery --------------------------------------------------------------------------------
    def replay(self, batch: list[Message]) -> None:
        """Rebuild the registry and the growing segments from stored messages, in id order."""
        for m in batch:
            handler = _REPLAY.get(m._type)  # the slot: this runs for every stored message
            if handler is None:
                continue
            try:
                handler(self, m)
            except StreamingError:
                continue  # not something the shard step would have written: nothing to rebuild

    def _replay_ddl(self, m: Message) -> None:
        plan = _Plan()
        _HANDLERS[m.message_type](self, plan, m, [], [])
        for seg, _ in plan.sealed:  # a drop's segments were already sealed by FLUSH messages before it
            self._segments.remove(seg)
        plan.sealed.clear()
        self._commit(plan)

    def _replay_insert(self, m: Message) -> None:
        sid = bodies.read_segment(m)
        self._segments.next_id = max(self._segments.next_id, sid + 1)
        raw = m.properties.get(PROP_ROWS, "")
        rows = int(raw) if raw.isascii() and raw.isdigit() else int(bodies.read_rows(m).num_rows)
        if sid in self._replay_sealed:
            return  # rows that landed after their segment's seal (see the module docstring)
        seg = self._segments.get(sid)
        if seg is None:
            collection = self._registry.get(m.vchannel, {}).get(m.properties.get(PROP_COLLECTION, ""))
            partition = m.properties.get(PROP_PARTITION, DEFAULT_PARTITION)
            if collection is None or collection.info.dropped or partition not in collection.info.partitions:
                return
            seg = self._segments.restore((m.vchannel, collection.info.name, partition), sid, self._age_origin(m))
        seg.rows += rows
        seg.bytes += len(m.payload)

    def _replay_flush(self, m: Message) -> None:
        sid = bodies.read_segment(m)
        self._segments.next_id = max(self._segments.next_id, sid + 1)
        self._replay_sealed.add(sid)
        seg = self._segments.get(sid)
        if seg is not None:
            self._segments.remove(seg)

    def _age_origin(self, m: Message) -> float:
        """``created_at`` on our clock for a segment first written at ``m``'s timestamp."""
        now = self._clock()
        if m.timetick <= 0:
            return now
        age = self._wall_clock() - (m.timetick >> LOGICAL_BITS) / 1000.0
        return now - max(0.0, age)

    def export_state(self) -> dict[str, Any]:
        """The registry (dropped collections too: replay ignores their late DML), the growing segments,
        the next segment id and the ids sealed so far (see SnapshotInterceptor).

        Sealed ids are kept as ranges: almost every id below ``next_segment_id`` is sealed, so the
        ranges stay few however many segments were ever written.  A segment's age travels as the wall
        time it was created at, as replay derives it from the first insert's timestamp.
        """
        skew = self._wall_clock() - self._clock()
        sealed: list[list[int]] = []
        for sid in sorted(self._replay_sealed):
            if sealed and sealed[-1][1] == sid:
                sealed[-1][1] = sid + 1
            else:
                sealed.append([sid, sid + 1])
        return {
            "next_segment_id": self._segments.next_id,
            "collections": [
                {"vchannel": c.info.vchannel, "name": c.info.name, "primary_key": c.info.primary_key,
                 "partitions": sorted(c.info.partitions), "dropped": c.info.dropped,
                 "schema": base64.b64encode(c.info.schema.serialize().to_pybytes()).decode()}
                for by_name in self._registry.values() for c in by_name.values()
            ],
            "segments": [
                {"id": s.segment_id, "vchannel": s.vchannel, "collection": s.collection, "partition": s.partition,
                 "rows": s.rows, "bytes": s.bytes, "created_wall": s.created_at + skew}
                for s in self._segments.select()
            ],
            "sealed": sealed,
        }

    def import_state(self, state: dict[str, Any]) -> None:
        for raw in state["collections"]:
            schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(raw["schema"])))
            c = _Collection.new(raw["vchannel"], raw["name"], schema, raw["primary_key"])
            c = c.with_partitions(frozenset(raw["partitions"]))
            self._registry.setdefault(c.info.vchannel, {})[c.info.name] = c.as_dropped() if raw["dropped"] else c
        now, wall = self._clock(), self._wall_clock()
        for raw in state["segments"]:
            created = now - max(0.0, wall - float(raw["created_wall"]))
            seg = self._segments.restore((raw["vchannel"], raw["collection"], raw["partition"]), int(raw["id"]),
                                         created)
            seg.rows, seg.bytes = int(raw["rows"]), int(raw["bytes"])
        for start, end in state["sealed"]:
            self._replay_sealed.update(range(int(start), int(end)))
        self._segments.next_id = max(self._segments.next_id, int(state["next_segment_id"]))

    async def recovered(self) -> None:
        self._replay_sealed.clear()

    async def close(self) -> None:
        self._registry.clear()
        self._segments.clear()


_Handler = Callable[[ShardInterceptor, _Plan, Message, list[Message], list[Message]], None]
_HANDLERS: dict[MessageType, _Handler] = {
    _T.CREATE_COLLECTION: ShardInterceptor._create_collection,
    _T.DROP_COLLECTION: ShardInterceptor._drop_collection,
    _T.CREATE_PARTITION: ShardInterceptor._create_partition,
    _T.DROP_PARTITION: ShardInterceptor._drop_partition,
    _T.INSERT: ShardInterceptor._insert,
    _T.UPSERT: ShardInterceptor._insert,
    _T.DELETE: ShardInterceptor._delete,
    _T.MANUAL_FLUSH: ShardInterceptor._manual_flush,
    _T.FLUSH: ShardInterceptor._flush,
}
_SHARD_TYPES = frozenset(_HANDLERS) | {_T.CREATE_SEGMENT}
_REPLAY: dict[MessageType, Callable[[ShardInterceptor, Message], None]] = {
    **dict.fromkeys(_DDL, ShardInterceptor._replay_ddl),
    _T.INSERT: ShardInterceptor._replay_insert,
    _T.UPSERT: ShardInterceptor._replay_insert,
    _T.FLUSH: ShardInterceptor._replay_flush,
}
# Replay acts on these types only (see ``interceptors.base.plain_skipping_types``).
ShardInterceptor.replay_types = frozenset(_REPLAY)

__all__ = ["CollectionInfo", "SegmentInfo", "ShardInterceptor"]
