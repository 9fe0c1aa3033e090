"""flusher.read.spark.read_collection against files written in the flusher's layout, on a real local Spark."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from flusher.read.spark import CollectionLayoutError, CollectionNotFoundError, as_of, read_collection

from .layout import BASE_MS, HISTORY_AS_OF, FlushedCollection, timetick, write_history

pytestmark = pytest.mark.spark


def visible(df: DataFrame) -> set[tuple[int, int]]:
    return {(r["id"], r["_ts"]) for r in df.select("id", "_ts").collect()}


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("history")
    write_history(root)
    return root


def test_everything_has_exact_rows_and_columns(spark: SparkSession, history: Path) -> None:
    df = read_collection(spark, history, "books")
    assert df.columns == ["id", "title", "_ts", "_segment", "partition"]
    rows = sorted((tuple(r) for r in df.collect()), key=lambda r: (r[0], r[2]))
    assert rows == [
        (1, "title 1", timetick(0), 1, "_default"),
        (2, "title 2", timetick(40), 3, "_default"),
        (3, "title 3", timetick(10), 1, "_default"),
        (5, "title 5", timetick(30), 2, "p1"),
    ]
    assert df.schema["_ts"].dataType == T.LongType()
    assert df.schema["_segment"].dataType == T.LongType()
    assert df.schema["partition"].dataType == T.StringType()


@pytest.mark.parametrize("case", list(HISTORY_AS_OF))
def test_as_of(spark: SparkSession, history: Path, case: str) -> None:
    bound, expected = HISTORY_AS_OF[case]
    assert visible(read_collection(spark, history, "books", as_of_ts=bound)) == expected


def test_as_of_wall_clock_is_everything_up_to_that_millisecond(spark: SparkSession, history: Path) -> None:
    at_12ms = datetime.fromtimestamp(BASE_MS / 1000, UTC) + timedelta(milliseconds=12, microseconds=999)
    assert as_of(at_12ms) == HISTORY_AS_OF["at-12ms"][0]
    assert visible(read_collection(spark, history, "books", as_of_ts=as_of(at_12ms))) == HISTORY_AS_OF["at-12ms"][1]


def test_reinsert_after_delete_is_visible(spark: SparkSession, history: Path) -> None:
    df = read_collection(spark, history, "books").where("id = 2")
    assert [(r["_ts"], r["_segment"]) for r in df.collect()] == [(timetick(40), 3)]
    assert read_collection(spark, history, "books", as_of_ts=timetick(39)).where("id = 2").count() == 0


def test_missing_collection_names_the_path(spark: SparkSession, tmp_path: Path) -> None:
    with pytest.raises(CollectionNotFoundError, match=str(tmp_path / "nope")) as raised:
        read_collection(spark, tmp_path, "nope")
    assert raised.value.path == str(tmp_path / "nope")


@pytest.mark.parametrize("deletes", ["absent", "empty-dir", "only-a-temporary-file", "zero-rows"])
def test_deletes_absent_or_empty(spark: SparkSession, tmp_path: Path, deletes: str) -> None:
    c = FlushedCollection(tmp_path, "c")
    c.write_rows([1, 2], [timetick(0), timetick(1)])
    if deletes == "empty-dir":
        (c.root / "_deletes" / c.name).mkdir(parents=True)
    elif deletes == "only-a-temporary-file":
        keys = pa.table({"id": pa.array([1], pa.int64()), "_ts": pa.array([timetick(5)], pa.int64())})
        c.write_temporary(keys, c.root / "_deletes" / c.name)
    elif deletes == "zero-rows":
        c.write_deletes([], [])
    assert visible(read_collection(spark, tmp_path, "c")) == {(1, timetick(0)), (2, timetick(1))}


def test_temporary_files_are_never_read(spark: SparkSession, tmp_path: Path) -> None:
    c = FlushedCollection(tmp_path, "c")
    c.write_rows([1], [timetick(0)])
    stray = pa.table({"id": pa.array([666], pa.int64()), "title": ["stray"], "_ts": pa.array([timetick(0)])})
    segment_dir = c.path / "partition=_default" / "segment=1"
    c.write_temporary(stray.append_column("_segment", pa.array([1], pa.int64())), segment_dir)
    hidden_segment = c.path / "partition=_default" / ".segment=9"
    c.write_temporary(stray.append_column("_segment", pa.array([9], pa.int64())), hidden_segment)
    c.drop()  # the _dropped marker sits beside the data: a dropped collection still reads normally
    assert visible(read_collection(spark, tmp_path, "c")) == {(1, timetick(0))}


def test_numeric_partition_names_stay_strings(spark: SparkSession, tmp_path: Path) -> None:
    c = FlushedCollection(tmp_path, "c")
    c.write_rows([1], [timetick(0)], partition="007", segment=1)
    c.write_rows([2], [timetick(0)], partition="1", segment=2)
    df = read_collection(spark, tmp_path, "c")
    assert df.schema["partition"].dataType == T.StringType()
    assert "segment" not in df.columns
    assert {(r["id"], r["partition"]) for r in df.collect()} == {(1, "007"), (2, "1")}


def test_existing_collection_without_data_reads_empty(spark: SparkSession, tmp_path: Path) -> None:
    c = FlushedCollection(tmp_path, "c")
    c.write_deletes([1], [timetick(0)])
    df = read_collection(spark, tmp_path, "c")
    assert df.count() == 0
    assert df.columns == ["_ts", "_segment", "partition"]


def test_primary_key_from_metadata_argument_or_deletes(spark: SparkSession, tmp_path: Path) -> None:
    # A string key named "pk" in the metadata; "id" is an ordinary column here and must not be used.
    c = FlushedCollection(tmp_path, "meta", primary_key="pk")
    table = pa.table({"pk": ["a", "b"], "id": pa.array([1, 2], pa.int64()), "_ts": [timetick(0), timetick(0)]})
    c.write_segment(table)
    c.write_deletes(["a"], [timetick(1)], key_type=pa.string())
    assert [r["pk"] for r in read_collection(spark, tmp_path, "meta").collect()] == ["b"]

    # No metadata: the deletes' only non-_ts column names the key; an explicit argument wins over it.
    bare = FlushedCollection(tmp_path, "bare", primary_key=None)
    bare.write_segment(table)
    bare.primary_key = "pk"
    bare.write_deletes(["a"], [timetick(1)], key_type=pa.string())
    assert [r["pk"] for r in read_collection(spark, tmp_path, "bare").collect()] == ["b"]
    with pytest.raises(CollectionLayoutError, match="'title' is not a column of the data"):
        read_collection(spark, tmp_path, "bare", primary_key="title")


def test_column_types_round_trip(spark: SparkSession, tmp_path: Path) -> None:
    vectors = [[i / 4 + j for j in range(16)] for i in range(3)]  # quarters: exact in float32
    table = pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "f32": pa.array([0.5, -1.25, None], pa.float32()),
            "f64": pa.array([0.1, 1e300, -0.0], pa.float64()),
            "flag": pa.array([True, False, None], pa.bool_()),
            "s": pa.array(["plain", "ünïcode ✓", ""], pa.string()),
            "raw": pa.array([b"\x00\xff", b"", None], pa.binary()),
            "vec": pa.array(vectors, pa.list_(pa.float32(), 16)),
            "sparse": pa.array([[1.5], [], None], pa.list_(pa.float32())),
            "meta": pa.array(['{"a": 1}', "[1, 2]", None], pa.json_()),
            "_ts": pa.array([timetick(0)] * 3, pa.int64()),
        }
    )
    FlushedCollection(tmp_path, "c").write_segment(table)
    df = read_collection(spark, tmp_path, "c").orderBy("id")
    types = {f.name: f.dataType for f in df.schema.fields}
    assert types == {
        "id": T.LongType(),
        "f32": T.FloatType(),
        "f64": T.DoubleType(),
        "flag": T.BooleanType(),
        "s": T.StringType(),
        "raw": T.BinaryType(),
        "vec": T.ArrayType(T.FloatType(), True),
        "sparse": T.ArrayType(T.FloatType(), True),
        "meta": T.StringType(),  # Parquet's JSON logical type (pyarrow's arrow.json) arrives as text
        "_ts": T.LongType(),
        "_segment": T.LongType(),
        "partition": T.StringType(),
    }
    rows = df.collect()
    assert [r["f32"] for r in rows] == [0.5, -1.25, None]
    assert [r["f64"] for r in rows] == [0.1, 1e300, -0.0]
    assert [r["flag"] for r in rows] == [True, False, None]
    assert [r["s"] for r in rows] == ["plain", "ünïcode ✓", ""]
    assert [None if r["raw"] is None else bytes(r["raw"]) for r in rows] == [b"\x00\xff", b"", None]
    assert [r["vec"] for r in rows] == vectors
    assert [r["sparse"] for r in rows] == [[1.5], [], None]
    assert [r["meta"] and json.loads(r["meta"]) for r in rows] == [{"a": 1}, [1, 2], None]
