"""The three readers (Spark, pyarrow, DuckDB) against a model of the row rule, at many timeticks.

A random workload (inserts in two partitions, deletes, transactions that insert and delete the same keys in any
order, a rolled back one now and then, rows written while a transaction is open, flushes at random moments) goes
through a real node; a Python model keeps every statement with its visible ``(ts, order)`` and says which rows a
read as of T returns. pyarrow and DuckDB must equal it at ~20 timeticks, Spark at 5 of them; then again after a
compaction whose horizon lies in the middle of the history (its inputs still there, in their grace period), where
a read before the horizon must fail instead.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from flusher import layout
from flusher.compact import CompactionConfig, compact_collection
from flusher.read.duckdb import read_collection_duckdb
from flusher.read.spark import AsOfBeforeHorizonError, read_collection, read_collection_arrow
from streamingnode.client import AsyncClient
from streamingnode.server import ServerThread
from tests.integration.conftest import node_config
from tests.seeds import draw_seed
from wal.clock import physical_ms

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("val", pa.int64())])
KEYS = 12  # few keys: most of them see inserts, deletes and re-inserts
PARTITIONS = ("_default", "p1")

Row = tuple[int, int, int, str]  # pk, val, _ts, partition


@dataclass
class Model:
    """Every committed statement as ``(ts, order, kind, pk, val, partition)``: ``order`` is the order the statements
    were written in, which is the order of their message ids (and so statement order inside one commit)."""

    statements: list[tuple[int, int, str, int, int, str]] = field(default_factory=list)
    order: int = 0

    def stamp(self) -> int:
        self.order += 1
        return self.order

    def visible(self, as_of: int | None) -> list[Row]:
        def seen(ts: int) -> bool:
            return as_of is None or ts <= as_of

        deletes: dict[int, list[tuple[int, int]]] = {}
        for ts, order, kind, pk, _, _ in self.statements:
            if kind == "delete" and seen(ts):
                deletes.setdefault(pk, []).append((ts, order))
        return sorted((pk, val, ts, part) for ts, order, kind, pk, val, part in self.statements
                      if kind == "insert" and seen(ts) and not any((ts, order) < d for d in deletes.get(pk, [])))


def rows(pks: list[int], val: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(pks, pa.int64()), pa.array([val] * len(pks), pa.int64())], schema=SCHEMA)


async def workload(address: str, rng: random.Random, operations: int) -> tuple[Model, list[int]]:
    """Run the workload; the model of what committed, and every timetick a statement became visible at."""
    model = Model()
    stamps: list[int] = []
    async with AsyncClient(address) as client:
        await client.create_channels(["p"])
        data = client.data("p")
        await data.create_collection("v", "c", SCHEMA, primary_key="pk")
        await data.create_partition("v", "c", "p1")

        async def insert_now() -> None:
            pks, part, val = rng.sample(range(KEYS), rng.randint(1, 3)), rng.choice(PARTITIONS), model.stamp()
            ts = (await data.insert("v", "c", rows(pks, val), part)).timetick
            model.statements += [(ts, val, "insert", k, val, part) for k in pks]
            stamps.append(ts)

        for _ in range(operations):
            roll = rng.random()
            if roll < 0.4:
                await insert_now()
            elif roll < 0.6:
                pks = rng.sample(range(KEYS), rng.randint(1, 2))
                order = model.stamp()
                ts = (await data.delete("v", "c", pks)).timetick
                model.statements += [(ts, order, "delete", k, 0, "") for k in pks]
                stamps.append(ts)
            elif roll < 0.85:
                # A transaction: statements on a few keys in random order; rows written meanwhile outside it.
                body: list[tuple[int, str, int, int, str]] = []
                keys = rng.sample(range(KEYS), 2)
                rolled_back = rng.random() < 0.15
                async with client.txn("p", "v") as tx:
                    for _ in range(rng.randint(2, 6)):
                        k, order = rng.choice(keys), model.stamp()
                        if rng.random() < 0.55:
                            part = rng.choice(PARTITIONS)
                            await tx.insert("c", rows([k], order), part)
                            body.append((order, "insert", k, order, part))
                        else:
                            await tx.delete("c", [k])
                            body.append((order, "delete", k, 0, ""))
                        if rng.random() < 0.2:
                            await insert_now()
                    if rolled_back:
                        await tx.rollback()
                if not rolled_back:
                    ts = tx.commit_timetick
                    model.statements += [(ts, order, kind, k, val, part) for order, kind, k, val, part in body]
                    stamps.append(ts)
            else:
                await data.flush("v", "c")
        await data.flush("v", "c")
    return model, stamps


def as_tuples(table: pa.Table) -> list[Row]:
    return sorted(zip(*(table.column(c).to_pylist() for c in ("pk", "val", "_ts", "partition")), strict=True))


def check_pyarrow_and_duckdb(root: Path, model: Model, bounds: list[int | None], horizon: int | None) -> None:
    con = duckdb.connect()
    try:
        for bound in bounds:
            if horizon is not None and bound is not None and bound < horizon:
                with pytest.raises(AsOfBeforeHorizonError):
                    read_collection_arrow(root, "c", bound)
                with pytest.raises(AsOfBeforeHorizonError):
                    read_collection_duckdb(con, root, "c", as_of=bound)
                continue
            expected = model.visible(bound)
            assert as_tuples(read_collection_arrow(root, "c", bound)) == expected, f"pyarrow as of {bound}"
            got = read_collection_duckdb(con, root, "c", as_of=bound).select("pk, val, _ts, partition").fetchall()
            assert sorted(got) == expected, f"duckdb as of {bound}"
    finally:
        con.close()


def check_spark(spark, root: Path, model: Model, bounds: list[int | None]) -> None:
    for bound in bounds:
        df = read_collection(spark, root, "c", as_of_ts=bound).select("pk", "val", "_ts", "partition")
        got = sorted((r["pk"], r["val"], r["_ts"], r["partition"]) for r in df.collect())
        assert got == model.visible(bound), f"spark as of {bound}"


def test_spark_pyarrow_and_duckdb_agree_with_the_model(
    tmp_path: Path, spark, record_property: Callable[[str, object], None]
) -> None:
    rng = random.Random(draw_seed("READERS_AGREE_SEED", record_property))
    with ServerThread(node_config(tmp_path / "data")) as srv:
        model, stamps = asyncio.run(workload(srv.address, rng, operations=150))
        root = srv.node.config.parquet_root / "p"

    # Bounds: just before and at statements' timeticks (where the answers change), and no bound at all.
    candidates = sorted({b for ts in stamps for b in (ts - 1, ts)})
    bounds: list[int | None] = [None, *sorted(rng.sample(candidates, min(19, len(candidates))))]
    assert any(model.visible(b) != model.visible(None) for b in bounds[1:]), "the bounds cut through the history"
    check_pyarrow_and_duckdb(root, model, bounds, None)
    check_spark(spark, root, model, [None, *rng.sample(bounds[1:], 2)])

    # A compaction with its horizon in the middle of the history; the inputs stay for their grace period.
    middle = sorted(stamps)[len(stamps) // 2]
    config = CompactionConfig(min_files=2, horizon_seconds=0, grace_seconds=3600)
    result = compact_collection(root, "c", config, now_ms=physical_ms(middle))
    assert result.generation is not None and result.horizon is not None and result.files_after < result.files_before
    [record] = layout.read_records(root, "c")
    assert all((root / p).exists() for p in record.inputs), "the inputs are still there: the readers must skip them"
    check_pyarrow_and_duckdb(root, model, bounds, result.horizon)
    later = [b for b in bounds[1:] if b is not None and b >= result.horizon]
    check_spark(spark, root, model, [None, *rng.sample(later, min(1, len(later)))])
