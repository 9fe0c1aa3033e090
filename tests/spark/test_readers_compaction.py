"""The readers honour compaction records: they read the committed set (never the inputs and the outputs of one
record together), an output still under its hidden name, and refuse an as-of before the horizon.

The record is written here by hand, in the documented form (``<root>/<collection>/_compactions/<generation>.json``
with paths relative to the root), not by the compactor: the readers are checked against the contract.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import flusher.read.spark
from flusher.read.duckdb import read_collection_duckdb
from flusher.read.spark import AsOfBeforeHorizonError, CollectionLayoutError, read_collection, read_collection_arrow
from tests.spark.layout import FlushedCollection, file_name, timetick

pytestmark = pytest.mark.spark

OUTPUT = f"c/partition=_default/segment=-1/{file_name(1, 4)}"


def compacted(root: Path, *, hidden_output: bool) -> None:
    """Rows 1, 2 (t0) and 3 (t10), a delete of 2 at t15; then a compaction with horizon t15 that merged both data
    files and the delete file into one output holding rows 1 and 3. The inputs are still there (grace period)."""
    c = FlushedCollection(root, "c", primary_key="id")
    first = c.write_rows([1, 2], [timetick(0), timetick(0, 1)], segment=1)
    second = c.write_rows([3], [timetick(10)], segment=1)
    deletes = c.write_deletes([2], [timetick(15)])
    out = pq.read_table(first).filter(pc.field("id") == 1)
    merged = pa.concat_tables([out, pq.read_table(second)]).replace_schema_metadata(
        {"streamingnode.primary_key": "id"})
    target = root / OUTPUT
    target.parent.mkdir(parents=True)
    pq.write_table(merged, target.with_name("." + target.name))
    if not hidden_output:
        os.link(target.with_name("." + target.name), target)
    record = {"generation": 1, "horizon": timetick(15),
              "inputs": [p.relative_to(root).as_posix() for p in (first, second, deletes)], "outputs": [OUTPUT]}
    (root / "c" / "_compactions").mkdir()
    (root / "c" / "_compactions" / f"{1:020d}.json").write_text(json.dumps(record))


EXPECTED = [(1, timetick(0)), (3, timetick(10))]


@pytest.mark.parametrize("hidden_output", [False, True], ids=["linked", "hidden"])
def test_pyarrow_and_duckdb_read_the_committed_set_once(tmp_path: Path, hidden_output: bool) -> None:
    compacted(tmp_path, hidden_output=hidden_output)
    table = read_collection_arrow(tmp_path, "c")
    assert sorted(zip(table["id"].to_pylist(), table["_ts"].to_pylist(), strict=True)) == EXPECTED
    assert set(table["partition"].to_pylist()) == {"_default"}
    con = duckdb.connect()
    try:
        assert sorted(read_collection_duckdb(con, tmp_path, "c").select("id, _ts").fetchall()) == EXPECTED
        assert sorted(read_collection_duckdb(con, tmp_path, "c", as_of=timetick(15)).select("id, _ts").fetchall()) \
            == EXPECTED
        with pytest.raises(AsOfBeforeHorizonError, match=str(timetick(15))):
            read_collection_duckdb(con, tmp_path, "c", as_of=timetick(15) - 1)
    finally:
        con.close()
    with pytest.raises(AsOfBeforeHorizonError, match=str(timetick(15))):
        read_collection_arrow(tmp_path, "c", timetick(10))
    # A plain read of the directory sees both the inputs and the (linked) output: what the docs say it does.
    plain = pq.ParquetDataset(tmp_path / "c").read()
    assert plain.num_rows == (3 if hidden_output else 5)


def test_spark_reads_the_committed_set_once_and_refuses_an_as_of_before_the_horizon(
    tmp_path: Path, spark
) -> None:
    compacted(tmp_path, hidden_output=False)
    got = sorted((r["id"], r["_ts"]) for r in read_collection(spark, tmp_path, "c").collect())
    assert got == EXPECTED
    got = sorted((r["id"], r["_ts"]) for r in read_collection(spark, tmp_path.as_uri(), "c", timetick(20)).collect())
    assert got == EXPECTED
    with pytest.raises(AsOfBeforeHorizonError, match=str(timetick(15))):
        read_collection(spark, tmp_path, "c", as_of_ts=timetick(15) - 1)


def test_spark_fails_naming_an_output_that_keeps_only_its_hidden_name(
    tmp_path: Path, spark, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark skips a name starting with '.' even when it is named: rather than read the inputs, or nothing, the
    read waits for the link and then fails naming the file (no wait here)."""
    compacted(tmp_path, hidden_output=True)
    monkeypatch.setattr(flusher.read.spark, "_LINK_WAIT_SECONDS", 0.0)
    hidden = tmp_path / OUTPUT
    with pytest.raises(CollectionLayoutError, match="hidden name") as raised:
        read_collection(spark, tmp_path, "c")
    assert raised.value.path == str(hidden.with_name("." + hidden.name))
