"""A collection over several vchannels (Milvus shards): the SDK routes every key to one shard by a
stable hash, the flusher writes the shards into one directory, and the readers see one table whose
rows, as of every timetick, are those of an independent model of the operations."""

from __future__ import annotations

import random
import struct
import zlib
from collections import Counter
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from flusher.read.duckdb import read_collection_duckdb
from flusher.read.spark import read_collection_arrow
from streamingnode.client import AsyncClient, InvalidArgumentError, ShardedCollection, shard_of
from streamingnode.server import ServerThread
from tests.integration.conftest import node_config
from tests.seeds import draw_seed
from wal import bodies
from wal.message import MessageType

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("v", pa.string())])
SHARDS = 4


def rows(pks: list[int], tag: str) -> pa.RecordBatch:
    return pa.record_batch([pa.array(pks, pa.int64()), pa.array([f"{tag}-{p}" for p in pks])], schema=SCHEMA)


# --- the hash ---------------------------------------------------------------------------------------
def test_shard_of_is_crc32_of_the_canonical_bytes_and_never_changes() -> None:
    # Pinned values: a change of the hash (or of the key's bytes) would move keys between shards of
    # collections that already hold data, so it must show up here.
    assert [shard_of(k, 4) for k in (0, 1, 2, 3, -1, 1 << 62)] == [
        zlib.crc32(struct.pack("<q", k)) % 4 for k in (0, 1, 2, 3, -1, 1 << 62)]
    assert [shard_of(k, 16) for k in (0, 1, 2, 3, -1)] == [9, 7, 4, 10, 12]
    assert [shard_of(k, 16) for k in ("", "a", "user-42", "ü")] == [0, 3, 3, 5]
    assert shard_of("a", 4) == zlib.crc32(b"a") % 4


@pytest.mark.parametrize(("key", "message"), [
    (True, "int64 or a string, got bool"), (1.5, "got float"), (1 << 63, "outside int64"), (None, "got NoneType"),
])
def test_shard_of_refuses_what_is_no_primary_key(key: object, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        shard_of(key, 4)  # type: ignore[arg-type]


async def test_sharded_collection_refuses_bad_arguments(server: str) -> None:
    async with AsyncClient(server) as client:
        data = client.data("p")
        for bad in (0, -1, 257, True, "4"):
            with pytest.raises(InvalidArgumentError, match="shards must be an integer from 1 to 256"):
                data.sharded("v", "users", bad, "pk")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="collection"):
            data.sharded("v", "bad/name", 2, "pk")
        coll = data.sharded("v", "users", 2, "pk")
        with pytest.raises(InvalidArgumentError, match="no primary key column 'pk'"):
            await coll.insert(pa.record_batch([pa.array([1])], names=["other"]))
        with pytest.raises(InvalidArgumentError, match="null primary key at row 1"):
            await coll.insert(pa.record_batch([pa.array([1, None], pa.int64())], names=["pk"]))
        with pytest.raises(InvalidArgumentError, match="has no rows"):
            await coll.insert(rows([], "x"))
        with pytest.raises(InvalidArgumentError, match="needs keys"):
            await coll.delete([])
        with pytest.raises(InvalidArgumentError, match="holds key 7 twice"):
            await coll.upsert(rows([1, 7, 2, 7], "x"))


# --- routing ----------------------------------------------------------------------------------------
async def test_every_write_goes_to_the_shard_of_its_key_and_a_delete_is_split(server: str) -> None:
    async with AsyncClient(server) as client:
        await client.create_channels(["p"])
        coll = client.data("p").sharded("v", "users", SHARDS, "pk")
        assert coll.vchannels == ["v_0", "v_1", "v_2", "v_3"]
        created = await coll.create(SCHEMA)
        assert len(created) == SHARDS
        keys = list(range(40))
        inserted = await coll.insert(rows(keys, "a"))
        assert len(inserted) == SHARDS, "40 keys reach every one of 4 shards"
        deleted = await coll.delete(pa.array([0, 1, 2, 3, 4, 5, 6, 7], pa.int64()))
        by_shard = Counter(coll.shard_of(k) for k in range(8))
        assert len(deleted) == len(by_shard) > 1
        last = max(r.timetick for r in deleted)

        seen: dict[str, dict[MessageType, list[int]]] = {}
        async with client.consumer("p") as consumer:
            async for pack in consumer:
                for m in pack.messages:
                    if m.message_type is MessageType.INSERT:
                        got = bodies.read_insert(m).column("pk").to_pylist()
                    elif m.message_type is MessageType.DELETE:
                        got = bodies.read_delete(m).to_pylist()
                    else:
                        continue
                    seen.setdefault(m.vchannel, {}).setdefault(m.message_type, []).extend(got)
                if pack.end_ts >= last:
                    break
        assert sorted(seen) == coll.vchannels
        for index, vchannel in enumerate(coll.vchannels):
            assert seen[vchannel][MessageType.INSERT] == [k for k in keys if shard_of(k, SHARDS) == index]
            assert seen[vchannel].get(MessageType.DELETE, []) == [
                k for k in range(8) if shard_of(k, SHARDS) == index]


