"""The WAL of one pchannel: append, read, truncate, close.

A ``WAL`` is a handle opened by ``WALManager.open`` with a fresh term.  Opening the same pchannel
again fences this handle: its appends fail with CHANNEL_FENCED and nothing it sends is written.
Appends go through the manager's group committer; reads are Scanners that catch up from storage
and then tail this WAL's in-memory buffer.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from wal._codec import BLOCK_HEADER_SIZE, block_checksum_ok, decode_block
from wal._committer import GroupCommitter, fenced_error
from wal._record import MAX_TIMETICK, PLAIN_PAYLOAD_BYTES, PLAIN_VCHANNEL_CHARS, check_encodable
from wal._tail import StoredBlocks, TailBuffer
from wal.backend import Backend, ChannelInfo
from wal.errors import (
    ChannelNotExistError,
    CodecError,
    CorruptedError,
    InvalidArgumentError,
    OnShutdownError,
    OutOfRangeError,
    StreamingError,
)
from wal.message import AppendResult, Message, MessageID, MessageType
from wal.options import ReadOption

_new_tuple = tuple.__new__

COMMIT_OVERHEAD = 64
"""Bytes a message counts for in a commit beyond its payload (its id, tick, vchannel and framing, by a
fixed estimate): what max_commit_bytes and a produce stream's pending bytes are weighed in."""

if TYPE_CHECKING:
    from wal.manager import WALManager
    from wal.scanner import Scanner


class WALState(enum.Enum):
    RUNNING = "running"
    FENCED = "fenced"
    CLOSING = "closing"
    CLOSED = "closed"
    DESTROYED = "destroyed"


StoredBlock = tuple[MessageID, bytes, bool]
"""A stored block as ``WAL.read_blocks`` returns it: (id of its first message, the block as stored,
whether its checksum was already verified)."""


def _read_checked(
    backend: Backend, channel_key: int, from_id: MessageID, max_bytes: int
) -> list[StoredBlock]:
    """Read blocks and verify their checksums, both on the reader thread: zlib releases the GIL, so
    the CRC (about a fifth of a catch-up read) runs beside the event loop's decoding."""
    return [(first, block, block_checksum_ok(block)) for first, block in
            backend.read_blocks(channel_key, from_id, max_bytes)]


