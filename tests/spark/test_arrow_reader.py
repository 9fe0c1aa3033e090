"""flusher.read.spark.read_collection_arrow: the same files and the same as-of rules with pyarrow.dataset (no Spark)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from flusher.read.spark import CollectionNotFoundError, read_collection_arrow

from .layout import HISTORY_AS_OF, FlushedCollection, timetick, write_history


def visible(table: pa.Table) -> set[tuple[int, int]]:
    return set(zip(table["id"].to_pylist(), table["_ts"].to_pylist(), strict=True))


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("history")
    write_history(root)
    return root


@pytest.mark.parametrize("case", list(HISTORY_AS_OF))
def test_as_of_matches_the_spark_reader_expectations(history: Path, case: str) -> None:
    bound, expected = HISTORY_AS_OF[case]
    assert visible(read_collection_arrow(history, "books", as_of_ts=bound)) == expected


def test_columns_and_types(history: Path) -> None:
    table = read_collection_arrow(history, "books")
    assert table.schema.names == ["id", "title", "_ts", "_segment", "partition"]
    assert table.schema.field("partition").type == pa.string()
    assert sorted(table["partition"].to_pylist()) == ["_default", "_default", "_default", "p1"]


def test_uri_root(history: Path) -> None:
    assert visible(read_collection_arrow(history.as_uri(), "books")) == HISTORY_AS_OF["everything"][1]


def test_missing_collection(tmp_path: Path) -> None:
    with pytest.raises(CollectionNotFoundError, match=str(tmp_path / "nope")):
        read_collection_arrow(tmp_path, "nope")


def test_temporary_files_numeric_partitions_and_vectors(tmp_path: Path) -> None:
    c = FlushedCollection(tmp_path, "c")
    vectors = pa.array([[1.0] * 16, [2.0] * 16], pa.list_(pa.float32(), 16))
    table = pa.table({"id": pa.array([1, 2], pa.int64()), "vec": vectors, "_ts": [timetick(0), timetick(1)]})
    c.write_segment(table, partition="007")
    c.write_temporary(table.append_column("_segment", pa.array([1, 1], pa.int64())), c.path / "partition=007")
    c.write_deletes([1], [timetick(2)])
    c.drop()
    result = read_collection_arrow(tmp_path, "c")
    assert result["id"].to_pylist() == [2]
    assert result["partition"].to_pylist() == ["007"]
    assert result.schema.field("vec").type == pa.list_(pa.float32(), 16)


def test_existing_collection_without_data_reads_empty(tmp_path: Path) -> None:
    FlushedCollection(tmp_path, "c")
    table = read_collection_arrow(tmp_path, "c")
    assert table.num_rows == 0
    assert table.schema.names == ["_ts", "_segment", "partition"]