# --- against a model --------------------------------------------------------------------------------
class Model:
    """Every row ever inserted and every delete, each at the (timetick, id) of its message; a row is
    visible as of T when it is at or before T and no delete of its key at or before T comes after it."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, str, tuple[int, int]]] = []
        self.deletes: list[tuple[int, tuple[int, int]]] = []

    def visible(self, as_of: int) -> Counter[tuple[int, str]]:
        out: Counter[tuple[int, str]] = Counter()
        for pk, value, at in self.rows:
            if at[0] > as_of:
                continue
            if any(key == pk and when[0] <= as_of and at < when for key, when in self.deletes):
                continue
            out[(pk, value)] += 1
        return out


async def _insert(coll: ShardedCollection, model: Model, pks: list[int], tag: str) -> None:
    results = await coll.insert(rows(pks, tag))
    # One result per shard that got rows, in shard order.
    at = dict(zip(sorted({coll.shard_of(k) for k in pks}), results, strict=True))
    for pk in pks:
        r = at[coll.shard_of(pk)]
        model.rows.append((pk, f"{tag}-{pk}", (r.timetick, r.message_id)))


async def _delete(coll: ShardedCollection, model: Model, keys: list[int]) -> None:
    results = await coll.delete(keys)
    for shard, r in zip(sorted({coll.shard_of(k) for k in keys}), results, strict=True):
        model.deletes += [(k, (r.timetick, r.message_id)) for k in keys if coll.shard_of(k) == shard]


async def _upsert(coll: ShardedCollection, model: Model, pks: list[int], tag: str) -> None:
    results = await coll.upsert(rows(pks, tag))
    at = dict(zip(sorted({coll.shard_of(k) for k in pks}), results, strict=True))
    for pk in pks:
        # The row and a delete of its key at one (ts, id): older versions go, this one stays.
        when = (at[coll.shard_of(pk)].timetick, at[coll.shard_of(pk)].message_id)
        model.rows.append((pk, f"{tag}-{pk}", when))
        model.deletes.append((pk, when))


async def _random_ops(coll: ShardedCollection, rng: random.Random, model: Model, steps: int, tag: str) -> None:
    for step in range(steps):
        roll = rng.random()
        if roll < 0.4:
            # Keys repeat: a second insert of a key is a second row (no upsert), in its key's shard.
            await _insert(coll, model, [rng.randrange(50) for _ in range(rng.randrange(1, 12))], f"{tag}{step}")
        elif roll < 0.6:
            await _upsert(coll, model, sorted({rng.randrange(50) for _ in range(rng.randrange(1, 10))}),
                          f"{tag}{step}u")
        elif roll < 0.85:
            keys = sorted({rng.randrange(50) for _ in range(rng.randrange(1, 8))})
            await _delete(coll, model, keys)
        else:
            await coll.flush()


async def test_a_sharded_collection_reads_as_one_table_that_matches_the_model_at_every_timetick(
    tmp_path: Path, record_property: object,
) -> None:
    rng = random.Random(draw_seed("SHARDS_SEED", record_property))  # type: ignore[arg-type]
    model = Model()
    config = node_config(tmp_path / "data")
    with ServerThread(config) as first:
        async with AsyncClient(first.address) as client:
            await client.create_channels(["p"])
            coll = client.data("p").sharded("v", "users", SHARDS, "pk")
            await coll.create(SCHEMA)
            await _random_ops(coll, rng, model, 40, "a")
            # Rows and deletes of several shards still buffered: the restart replays them, once.
            await _insert(coll, model, list(range(50, 58)), "pending")
            await _delete(coll, model, [0, 1, 2, 3, 4, 5, 50, 51])
    with ServerThread(config) as server_thread:
        async with AsyncClient(server_thread.address) as client:
            coll = client.data("p").sharded("v", "users", SHARDS, "pk")
            await _random_ops(coll, rng, model, 40, "b")
            _, flushed_at = await coll.flush()
        root = server_thread.node.config.parquet_root / "p"

    shard_dirs = {p.parent.parent.name for p in (root / "users").glob("partition=*/segment=*/*.parquet")}
    assert shard_dirs == {"partition=_default"}, "every shard writes into the one collection directory"
    segments = {p.parent.name for p in (root / "users").glob("partition=*/segment=*/*.parquet")}
    assert len(segments) >= SHARDS, "each shard has its own segments"
    times = sorted({t for _, _, (t, _) in model.rows} | {t for _, (t, _) in model.deletes})
    con = duckdb.connect()
    try:
        for as_of in [times[0] - 1, *times, flushed_at]:
            want = model.visible(as_of)
            got = read_collection_arrow(root, "users", as_of_ts=as_of, primary_key="pk")
            assert Counter(zip(got.column("pk").to_pylist(), got.column("v").to_pylist(), strict=True)) == want, \
                f"pyarrow as of {as_of}"
            dd = read_collection_duckdb(con, root, "users", as_of=as_of, primary_key="pk").project("pk, v")
            assert Counter(dd.fetchall()) == want, f"DuckDB as of {as_of}"
    finally:
        con.close()
    latest = read_collection_arrow(Path(root), "users", primary_key="pk")
    assert latest.num_rows == sum(model.visible(flushed_at).values())

