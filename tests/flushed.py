"""Reading back what a flusher committed under its root, for the flusher and retention tests."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def data_files(root: Path, collection: str = "c") -> list[Path]:
    return sorted((root / collection).glob("partition=*/segment=*/*.parquet"))


def delete_files(root: Path, collection: str = "c") -> list[Path]:
    return sorted((root / "_deletes" / collection).glob("*.parquet"))


def read_all(files: list[Path]) -> pa.Table | None:
    if not files:
        return None
    return pa.concat_tables([pq.read_table(f) for f in files])


def pks(root: Path, collection: str = "c") -> list[int]:
    t = read_all(data_files(root, collection))
    return [] if t is None else sorted(t.column("pk").to_pylist())
