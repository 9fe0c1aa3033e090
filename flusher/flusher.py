"""The flusher of one pchannel: a durable reader of the WAL that writes Parquet files, exactly once.

Lifecycle: ``Flusher(stream, root, config)`` → ``await start()`` (recover, then a background task
reads the WAL) → ``await aclose()``.  States go starting → running → draining → closed.

What it does with each message (in the scanner's delivery order, transactions whole at commit):

- CREATE_COLLECTION registers the schema; DROP_COLLECTION writes the collection's remaining buffers,
  then a ``_dropped`` marker, and ignores the collection's later messages.
- INSERT rows buffer per segment directory, DELETE keys per collection; an UPSERT buffers both, its
  rows and a delete entry of each row's key, at its one ``(ts, id)``.  Every row and delete entry
  carries ``_ts`` (its visible timestamp) and ``_id`` (its message id), which order the statements of
  one transaction for the readers (``flusher.read.plan``, "the row rule").  A file is written on the
  segment's FLUSH, on a MANUAL_FLUSH of its vchannel (and collection), when a buffer reaches
  ``max_rows``/``max_bytes``/``max_age_seconds``, and — largest buffer first — whenever all buffers
  together exceed ``memory_cap_bytes``.

Exactly once.  The truth is the set of committed files (``commit.py``).  Each file records the
delivery key ``(visible ts, id)`` of its last message; on start ``_probe.scan`` gives each
directory's largest one, and messages at or below it are skipped.  The reader resumes from the
stored checkpoint: the start of the oldest pack that holds a message not yet in a committed file
(or, with nothing buffered, where the reader is).  The checkpoint is stored only after the files it
steps over are durable, together with the collection registry (in one ``put_meta`` value, so a
crash cannot separate them; a replay that repeats DDL just re-applies it).  A crash anywhere
therefore re-reads at least everything not committed, and skips everything committed, even when
limits cut the replayed files at other boundaries.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import dataclasses
import enum
import errno
import functools
import json
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
import structlog

from flusher import _overlaps, _probe, _repair, compaction_record, layout
from flusher import compact as _compact
from flusher._buffers import Buffer, delete_rows, insert_destination, upsert_delete_rows
from flusher.commit import StagingFencedError, commit_file, crash_point, inside, open_staging, remove_temporaries
from interceptors.recovery.snapshot import load_snapshot
from interceptors.recovery.streaming_wal import StreamingWAL
from interceptors.shard.interceptor import ShardInterceptor
from wal import bodies
from wal.clock import physical_ms
from wal.errors import ChannelFencedError, ErrorCode, InvalidArgumentError, OnShutdownError, StreamingError
from wal.message import Message, MessageType, Position
from wal.options import DeliverFilter, DeliverPolicy, ReadOption
from wal.scanner import MsgPack, Scanner
from wal.tasks import cancel_and_wait
from wal.wal import WAL

log = structlog.get_logger(__name__)

CHECKPOINT_META = "flusher_checkpoint"
"""The default ``FlusherConfig.checkpoint_name``."""
_KEEP_FLUSH_RESULTS = 1024
_T = TypeVar("_T")
_MT = MessageType


@dataclass(frozen=True, slots=True)
class FlusherConfig:
    """Limits of one flusher.  A buffer is written when any of its limits is reached."""

    max_rows: int = 1_000_000
    max_bytes: int = 64 << 20
    """Per buffer, counted as the payload bytes it holds."""
    max_age_seconds: float = 50.0
    """Since the buffer's first row arrived (checked at every TimeTick); the node's default too
    (``flush_max_age_seconds``): an idle insert reaches Parquet within a minute."""
    memory_cap_bytes: int = 256 << 20
    """All buffers together; above it the largest buffer is written first."""
    compression: str = "zstd"
    checkpoint_interval_seconds: float = 1.0
    """How often the checkpoint moves when no file was written (after a write it moves at once)."""
    read_batch_bytes: int = 1 << 20
    checkpoint_name: str = CHECKPOINT_META
    """The WAL meta key of the checkpoint: one per (pchannel, root); a second flusher of the same
    pchannel writing elsewhere needs its own."""
    compaction: _compact.CompactionConfig | None = None
    """Compaction of small files (``flusher/compact.py``); None: never in the background."""
    compaction_interval_seconds: float = 300.0

    def __post_init__(self) -> None:
        if self.max_rows < 1 or self.max_bytes < 1 or self.memory_cap_bytes < 1 or not self.max_age_seconds > 0:
            raise InvalidArgumentError("flusher limits must be positive")


class FlusherState(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class FlusherStats:
    """A snapshot of ``Flusher.stats()``."""

    rows_written: int
    delete_rows_written: int
    bytes_written: int
    files_written: int
    buffered_bytes: int
    buffered_rows: int
    peak_buffered_bytes: int
    buffers: int
    processed_timetick: int
    lag_ms: int
    """Physical milliseconds between the WAL's last timestamp and the last one processed."""
    checkpoint: Position
    files_quarantined: int = 0
    """Damaged files moved to ``_quarantine/`` (rewritten from the WAL or lost)."""
    files_lost: int = 0
    """Of those, the files whose messages the WAL no longer held: their rows are not in Parquet."""