class WAL:
    """One pchannel's log.  Create through ``WALManager.open``; close with ``aclose``."""

    def __init__(self, manager: WALManager, info: ChannelInfo, committer: GroupCommitter) -> None:
        self._manager = manager
        self._committer = committer
        self.pchannel = info.name
        self.term = info.term
        self._channel_key = info.key
        self._first_id = info.first_id
        self._next_id = info.next_id  # one past the last committed (acknowledged) id
        self._next_alloc = info.next_id  # one past the last id handed to a write
        self._last_timetick = info.last_timetick
        self._written_max_ts = info.last_timetick  # maintained by the committer's writes
        self._state = WALState.RUNNING
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._tail = TailBuffer(manager.tail_buffer_bytes, info.next_id)
        # Readers behind the tail share what is decoded from storage: a quarter of the tail's budget.
        self._stored = StoredBlocks(manager.tail_buffer_bytes // 4)
        self._changed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # The latest not-persisted TimeTick and the id it follows: tailing scanners that have read
        # everything below that id may release by it (it was made once every earlier append was acked).
        self._volatile_tick: tuple[MessageID, Message] | None = None
        self.committed_bytes = 0
        """Bytes committed since this WAL opened (payloads and COMMIT_OVERHEAD per message): what the
        delivery budget weighs its own bytes against (streamingnode.server.fanout)."""
        # Open scanners, for metrics read at scrape time (weak: one dropped without aclose goes away).
        self.scanners: weakref.WeakSet[Scanner] = weakref.WeakSet()
        # Lazy scanners (ReadOption.lazy) wait on this one: resolved like _changed except by commits
        # that hold no TimeTick, so a caught-up lazy reader is not woken for data it cannot release yet.
        self._ticked: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._prompt_readers = 0
        self.tick_wanted: Callable[[], object] | None = None
        """Set by whoever emits TimeTicks (the timetick step): called when a reader needs a tick now,
        although no append asked for one (a prompt reader opened, a lazy one waits for a position)."""

    # --- state -----------------------------------------------------------------------------------
    @property
    def state(self) -> WALState:
        return self._state

    @property
    def first_id(self) -> MessageID:
        """The first retained id (equal to ``next_id`` when the log is empty)."""
        return self._first_id

    @property
    def next_id(self) -> MessageID:
        """The id the next acknowledged message will have."""
        return self._next_id

    @property
    def last_id(self) -> MessageID | None:
        return self._next_id - 1 if self._next_id > self._first_id else None

    @property
    def last_timetick(self) -> int:
        """The largest timestamp among acknowledged messages (recovered on reopen)."""
        return self._last_timetick

    def _write_refusal(self) -> StreamingError | None:
        """Why a write must not happen now, or None."""
        state = self._state
        if state is WALState.RUNNING or state is WALState.CLOSING:
            return None
        if state is WALState.FENCED:
            return fenced_error(self)
        if state is WALState.DESTROYED:
            return ChannelNotExistError(f"pchannel {self.pchannel!r} was destroyed", channel=self.pchannel)
        return OnShutdownError(f"WAL of pchannel {self.pchannel!r} is closed", channel=self.pchannel)

    def _read_refusal(self) -> StreamingError | None:
        if self._state is WALState.DESTROYED:
            return ChannelNotExistError(f"pchannel {self.pchannel!r} was destroyed", channel=self.pchannel)
        if self._state is WALState.CLOSED:
            return OnShutdownError(f"WAL of pchannel {self.pchannel!r} is closed", channel=self.pchannel)
        return None

    # --- append ----------------------------------------------------------------------------------
    async def append(self, message: Message) -> AppendResult:
        """Append one message; returns once it is durable.  See ``append_batch``."""
        return (await self.append_batch((message,)))[0]

    async def append_batch(self, messages: Sequence[Message]) -> list[AppendResult]:
        """Append messages atomically and in order; return once they are durable.

        All or nothing: on error no message of the batch is stored and none has an id.  The messages
        become immutable (they get their ids) when the call succeeds.
        """
        if self._state is not WALState.RUNNING:
            err = self._write_refusal() or OnShutdownError(
                f"WAL of pchannel {self.pchannel!r} is closing", channel=self.pchannel
            )
            raise err
        batch = list(messages)
        if not batch:
            return []
        nbytes = 0
        txns = False  # any message of a transaction (such a message always takes the full check below)
        for m in batch:
            if not isinstance(m, Message):
                raise InvalidArgumentError(f"expected Message, got {type(m).__name__}")
            if m._id is not None:
                raise InvalidArgumentError(f"message {m._id} was already appended", message_id=m._id)
            if m._not_persisted:
                raise InvalidArgumentError("a not-persisted message cannot be appended to storage")
            size = len(m._payload)
            # Here, not in the group commit: a message the block's fixed-width fields cannot hold would
            # fail the shared write of every pchannel in it.  The test is _record.needs_width_check's,
            # inlined (this loop runs per message); only a message it picks gets the full check.
            if (m._properties or m._txn is not None or len(m._vchannel) > PLAIN_VCHANNEL_CHARS
                    or size > PLAIN_PAYLOAD_BYTES or not 0 <= m._timetick <= MAX_TIMETICK):
                check_encodable(m, f"messages[{next(i for i, x in enumerate(batch) if x is m)}]")
                if m._txn is not None:
                    txns = True
            nbytes += size + COMMIT_OVERHEAD
        self._inflight += 1
        self._idle.clear()
        try:
            await self._committer.submit(self, batch, nbytes)
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()
        if txns:  # known from the loop above: no second pass (a generator) over the batch
            return [AppendResult(m._id, m._timetick, m._txn.txn_id if m._txn else None) for m in batch]  # type: ignore[arg-type]
        # The usual batch: the results are built by map in C, not by the named tuple's Python __new__
        # once per message (about half the cost at 1,000 messages).
        return list(map(_new_tuple, itertools.repeat(AppendResult),
                        zip([m._id for m in batch], [m._timetick for m in batch], itertools.repeat(None))))

    def _on_committed(
        self, first_id: MessageID, messages: list[Message], nbytes: int, max_timetick: int, ticked: bool = True
    ) -> None:
        """Called by the committer, on the loop, after a durable write of consecutive ids (``ticked``:
        they include a TimeTick)."""
        self._next_id = first_id + len(messages)
        self._last_timetick = max(self._last_timetick, max_timetick)
        self.committed_bytes += nbytes
        self._tail.extend(first_id, messages, nbytes)
        self._notify(ticked)

    def deliver_unpersisted(self, tick: Message) -> None:
        """Hand a not-persisted TimeTick to tailing scanners without writing it.

        The caller guarantees that every message with a smaller timestamp is already acknowledged.
        """
        if not tick.not_persisted or tick.message_type is not MessageType.TIME_TICK:
            raise InvalidArgumentError("only not-persisted TimeTick messages can be delivered unpersisted")
        self._volatile_tick = (self._next_id, tick)
        self._notify()

    async def put_meta(self, name: str, value: bytes) -> None:
        """Durably store a small named value for this pchannel (synced before returning)."""
        if self._state is not WALState.RUNNING:
            raise self._write_refusal() or OnShutdownError("WAL is closing", channel=self.pchannel)
        await self._manager._run_write(self._manager.backend.put_meta, self._channel_key, name, value)

    async def get_meta(self, name: str) -> bytes | None:
        return await self._manager._run_read(self._manager.backend.get_meta, self._channel_key, name)

    def _notify(self, ticked: bool = True) -> None:
        fut = self._changed
        self._changed = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        if ticked:
            fut = self._ticked
            self._ticked = asyncio.get_running_loop().create_future()
            fut.set_result(None)

    async def _wait_change(self, lazy: bool = False) -> None:
        """Wait until something is committed or the state changes (no polling); ``lazy``: until a
        TimeTick is committed or delivered, or the state changes."""
        await asyncio.shield(self._ticked if lazy else self._changed)

    # --- who needs ticks -------------------------------------------------------------------------
    @property
    def prompt_readers(self) -> int:
        """Open scanners that are not lazy: while there are none, no tick is needed after an append."""
        return self._prompt_readers

    def want_tick(self) -> None:
        """Ask for a TimeTick now (see ``tick_wanted``); a no-op when nothing emits ticks."""
        if self.tick_wanted is not None:
            self.tick_wanted()

    def _reader_opened(self, lazy: bool) -> None:
        if not lazy:
            self._prompt_readers += 1
            # What was appended while no prompt reader was open got no tick of its own.
            self.want_tick()

    def _reader_closed(self, lazy: bool) -> None:
        if not lazy:
            self._prompt_readers -= 1

    # --- read ------------------------------------------------------------------------------------
    def read(self, option: ReadOption | None = None) -> Scanner:
        """A Scanner over this pchannel; iterate it with ``async for`` and close it with ``aclose``."""
        from wal.scanner import Scanner  # noqa: PLC0415  (the scanner module imports this one)

        err = self._read_refusal()
        if err is not None:
            raise err
        scanner = Scanner(self, option or ReadOption())
        self.scanners.add(scanner)
        self._reader_opened(scanner.lazy)
        return scanner

    async def _read_storage(self, from_id: MessageID, max_bytes: int) -> list[StoredBlock]:
        """Stored blocks from ``from_id``: (first id, block, whether its checksum was verified)."""
        err = self._read_refusal()
        if err is not None:
            raise err
        if from_id < self._first_id:
            raise OutOfRangeError(
                f"message {from_id} of pchannel {self.pchannel!r} was truncated; first is {self._first_id}",
                channel=self.pchannel, message_id=from_id,
            )
        return await self._manager._run_read(_read_checked, self._manager.backend, self._channel_key, from_id,
                                             max_bytes)

    # --- raw stored blocks: replaying the log without a Scanner (recovery snapshots) -----------------
    # A Scanner reorders and filters; a replay that rebuilds state (interceptors.recovery.snapshot) wants
    # every message in id order and chooses where each step runs: the read in the WAL's reader pool, the
    # decode in a worker thread.  These three methods are that seam.
    @property
    def cached_from(self) -> MessageID:
        """The lowest id still held in memory (the tail): ``read_cached`` answers from here to
        ``next_id``.  A replay that wants to take messages as they are keeps its position above it."""
        return self._tail.base

    def read_cached(self, from_id: MessageID, limit: int) -> list[Message] | None:
        """Up to ``limit`` acknowledged messages from ``from_id`` still held in memory (the WAL's tail),
        in id order, without I/O: a new list of the stored (immutable) messages; ``[]`` when none is
        written yet at ``from_id``; None when ``from_id`` is no longer in memory (read the blocks)."""
        return self._tail.read(from_id, limit)

    async def read_blocks(self, from_id: MessageID, max_bytes: int) -> list[StoredBlock]:
        """The stored blocks from the one holding ``from_id`` on, about ``max_bytes`` of them, undecoded,
        read in the WAL's reader pool.  Decode them with ``decode_blocks(from_id, blocks)``.

        Raises OutOfRangeError when ``from_id`` was truncated, and the WAL's refusal when it is closed
        or failed.  An empty list means nothing is stored from ``from_id``."""
        return await self._read_storage(from_id, max_bytes)

    def decode_blocks(self, from_id: MessageID, blocks: list[StoredBlock]) -> list[Message]:
        """The acknowledged messages of ``blocks`` (as returned by ``read_blocks(from_id, ...)``) from
        ``from_id`` on, in id order, immutable.  Pure CPU and thread-safe: may run in a worker thread.

        A damaged block ends the list when messages precede it, and raises CorruptedError (naming the
        block's id and the pchannel) when it is the first."""
        return self._decode_stored(from_id, blocks)

    async def read_stored(self, nid: MessageID, max_bytes: int = 1 << 20) -> list[Message]:
        """Stored messages from ``nid`` in id order (no reordering, no filtering), about ``max_bytes``.

        Only acknowledged messages are returned.  Messages before a damaged block are returned
        first; the read that starts at the damaged block raises CorruptedError.
        """
        return self._decode_stored(nid, await self._read_storage(nid, max_bytes))

    def _decode_stored(
        self, nid: MessageID, blocks: list[StoredBlock], marks: list[int] | None = None
    ) -> list[Message]:
        """Decode blocks read from ``nid`` (see ``read_stored``; ``marks`` as in ``decode_block``)."""
        start = nid
        limit = self.next_id  # never hand out what is written but not yet acknowledged
        out: list[Message] = []
        for first_id, block, verified in blocks:
            if first_id > nid:
                if out:
                    # A hole after what was decoded (a replicated log that lost messages): hand out what
                    # precedes it; the next read starts at the hole and fails below, naming it.  Going on
                    # would hand out what follows as if nothing were missing.
                    break
                raise OutOfRangeError(
                    f"message {nid} of pchannel {self.pchannel!r} was truncated while reading",
                    channel=self.pchannel, message_id=nid,
                )
            try:
                msgs = self._decode_block(block, first_id, nid, marks, mark_base=len(out), verified=verified)
            except CodecError as exc:
                if out:
                    break  # hand out what precedes the damage; the next read starts at it and fails
                raise CorruptedError(
                    f"stored block at id {first_id} of pchannel {self.pchannel!r} is damaged: {exc}",
                    channel=self.pchannel, message_id=first_id, path=self._manager.backend.path,
                ) from exc
            out.extend(msgs)
            nid = first_id + len(msgs) if first_id >= nid else nid + len(msgs)
        del out[max(limit - (out[0]._id if out else limit), 0):]  # type: ignore[operator]
        if not out:
            raise CorruptedError(
                f"pchannel {self.pchannel!r} has no stored message {start} below {limit}",
                channel=self.pchannel, message_id=start,
            )
        return out

    async def _seek_time(self, ts: int) -> MessageID:
        entry = await self._manager._run_read(self._manager.backend.seek_time, self._channel_key, ts)
        if entry is None:
            return self._first_id
        return max(min(entry.resume_id, entry.message_id), self._first_id)

    async def seek_time(self, timetick: int) -> MessageID:
        """An id from which a reader finds every retained message with a timestamp above ``timetick``:
        the resume id of the last persisted TimeTick at or before it (the first retained id if none)."""
        return await self._seek_time(timetick)

    # --- maintenance -----------------------------------------------------------------------------
    async def block_start(self, message_id: MessageID) -> MessageID:
        """The first id of the stored block holding ``message_id`` (which must be retained).

        ``truncate`` drops whole blocks, so truncating before this id leaves it as the first id exactly.
        """
        blocks = await self._read_storage(message_id, 1)
        return blocks[0][0] if blocks else message_id

    def _decode_block(self, block: bytes, first_id: MessageID, start: MessageID, marks: list[int] | None, *,
                      mark_base: int, verified: bool) -> list[Message]:
        """``decode_block(block, first_id, start, marks=marks, mark_base=mark_base)``, through the cache
        of blocks decoded from storage (``StoredBlocks``) when it is on."""
        if self._stored.max_bytes <= 0 or len(block) < BLOCK_HEADER_SIZE:
            return decode_block(block, first_id, start, marks=marks, mark_base=mark_base, checksum_verified=verified)
        every, every_mark = self._stored.decoded(
            block, first_id, block[:BLOCK_HEADER_SIZE],
            lambda m: decode_block(block, first_id, None, marks=m, checksum_verified=verified))
        skip = 0 if start <= first_id else min(start - first_id, len(every))
        out = every[skip:]
        if marks is not None and out:
            # As decode_block marks a read from ``start``: its first message, then the block's own marks
            # after it (a mark depends only on the message and its predecessor, the same in both).
            marks.append(mark_base)
            marks.extend(mark_base + k - skip for k in every_mark if k > skip)
        return out

    async def truncate(self, before_id: MessageID) -> MessageID:
        """Drop stored messages with ids < ``before_id`` (whole blocks); return the new first id."""
        if before_id > self._next_id:
            raise OutOfRangeError(
                f"cannot truncate pchannel {self.pchannel!r} before {before_id}: last id is {self.last_id}",
                channel=self.pchannel, message_id=before_id,
            )
        if self._state is not WALState.RUNNING:
            raise self._write_refusal() or OnShutdownError("WAL is closing", channel=self.pchannel)
        first = await self._manager._run_write(self._manager.backend.truncate, self._channel_key, before_id)
        self._first_id = max(self._first_id, min(first, self._next_id))
        return self._first_id

    async def aclose(self) -> None:
        """Stop accepting appends, wait for those in flight, then close.  Idempotent."""
        if self._state is WALState.RUNNING:
            self._state = WALState.CLOSING
        await self._idle.wait()
        if self._state is not WALState.DESTROYED:
            self._state = WALState.CLOSED
        self._manager._forget(self)
        self._notify()

    def _fence(self) -> None:
        if self._state is WALState.RUNNING:
            self._state = WALState.FENCED
            self._notify()

    def _destroyed(self) -> None:
        self._state = WALState.DESTROYED
        self._notify()

    def __repr__(self) -> str:
        return f"WAL({self.pchannel!r}, term={self.term}, ids=[{self._first_id}, {self._next_id}), {self._state.value})"
