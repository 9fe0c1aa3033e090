"""Every accepted column type, produced through a real node and flushed, read back by real Spark through
``read_collection``: the Spark types of the flusher README's table, and every value (edge values and
nulls) exactly.  One Spark job: the rows come back through ``toArrow``, which keeps time zones and
nanosecond-free timestamps as they are rather than converting through Python's local time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flusher.read.spark import read_collection
from tests import typed_rows

pytestmark = pytest.mark.spark

SPARK_TYPES = {
    "pk": "bigint", "i8": "tinyint", "i16": "smallint",
    "ts": "timestamp_ntz", "ts_utc": "timestamp", "ts_ms": "timestamp", "ts_s": "timestamp",
    "d": "date", "dec": "decimal(12,4)", "big": "decimal(38,0)", "f64": "double",
    "nums": "array<bigint>", "tags": "array<string>", "addr": "struct<city:string,zip:int,at:timestamp_ntz>",
    "vec": "array<float>", "h16": "array<float>", "bf16": "array<float>", "bits": "binary",
    "sp": "map<bigint,float>", "j": "string",
}


def test_every_type_reads_back_exactly_with_spark(tmp_path: Path, spark: Any) -> None:
    root, files = typed_rows.produce(tmp_path)
    assert files
    df = read_collection(spark, str(root), typed_rows.COLLECTION, primary_key="pk")
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    assert {k: types.get(k) for k in SPARK_TYPES} == SPARK_TYPES

    rows = df.toArrow().sort_by("pk").to_pylist()
    for r in rows:
        r["sp"] = None if r["sp"] is None else dict(r["sp"])
    problems = typed_rows.mismatches(rows, typed_rows.EXPECTED)
    assert not problems, "\n".join(problems)