@dataclass(slots=True)
class _Collection:
    vchannel: str
    name: str
    schema: pa.Schema
    primary_key: str
    dropped: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"vchannel": self.vchannel, "name": self.name, "primary_key": self.primary_key,
                "dropped": self.dropped, "schema": base64.b64encode(self.schema.serialize().to_pybytes()).decode()}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> _Collection:
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(raw["schema"])))
        return cls(raw["vchannel"], raw["name"], schema, raw["primary_key"], bool(raw["dropped"]))


class Flusher:
    """Writes the collections of one pchannel as Parquet under ``root``.  See the module docstring.

    ``stream`` is the pchannel's ``StreamingWAL`` (needed by ``flush``) or a bare ``WAL`` (read only).
    Use one root per pchannel: segment ids are unique only within a pchannel.
    """

    def __init__(self, stream: StreamingWAL | WAL, root: Path | str, config: FlusherConfig | None = None, *,
                 on_damage: Callable[[BaseException], None] | None = None) -> None:
        self._stream = stream if isinstance(stream, StreamingWAL) else None
        self._wal: WAL = stream.wal if isinstance(stream, StreamingWAL) else stream
        self._root = Path(root)
        self._cfg = config or FlusherConfig()
        self._on_damage = on_damage
        """Told when the flusher stops on damaged storage (a CORRUPTED error from its reads of the
        WAL); the node moves the pchannel to FAILED.  Called from the flusher's own tasks: it must
        not wait for this flusher to close (the node schedules the close instead)."""
        self._state = FlusherState.STARTING
        self._collections: dict[tuple[str, str], _Collection] = {}
        self._buffers: dict[str, Buffer] = {}
        self._flushed: dict[str, layout.DeliveryKey] = {}
        self._sealed: set[int] = set()
        self._buffered = 0
        self._peak = 0
        self._position = Position(self._wal.pchannel, self._wal.first_id, 0)
        self._pack_start = self._position
        self._saved: tuple[int, int] | None = None
        self._saved_at = 0.0
        self._registry_dirty = False
        self._wrote = False
        self._processed = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._flush_files: collections.OrderedDict[int, list[str]] = collections.OrderedDict()
        self._current_files: list[str] | None = None
        self._error: BaseException | None = None
        self._scanner: Scanner | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"flusher-{self._wal.pchannel}")
        self._rows_written = 0
        self._delete_rows_written = 0
        self._bytes_written = 0
        self._files_written = 0
        self._quarantined = 0
        self._lost = 0
        self._damaged: list[layout.Damaged] = []  # moved aside at start, rebuilt before reading
        self._unchecked: list[str] = []  # sound footers whose data the check task has still to read
        self._holding = False
        self._checked = asyncio.Event()
        """Set once ``_holding`` ended, or the flusher stopped: on-demand compaction waits for it."""
        self._staging: Path | None = None
        self._check_task: asyncio.Task[None] | None = None
        self._compact_task: asyncio.Task[None] | None = None
        self._compactions = _compact.CompactionTotals()
        self.problems: list[str] = []
        """Damage found that this flusher cannot repair (one human-readable line per finding); the
        node shows it in DescribeChannels."""

    # --- lifecycle -------------------------------------------------------------------------------
    @property
    def state(self) -> FlusherState:
        return self._state

    @property
    def root(self) -> Path:
        return self._root

    @property
    def checkpoint(self) -> Position:
        """The stored checkpoint: every message before its id is in committed files (or needs none),
        so the WAL may be truncated below it (but see ``retained_from``)."""
        if self._saved is None:
            return Position(self._wal.pchannel, self._wal.first_id, 0)
        return Position(self._wal.pchannel, self._saved[0], self._saved[1])

    @property
    def checking(self) -> bool:
        """True until the data of every file committed before the start is checked (and any damaged
        one moved aside and rewritten, or reported in ``problems``)."""
        return self._holding

    @property
    def retained_from(self) -> int:
        """The id below which retention may truncate the WAL for this flusher: the checkpoint's, or
        the first retained id while committed files are being checked or damaged ones rebuilt (a
        damaged file's messages must stay in the WAL until it is written again)."""
        return self._wal.first_id if self._holding else self.checkpoint.message_id

    async def start(self) -> None:
        """Recover from the committed files and the stored checkpoint, then start reading."""
        if self._state is not FlusherState.STARTING:
            raise InvalidArgumentError(f"flusher of {self._wal.pchannel!r} was already started")
        # First fence every older term's writer (commit.open_staging), then list what is committed:
        # a file an older owner renamed before this point is listed and adopted, and none can land after.
        try:
            self._staging = await self._in_thread(open_staging, self._root, self._wal.term)
        except StagingFencedError as exc:
            raise self._fenced(exc) from exc
        removed = await self._in_thread(remove_temporaries, self._root)
        await self._in_thread(self._recover_compactions)
        committed = await _probe.scan(self._root, self._wal.pchannel)
        self._flushed = committed.flushed
        # Directories compacted away still count: their messages are in the compaction outputs.
        for directory, key in (await self._in_thread(layout.compacted_keys, self._root)).items():
            if key > self._flushed.get(directory, _NOTHING):
                self._flushed[directory] = key
        self._unchecked = committed.files
        self._holding = True  # until the data of every file is checked (``_check_files``)
        for d in committed.damaged:
            # Moved aside now, before anything reads the tree: neither this flusher nor a reader
            # sees it again.  Its messages are not in ``_flushed``; the task rebuilds the file
            # before it reads on, so a replay cannot write them a second time.
            await self._move_aside(d)
        self._damaged = committed.damaged
        raw = await self._wal.get_meta(self._cfg.checkpoint_name)
        # Lazy: once caught up the flusher reads by time ticks (every tick interval while data comes
        # in), not after every append; wait_flushed asks for a tick when someone waits on it.
        option = ReadOption(read_batch_bytes=self._cfg.read_batch_bytes, lazy=True)
        saved = json.loads(raw) if raw is not None else None
        if saved is not None and int(saved["message_id"]) < self._wal.first_id:
            # Retention truncated past a checkpoint left while this flusher was off: what lay between
            # is gone from the log.  Start from the first retained message, as without a checkpoint.
            log.warning("flusher checkpoint is below the retained log; messages in between were never "
                        "written to Parquet", pchannel=self._wal.pchannel, checkpoint=int(saved["message_id"]),
                        first_id=self._wal.first_id)
            saved = None
        if saved is not None:
            for c in saved["collections"]:
                coll = _Collection.from_json(c)
                self._collections[(coll.vchannel, coll.name)] = coll
            self._saved = (int(saved["message_id"]), int(saved["timetick"]))
            self._position = self._pack_start = self.checkpoint
            self._processed = self._saved[1]
            option = ReadOption(
                deliver_policy=DeliverPolicy.start_from(self._saved[0]),
                deliver_filters=(DeliverFilter.timetick_gt(self._saved[1]),),
                read_batch_bytes=self._cfg.read_batch_bytes,
                lazy=True,
            )
        else:
            await self._seed_from_snapshot()
        self._scanner = self._wal.read(option)
        self._task = asyncio.get_running_loop().create_task(self._run(self._scanner),
                                                            name=f"flusher-{self._wal.pchannel}")
        self._task.add_done_callback(self._on_done)
        if self._cfg.compaction is not None and self._cfg.compaction_interval_seconds > 0:
            self._compact_task = asyncio.get_running_loop().create_task(
                self._compact_loop(), name=f"flusher-compact-{self._wal.pchannel}")
        self._state = FlusherState.RUNNING
        log.info("flusher started", pchannel=self._wal.pchannel, root=str(self._root), checkpoint=self._saved,
                 committed_dirs=len(self._flushed), removed_temporaries=removed,
                 quarantined=len(committed.damaged))

    async def _seed_from_snapshot(self) -> None:
        """Reading from the first retained message: the collections created before it are known only
        from the recovery snapshot that retention stored with the truncation (the CreateCollection
        messages are gone).

        When the snapshot is above the first retained id (a crash between storing it and truncating),
        drops it records may still be ahead in the log: those collections are seeded live, and the
        DropCollection, when read, marks them dropped as usual.
        """
        if self._wal.first_id == 0:
            return  # nothing was ever truncated: every CreateCollection is in the log
        snapshot = await load_snapshot(self._wal)
        if snapshot is None:
            return
        exact = snapshot.message_id <= self._wal.first_id
        for c in snapshot.steps.get(ShardInterceptor.name, {}).get("collections", []):
            coll = _Collection.from_json(c)
            if not exact:
                coll.dropped = False
            self._collections[(coll.vchannel, coll.name)] = coll
        self._registry_dirty = True

    async def aclose(self) -> None:
        """Stop reading; buffered rows are not written (the checkpoint replays them).  Idempotent."""
        if self._state is FlusherState.CLOSED:
            return
        self._state = FlusherState.DRAINING
        self._checked.set()
        if self._check_task is not None:
            await cancel_and_wait(self._check_task)
        if self._compact_task is not None:
            await cancel_and_wait(self._compact_task)
        if self._task is not None and not self._task.done():
            await cancel_and_wait(self._task)
        # A task that ended by itself was reported by ``_on_done`` (its error fails every waiter):
        # raising it again here would stop the owner closing the rest of the pchannel.
        if self._scanner is not None:
            await self._scanner.aclose()
        self._fail_waiters(OnShutdownError(f"flusher of {self._wal.pchannel!r} is closed", channel=self._wal.pchannel))
        self._executor.shutdown(wait=True)
        self._buffers.clear()
        self._buffered = 0
        self._state = FlusherState.CLOSED

    async def __aenter__(self) -> Flusher:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _on_done(self, task: asyncio.Task[None]) -> None:
        # Nobody may wait forever on a flusher that died: fail every waiter with its error.
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:  # the scanner ended (closed under us)
            exc = OnShutdownError(f"flusher of {self._wal.pchannel!r} stopped reading", channel=self._wal.pchannel)
        elif self._report_damage(exc):
            # The node logs the failure of the pchannel (the one error line); this says who met it.
            log.warning("flusher stopped: the WAL it reads is damaged", pchannel=self._wal.pchannel, error=repr(exc))
        else:
            log.error("flusher stopped", pchannel=self._wal.pchannel, error=repr(exc))
        self._error = exc
        self._checked.set()
        self._fail_waiters(exc)

    def _fenced(self, exc: StagingFencedError) -> ChannelFencedError:
        return ChannelFencedError(
            f"flusher of pchannel {self._wal.pchannel!r} term {self._wal.term} is fenced: a newer term's "
            f"flusher writes its Parquet directory, so nothing more is committed here ({exc})",
            channel=self._wal.pchannel, term=self._wal.term)

    def _report_damage(self, exc: BaseException) -> bool:
        """Hand damaged storage (CORRUPTED) to ``on_damage``; True when it was handed over.  A
        shutdown, a fence or a full disk is not damage: those are the flusher's own to report."""
        if self._on_damage is None or not isinstance(exc, StreamingError) or exc.code is not ErrorCode.CORRUPTED:
            return False
        self._on_damage(exc)
        return True

    def _fail_waiters(self, exc: BaseException) -> None:
        waiters, self._waiters = self._waiters, []
        for _, fut in waiters:
            if not fut.done():
                fut.set_exception(exc)

    async def _in_thread(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run blocking file work on the flusher's own thread; a cancel waits for it to finish, so
        a close never leaves a commit half done behind it."""
        fut = asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(fn, *args))
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            await asyncio.wait([fut])
            raise

    # --- the public API --------------------------------------------------------------------------
    async def wait_flushed(self, timetick: int) -> list[str]:
        """Return once every message with a timestamp <= ``timetick`` is processed (files durable).

        The result lists the files (relative to the root) written for the MANUAL_FLUSH at exactly
        ``timetick``, if there is one.
        """
        if self._error is not None:
            raise self._error
        if self._state in (FlusherState.DRAINING, FlusherState.CLOSED):
            raise OnShutdownError(f"flusher of {self._wal.pchannel!r} is closed", channel=self._wal.pchannel)
        if self._processed < timetick:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append((timetick, fut))
            self._wal.want_tick()  # the reader is lazy: release up to here now, not at the next beat
            await fut
        return self._flush_files.pop(timetick, [])

    async def flush(self, vchannel: str, collection: str | None = None, *, deadline: float | None = None) -> list[str]:
        """Append a MANUAL_FLUSH through the chain and return the files it wrote, once durable."""
        if self._stream is None:
            raise InvalidArgumentError("flush needs the pchannel's StreamingWAL, not a bare WAL")
        result = await self._stream.append(bodies.manual_flush(vchannel, collection), deadline=deadline)
        return await self.wait_flushed(result.timetick)

    def stats(self) -> FlusherStats:
        last = self._wal.last_timetick
        lag = max(0, physical_ms(last) - physical_ms(self._processed)) if last else 0
        return FlusherStats(
            rows_written=self._rows_written, delete_rows_written=self._delete_rows_written,
            bytes_written=self._bytes_written, files_written=self._files_written,
            buffered_bytes=self._buffered, buffered_rows=sum(b.rows for b in self._buffers.values()),
            peak_buffered_bytes=self._peak, buffers=len(self._buffers), processed_timetick=self._processed,
            lag_ms=lag, checkpoint=self.checkpoint, files_quarantined=self._quarantined, files_lost=self._lost,
        )

    # --- the reader loop -------------------------------------------------------------------------
    async def _run(self, scanner: Scanner) -> None:
        await self._repair_overlaps()
        if self._damaged:
            damaged, self._damaged = self._damaged, []
            await self._rebuild(damaged)
        self._check_task = asyncio.get_running_loop().create_task(
            self._check_files(), name=f"flusher-check-{self._wal.pchannel}")
        async for pack in scanner:
            await self._process(pack)

    async def _process(self, pack: MsgPack) -> None:
        # Only the types the flusher acts on, picked in one pass: on a log of plain DATA messages
        # every message would otherwise cost a handler lookup here, on the node's event loop.
        wanted = _WANTED
        msgs = [m for m in pack.messages if m._type in wanted]
        pack.messages.clear()
        commits = {m.txn.txn_id: m.timetick for m in msgs if m.message_type is _MT.COMMIT_TXN and m.txn is not None}
        self._pack_start = pack.start_position
        # Popped one by one so each payload is released as soon as it is handled (or buffered):
        # a pack can be large while catching up, and the memory cap is about what stays.
        msgs.reverse()
        while msgs:
            m = msgs.pop()
            handler = _HANDLERS.get(m.message_type)
            if handler is not None:
                ts = m.timetick if m.txn is None else commits.get(m.txn.txn_id, m.timetick)
                await handler(self, m, ts)
        for b in [b for b in self._buffers.values() if b.late]:
            await self._write(b)
        now = time.monotonic()
        oldest_ms = time.time() * 1000 - self._cfg.max_age_seconds * 1000
        for b in [b for b in self._buffers.values() if b.rows and b.born_ms <= oldest_ms]:
            await self._write(b)
        self._position = pack.end_position
        self._processed = max(self._processed, pack.end_ts)
        await self._maybe_checkpoint(now)
        self._wake(self._processed)

    def _wake(self, processed: int) -> None:
        if not self._waiters:
            return
        keep = []
        for ts, fut in self._waiters:
            if ts <= processed:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((ts, fut))
        self._waiters = keep

    async def _maybe_checkpoint(self, now: float) -> None:
        if self._buffers:
            pos = min((b.resume for b in self._buffers.values()), key=lambda p: (p.message_id, p.timetick))
        else:
            pos = self._position
        target = (pos.message_id, pos.timetick)
        if self._saved is not None and target <= self._saved and not self._registry_dirty:
            return
        if not self._wrote and now - self._saved_at < self._cfg.checkpoint_interval_seconds:
            return
        value = {"version": 1, "message_id": target[0], "timetick": target[1],
                 "collections": [c.to_json() for c in self._collections.values()]}
        await self._wal.put_meta(self._cfg.checkpoint_name, json.dumps(value).encode())
        crash_point("checkpoint")
        self._saved = max(target, self._saved) if self._saved is not None else target
        self._saved_at = now
        self._wrote = False
        self._registry_dirty = False

    # --- message handlers ------------------------------------------------------------------------
    def _live(self, m: Message) -> _Collection | None:
        c = self._collections.get((m.vchannel, m.properties.get(bodies.PROP_COLLECTION, "")))
        return None if c is None or c.dropped else c

    async def _on_create_collection(self, m: Message, ts: int) -> None:
        name = m.properties[bodies.PROP_COLLECTION]
        self._collections[(m.vchannel, name)] = _Collection(
            m.vchannel, name, bodies.read_schema(m), m.properties[bodies.PROP_PRIMARY_KEY])
        self._registry_dirty = True

    async def _on_drop_collection(self, m: Message, ts: int) -> None:
        c = self._live(m)
        if c is None:
            return
        # The shard step sealed the collection's segments just before the drop, so their rows are
        # written already; what can remain are deletes (and rows of transactions after a seal).
        for b in [b for b in self._buffers.values() if b.collection == c.name and m.vchannel in b.vchannels]:
            await self._write(b)
        marker = json.dumps({"collection": c.name, "vchannel": m.vchannel, "timetick": ts,
                             "message_id": m.message_id}).encode()
        def write_marker(f: BinaryIO) -> None:
            f.write(marker)

        await self._commit_when_space(c.name, layout.DROPPED_MARKER, write_marker)
        c.dropped = True
        self._registry_dirty = True
        self._wrote = True

    async def _on_insert(self, m: Message, ts: int) -> None:
        c = self._live(m)
        if c is None:
            return
        directory, segment = insert_destination(m, c.name)
        key = _key(m, ts)
        if key <= self._flushed.get(directory, _NOTHING):
            return  # already in a committed file (a replay after a restart)
        batch = bodies.read_rows(m)
        b = self._buffers.get(directory)
        if b is None:
            b = self._buffers[directory] = Buffer(directory, c.name, c.schema, segment, self._pack_start,
                                                  primary_key=c.primary_key)
        if segment in self._sealed:
            b.late = True
        await self._add(b, batch, ts, key, m)

    async def _on_delete(self, m: Message, ts: int) -> None:
        c = self._live(m)
        if c is not None:
            await self._add_deletes(c, m, ts, lambda: delete_rows(m, c.schema, c.primary_key))

    async def _on_upsert(self, m: Message, ts: int) -> None:
        # The row and the delete entry of its key share the message's (ts, id): by the row rule the
        # delete removes the key's older versions and not this row.  Each half goes to its own
        # directory and is skipped on a replay by that directory's own committed key.
        c = self._live(m)
        if c is None:
            return
        await self._on_insert(m, ts)
        await self._add_deletes(c, m, ts, lambda: upsert_delete_rows(bodies.read_rows(m), c.schema, c.primary_key))

    async def _add_deletes(self, c: _Collection, m: Message, ts: int,
                           entries: Callable[[], tuple[pa.Schema, pa.RecordBatch]]) -> None:
        directory = layout.deletes_dir(c.name)
        key = _key(m, ts)
        if key <= self._flushed.get(directory, _NOTHING):
            return
        schema, batch = entries()
        b = self._buffers.get(directory)
        if b is None:
            b = self._buffers[directory] = Buffer(directory, c.name, schema, None, self._pack_start,
                                                  primary_key=c.primary_key)
        # An upsert's keys are a view of the payload its rows already count.
        await self._add(b, batch, ts, key, m, size=batch.nbytes if m.message_type is _MT.UPSERT else None)

    async def _add(self, b: Buffer, batch: pa.RecordBatch, ts: int, key: layout.DeliveryKey, m: Message, *,
                   size: int | None = None) -> None:
        # The payload stays alive as long as the zero-copy batch does: count whichever is larger.
        size = max(len(m.payload), batch.nbytes) if size is None else size
        b.add(batch, ts, key, m.vchannel, size)
        self._buffered += size
        self._peak = max(self._peak, self._buffered)
        if b.rows >= self._cfg.max_rows or b.nbytes >= self._cfg.max_bytes:
            await self._write(b)
        while self._buffered > self._cfg.memory_cap_bytes and self._buffers:
            await self._write(max(self._buffers.values(), key=lambda x: x.nbytes))

    async def _on_flush(self, m: Message, ts: int) -> None:
        segment = bodies.read_segment(m)
        self._sealed.add(segment)
        directory = layout.segment_dir(m.properties.get(bodies.PROP_COLLECTION, ""),
                                        m.properties.get(bodies.PROP_PARTITION, bodies.DEFAULT_PARTITION), segment)
        b = self._buffers.get(directory)
        if b is not None:
            await self._write(b)

    async def _on_manual_flush(self, m: Message, ts: int) -> None:
        collection = m.properties.get(bodies.PROP_COLLECTION)
        vchannel = m.vchannel
        chosen = [b for b in self._buffers.values()
                  if (collection is None or b.collection == collection)
                  and (vchannel == "" or vchannel in b.vchannels)]
        files: list[str] = []
        self._current_files = files
        try:
            for b in chosen:
                await self._write(b)
        finally:
            self._current_files = None
        self._flush_files[ts] = files
        while len(self._flush_files) > _KEEP_FLUSH_RESULTS:
            self._flush_files.popitem(last=False)

    # --- compaction ------------------------------------------------------------------------------
    def _recover_compactions(self) -> None:
        grace = (self._cfg.compaction or _compact.CompactionConfig()).grace_seconds
        for c in compaction_record.collections(self._root):
            compaction_record.recover(self._root, c, grace)

    async def compact(self, collection: str | None = None, progress: Callable[[str], None] | None = None, *,
                      config: _compact.CompactionConfig | None = None,
                      now_ms: int | None = None) -> list[_compact.CompactionResult]:
        """One compaction pass over ``collection`` (or every collection), on the flusher's own thread,
        so no commit runs meanwhile.  Directories with buffered rows are left alone.  ``config``
        replaces the flusher's compaction settings for this pass; ``now_ms`` the wall clock the
        horizon is counted back from (a model test picks its horizons)."""
        cfg = config or self._cfg.compaction or _compact.CompactionConfig()
        if self._holding:
            # The files committed before the start are still being checked (a damaged one moved aside
            # and rebuilt): a pass deleting one meanwhile would look like damage to the check.
            await self._checked.wait()
            if self._holding:
                raise OnShutdownError(f"flusher of {self._wal.pchannel!r} stopped before its files were checked",
                                      channel=self._wal.pchannel)
        busy = set(self._buffers)  # a buffer opened later holds only messages delivered later
        names = [collection] if collection is not None else \
            await self._in_thread(compaction_record.collections, self._root)
        results = []
        for name in names:
            try:
                r = await self._in_thread(functools.partial(_compact.compact_collection, self._root, name, cfg,
                                                            busy=busy, progress=progress, staging=self._staging,
                                                            now_ms=now_ms))
            except StagingFencedError as exc:
                raise self._fenced(exc) from exc
            except layout.OverlappingRecordError as exc:
                if collection is not None:
                    raise
                # A record older code wrote that could not be repaired (``problems``): this collection
                # waits, the others are compacted.
                log.error("compaction skipped", pchannel=self._wal.pchannel, collection=name,  # noqa: TRY400
                          error=str(exc)[:300])  # the reason is the record, not this stack
                continue
            self._compactions.add(r)
            if r.generation is not None:
                log.info("compacted", pchannel=self._wal.pchannel, collection=name, generation=r.generation,
                         files_before=r.files_before, files_after=r.files_after, bytes_before=r.bytes_before,
                         bytes_after=r.bytes_after, rows_dropped=r.rows_dropped, seconds=round(r.seconds, 3))
            results.append(r)
        return results

    def compaction_stats(self) -> _compact.CompactionTotals:
        """Totals of this flusher's compactions (a copy)."""
        return dataclasses.replace(self._compactions)

    async def _compact_loop(self) -> None:
        while True:
            await asyncio.sleep(self._cfg.compaction_interval_seconds)
            if self._holding or self._state is not FlusherState.RUNNING:
                continue  # files are still being checked (or rebuilt): compaction would race the check
            try:
                await self.compact()
            except (OSError, ValueError, layout.LayoutError, pa.ArrowException) as exc:
                # A failed pass leaves its uncommitted outputs, removed by the next one; the flusher goes on.
                log.error("compaction failed", pchannel=self._wal.pchannel, error=str(exc)[:300])  # noqa: TRY400

    # --- writing ---------------------------------------------------------------------------------
    async def _write(self, b: Buffer) -> None:
        """Commit ``b`` as one file, then forget it.  Returns once the file is durable."""
        if self._buffers.get(b.directory) is not b:
            return
        path = await self._commit_buffer(b)
        name = path.name
        size = path.stat().st_size
        del self._buffers[b.directory]
        self._buffered -= b.nbytes
        self._flushed[b.directory] = b.last_key
        self._wrote = True
        self._files_written += 1
        self._bytes_written += size
        if b.segment is None:
            self._delete_rows_written += b.rows
        else:
            self._rows_written += b.rows
        rel = f"{b.directory}/{name}"
        if self._current_files is not None:
            self._current_files.append(rel)
        log.debug("flusher wrote", pchannel=self._wal.pchannel, file=rel, rows=b.rows, bytes=size)


    async def _commit_buffer(self, b: Buffer) -> Path:
        table = b.to_table(self._wal.pchannel)
        compression = self._cfg.compression

        def write(f: Any) -> None:
            # Page checksums let a check of the data (``layout.check_data``) tell a damaged page.
            pq.write_table(table, f, compression=compression, coerce_timestamps="us",
                           allow_truncated_timestamps=True, write_page_checksum=True)

        return await self._commit_when_space(b.directory, layout.file_name(b.first_id, b.last_id), write)

    async def _commit_when_space(self, directory: str, name: str, write: Callable[[BinaryIO], None]) -> Path:
        """Commit a file; a full disk holds the flusher back instead of stopping it.  A failed commit
        leaves nothing behind and the name is deterministic, so the same file is tried again (backing
        off up to every 5 s) until space returns; the node frees space meanwhile (streamingnode.node.disk_guard)."""
        delay = 0.1
        while True:
            try:
                return await self._in_thread(_commit_under, self._root, directory, name, write, self._staging)
            except StagingFencedError as exc:
                raise self._fenced(exc) from exc
            except OSError as exc:
                if exc.errno not in _FULL_ERRNOS:
                    raise
                log.warning("flusher: the disk is full, the file is written again once space returns",
                            pchannel=self._wal.pchannel, file=f"{directory}/{name}", retry_seconds=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, _FULL_RETRY_MAX_SECONDS)

    # --- records listing a path as input and output (flusher/_overlaps.py) ----------------------
    async def _repair_overlaps(self) -> None:
        """Give each output an older pass named after its input its own name, from the file while it
        is there, else from the WAL; report the ones lost (``problems``)."""
        for o in await self._in_thread(_overlaps.find, self._root):
            log.error("compaction record lists a path as both input and output", pchannel=self._wal.pchannel,
                      collection=o.collection, record=o.record_path, paths=list(o.paths))
            replacements: dict[str, str] = {}
            for rel in o.paths:
                new = _overlaps.renamed(rel, o.record.generation)
                directory, _, name = new.rpartition("/")
                found = await self._in_thread(_overlaps.source, self._root, rel)
                if found is not None:
                    data = await self._in_thread(found.read_bytes)
                    await self._commit_when_space(directory, name, functools.partial(_write_bytes, data))
                    replacements[rel] = new
                    continue
                why = await self._rebuild_lost_output(rel, directory, name)
                if why is None:
                    replacements[rel] = new
                    continue
                self._lost += 1
                line = (f"collection {o.collection!r}: compaction record {o.record_path} lists {rel} as both input "
                        f"and output, and the file is gone; it cannot be rebuilt: {why}.  The collection's "
                        "readers refuse it (reading on would show the rows its delete entries removed)")
                self.problems.append(line)
                log.error("compaction output lost", pchannel=self._wal.pchannel, collection=o.collection,
                          record=o.record_path, file=rel, reason=why)
            if len(replacements) == len(o.paths):
                await self._in_thread(_overlaps.publish, self._root, o, replacements, self._staging)
                log.warning("compaction record repaired", pchannel=self._wal.pchannel, collection=o.collection,
                            record=o.record_path, outputs=sorted(replacements.values()))

    async def _rebuild_lost_output(self, rel: str, directory: str, name: str) -> str | None:
        """Write ``directory/name`` with the messages the name of ``rel`` states, read from the WAL;
        None when done, else why it cannot be."""
        ids = layout.parse_name(rel.rpartition("/")[2])
        if ids is None:
            return "its name states no message ids"
        if ids[0] < self._wal.first_id:
            return (f"its messages {ids[0]}..{ids[1]} are no longer in the WAL (retention truncated it up to "
                    f"{self._wal.first_id})")
        target = _repair.Target(rel.rpartition("/")[0], ids[0], ids[1])
        found = await _repair.rebuild(self._wal, [target], self._collections, self._cfg.read_batch_bytes)
        b = found.get(target)
        if b is None:
            return f"its messages {ids[0]}..{ids[1]} were not found whole in the WAL"
        table = b.to_table(self._wal.pchannel)
        compression = self._cfg.compression

        def write(f: Any) -> None:
            pq.write_table(table, f, compression=compression, coerce_timestamps="us",
                           allow_truncated_timestamps=True, write_page_checksum=True)

        await self._commit_when_space(directory, name, write)
        log.warning("lost compaction output rebuilt from the WAL", pchannel=self._wal.pchannel, file=rel,
                    rebuilt=f"{directory}/{name}", rows=b.rows)
        return None

    # --- damaged files ---------------------------------------------------------------------------
    async def _move_aside(self, d: layout.Damaged) -> None:
        moved = await self._in_thread(layout.quarantine, self._root, d.rel)
        self._quarantined += 1
        log.error("damaged parquet file moved aside", pchannel=self._wal.pchannel, file=d.rel,
                  moved_to=str(moved.relative_to(self._root)), reason=d.reason)

    async def _check_files(self) -> None:
        """Read the data of every file committed before this start (page checksums, statistics);
        a damaged one is moved aside and rebuilt.  Runs beside the reader: those files' messages
        are all at or below ``_flushed``, so the reader never writes them again.  Retention is held
        (``retained_from``) until the last file is checked."""
        try:
            rels, self._unchecked = self._unchecked, []
            async for rel, _, reason in _probe.probe(_probe.DATA, self._root, self._wal.pchannel, rels):
                if reason is not None:
                    d = layout.Damaged(rel, reason)
                    await self._move_aside(d)
                    await self._rebuild([d])
        except (OSError, StreamingError, layout.LayoutError) as exc:
            if self._report_damage(exc):
                # Rebuilding a file read a damaged WAL block: the pchannel fails (the node closes
                # this flusher, so nothing more is checked; the hold on retention stays until then).
                log.warning("flusher stopped checking its files: the WAL it reads is damaged",
                            pchannel=self._wal.pchannel, error=repr(exc))
                return
            log.exception("flusher could not check its files", pchannel=self._wal.pchannel)
            self.problems.append(f"the check of the committed Parquet files stopped: {exc!r:.200}")
        self._holding = False
        self._checked.set()

    async def _rebuild(self, damaged: list[layout.Damaged]) -> None:
        """Write each moved-aside file again from the WAL, or report it lost (``problems``)."""
        first_kept = self._wal.first_id
        targets: dict[_repair.Target, layout.Damaged] = {}
        lost: list[tuple[layout.Damaged, str]] = []
        for d in damaged:
            ids = layout.parse_name(d.name)
            if ids is None:
                lost.append((d, "its name states no message ids"))
            elif min(ids) < first_kept:
                lost.append((d, f"its messages {ids[0]}..{ids[1]} are no longer in the WAL "
                                f"(the first retained is {first_kept})"))
            else:
                targets[_repair.Target(d.directory, ids[0], ids[1])] = d
        if targets:
            found = await _repair.rebuild(self._wal, list(targets), self._collections, self._cfg.read_batch_bytes)
            for target, d in targets.items():
                b = found.get(target)
                if b is None:
                    lost.append((d, f"its messages {target.first_id}..{target.last_id} were not found whole in "
                                    "the WAL"))
                    continue
                path = await self._commit_buffer(b)
                if b.last_key > self._flushed.get(b.directory, _NOTHING):
                    self._flushed[b.directory] = b.last_key
                log.warning("damaged parquet file rewritten from the WAL", pchannel=self._wal.pchannel,
                            file=d.rel, rows=b.rows, bytes=path.stat().st_size)
        for d, why in lost:
            self._lost += 1
            line = (f"Parquet file {d.rel} was damaged ({d.reason[:200]}) and moved to "
                    f"{layout.QUARANTINE_DIR}/; it cannot be rewritten: {why}, so its rows are missing "
                    "from the Parquet output")
            self.problems.append(line)
            log.error("damaged parquet file lost", pchannel=self._wal.pchannel, file=d.rel, reason=why)


_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_FULL_RETRY_MAX_SECONDS = 5.0


def _commit_under(root: Path, directory: str, name: str, write: Callable[[BinaryIO], None],
                  staging: Path | None) -> Path:
    """``commit_file`` into ``root/directory``, a directory derived from collection and partition
    names read back from the log: checked to lie inside ``root`` before anything is written."""
    return commit_file(inside(root, directory), name, write, staging=staging)


def _write_bytes(data: bytes, f: BinaryIO) -> None:
    f.write(data)


def _key(m: Message, ts: int) -> layout.DeliveryKey:
    mid = m.message_id
    assert mid is not None  # read from the WAL
    return ts, mid


_NOTHING: layout.DeliveryKey = (-1, -1)
_Handler = Callable[[Flusher, Message, int], Awaitable[None]]
_HANDLERS: dict[MessageType, _Handler] = {
    _MT.CREATE_COLLECTION: Flusher._on_create_collection,
    _MT.DROP_COLLECTION: Flusher._on_drop_collection,
    _MT.INSERT: Flusher._on_insert,
    _MT.DELETE: Flusher._on_delete,
    _MT.UPSERT: Flusher._on_upsert,
    _MT.FLUSH: Flusher._on_flush,
    _MT.MANUAL_FLUSH: Flusher._on_manual_flush,
}

_WANTED = frozenset({*_HANDLERS, _MT.COMMIT_TXN})

__all__ = ["CHECKPOINT_META", "Flusher", "FlusherConfig", "FlusherState", "FlusherStats"]
