"""Delete files live outside the collections' directories (``<root>/_deletes/<collection>/``), so that a
plain glob of a collection's directory reads data files only, and the name is no collection's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flusher import Flusher, FlusherConfig, layout
from interceptors.recovery.streaming_wal import ChainConfig, StreamingWAL, open_streaming_wal
from streamingnode.offline.verify.parquet import parquet_files
from tests.flushed import delete_files
from wal import InvalidArgumentError, Message, WALManager, bodies, names

SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("name", pa.string())])


@pytest.fixture
async def swal(manager: WALManager) -> AsyncIterator[StreamingWAL]:
    await manager.create_channel("p")
    s = await open_streaming_wal(manager, "p", ChainConfig(tick_interval=0.01, segment_max_rows=1000))
    await s.ready()
    yield s
    await s.aclose()


def test_the_deletes_directory_is_no_collection_name() -> None:
    assert layout.DELETES_DIR == names.DELETES_DIR == "_deletes"
    with pytest.raises(InvalidArgumentError, match="'_deletes' is reserved"):
        bodies.validate_name("collection", "_deletes")
    assert bodies.validate_name("collection", "_deleted") == "_deleted"


async def test_a_glob_of_the_collection_directory_reads_data_files_only(swal: StreamingWAL, tmp_path: Path) -> None:
    f = Flusher(swal, tmp_path, FlusherConfig())
    await f.start()
    try:
        await swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
        batch = pa.record_batch([pa.array([1, 2, 3], pa.int64()), pa.array(["a", "b", "c"])], schema=SCHEMA)
        await swal.append(bodies.insert("v", "c", batch))
        await swal.append(bodies.delete("v", "c", [2]))
        await swal.append(Message(bodies.MessageType.DATA, "v", b"mark"))
        written = await f.flush("v", "c")
    finally:
        await f.aclose()
    found = delete_files(tmp_path, "c")
    assert len(found) == 1, f"not one delete file under _deletes/c: {found}"
    [deletes] = found
    assert deletes.parent == tmp_path / "_deletes" / "c"
    assert f"_deletes/c/{deletes.name}" in written
    assert f"_deletes/c/{deletes.name}" in layout.committed_files(tmp_path)  # the flusher's start-up listing
    assert deletes in list(parquet_files(tmp_path, None))  # verify's listing checks it too

    # What a user types first: every file under the collection's directory is a data file (no NULL rows).
    assert all("_segment" in pq.read_schema(p).names for p in (tmp_path / "c").rglob("*.parquet"))
    con = duckdb.connect()
    try:
        got = con.sql(f"SELECT pk, name FROM read_parquet('{tmp_path}/c/**/*.parquet') ORDER BY pk").fetchall()
    finally:
        con.close()
    assert got == [(1, "a"), (2, "b"), (3, "c")]  # data rows only, deletes not applied
