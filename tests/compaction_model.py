"""A seeded random walk through the flusher and compaction, checked against a plain model.

The walk drives a real chain (``open_streaming_wal``) and a ``Flusher`` over one collection with two
partitions: inserts (keys from a small range, so versions pile up), deletes (of keys that exist or
never did), upserts, transactions of mixed statements (committed or rolled back), manual flushes,
compaction passes with a random horizon (a timetick of the walk's past: ``Flusher.compact(now_ms=)``)
and random thresholds (``min_files``, target size and rows, grace period), and restarts of the
flusher (now and then of the whole chain).  A check flushes everything, then asks every reader for
the rows as of random timeticks at or after the compaction horizon (and as of "now"), and compares
them with ``Model.visible``: a plain replay of the operations in (ts, id) order with a dict.

A failure names the seed and the step, and prints the walk's last operations (the tests report it with
``pytest.fail(..., pytrace=False)``: pytest's own traceback of a long walk once failed inside its AST
parser, hiding the finding); ``STREAMINGNODE_MODEL_SEED``
replays a seed.  ``tests/unit/test_compaction_model.py`` runs it with pyarrow and DuckDB,
``tests/spark/test_compaction_model_spark.py`` a smaller walk with Spark too.
"""

from __future__ import annotations

import random
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from flusher import Flusher, FlusherConfig, layout
from flusher.compact import CompactionConfig
from flusher.read.spark import read_collection_arrow
from interceptors.recovery.streaming_wal import ChainConfig, StreamingWAL, open_streaming_wal
from tests.unit.test_upsert_order import SCHEMA, Row, Statement, Writer
from wal import WALManager, bodies

SEED_ENV = "STREAMINGNODE_MODEL_SEED"
SECONDS_ENV = "STREAMINGNODE_MODEL_SECONDS"
"""When set, the unit test walks fresh seeds, one after another, for this many seconds (the long run)."""

PARTITIONS = (bodies.DEFAULT_PARTITION, "q")
KEYS = 24
CHAIN = ChainConfig(tick_interval=0.01, segment_max_rows=30)

Reader = Callable[[Path, "int | None"], "Counter[Row]"]


def arrow_reader(root: Path, as_of: int | None) -> Counter[Row]:
    t = read_collection_arrow(root, "c", as_of_ts=as_of)
    return Counter(zip(t["pk"].to_pylist(), t["val"].to_pylist(), strict=True))


def duckdb_reader(root: Path, as_of: int | None) -> Counter[Row]:
    import duckdb  # noqa: PLC0415

    from flusher.read.duckdb import read_collection_duckdb  # noqa: PLC0415

    with duckdb.connect() as con:
        rel = read_collection_duckdb(con, root, "c", as_of=as_of)
        return Counter((int(k), str(v)) for k, v in rel.select("pk, val").fetchall())


@dataclass
class Figures:
    """What a walk did: how many of each step, and how many reads it compared."""

    steps: Counter[str] = field(default_factory=Counter)
    reads: int = 0
    compactions: int = 0
    delete_entries_dropped: int = 0

    def line(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.steps.items()))
        return (f"{sum(self.steps.values())} steps ({kinds}); {self.compactions} compactions committed, "
                f"{self.delete_entries_dropped} delete entries dropped; {self.reads} reads compared")


