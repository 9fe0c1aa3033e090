"""Statement order inside a transaction and UPSERT, read with Spark: through a real node and the SDK (the
proto's UPSERT, ``DataClient.upsert``, ``Transaction.upsert``), and a random history against the model of
``tests/unit/test_upsert_order.py`` (one Spark session, a few as-of points: Spark is slow)."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from flusher import Flusher, FlusherConfig
from flusher.read.spark import read_collection
from interceptors.recovery.streaming_wal import open_streaming_wal
from streamingnode.client import AsyncClient
from streamingnode.server import ServerThread
from tests.integration.conftest import node_config
from tests.unit.test_upsert_order import FAST, SCHEMA, Model, Row, Writer, batch, read, run_random
from wal import Durability, InvalidArgumentError, WALManager, bodies
from wal.backends import MemoryBackend

pytestmark = pytest.mark.spark


def spark_read(spark: Any, root: Path, as_of: int | None) -> Counter[Row]:
    df = read_collection(spark, str(root), "c", as_of_ts=as_of)
    return Counter((r["pk"], r["val"]) for r in df.select("pk", "val").collect())


def test_sdk_upserts_and_transaction_order_through_a_node_match_the_model_in_spark_and_pyarrow(
    tmp_path: Path, spark: Any,
) -> None:
    model = Model()

    def record(kind: str, items: list[Row] | list[int], ts: int, mid: int | None) -> None:
        assert mid is not None
        model.ops.append((ts, mid, kind, items))

    with ServerThread(node_config(tmp_path / "data")) as srv:
        async def scenario() -> None:
            async with AsyncClient(srv.address) as client:
                await client.create_channels(["p"])
                data = client.data("p")
                await data.create_collection("v", "c", SCHEMA, primary_key="pk")
                for kind, items in (("insert", [(1, "a"), (2, "b"), (3, "c")]), ("insert", [(1, "dup")])):
                    r = await data.insert("v", "c", batch(items))  # type: ignore[arg-type]
                    record(kind, items, r.timetick, r.message_id)
                r = await data.upsert("v", "c", batch([(1, "up"), (4, "new")]))
                record("upsert", [(1, "up"), (4, "new")], r.timetick, r.message_id)
                with pytest.raises(InvalidArgumentError, match="holds primary key '5' more than once"):
                    await data.upsert("v", "c", batch([(5, "x"), (5, "y")]))
                for statements in (
                    [("insert", [(6, "t")]), ("delete", [6])],
                    [("delete", [2]), ("insert", [(2, "back")])],
                    [("insert", [(7, "first")]), ("delete", [7]), ("insert", [(7, "second")])],
                    [("insert", [(8, "x")]), ("upsert", [(8, "y"), (3, "z")])],
                ):
                    async with client.txn("p", "v") as tx:
                        ids = []
                        for kind, items in statements:
                            if kind == "delete":
                                ids.append((await tx.delete("c", items)).message_id)
                            elif kind == "insert":
                                ids.append((await tx.insert("c", batch(items))).message_id)  # type: ignore[arg-type]
                            else:
                                ids.append((await tx.upsert("c", batch(items))).message_id)  # type: ignore[arg-type]
                        commit = await tx.commit()
                    for mid, (kind, items) in zip(ids, statements, strict=True):
                        record(kind, items, commit.timetick, mid)  # type: ignore[arg-type]
                await data.flush("v", "c")

        asyncio.run(scenario())
        root = srv.node.config.parquet_root / "p"

    expected = Counter({(1, "up"): 1, (2, "back"): 1, (3, "z"): 1, (4, "new"): 1, (7, "second"): 1, (8, "y"): 1})
    assert model.visible(None) == expected
    for as_of in [None, *model.timeticks(), *(t - 1 for t in model.timeticks())]:
        want = model.visible(as_of)
        assert read(root, as_of) == want, as_of
    for as_of in [None, *model.timeticks()[2:5]]:  # before, at and after the upsert
        assert spark_read(spark, root, as_of) == model.visible(as_of), as_of


def test_random_operations_match_the_model_in_spark(tmp_path: Path, spark: Any) -> None:
    rng = random.Random(20261124)

    async def scenario() -> tuple[Model, Path]:
        manager = await WALManager.start(MemoryBackend(), durability=Durability.SYNC)
        try:
            await manager.create_channel("p")
            swal = await open_streaming_wal(manager, "p", FAST)
            await swal.ready()
            try:
                await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
                await swal.append(bodies.create_partition("v", "c", "other"))
                f = Flusher(swal, tmp_path / "out", FlusherConfig())
                await f.start()
                try:
                    w = Writer(swal)
                    await run_random(w, f, rng, 300)
                finally:
                    await f.aclose()
            finally:
                await swal.aclose()
        finally:
            await manager.aclose()
        return w.model, tmp_path / "out"

    model, root = asyncio.run(scenario())
    ticks = model.timeticks()
    points = [None, ticks[len(ticks) // 4], ticks[len(ticks) // 2] - 1, ticks[len(ticks) // 2], ticks[-1] - 1]
    for as_of in points:
        want = model.visible(as_of)
        assert spark_read(spark, root, as_of) == want == read(root, as_of), as_of


def test_the_reader_keeps_the_old_rule_for_files_written_before_the_id_column(tmp_path: Path, spark: Any) -> None:
    """No ``_id`` in the files: a delete at a row's very timetick does not remove it (``row._ts < del._ts``)."""
    import pyarrow.parquet as pq  # noqa: PLC0415

    from flusher.layout import deletes_dir, file_name  # noqa: PLC0415
    from flusher.read.spark import read_collection_arrow  # noqa: PLC0415

    ts = 1 << 40
    data = tmp_path / "c" / "partition=_default" / "segment=1"
    data.mkdir(parents=True)
    pq.write_table(pa.table({"pk": pa.array([1, 2], pa.int64()), "val": ["a", "b"], "_ts": [ts, ts],
                             "_segment": pa.array([1, 1], pa.int64())}).replace_schema_metadata(
        {"streamingnode.primary_key": "pk"}), data / file_name(1, 1))
    (tmp_path / deletes_dir("c")).mkdir(parents=True)
    pq.write_table(pa.table({"pk": pa.array([1, 2], pa.int64()), "_ts": [ts, ts + 1]}),
                   tmp_path / deletes_dir("c") / file_name(2, 3))
    assert read_collection_arrow(tmp_path, "c")["pk"].to_pylist() == [1]
    assert [r["pk"] for r in read_collection(spark, str(tmp_path), "c").collect()] == [1]
