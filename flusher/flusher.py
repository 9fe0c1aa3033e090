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
import collections
import enum
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import structlog

from flusher import _probe, layout
from flusher._buffers import Buffer, delete_rows, insert_destination, upsert_delete_rows
from flusher.checkpoint import Checkpoint, CollectionEntry, Registry
from flusher.compact import CompactionResult, CompactionTotals
from flusher.compaction_config import CompactionConfig
from flusher.compactor import Compactor
from flusher.config import FlusherConfig
from flusher.damage import NOTHING, DamageRepair
from flusher.writer import FileWriter
from interceptors.recovery.streaming_wal import StreamingWAL
from wal import bodies
from wal.clock import physical_ms
from wal.errors import ErrorCode, InvalidArgumentError, OnShutdownError, StreamingError
from wal.message import Message, MessageType, Position, of_types
from wal.options import ReadOption
from wal.resume import resume_after
from wal.scanner import MsgPack, Scanner
from wal.tasks import cancel_and_wait
from wal.wal import WAL

log = structlog.get_logger(__name__)

_KEEP_FLUSH_RESULTS = 1024
_MT = MessageType


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
        self._collections: Registry = {}
        self._buffers: dict[str, Buffer] = {}
        self._flushed: dict[str, layout.DeliveryKey] = {}
        self._sealed: set[int] = set()
        self._buffered = 0
        self._peak = 0
        self._position = Position(self._wal.pchannel, self._wal.first_id, 0)
        self._pack_start = self._position
        self._checkpoint = Checkpoint(self._wal, self._cfg.checkpoint_name, self._cfg.checkpoint_interval_seconds,
                                      self._collections)
        self._processed = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._flush_files: collections.OrderedDict[int, list[str]] = collections.OrderedDict()
        self._current_files: list[str] | None = None
        self._error: BaseException | None = None
        self._scanner: Scanner | None = None
        self._task: asyncio.Task[None] | None = None
        self._files = FileWriter(self._root, self._wal.pchannel, self._wal.term, self._cfg.compression)
        self._rows_written = 0
        self._delete_rows_written = 0
        self._bytes_written = 0
        self._files_written = 0
        self._damage = DamageRepair(self._wal, self._files, self._root, collections=self._collections,
                                    flushed=self._flushed, read_batch_bytes=self._cfg.read_batch_bytes)
        self._damaged: list[layout.Damaged] = []  # moved aside at start, rebuilt before reading
        self._unchecked: list[str] = []  # sound footers whose data the check task has still to read
        self._holding = False
        self._checked = asyncio.Event()
        """Set once ``_holding`` ended, or the flusher stopped: on-demand compaction waits for it."""
        self._check_task: asyncio.Task[None] | None = None
        self._compact_task: asyncio.Task[None] | None = None
        self._handlers: dict[MessageType, Callable[[Message, int], Awaitable[None]]] = {
            _MT.CREATE_COLLECTION: self._on_create_collection,
            _MT.DROP_COLLECTION: self._on_drop_collection,
            _MT.INSERT: self._on_insert,
            _MT.DELETE: self._on_delete,
            _MT.UPSERT: self._on_upsert,
            _MT.FLUSH: self._on_flush,
            _MT.MANUAL_FLUSH: self._on_manual_flush,
        }
        self._wanted = frozenset({*self._handlers, _MT.COMMIT_TXN})
        """The types the flusher acts on (a commit gives its transaction's rows their timestamp)."""
        self._compactor = Compactor(self._root, self._wal.pchannel, self._files, self._cfg.compaction)

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
        return self._checkpoint.position

    @property
    def problems(self) -> list[str]:
        """Damage found that this flusher cannot repair (one human-readable line per finding); the
        node shows it in DescribeChannels."""
        return self._damage.problems

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
        removed = await self._files.open()
        await self._files.in_thread(self._compactor.recover)
        committed = await _probe.scan(self._root, self._wal.pchannel)
        self._flushed.update(committed.flushed)  # in place: the repairs raise it too
        # Directories compacted away still count: their messages are in the compaction outputs.
        for directory, key in (await self._files.in_thread(layout.compacted_keys, self._root)).items():
            if key > self._flushed.get(directory, NOTHING):
                self._flushed[directory] = key
        self._unchecked = committed.files
        self._holding = True  # until the data of every file is checked (``_check_files``)
        for d in committed.damaged:
            # Moved aside now, before anything reads the tree: neither this flusher nor a reader
            # sees it again.  Its messages are not in ``_flushed``; the task rebuilds the file
            # before it reads on, so a replay cannot write them a second time.
            await self._damage.move_aside(d)
        self._damaged = committed.damaged
        # Lazy: once caught up the flusher reads by time ticks (every tick interval while data comes
        # in), not after every append; wait_flushed asks for a tick when someone waits on it.
        option = ReadOption(read_batch_bytes=self._cfg.read_batch_bytes, lazy=True)
        if await self._checkpoint.load():
            self._position = self._pack_start = self.checkpoint
            self._processed = self.checkpoint.timetick
            policy, filters = resume_after(self.checkpoint.message_id, self.checkpoint.timetick)
            option = ReadOption(
                deliver_policy=policy,
                deliver_filters=filters,
                read_batch_bytes=self._cfg.read_batch_bytes,
                lazy=True,
            )
        self._scanner = self._wal.read(option)
        self._task = asyncio.get_running_loop().create_task(self._run(self._scanner),
                                                            name=f"flusher-{self._wal.pchannel}")
        self._task.add_done_callback(self._on_done)
        if self._cfg.compaction is not None and self._cfg.compaction_interval_seconds > 0:
            self._compact_task = asyncio.get_running_loop().create_task(
                self._compact_loop(), name=f"flusher-compact-{self._wal.pchannel}")
        self._state = FlusherState.RUNNING
        log.info("flusher started", pchannel=self._wal.pchannel, root=str(self._root),
                 checkpoint=self._checkpoint.saved, committed_dirs=len(self._flushed), removed_temporaries=removed,
                 quarantined=len(committed.damaged))

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
        self._files.shutdown()
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
            lag_ms=lag, checkpoint=self.checkpoint, files_quarantined=self._damage.quarantined,
            files_lost=self._damage.lost,
        )

    # --- the reader loop -------------------------------------------------------------------------
    async def _run(self, scanner: Scanner) -> None:
        await self._damage.repair_overlaps()
        if self._damaged:
            damaged, self._damaged = self._damaged, []
            await self._damage.rebuild(damaged)
        self._check_task = asyncio.get_running_loop().create_task(
            self._check_files(), name=f"flusher-check-{self._wal.pchannel}")
        async for pack in scanner:
            await self._process(pack)

    async def _process(self, pack: MsgPack) -> None:
        # Only the types the flusher acts on, picked in one pass: on a log of plain DATA messages
        # every message would otherwise cost a handler lookup here, on the node's event loop.
        msgs = of_types(pack.messages, self._wanted)
        pack.messages.clear()
        commits = {m.txn.txn_id: m.timetick for m in msgs if m.message_type is _MT.COMMIT_TXN and m.txn is not None}
        self._pack_start = pack.start_position
        # Popped one by one so each payload is released as soon as it is handled (or buffered):
        # a pack can be large while catching up, and the memory cap is about what stays.
        msgs.reverse()
        while msgs:
            m = msgs.pop()
            handler = self._handlers.get(m.message_type)
            if handler is not None:
                ts = m.timetick if m.txn is None else commits.get(m.txn.txn_id, m.timetick)
                await handler(m, ts)
        for b in [b for b in self._buffers.values() if b.late]:
            await self._write(b)
        now = time.monotonic()
        oldest_ms = time.time() * 1000 - self._cfg.max_age_seconds * 1000
        for b in [b for b in self._buffers.values() if b.rows and b.born_ms <= oldest_ms]:
            await self._write(b)
        self._position = pack.end_position
        self._processed = max(self._processed, pack.end_ts)
        await self._checkpoint.maybe_store(now, self._resume_position())
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

    def _resume_position(self) -> Position:
        """Where a restart must read from: the start of the oldest pack holding a buffered message."""
        if self._buffers:
            return min((b.resume for b in self._buffers.values()), key=lambda p: (p.message_id, p.timetick))
        return self._position

    # --- message handlers ------------------------------------------------------------------------
    def _live(self, m: Message) -> CollectionEntry | None:
        c = self._collections.get((m.vchannel, m.properties.get(bodies.PROP_COLLECTION, "")))
        return None if c is None or c.dropped else c

    async def _on_create_collection(self, m: Message, ts: int) -> None:
        name = m.properties[bodies.PROP_COLLECTION]
        self._collections[(m.vchannel, name)] = CollectionEntry(
            m.vchannel, name, bodies.read_schema(m), m.properties[bodies.PROP_PRIMARY_KEY])
        self._checkpoint.registry_changed()

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

        await self._files.commit_when_space(c.name, layout.DROPPED_MARKER, write_marker)
        c.dropped = True
        self._checkpoint.registry_changed()
        self._checkpoint.file_written()

    async def _on_insert(self, m: Message, ts: int) -> None:
        c = self._live(m)
        if c is None:
            return
        directory, segment = insert_destination(m, c.name)
        key = _key(m, ts)
        if key <= self._flushed.get(directory, NOTHING):
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

    async def _add_deletes(self, c: CollectionEntry, m: Message, ts: int,
                           entries: Callable[[], tuple[pa.Schema, pa.RecordBatch]]) -> None:
        directory = layout.deletes_dir(c.name)
        key = _key(m, ts)
        if key <= self._flushed.get(directory, NOTHING):
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

    # --- compaction (flusher/compactor.py) ------------------------------------------------------
    async def compact(self, collection: str | None = None, progress: Callable[[str], None] | None = None, *,
                      config: CompactionConfig | None = None, now_ms: int | None = None) -> list[CompactionResult]:
        """One compaction pass over ``collection`` (or every collection), on the flusher's own thread,
        so no commit runs meanwhile.  Directories with buffered rows are left alone.  ``config``
        replaces the flusher's compaction settings for this pass; ``now_ms`` the wall clock the
        horizon is counted back from (a model test picks its horizons)."""
        if self._holding:
            # The files committed before the start are still being checked (a damaged one moved aside
            # and rebuilt): a pass deleting one meanwhile would look like damage to the check.
            await self._checked.wait()
            if self._holding:
                raise OnShutdownError(f"flusher of {self._wal.pchannel!r} stopped before its files were checked",
                                      channel=self._wal.pchannel)
        busy = set(self._buffers)  # a buffer opened later holds only messages delivered later
        return await self._compactor.run(collection, busy, progress, config=config, now_ms=now_ms)

    def compaction_stats(self) -> CompactionTotals:
        """Totals of this flusher's compactions (a copy)."""
        return self._compactor.totals()

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
        path = await self._files.commit_buffer(b)
        name = path.name
        size = path.stat().st_size
        del self._buffers[b.directory]
        self._buffered -= b.nbytes
        self._flushed[b.directory] = b.last_key
        self._checkpoint.file_written()
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


    # --- damaged files (flusher/damage.py) ------------------------------------------------------
    async def _check_files(self) -> None:
        """Read the data of every file committed before this start (page checksums, statistics);
        a damaged one is moved aside and rebuilt.  Runs beside the reader: those files' messages
        are all at or below ``_flushed``, so the reader never writes them again.  Retention is held
        (``retained_from``) until the last file is checked."""
        try:
            rels, self._unchecked = self._unchecked, []
            await self._damage.check(rels)
        except (OSError, StreamingError, layout.LayoutError) as exc:
            if self._report_damage(exc):
                # Rebuilding a file read a damaged WAL block: the pchannel fails (the node closes
                # this flusher, so nothing more is checked; the hold on retention stays until then).
                log.warning("flusher stopped checking its files: the WAL it reads is damaged",
                            pchannel=self._wal.pchannel, error=repr(exc))
                return
            log.exception("flusher could not check its files", pchannel=self._wal.pchannel)
            self._damage.problems.append(f"the check of the committed Parquet files stopped: {exc!r:.200}")
        self._holding = False
        self._checked.set()


def _key(m: Message, ts: int) -> layout.DeliveryKey:
    mid = m.message_id
    assert mid is not None  # read from the WAL
    return ts, mid


__all__ = ["Flusher", "FlusherState", "FlusherStats"]
