"""Statement order inside a transaction, and UPSERT: the row rule (``flusher.read.spark``'s docstring) from the log
through the flusher to the pyarrow reader, checked against a model that replays the operations in (ts, id) order
with a dict.  ``tests/spark/test_upsert_order_spark.py`` runs the same scenarios through Spark."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flusher import Flusher, FlusherConfig, _repair
from flusher.layout import deletes_dir
from flusher.read.spark import read_collection_arrow
from interceptors.recovery.streaming_wal import ChainConfig, StreamingWAL, open_streaming_wal
from wal import InvalidArgumentError, Message, MessageType, SchemaMismatchError, WALManager, bodies

SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("val", pa.string())])
FAST = ChainConfig(tick_interval=0.01, segment_max_rows=40)

Row = tuple[int, str]


def batch(rows: Iterable[Row]) -> pa.RecordBatch:
    pks, vals = zip(*rows, strict=True)
    return pa.record_batch([pa.array(pks, pa.int64()), pa.array(vals)], schema=SCHEMA)


@dataclass
class Model:
    """What was committed, as (visible ts, message id, kind, rows or keys); ``visible`` replays it with a dict."""

    ops: list[tuple[int, int, str, list[Row] | list[int]]] = field(default_factory=list)

    def visible(self, as_of: int | None) -> Counter[Row]:
        state: dict[int, list[Row]] = {}
        for ts, _, kind, items in sorted(self.ops, key=lambda op: (op[0], op[1])):
            if as_of is not None and ts > as_of:
                break
            if kind == "insert":
                for row in items:
                    state.setdefault(row[0], []).append(row)  # type: ignore[index]
            elif kind == "delete":
                for key in items:
                    state.pop(key, None)  # type: ignore[arg-type]
            else:  # upsert: every older version goes, the new row stays
                for row in items:
                    state[row[0]] = [row]  # type: ignore[index]
        return Counter(row for rows in state.values() for row in rows)

    def timeticks(self) -> list[int]:
        return sorted({op[0] for op in self.ops})


Statement = tuple[str, list[Row] | list[int]]


class Writer:
    """Appends through the chain and records what became visible, at which (ts, id), in ``model``."""

    def __init__(self, swal: StreamingWAL, collection: str = "c") -> None:
        self.swal = swal
        self.collection = collection
        self.model = Model()

    def _message(self, kind: str, items: list[Row] | list[int], partition: str) -> Message:
        if kind == "delete":
            return bodies.delete("v", self.collection, items)
        build = bodies.insert if kind == "insert" else bodies.upsert
        return build("v", self.collection, batch(items), partition)  # type: ignore[arg-type]

    async def one(self, kind: str, items: list[Row] | list[int], partition: str = bodies.DEFAULT_PARTITION) -> int:
        r = await self.swal.append(self._message(kind, items, partition))
        self.model.ops.append((r.timetick, r.message_id, kind, items))
        return r.timetick

    async def txn(self, statements: list[Statement], *, commit: bool = True) -> int:
        ctx, _ = await self.swal.begin_txn("v", keepalive_ms=60_000)
        ids = []
        for kind, items in statements:
            ids.append((await self.swal.append(self._message(kind, items, bodies.DEFAULT_PARTITION).with_txn(ctx)))
                       .message_id)
        if not commit:
            return (await self.swal.rollback_txn(ctx.txn_id)).timetick
        ts = (await self.swal.commit_txn(ctx.txn_id)).timetick
        self.model.ops.extend((ts, mid, kind, items) for mid, (kind, items) in zip(ids, statements, strict=True))
        return ts


def read(root: Path, as_of: int | None, collection: str = "c") -> Counter[Row]:
    t = read_collection_arrow(root, collection, as_of_ts=as_of)
    return Counter(zip(t["pk"].to_pylist(), t["val"].to_pylist(), strict=True))


@pytest.fixture
async def swal(manager: WALManager) -> AsyncIterator[StreamingWAL]:
    await manager.create_channel("p")
    s = await open_streaming_wal(manager, "p", FAST)
    await s.ready()
    await s.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    await s.append(bodies.create_partition("v", "c", "other"))
    yield s
    await s.aclose()


@pytest.fixture
async def flusher(swal: StreamingWAL, tmp_path: Path) -> AsyncIterator[Flusher]:
    f = Flusher(swal, tmp_path / "out", FlusherConfig())
    await f.start()
    yield f
    await f.aclose()


async def flushed(f: Flusher) -> Path:
    await f.flush("v")
    return f.root


# --- statement order inside one transaction ----------------------------------------------------------------------
async def test_a_transaction_that_inserts_then_deletes_a_key_leaves_it_invisible(
    swal: StreamingWAL, flusher: Flusher,
) -> None:
    w = Writer(swal)
    ts = await w.txn([("insert", [(1, "a"), (2, "b")]), ("delete", [1])])
    root = await flushed(flusher)
    assert read(root, ts) == read(root, None) == Counter({(2, "b"): 1}) == w.model.visible(ts)
    assert read(root, ts - 1) == Counter()


async def test_a_transaction_that_deletes_then_inserts_a_key_leaves_it_visible(
    swal: StreamingWAL, flusher: Flusher,
) -> None:
    w = Writer(swal)
    before = await w.one("insert", [(1, "old")])
    ts = await w.txn([("delete", [1]), ("insert", [(1, "new")])])
    root = await flushed(flusher)
    assert read(root, ts) == read(root, None) == Counter({(1, "new"): 1}) == w.model.visible(None)
    assert read(root, ts - 1) == read(root, before) == Counter({(1, "old"): 1})


async def test_insert_delete_insert_in_one_transaction_leaves_one_row(swal: StreamingWAL, flusher: Flusher) -> None:
    w = Writer(swal)
    ts = await w.txn([("insert", [(1, "first")]), ("delete", [1]), ("insert", [(1, "second")])])
    root = await flushed(flusher)
    assert read(root, ts) == Counter({(1, "second"): 1}) == w.model.visible(ts)


# --- upsert ----------------------------------------------------------------------------------------------------
async def test_an_upsert_replaces_every_older_version_as_of_its_timetick_and_not_before(
    swal: StreamingWAL, flusher: Flusher,
) -> None:
    w = Writer(swal)
    await w.one("insert", [(1, "v1"), (2, "keep")])
    t2 = await w.one("insert", [(1, "v2")])  # a duplicate key: two rows until something replaces them
    t3 = await w.one("insert", [(1, "elsewhere")], partition="other")
    up = await w.one("upsert", [(1, "up"), (3, "new")])
    root = await flushed(flusher)
    assert read(root, t2)[(1, "v1")] == read(root, t2)[(1, "v2")] == 1
    assert read(root, up - 1) == read(root, t3) == Counter(
        {(1, "v1"): 1, (1, "v2"): 1, (1, "elsewhere"): 1, (2, "keep"): 1})
    assert read(root, up) == read(root, None) == Counter({(1, "up"): 1, (2, "keep"): 1, (3, "new"): 1})
    for as_of in [*w.model.timeticks(), None]:
        assert read(root, as_of) == w.model.visible(as_of), as_of


async def test_an_upsert_in_a_transaction_replaces_the_transactions_own_earlier_insert_and_a_later_delete_wins(
    swal: StreamingWAL, flusher: Flusher,
) -> None:
    w = Writer(swal)
    ts = await w.txn([("insert", [(1, "a"), (2, "b")]), ("upsert", [(1, "c")]), ("upsert", [(2, "d")]),
                      ("delete", [2])])
    root = await flushed(flusher)
    assert read(root, ts) == Counter({(1, "c"): 1}) == w.model.visible(ts)


async def test_the_flusher_writes_an_upsert_as_a_row_and_a_delete_entry_at_one_ts_and_id(
    swal: StreamingWAL, flusher: Flusher,
) -> None:
    r = await swal.append(bodies.upsert("v", "c", batch([(5, "x"), (6, "y")])))
    root = await flushed(flusher)
    [data] = sorted((root / "c").glob("partition=*/segment=*/*.parquet"))
    [deletes] = sorted((root / deletes_dir("c")).glob("*.parquet"))
    stamp = {"_ts": r.timetick, "_id": r.message_id}
    assert pq.read_table(data).select(["pk", "val", "_ts", "_id"]).to_pylist() == [
        {"pk": 5, "val": "x", **stamp}, {"pk": 6, "val": "y", **stamp}]
    assert pq.read_table(deletes).to_pylist() == [{"pk": 5, **stamp}, {"pk": 6, **stamp}]


async def test_a_wal_consumer_sees_one_upsert_message_with_the_segment_stamped(swal: StreamingWAL) -> None:
    r = await swal.append(bodies.upsert("v", "c", batch([(1, "x")])))
    [m] = [m for m in await swal.wal.read_stored(r.message_id) if m.message_id == r.message_id]
    assert m.message_type is MessageType.UPSERT
    assert bodies.read_upsert(m).to_pylist() == [{"pk": 1, "val": "x"}]
    assert bodies.read_segment(m) >= 0 and m.properties[bodies.PROP_ROWS] == "1"
    assert [s.rows for s in swal.shard.growing_segments()] == [1]


async def test_an_upsert_holding_a_key_twice_is_refused_naming_it_and_nothing_is_written(swal: StreamingWAL) -> None:
    last = swal.wal.last_id
    with pytest.raises(InvalidArgumentError, match=r"upsert into 'c' holds primary key '7' more than once") as e:
        await swal.append(bodies.upsert("v", "c", batch([(7, "a"), (8, "b"), (7, "c")])))
    assert e.value.fields["field"] == "pk"
    # The tick beat may append TimeTicks meanwhile (every 10 ms here): only they may follow.
    after = [m for m in await swal.wal.read_stored(last) if m.message_id is not None and m.message_id > last]
    assert [m.message_type for m in after if m.message_type is not MessageType.TIME_TICK] == []


async def test_an_upsert_is_checked_against_the_schema_like_an_insert(swal: StreamingWAL) -> None:
    wrong = pa.record_batch([pa.array([1], pa.int64())], names=["pk"])
    with pytest.raises(SchemaMismatchError, match="insert lacks column 'val'"):
        await swal.append(bodies.upsert("v", "c", wrong))


async def test_a_damaged_file_holding_upserts_is_rebuilt_from_the_wal_with_the_same_rows(
    swal: StreamingWAL, flusher: Flusher,
) -> None:
    w = Writer(swal)
    await w.one("insert", [(1, "a")])
    await w.txn([("upsert", [(1, "b")]), ("delete", [9]), ("upsert", [(2, "c")])])
    await w.one("upsert", [(3, "d")])
    root = await flushed(flusher)
    files = sorted(root.glob("**/*.parquet"))
    assert len(files) == 2
    targets = []
    for path in files:
        first, last = (int(x) for x in path.stem.split("-"))
        targets.append(_repair.Target(path.parent.relative_to(root).as_posix(), first, last))
    info = swal.shard.collections("v")["c"]
    rebuilt = await _repair.rebuild(swal.wal, targets, {("v", "c"): info}, 1 << 20)
    for path, target in zip(files, targets, strict=True):
        assert target in rebuilt, f"{path} was not rebuilt from the WAL"
        assert rebuilt[target].to_table(swal.wal.pchannel).equals(pq.read_table(path)), path


# --- against the model, at many timeticks ----------------------------------------------------------------------
def random_statement(rng: random.Random) -> Statement:
    keys = rng.sample(range(12), rng.randint(1, 3))
    kind = rng.choice(["insert", "insert", "delete", "upsert"])
    if kind == "delete":
        return kind, keys
    return kind, [(k, f"{kind[0]}{rng.randrange(10**6)}") for k in keys]


async def run_random(w: Writer, f: Flusher, rng: random.Random, operations: int) -> None:
    """``operations`` random steps: single inserts, deletes and upserts, transactions of 2-5 statements (some
    rolled back), and flushes."""
    for _ in range(operations):
        roll = rng.random()
        if roll < 0.55:
            kind, items = random_statement(rng)
            partition = "other" if kind != "delete" and rng.random() < 0.2 else bodies.DEFAULT_PARTITION
            await w.one(kind, items, partition)
        elif roll < 0.9:
            await w.txn([random_statement(rng) for _ in range(rng.randint(2, 5))], commit=rng.random() < 0.85)
        else:
            await f.flush("v")
    await f.flush("v")


async def test_random_operations_match_the_model_at_every_timetick(
    swal: StreamingWAL, flusher: Flusher, seed: int,
) -> None:
    rng = random.Random(seed)
    w = Writer(swal)
    await run_random(w, flusher, rng, 300)
    ticks = w.model.timeticks()
    assert len(ticks) > 150
    for as_of in [None, ticks[0] - 1, *ticks, *(t - 1 for t in rng.sample(ticks, 30))]:
        assert read(flusher.root, as_of) == w.model.visible(as_of), as_of


def test_id_is_a_reserved_column_name_and_an_upsert_body_reads_only_as_rows() -> None:
    schema = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("_id", pa.int64())])
    with pytest.raises(InvalidArgumentError, match="field name '_id' is reserved for system columns"):
        bodies.create_collection("v", "c", schema, "pk")
    m = bodies.upsert("v", "c", batch([(1, "x")]), "other")
    assert (m.message_type, m.properties) == (MessageType.UPSERT, {"collection": "c", "partition": "other"})
    assert bodies.read_rows(m).equals(bodies.read_upsert(m))
    with pytest.raises(bodies.CodecError, match="expected an INSERT or UPSERT message, got DELETE"):
        bodies.read_rows(bodies.delete("v", "c", [1]))
    with pytest.raises(bodies.CodecError, match="expected a INSERT message, got UPSERT"):
        bodies.read_insert(m)