class Walk:
    """One walk: ``await run(steps)``; raises AssertionError naming the seed and step on a mismatch."""

    def __init__(self, manager: WALManager, root: Path, seed: int, readers: dict[str, Reader],
                 pchannel: str = "p", *, as_of_per_check: int = 3) -> None:
        self.manager = manager
        self.as_of_per_check = as_of_per_check
        self.pchannel = pchannel
        self.root = root
        self.seed = seed
        self.rng = random.Random(seed)
        self.readers = readers
        self.swal: StreamingWAL | None = None
        self.flusher: Flusher | None = None
        self.writer: Writer | None = None
        self.history: list[str] = []
        self.figures = Figures()
        self._next_value = 0
        self._last_now_ms = 0

    # --- lifecycle ---------------------------------------------------------------------------------
    async def _open(self) -> None:
        if self.pchannel not in await self.manager.list_channels():
            await self.manager.create_channel(self.pchannel)
        self.swal = await open_streaming_wal(self.manager, self.pchannel, CHAIN)
        await self.swal.ready()
        model = self.writer.model if self.writer is not None else None
        self.writer = Writer(self.swal)
        if model is not None:
            self.writer.model = model
        await self._start_flusher()

    async def _start_flusher(self) -> None:
        assert self.swal is not None
        # No background passes: the walk decides when compaction runs, and with what horizon.
        self.flusher = Flusher(self.swal, self.root, FlusherConfig(compaction=None))
        await self.flusher.start()

    async def aclose(self) -> None:
        if self.flusher is not None:
            await self.flusher.aclose()
            self.flusher = None
        if self.swal is not None:
            await self.swal.aclose()
            self.swal = None

    async def run(self, steps: int) -> Figures:
        await self._open()
        assert self.swal is not None
        await self.swal.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
        await self.swal.append(bodies.create_partition("v", "c", "q"))
        # One row no step deletes (its key is out of their range), flushed: the readers find the collection.
        assert self.writer is not None and self.flusher is not None
        await self.writer.one("insert", [(KEYS + 100, "first")])
        await self.flusher.flush("v")
        try:
            for i in range(steps):
                await self._step(i)
            await self._step(steps, "check")
        finally:
            await self.aclose()
        return self.figures

    async def _step(self, i: int, kind: str | None = None) -> None:
        kind = kind or self.rng.choices(_KINDS, _WEIGHTS)[0]
        self.figures.steps[kind] += 1
        try:
            await getattr(self, f"_{kind}")()
        except AssertionError as exc:
            raise AssertionError(self._context(i, kind, str(exc))) from None
        except Exception as exc:  # its traceback in the message: the test reports it without pytest's own
            trace = "".join(traceback.format_exception(exc))[-4000:]
            raise AssertionError(self._context(i, kind, f"{exc!r}\n{trace}")) from None

    def _context(self, i: int, kind: str, what: str) -> str:
        tail = "\n  ".join(self.history[-40:])
        return (f"model walk, seed {self.seed} (replay: {SEED_ENV}={self.seed}), step {i} ({kind}): {what}\n"
                f"last steps:\n  {tail}")

    # --- what a step does ----------------------------------------------------------------------------
    def _rows(self, n: int, *, distinct: bool = False) -> list[Row]:
        keys = self.rng.sample(range(KEYS), n) if distinct else [self.rng.randrange(KEYS) for _ in range(n)]
        out = []
        for k in keys:
            self._next_value += 1
            out.append((k, f"v{self._next_value}"))
        return out

    def _statement(self) -> Statement:
        kind = self.rng.choices(("insert", "delete", "upsert"), (4, 3, 2))[0]
        n = self.rng.randint(1, 3)
        if kind == "delete":
            return kind, [self.rng.randrange(KEYS + 4) for _ in range(n)]  # a few keys never inserted
        return kind, self._rows(n, distinct=kind == "upsert")

    async def _insert(self) -> None:
        assert self.writer is not None
        rows = self._rows(self.rng.randint(1, 4))
        partition = self.rng.choice(PARTITIONS)
        ts = await self.writer.one("insert", rows, partition)
        self.history.append(f"insert {rows} into {partition} at {ts}")

    async def _delete(self) -> None:
        assert self.writer is not None
        keys = [self.rng.randrange(KEYS + 4) for _ in range(self.rng.randint(1, 3))]
        ts = await self.writer.one("delete", keys)
        self.history.append(f"delete {keys} at {ts}")

    async def _upsert(self) -> None:
        assert self.writer is not None
        rows = self._rows(self.rng.randint(1, 3), distinct=True)
        partition = self.rng.choice(PARTITIONS)
        ts = await self.writer.one("upsert", rows, partition)
        self.history.append(f"upsert {rows} into {partition} at {ts}")

    async def _txn(self) -> None:
        assert self.writer is not None
        statements = [self._statement() for _ in range(self.rng.randint(1, 4))]
        commit = self.rng.random() < 0.85
        ts = await self.writer.txn(statements, commit=commit)
        self.history.append(f"txn {statements} {'committed' if commit else 'rolled back'} at {ts}")

    async def _flush(self) -> None:
        assert self.flusher is not None
        files = await self.flusher.flush("v")
        self.history.append(f"flush: {len(files)} files")

    def _horizon(self) -> int:
        _, _, horizon = layout.visible_files(self.root, "c")
        return horizon or 0

    async def _compact(self) -> None:
        await self._pass(0)
        if self.rng.random() < 0.4:
            # A second pass at once, its clock later or equal: what a node's periodic passes meet while
            # the horizon moves on (a delete file the first pass merged is the only one the second sees).
            await self._pass(self._last_now_ms)

    async def _pass(self, not_before_ms: int) -> None:
        assert self.flusher is not None and self.writer is not None
        ticks = [t for t in self.writer.model.timeticks() if t >> 18 >= not_before_ms]
        cfg = CompactionConfig(
            target_bytes=self.rng.choice((2_000, 8_000, 128 << 20)),
            target_rows=self.rng.choice((None, None, 4, 16)),
            min_files=self.rng.choice((1, 2, 2, 3, 5)),
            horizon_seconds=0,
            grace_seconds=self.rng.choice((0.0, 0.0, 0.0, 3600.0)),
        )
        # The horizon: the physical part of a timetick of the walk's past, or "now".
        now_ms = self.rng.choice(ticks) >> 18 if ticks and self.rng.random() < 0.85 else int(time.time() * 1000)
        self._last_now_ms = now_ms
        if self.rng.random() < 0.7:
            # As a node's passes mostly find: nothing buffered (buffered rows keep every delete entry).
            await self.flusher.flush("v")
        results = await self.flusher.compact("c", config=cfg, now_ms=now_ms)
        for r in results:
            if r.generation is not None:
                self.figures.compactions += 1
                self.figures.delete_entries_dropped += r.delete_entries_dropped
            self.history.append(
                f"compact (min_files {cfg.min_files}, target {cfg.target_bytes} B/{cfg.target_rows} rows, grace "
                f"{cfg.grace_seconds:.0f}, now_ms {now_ms}): generation {r.generation}, horizon {r.horizon}, "
                f"{r.files_before}->{r.files_after} files, {r.rows_dropped} rows and {r.delete_entries_dropped} "
                "delete entries dropped")

    async def _restart(self) -> None:
        assert self.flusher is not None
        whole = self.rng.random() < 0.3
        if whole:
            await self.aclose()
            await self._open()
        else:
            await self.flusher.aclose()
            await self._start_flusher()
        self.history.append(f"restart {'the chain and the flusher' if whole else 'the flusher'}")

    async def _check(self) -> None:
        assert self.flusher is not None and self.writer is not None
        await self.flusher.flush("v")
        horizon = self._horizon()
        model = self.writer.model
        later = [t for t in model.timeticks() if t >= horizon]
        picks: list[int | None] = [None, horizon, *self.rng.sample(later, min(len(later), self.as_of_per_check))]
        for as_of in picks:
            want = model.visible(as_of)
            for name, reader in self.readers.items():
                got = reader(self.root, as_of)
                self.figures.reads += 1
                if got != want:
                    missing = want - got
                    extra = got - want
                    raise AssertionError(
                        f"{name} as of {as_of} (horizon {horizon}): {sum(extra.values())} rows the model has not "
                        f"({sorted(extra)[:10]}), {sum(missing.values())} missing ({sorted(missing)[:10]})")
        self.history.append(f"check as of {picks}: {len(self.readers)} readers agree with the model")


_KINDS = ("insert", "delete", "upsert", "txn", "flush", "compact", "restart", "check")
_WEIGHTS = (26, 16, 10, 8, 18, 12, 3, 7)


__all__ = ["SECONDS_ENV", "SEED_ENV", "Figures", "Reader", "Walk", "arrow_reader", "duckdb_reader"]
