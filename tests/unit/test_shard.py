"""The shard step: registry checks, segment assignment and seals, all-or-nothing batches, replay."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from interceptors.shard.interceptor import ShardInterceptor
from tests.factories import flat, packs_until, tick
from wal import AppendResult, Message, MessageType, TxnContext, WALManager, bodies
from wal.backends import MemoryBackend
from wal.errors import (
    CodecError,
    CollectionExistError,
    CollectionNotExistError,
    InvalidArgumentError,
    PartitionExistError,
    PartitionNotExistError,
    SchemaMismatchError,
    StreamingError,
)

VEC = pa.list_(pa.float32(), 4)
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("vec", VEC), pa.field("s", pa.string())])


def rows(n: int, start: int = 0) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({
        "id": list(range(start, start + n)),
        "vec": [[float(i)] * 4 for i in range(n)],
        "s": [f"r{i}" for i in range(n)],
    }, schema=SCHEMA)


def create(coll: str = "c", vch: str = "v") -> Message:
    return bodies.create_collection(vch, coll, SCHEMA, "id")


def ins(n: int = 1, coll: str = "c", part: str = bodies.DEFAULT_PARTITION, vch: str = "v") -> Message:
    return bodies.insert(vch, coll, rows(n), part)


class DiskError(Exception):
    pass


class Recorder:
    """A fake ``append_next``: records what it got, answers ids 0, 1, 2, …, or fails when told."""

    def __init__(self) -> None:
        self.batches: list[list[Message]] = []
        self.next_id = 0
        self.fail: Exception | None = None

    async def __call__(self, batch: list[Message]) -> list[AppendResult]:
        if self.fail is not None:
            raise self.fail
        self.batches.append(list(batch))
        out = [AppendResult(self.next_id + i, 0, None) for i in range(len(batch))]
        self.next_id += len(batch)
        return out

    @property
    def written(self) -> list[Message]:
        return [m for b in self.batches for m in b]

    def types(self) -> list[str]:
        return [m.message_type.name for m in self.written]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def run(shard: ShardInterceptor, rec: Recorder, *msgs: Message) -> list[AppendResult]:
    return await shard.do_append(list(msgs), rec)


def seg_of(m: Message) -> int:
    return bodies.read_segment(m)


def flushes(rec: Recorder) -> list[tuple[int, str]]:
    return [(seg_of(m), m.properties["reason"]) for m in rec.written if m.message_type is MessageType.FLUSH]


def assert_replay_equal(shard: ShardInterceptor, written: Sequence[Message], vchannels: Sequence[str]) -> None:
    again = ShardInterceptor()
    again.replay(list(written))
    for v in vchannels:
        assert again.collections(v) == shard.collections(v)
    assert again.growing_segments() == shard.growing_segments()
    assert again.next_segment_id == shard.next_segment_id


# --- registry ---------------------------------------------------------------------------------------
async def test_create_and_insert_in_one_batch() -> None:
    shard, rec = ShardInterceptor(), Recorder()
    res = await run(shard, rec, create(), ins(3))
    assert [r.message_id for r in res] == [0, 1]
    assert rec.types() == ["CREATE_COLLECTION", "INSERT"]
    m = rec.written[1]
    assert m.properties["segment"] == "1" and m.properties["rows"] == "3" and m.properties["partition"] == "_default"
    info = shard.collections("v")["c"]
    assert info.schema.equals(SCHEMA) and info.primary_key == "id" and info.partitions == {"_default"}
    [seg] = shard.growing_segments()
    assert (seg.segment_id, seg.collection, seg.partition, seg.rows, seg.bytes) == (1, "c", "_default", 3,
                                                                                    len(m.payload))
    assert shard.collections("other") == {}


@pytest.mark.parametrize(("setup", "bad", "error", "match"), [
    ([], ins(), CollectionNotExistError, "'c' does not exist"),
    ([create(), bodies.drop_collection("v", "c")], ins(), CollectionNotExistError, "'c' was dropped"),
    ([create()], ins(part="p9"), PartitionNotExistError, "'p9'"),
    ([create()], create(), CollectionExistError, "already exists"),
    ([], bodies.drop_collection("v", "c"), CollectionNotExistError, "does not exist"),
    ([create()], bodies.drop_partition("v", "c", "p1"), PartitionNotExistError, "'p1'"),
    ([create(), bodies.create_partition("v", "c", "p1")], bodies.create_partition("v", "c", "p1"),
     PartitionExistError, "'p1'"),
    ([create()], bodies.drop_partition("v", "c", "_default"), InvalidArgumentError, "default partition"),
    ([create()], bodies.insert("v", "c", rows(2).drop_columns(["s"])), SchemaMismatchError, "lacks column 's'"),
    ([create()], bodies.insert("v", "c", rows(2).append_column("x", pa.array([1, 2]))), SchemaMismatchError,
     "'x'"),
    ([create()], bodies.insert("v", "c", rows(2).set_column(2, "s", pa.array([1, 2]))), SchemaMismatchError,
     "'s' has type int64"),
    ([create()], bodies.delete("v", "c", ["a"]), SchemaMismatchError, "delete keys have type string"),
    ([], bodies.delete("v", "c", [1]), CollectionNotExistError, "'c'"),
    ([create()], Message(MessageType.INSERT, "v", b"garbage", {"collection": "c"}), CodecError, "INSERT"),
    ([create()], Message(MessageType.CREATE_SEGMENT, "v"), InvalidArgumentError, "segments"),
    ([create()], ins(vch=""), InvalidArgumentError, "broadcast"),
    ([create()], Message(MessageType.INSERT, "v", b"", {}), InvalidArgumentError, "'collection' property"),
    ([create()], bodies.manual_flush("v", "zz"), CollectionNotExistError, "'zz'"),
])
async def test_invalid_message_fails_its_batch_and_writes_nothing(
    setup: list[Message], bad: Message, error: type[Exception], match: str
) -> None:
    shard, rec = ShardInterceptor(), Recorder()
    if setup:
        await run(shard, rec, *setup)
    before = (shard.collections("v"), shard.growing_segments(), shard.next_segment_id, len(rec.batches))
    with pytest.raises(error, match=match):
        # Valid messages around the bad one, including a new collection and a new segment.
        await run(shard, rec, bodies.create_collection("v", "other", SCHEMA, "id"), ins(coll="other"), bad)
    assert (shard.collections("v"), shard.growing_segments(), shard.next_segment_id, len(rec.batches)) == before


async def test_ddl_in_a_transaction_is_refused_and_txn_dml_is_checked_the_same() -> None:
    shard, rec = ShardInterceptor(), Recorder()
    with pytest.raises(InvalidArgumentError, match="transaction"):
        await run(shard, rec, create().with_txn(TxnContext(7, 1000)))
    with pytest.raises(CollectionNotExistError):
        await run(shard, rec, ins().with_txn(TxnContext(7, 1000)))
    await run(shard, rec, create())
    await run(shard, rec, ins(2).with_txn(TxnContext(7, 1000)))
    assert rec.written[-1].properties["segment"] == "1"


async def test_partitions_and_deletes() -> None:
    shard, rec = ShardInterceptor(), Recorder()
    await run(shard, rec, create(), bodies.create_partition("v", "c", "p1"), ins(part="p1"), ins(),
              bodies.delete("v", "c", [1, 2]))
    assert shard.collections("v")["c"].partitions == {"_default", "p1"}
    assert [(s.segment_id, s.partition) for s in shard.growing_segments()] == [(1, "p1"), (2, "_default")]
    await run(shard, rec, bodies.drop_partition("v", "c", "p1"))
    assert rec.types()[-2:] == ["FLUSH", "DROP_PARTITION"]
    assert flushes(rec) == [(1, "drop")]
    assert shard.collections("v")["c"].partitions == {"_default"}
    assert [s.segment_id for s in shard.growing_segments()] == [2]


async def test_drop_collection_seals_its_segments_before_the_drop_and_allows_recreate() -> None:
    shard, rec = ShardInterceptor(), Recorder()
    await run(shard, rec, create(), bodies.create_partition("v", "c", "p"), ins(), ins(part="p"),
              create("d"), ins(coll="d"))
    res = await run(shard, rec, bodies.drop_collection("v", "c"), create(), ins())
    assert rec.types()[-5:] == ["FLUSH", "FLUSH", "DROP_COLLECTION", "CREATE_COLLECTION", "INSERT"]
    assert [r.message_id for r in res] == [8, 9, 10]
    assert flushes(rec) == [(1, "drop"), (2, "drop")]
    assert [(s.segment_id, s.collection) for s in shard.growing_segments()] == [(3, "d"), (4, "c")]
    assert shard.collections("v")["c"].partitions == {"_default"}


async def test_one_name_is_one_table_across_vchannels_and_re_creations() -> None:
    shard, rec = ShardInterceptor(), Recorder()
    other = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("s", pa.string(), nullable=False)])
    await run(shard, rec, create("c", "v"), create("c", "w"))  # shards of one table: same schema, fine
    written = len(rec.written)
    with pytest.raises(SchemaMismatchError, match="'c' exists on vchannel 'v' with another schema"):
        await run(shard, rec, bodies.create_collection("x", "c", other, "id"))
    with pytest.raises(SchemaMismatchError, match="primary key 'id'"):
        await run(shard, rec, bodies.create_collection("x", "c", other, "s"))
    # Within one batch too: the second create sees the first one's schema.
    with pytest.raises(SchemaMismatchError):
        await run(shard, rec, bodies.create_collection("x", "n", SCHEMA, "id"),
                  bodies.create_collection("y", "n", other, "id"))
    assert len(rec.written) == written, "nothing of a refused batch is written"
    await run(shard, rec, bodies.drop_collection("v", "c"), bodies.drop_collection("w", "c"))
    with pytest.raises(SchemaMismatchError, match="was dropped on vchannel"):
        await run(shard, rec, bodies.create_collection("v", "c", other, "id"))
    await run(shard, rec, create("c", "v"), ins(2, "c", vch="v"))  # the same schema again: the table goes on
    assert_replay_equal(shard, rec.written, ["v", "w", "x"])


# --- segments ---------------------------------------------------------------------------------------
async def test_seal_on_rows_keeps_segments_within_the_limit() -> None:
    shard, rec = ShardInterceptor(max_rows=10), Recorder()
    await run(shard, rec, create(), ins(4), ins(4))
    res = await run(shard, rec, ins(4), ins(6), ins(30))
    # 8 + 4 > 10: segment 1 is sealed right after the insert that went to segment 2 instead; 4 + 6
    # fills segment 2 exactly; 30 rows alone exceed the limit, so segment 3 is sealed at once.
    assert [m.message_type.name for m in rec.batches[-1]] == ["INSERT", "FLUSH", "INSERT", "FLUSH", "INSERT",
                                                              "FLUSH"]
    assert [seg_of(m) for m in rec.batches[-1]] == [2, 1, 2, 2, 3, 3]
    assert flushes(rec) == [(1, "rows"), (2, "rows"), (3, "rows")]
    assert [r.message_id for r in res] == [3, 5, 7]  # results of the caller's messages only
    assert shard.growing_segments() == []
    await run(shard, rec, ins())
    assert seg_of(rec.written[-1]) == 4


async def test_seal_on_bytes() -> None:
    size = len(ins(1).payload)
    shard, rec = ShardInterceptor(max_bytes=size * 2 + 1), Recorder()
    await run(shard, rec, create(), ins(), ins(), ins())
    assert flushes(rec) == [(1, "bytes")]
    assert [(s.segment_id, s.bytes) for s in shard.growing_segments()] == [(2, size)]


async def test_seal_on_age_when_the_next_insert_arrives() -> None:
    clock = Clock()
    shard, rec = ShardInterceptor(max_age_seconds=60, clock=clock), Recorder()
    await run(shard, rec, create(), ins())
    clock.now += 59
    await run(shard, rec, ins())
    assert flushes(rec) == []
    clock.now += 1
    await run(shard, rec, ins())
    assert rec.types()[-2:] == ["INSERT", "FLUSH"] and flushes(rec) == [(1, "age")]
    assert [(s.segment_id, s.rows, s.created_at) for s in shard.growing_segments()] == [(2, 1, clock.now)]


async def test_seal_expired_for_a_timer() -> None:
    clock = Clock()
    shard, rec = ShardInterceptor(max_age_seconds=60, clock=clock), Recorder()
    await run(shard, rec, create(), create("d"), ins(), ins(coll="d"))
    clock.now += 30
    await run(shard, rec, bodies.create_partition("v", "c", "p"), ins(part="p"))
    assert shard.seal_expired(clock.now) == []
    clock.now += 30
    seals = shard.seal_expired()
    assert [(seg_of(m), m.properties["reason"], m.properties["collection"]) for m in seals] == [
        (1, "age", "c"), (2, "age", "d")]
    # Until the FLUSH is written the segment takes no rows: a new insert opens a new segment.
    await run(shard, rec, ins())
    assert seg_of(rec.written[-1]) == 4
    # A FLUSH whose write failed is handed out again.
    rec.fail = DiskError("disk")
    with pytest.raises(DiskError):
        await run(shard, rec, *seals)
    rec.fail = None
    again = shard.seal_expired()
    assert [seg_of(m) for m in again] == [1, 2]
    await run(shard, rec, *again)
    assert [s.segment_id for s in shard.growing_segments()] == [3, 4]
    with pytest.raises(InvalidArgumentError, match="not a growing segment"):
        await run(shard, rec, bodies.flush_segment("v", "c", "_default", 1, "age"))


async def test_manual_flush_of_a_vchannel_a_collection_and_the_pchannel() -> None:
    shard, rec = ShardInterceptor(), Recorder()
    await run(shard, rec, create(), create("d"), ins(), ins(coll="d"), create(vch="w"), ins(vch="w"))
    await run(shard, rec, bodies.manual_flush("v", "d"))
    assert rec.types()[-2:] == ["MANUAL_FLUSH", "FLUSH"] and flushes(rec) == [(2, "manual")]
    await run(shard, rec, ins(coll="d"), bodies.manual_flush("v"))
    assert flushes(rec)[1:] == [(1, "manual"), (4, "manual")]
    assert [s.vchannel for s in shard.growing_segments()] == ["w"]
    await run(shard, rec, bodies.manual_flush(""))
    assert flushes(rec)[-1] == (3, "manual") and shard.growing_segments() == []


async def test_a_failed_write_changes_nothing() -> None:
    shard, rec = ShardInterceptor(max_rows=3), Recorder()
    await run(shard, rec, create(), ins(2))
    before = (shard.collections("v"), shard.growing_segments())
    rec.fail = DiskError("disk")
    with pytest.raises(DiskError):
        await run(shard, rec, bodies.create_partition("v", "c", "p"), ins(2), ins(part="p"), ins(5))
    assert (shard.collections("v"), shard.growing_segments()) == before
    rec.fail = None
    await run(shard, rec, ins())
    assert seg_of(rec.written[-1]) == 1 and flushes(rec) == [(1, "rows")]
    assert_replay_equal(shard, rec.written, ["v"])


async def test_concurrent_batches_share_segments_and_survive_reordered_writes() -> None:
    shard = ShardInterceptor(max_rows=10)
    rec = Recorder()
    await run(shard, rec, create(), ins(2))
    gates: list[asyncio.Future[None]] = []

    async def held(batch: list[Message]) -> list[AppendResult]:
        gate = asyncio.get_running_loop().create_future()
        gates.append(gate)
        await gate
        return await rec(batch)

    a = asyncio.ensure_future(shard.do_append([ins(3)], held))  # segment 1: 5 rows
    b = asyncio.ensure_future(shard.do_append([ins(5)], held))  # fills segment 1: sealed
    c = asyncio.ensure_future(shard.do_append([ins(4)], held))  # segment 2
    await asyncio.sleep(0)
    gates[1].set_result(None)  # b lands first, a after the seal (as a retried write could)
    await b
    gates[2].set_exception(DiskError("disk"))
    with pytest.raises(DiskError):
        await c
    gates[0].set_result(None)
    await a
    assert [(m.message_type.name, seg_of(m)) for m in rec.written[-3:]] == [("INSERT", 1), ("FLUSH", 1),
                                                                          ("INSERT", 1)]
    assert shard.growing_segments() == [] and shard.next_segment_id == 2  # c's id 2 was handed back
    assert_replay_equal(shard, rec.written, ["v"])


# --- replay -----------------------------------------------------------------------------------------
async def test_replay_reproduces_registry_and_segments_and_continues_the_growing_segment() -> None:
    shard, rec = ShardInterceptor(max_rows=5), Recorder()
    await run(shard, rec, create(), create("d"), create(vch="w"), bodies.create_partition("v", "c", "p"))
    await run(shard, rec, ins(3), ins(3), ins(part="p"), ins(coll="d"), ins(vch="w"), bodies.delete("v", "c", [1]))
    await run(shard, rec, bodies.drop_collection("v", "d"), bodies.manual_flush("w"), ins(vch="w"))
    await run(shard, rec, bodies.create_partition("v", "c", "q"), bodies.drop_partition("v", "c", "q"))
    assert_replay_equal(shard, rec.written, ["v", "w"])
    again = ShardInterceptor(max_rows=5)
    again.replay(rec.written)
    await again.recovered()
    growing = {(s.vchannel, s.collection, s.partition): s.segment_id for s in again.growing_segments()}
    rec2 = Recorder()
    await run(again, rec2, ins(), ins(part="p"), ins(vch="w"))
    assert [seg_of(m) for m in rec2.written] == [
        growing[("v", "c", "_default")], growing[("v", "c", "p")], growing[("w", "c", "_default")]]


async def test_replay_carries_a_segments_age_across_the_restart() -> None:
    clock = Clock()
    wall_ms = 1_700_000_000_000
    shard, rec = ShardInterceptor(max_age_seconds=60), Recorder()
    await run(shard, rec, create(), ins())
    rec.written[1].with_timetick((wall_ms - 45_000) << 18)  # written 45 s before the restart
    again = ShardInterceptor(max_age_seconds=60, clock=clock, wall_clock=lambda: wall_ms / 1000)
    again.replay(rec.written)
    assert again.growing_segments()[0].created_at == pytest.approx(clock.now - 45)
    assert again.seal_expired() == []
    clock.now += 15
    assert [seg_of(m) for m in again.seal_expired()] == [1]


async def test_end_to_end_through_a_real_wal_and_a_restart() -> None:
    backend = MemoryBackend()
    manager = await WALManager.start(backend)
    await manager.create_channel("p")
    wal = await manager.open("p")
    ts = 0

    async def stamp_and_append(batch: list[Message]) -> list[AppendResult]:
        nonlocal ts
        for m in batch:  # stands in for the timetick step
            ts += 1
            m.with_timetick(ts)
        return await wal.append_batch(batch)

    shard = ShardInterceptor(max_rows=4)
    res = await shard.do_append([create(), ins(3), ins(3)], stamp_and_append)
    assert [r.message_id for r in res] == [0, 1, 2]  # the FLUSH of segment 1 is id 3
    with pytest.raises(SchemaMismatchError):
        await shard.do_append([ins(), bodies.insert("v", "c", rows(1).drop_columns(["vec"]))], stamp_and_append)
    res = await shard.do_append([bodies.manual_flush("v"), ins(1)], stamp_and_append)
    assert [r.message_id for r in res] == [4, 6]
    await wal.append(tick(ts + 1))
    stored = flat(await packs_until(wal.read(), ts + 1))
    assert [m.message_type.name for m in stored] == ["CREATE_COLLECTION", "INSERT", "INSERT", "FLUSH",
                                                     "MANUAL_FLUSH", "FLUSH", "INSERT"]
    await manager.aclose()

    manager = await WALManager.start(backend.reopen())
    wal = await manager.open("p")
    stored = flat(await packs_until(wal.read(), ts + 1))
    again = ShardInterceptor(max_rows=4)
    again.replay(stored)
    await again.recovered()
    assert again.collections("v") == shard.collections("v")
    assert again.growing_segments() == shard.growing_segments()
    assert [s.segment_id for s in again.growing_segments()] == [3]
    await manager.aclose()


# --- model-based ------------------------------------------------------------------------------------
Op = tuple[str, str, str, str, bool]  # kind, vchannel, collection, partition, well-formed rows/keys

ops = st.tuples(
    st.sampled_from(["create", "drop", "create_part", "drop_part", "insert", "insert", "insert", "delete",
                     "flush", "flush_all"]),
    st.sampled_from(["v", "w"]),
    st.sampled_from(["a", "b"]),
    st.sampled_from(["_default", "p"]),
    st.booleans(),
)


def op_message(op: Op) -> Message:
    kind, vch, coll, part, good = op
    if kind == "create":
        return bodies.create_collection(vch, coll, SCHEMA, "id")
    if kind == "drop":
        return bodies.drop_collection(vch, coll)
    if kind == "create_part":
        return bodies.create_partition(vch, coll, part)
    if kind == "drop_part":
        return bodies.drop_partition(vch, coll, part)
    if kind == "insert":
        return bodies.insert(vch, coll, rows(2) if good else rows(2).drop_columns(["vec"]), part)
    if kind == "delete":
        return bodies.delete(vch, coll, [1, 2] if good else ["x"])
    return bodies.manual_flush(vch, coll if kind == "flush" else None)


Model = dict[tuple[str, str], frozenset[str]]


def model_apply(model: Model, op: Op) -> type[Exception] | None:
    """Apply ``op`` to ``model`` in place; return the error the shard step must raise, if any."""
    kind, vch, coll, part, good = op
    parts = model.get((vch, coll))
    if kind == "create":
        if parts is not None:
            return CollectionExistError
        model[(vch, coll)] = frozenset({"_default"})
        return None
    if kind == "flush_all":
        return None
    if parts is None:
        return CollectionNotExistError
    if kind == "drop":
        del model[(vch, coll)]
    elif kind == "create_part":
        if part in parts:
            return PartitionExistError
        model[(vch, coll)] = parts | {part}
    elif kind == "drop_part":
        if part == "_default":
            return InvalidArgumentError
        if part not in parts:
            return PartitionNotExistError
        model[(vch, coll)] = parts - {part}
    elif kind == "insert":
        if part not in parts:
            return PartitionNotExistError
        if not good:
            return SchemaMismatchError
    elif kind == "delete" and not good:
        return SchemaMismatchError
    return None


@settings(max_examples=150, deadline=None)
@given(batches=st.lists(st.lists(ops, min_size=1, max_size=3), max_size=25), max_rows=st.integers(1, 7))
def test_shard_decisions_match_a_model_and_replay_reproduces_the_state(
    batches: list[list[Op]], max_rows: int
) -> None:
    async def scenario() -> None:
        shard, rec = ShardInterceptor(max_rows=max_rows), Recorder()
        model: Model = {}
        for batch in batches:
            trial = dict(model)
            expected = next((e for e in (model_apply(trial, op) for op in batch) if e is not None), None)
            msgs = [op_message(op) for op in batch]
            written_before = len(rec.written)
            if expected is None:
                results = await shard.do_append(msgs, rec)
                # The recorder's ids index its log: each result points at the caller's own message.
                assert len(results) == len(msgs)
                assert all(rec.written[r.message_id] is m for r, m in zip(results, msgs, strict=True))
                model = trial
            else:
                with pytest.raises(expected):
                    await shard.do_append(msgs, rec)
                assert len(rec.written) == written_before
        for vch in ("v", "w"):
            assert {n: c.partitions for n, c in shard.collections(vch).items()} == {
                c: p for (v, c), p in model.items() if v == vch}
        live = {(s.vchannel, s.collection, s.partition) for s in shard.growing_segments()}
        assert all(k[2] in model.get(k[:2], frozenset()) for k in live)
        assert all(s.rows < max_rows for s in shard.growing_segments())  # full ones are sealed at once
        sealed: set[int] = set()
        for m in rec.written:  # without concurrency, no row is assigned to a segment after its seal
            if m.message_type is MessageType.INSERT:
                assert seg_of(m) not in sealed
            elif m.message_type is MessageType.FLUSH:
                assert seg_of(m) not in sealed
                sealed.add(seg_of(m))
        assert_replay_equal(shard, rec.written, ["v", "w"])

    asyncio.run(scenario())


_payloads = [b"", b"garbage", create().payload, ins(2).payload, bodies.delete("v", "c", [1]).payload,
             bodies.insert("v", "c", rows(2).drop_columns(["s"])).payload]
_props = st.dictionaries(
    st.sampled_from(["collection", "partition", "segment", "primary_key", "reason", "rows"]),
    st.sampled_from(["c", "_default", "p", "id", "1", "2", "", "-1", "x/y", "é"]),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(st.sampled_from(sorted(MessageType)), st.sampled_from(["v", ""]), _props,
                                   st.sampled_from(_payloads)), min_size=1, max_size=3), max_size=12))
def test_hand_made_messages_raise_only_streaming_errors(
    batches: list[list[tuple[MessageType, str, dict[str, str], bytes]]]
) -> None:
    async def scenario() -> None:
        shard, rec = ShardInterceptor(max_rows=3), Recorder()
        await run(shard, rec, create(), bodies.create_partition("v", "c", "p"), ins())
        for batch in batches:
            msgs = [Message(t, v, payload, dict(props)) for t, v, props, payload in batch]
            written = len(rec.written)
            try:
                results = await shard.do_append(msgs, rec)
            except StreamingError:
                assert len(rec.written) == written
            else:
                assert all(rec.written[r.message_id] is m for r, m in zip(results, msgs, strict=True))
        assert_replay_equal(shard, rec.written, ["v"])

    asyncio.run(scenario())
