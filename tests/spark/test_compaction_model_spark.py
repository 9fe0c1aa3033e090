"""The compaction model walk (``tests/compaction_model.py``) with Spark as a third reader: a smaller walk than
the unit test's (a Spark read costs about a second), compared with the model at timeticks at or after the
horizon.  ``STREAMINGNODE_MODEL_SEED`` replays a seed."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flusher.read.spark import read_collection
from tests.compaction_model import SEED_ENV, Walk, arrow_reader, duckdb_reader
from tests.seeds import draw_seed
from tests.unit.test_upsert_order import Row
from wal import Durability, WALManager
from wal.backends import MemoryBackend

STEPS = 100


def test_spark_pyarrow_and_duckdb_agree_with_the_model_through_compactions(
    tmp_path: Path, spark: Any, record_property: Callable[[str, object], None],
) -> None:
    seed = draw_seed(SEED_ENV, record_property)

    def spark_reader(root: Path, as_of: int | None) -> Counter[Row]:
        df = read_collection(spark, str(root), "c", as_of_ts=as_of)
        return Counter((r["pk"], r["val"]) for r in df.select("pk", "val").collect())

    async def scenario() -> None:
        manager = await WALManager.start(MemoryBackend(), durability=Durability.SYNC)
        try:
            readers = {"spark": spark_reader, "pyarrow": arrow_reader, "duckdb": duckdb_reader}
            try:
                figures = await Walk(manager, tmp_path / "out", seed, readers, as_of_per_check=1).run(STEPS)
            except AssertionError as exc:
                pytest.fail(str(exc), pytrace=False)
            print(figures.line())
        finally:
            await manager.aclose()

    asyncio.run(scenario())
