"""Collections, schemas, segments and idempotent producers through the whole chain and a real WAL."""

from __future__ import annotations

import pyarrow as pa
import pytest

from interceptors.dedup import PROP_PRODUCER, PROP_SEQUENCE
from interceptors.recovery.streaming_wal import ChainConfig, StreamingWAL, open_streaming_wal
from tests.conftest import ManagerFactory
from tests.factories import data
from tests.waiting import until
from wal import (
    CollectionExistError,
    CollectionNotExistError,
    InvalidTxnStateError,
    Message,
    MessageType,
    SchemaMismatchError,
    WALManager,
    bodies,
)

FAST = ChainConfig(tick_interval=0.02, segment_max_rows=10)
SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("name", pa.string()),
                    pa.field("vec", pa.list_(pa.float32(), 4))])


def rows(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch([
        pa.array(range(start, start + n), pa.int64()),
        pa.array([f"r{i}" for i in range(start, start + n)]),
        pa.array([[float(i)] * 4 for i in range(n)], pa.list_(pa.float32(), 4)),
    ], schema=SCHEMA)


async def _open(manager: WALManager, config: ChainConfig = FAST) -> StreamingWAL:
    if "p" not in await manager.list_channels():
        await manager.create_channel("p")
    swal = await open_streaming_wal(manager, "p", config)
    await swal.ready()
    return swal


async def _stored(swal: StreamingWAL) -> list[Message]:
    return await swal.wal.read_stored(swal.wal.first_id) if swal.wal.next_id > swal.wal.first_id else []


async def test_dml_is_refused_before_create_after_drop_and_with_a_wrong_schema(manager: WALManager) -> None:
    swal = await _open(manager)
    before = len(await _stored(swal))
    with pytest.raises(CollectionNotExistError, match="'c'"):
        await swal.append(bodies.insert("v", "c", rows(0, 2)))
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    with pytest.raises(CollectionExistError):
        await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    wrong = pa.record_batch([pa.array([1], pa.int64()), pa.array([2], pa.int64()),
                             pa.array([[0.0] * 4], pa.list_(pa.float32(), 4))], names=["pk", "name", "vec"])
    with pytest.raises(SchemaMismatchError, match="name"):
        await swal.append(bodies.insert("v", "c", wrong))
    # A batch with one bad message writes none of its messages.
    with pytest.raises(SchemaMismatchError):
        await swal.append_batch([bodies.insert("v", "c", rows(0, 2)), bodies.insert("v", "c", wrong)])
    await swal.append(bodies.drop_collection("v", "c"))
    with pytest.raises(CollectionNotExistError, match="dropped"):
        await swal.append(bodies.insert("v", "c", rows(0, 2)))
    stored = [m for m in await _stored(swal)][before:]
    kinds = [m.message_type for m in stored if m.message_type is not MessageType.TIME_TICK]
    assert kinds == [MessageType.CREATE_COLLECTION, MessageType.DROP_COLLECTION]  # nothing refused got in
    await swal.aclose()


async def test_segments_are_assigned_sealed_and_rebuilt_on_reopen(open_manager: ManagerFactory) -> None:
    m = await open_manager()
    swal = await _open(m)
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    results = await swal.append_batch([bodies.insert("v", "c", rows(i * 4, 4)) for i in range(3)])
    stored = {x.message_id: x for x in await _stored(swal)}
    segs = [bodies.read_segment(stored[r.message_id]) for r in results]
    assert segs[0] == segs[1] != segs[2]  # 8 rows fit, the third insert would pass max_rows=10
    seals = [x for x in stored.values() if x.message_type is MessageType.FLUSH]
    assert [bodies.read_segment(x) for x in seals] == [segs[0]]
    growing = swal.shard.growing_segments()
    await swal.aclose()
    await m.aclose()
    m2 = await open_manager()
    swal2 = await _open(m2)
    assert swal2.shard.growing_segments() == growing
    more = await swal2.append(bodies.insert("v", "c", rows(100, 1)))
    again = {x.message_id: x for x in await _stored(swal2)}
    assert bodies.read_segment(again[more.message_id]) == segs[2]  # continues the same growing segment
    flushed = await swal2.append(bodies.manual_flush("v"))
    after = await _stored(swal2)
    assert any(x.message_type is MessageType.FLUSH and bodies.read_segment(x) == segs[2]
               and x.message_id is not None and x.message_id > more.message_id for x in after)
    assert flushed.message_id > more.message_id
    await swal2.aclose()


async def test_ddl_fails_open_transactions_through_the_chain(manager: WALManager) -> None:
    swal = await _open(manager)
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    ctx, _ = await swal.begin_txn("v", keepalive_ms=10_000)
    ins = bodies.insert("v", "c", rows(0, 2))
    await swal.append(ins.with_txn(ctx))
    await swal.append(bodies.create_partition("v", "c", "p2"))
    with pytest.raises(InvalidTxnStateError):
        await swal.commit_txn(ctx.txn_id)
    await swal.aclose()


async def test_idempotent_producer_survives_reopen(open_manager: ManagerFactory) -> None:
    m = await open_manager()
    swal = await _open(m)

    def msg(seq: int) -> Message:
        return data("v", f"m{seq}".encode(), **{PROP_PRODUCER: "prod-1", PROP_SEQUENCE: str(seq)})

    first = await swal.append_batch([msg(0), msg(1), msg(2)])
    await swal.aclose()
    await m.aclose()
    m2 = await open_manager()
    swal2 = await _open(m2)
    before = swal2.wal.next_id
    retried = await swal2.append_batch([msg(1), msg(2)])
    assert retried == first[1:]
    assert swal2.wal.next_id == before  # the retry wrote nothing
    new = await swal2.append(msg(3))
    assert new.message_id >= before
    await swal2.aclose()


async def test_age_seal_happens_without_new_inserts(manager: WALManager) -> None:
    swal = await _open(manager, ChainConfig(tick_interval=0.02, segment_max_age_seconds=0.05,
                                            seal_check_interval=0.02))
    await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    r = await swal.append(bodies.insert("v", "c", rows(0, 1)))
    await until(lambda: not swal.shard.growing_segments(), "the segment sealed by age")
    stored = await _stored(swal)
    seals = [x for x in stored if x.message_type is MessageType.FLUSH]
    assert seals and seals[0].properties[bodies.PROP_REASON] == bodies.SEAL_AGE
    assert seals[0].message_id is not None and seals[0].message_id > r.message_id
    await swal.aclose()
