"""Writes Parquet files the way the flusher does (the layout in `flusher.read.spark`'s docstring), for the
readers' tests.

Deliberately independent of the flusher's own code: these tests check the readers against the written contract,
so a drift in the flusher shows up as a disagreement instead of being copied here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from flusher.read.spark import DELETES_DIR, DROPPED_MARKER, PRIMARY_KEY_METADATA

BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def timetick(ms_after_base: int, logical: int = 0) -> int:
    """The hybrid timetick ``physical_ms << 18 | logical`` of a moment `ms_after_base` ms after BASE_MS."""
    assert 0 <= logical < 1 << 18
    return (BASE_MS + ms_after_base) << 18 | logical


def file_name(first_id: int, last_id: int) -> str:
    return f"{first_id:020d}-{last_id:020d}.parquet"


class FlushedCollection:
    """One collection's directory under a root; ids of files advance by themselves."""

    def __init__(self, root: Path, name: str, primary_key: str | None = "id") -> None:
        self.root = root
        self.name = name
        self.path = root / name
        self.primary_key = primary_key
        self._next_id = 1
        self.path.mkdir(parents=True, exist_ok=True)

    def _ids(self, rows: int) -> tuple[int, int]:
        first = self._next_id
        self._next_id += max(rows, 1)
        return first, first + max(rows, 1) - 1

    @staticmethod
    def _commit(table: pa.Table, final: Path) -> Path:
        """Write to a dot-file, then rename: the flusher's way, so a reader never sees a half-written file."""
        final.parent.mkdir(parents=True, exist_ok=True)
        temporary = final.with_name("." + final.name + ".tmp")
        pq.write_table(table, temporary, coerce_timestamps="us")
        os.replace(temporary, final)
        return final

    def write_segment(self, table: pa.Table, *, partition: str = "_default", segment: int = 1) -> Path:
        """A data file of `table` (user columns and ``_ts``) in `partition`/`segment`; adds ``_segment``."""
        assert "_ts" in table.column_names
        table = table.append_column("_segment", pa.array([segment] * table.num_rows, pa.int64()))
        if self.primary_key is not None:
            table = table.replace_schema_metadata({PRIMARY_KEY_METADATA: self.primary_key})
        first, last = self._ids(table.num_rows)
        final = self.path / f"partition={partition}" / f"segment={segment}" / file_name(first, last)
        return self._commit(table, final)

    def write_rows(
        self, ids: Sequence[int], ts: Sequence[int], *, partition: str = "_default", segment: int = 1
    ) -> Path:
        """A data file with an int64 ``id`` (the key) and a string ``title`` derived from it."""
        table = pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "title": pa.array([f"title {i}" for i in ids], pa.string()),
                "_ts": pa.array(ts, pa.int64()),
            }
        )
        return self.write_segment(table, partition=partition, segment=segment)

    def write_deletes(self, keys: Sequence[object], ts: Sequence[int], key_type: pa.DataType | None = None) -> Path:
        """A deletes file: the key column (named as the primary key) and ``_ts``."""
        name = self.primary_key or "id"
        table = pa.table({name: pa.array(keys, key_type or pa.int64()), "_ts": pa.array(ts, pa.int64())})
        first, last = self._ids(table.num_rows)
        return self._commit(table, self.root / DELETES_DIR / self.name / file_name(first, last))

    def write_temporary(self, table: pa.Table, directory: Path) -> Path:
        """A complete Parquet file left under a dot-name, as a crash mid-flush leaves it: must never be read."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / ("." + file_name(self._next_id, self._next_id))  # still ends in .parquet
        pq.write_table(table, path)
        return path

    def drop(self) -> None:
        (self.path / DROPPED_MARKER).touch()


def write_history(root: Path, name: str = "books") -> FlushedCollection:
    """The shared scenario, in timetick order (``t(ms)`` = timetick(ms)):

    ====== ======================================= =====================================
    t      event                                   where
    ====== ======================================= =====================================
    0      insert 1; insert 2 (logical 1)          _default / segment 1
    10     insert 3                                _default / segment 1 (second file)
    15     delete 2
    20     insert 4                                p1 / segment 2
    25     delete 4; delete 99 (never inserted)
    30     insert 5; delete 5 at the same timetick p1 / segment 2  (an upsert: 5 stays)
    40     insert 2 again                          _default / segment 3
    ====== ======================================= =====================================
    """
    c = FlushedCollection(root, name)
    c.write_rows([1, 2], [timetick(0), timetick(0, 1)], segment=1)
    c.write_rows([3], [timetick(10)], segment=1)
    c.write_deletes([2], [timetick(15)])
    c.write_rows([4, 5], [timetick(20), timetick(30)], partition="p1", segment=2)
    c.write_deletes([4, 99, 5], [timetick(25), timetick(25), timetick(30)])
    c.write_rows([2], [timetick(40)], segment=3)
    return c


# (id, _ts) visible as of each bound, by the rules in flusher.read.spark's docstring.
HISTORY_AS_OF: dict[str, tuple[int | None, set[tuple[int, int]]]] = {
    "before-anything": (timetick(0) - 1, set()),
    "at-12ms": (timetick(12, (1 << 18) - 1), {(1, timetick(0)), (2, timetick(0, 1)), (3, timetick(10))}),
    "just-before-delete-2": (timetick(15) - 1, {(1, timetick(0)), (2, timetick(0, 1)), (3, timetick(10))}),
    "at-delete-2": (timetick(15), {(1, timetick(0)), (3, timetick(10))}),
    "at-26ms": (timetick(26), {(1, timetick(0)), (3, timetick(10))}),
    "at-35ms": (timetick(35), {(1, timetick(0)), (3, timetick(10)), (5, timetick(30))}),
    "everything": (None, {(1, timetick(0)), (3, timetick(10)), (5, timetick(30)), (2, timetick(40))}),
}
