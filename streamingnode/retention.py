"""WAL retention of one pchannel: truncate what nobody needs any more, keeping recovery whole.

The rules are stated once, in ``flusher/README.md`` ("Retention (truncating the WAL)"): which bounds
hold the cut, how it is rounded to a block and moved below a spanning transaction, the two steps
(``snapshot`` into ``interceptors.snapshot``, then ``truncate``), what a crash between them leaves,
and what a reader of a truncated id gets (``OutOfRangeError``).  This module implements them, one
``ChannelRetention`` task per pchannel.  Crash tests set ``STREAMINGNODE_RETENTION_KILL_AT``
(``KILL_ENV``) to stop the process after a step.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from flusher.flusher import Flusher
from interceptors.snapshot import ShadowReplay, load_snapshot, store_snapshot
from interceptors.streaming import StreamingWAL, default_interceptors
from streamingnode.groups import ConsumerGroups
from wal.clock import compose
from wal.crashpoints import CrashPoints
from wal.errors import InvalidArgumentError, StreamingError
from wal.lifecycle import cancel_and_wait
from wal.message import MessageID
from wal.wal import WALState

log = structlog.get_logger(__name__)

KILL_ENV = "STREAMINGNODE_RETENTION_KILL_AT"
STEPS = ("snapshot", "truncate")
# A cut moves down while a transaction spans it; each try replays from the snapshot again.  Nested
# transactions that long-lived are rare: give up for this check rather than replay without end.
_MAX_CUT_TRIES = 8


crash_point = CrashPoints(KILL_ENV, STEPS)
"""Called after the snapshot and the truncate steps (see ``wal.crashpoints``)."""


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    retention_seconds: float = 86400.0
    """Keep messages at least this long.  0: no time floor (truncate as soon as the flusher, the
    groups and the transactions allow); negative: keep everything (no retention task runs)."""
    check_seconds: float = 60.0
    """How often the bounds are checked."""

    def __post_init__(self) -> None:
        if not self.check_seconds > 0:
            raise InvalidArgumentError(f"retention check_seconds must be > 0, got {self.check_seconds!r}")

    @property
    def enabled(self) -> bool:
        return self.retention_seconds >= 0


@dataclass(frozen=True, slots=True)
class Truncation:
    """One truncation: ids [``first_id``, ``before_id``) went."""

    first_id: MessageID
    before_id: MessageID
    messages: int
    payload_bytes: int
    held_by: str
    """Which bound stopped the cut (``flusher``, ``group:<name>``, ``txn``, ``retention``, ``last``)."""


@dataclass(frozen=True, slots=True)
class RetentionStats:
    """A snapshot of ``ChannelRetention.stats()`` (for metrics)."""

    checks: int
    truncations: int
    messages_truncated: int
    bytes_truncated: int
    """Payload bytes of the truncated messages (encoding overhead not counted)."""
    first_id: MessageID
    """The first retained id now."""
    last_truncated_before: MessageID | None
    """Where the last truncation cut (its first retained id), None before the first one."""
    held_by: str
    """What bounded the last check."""


class RetentionState(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    CLOSED = "closed"


class ChannelRetention:
    """Truncates one pchannel's WAL.  ``start()`` runs a check every ``check_seconds``; ``check()``
    runs one now (tests, admin).  ``aclose()`` waits for a check in progress to end."""

    def __init__(
        self, stream: StreamingWAL, groups: ConsumerGroups | None, flusher: Flusher | None,
        config: RetentionConfig | None = None, *, wall_ms: Callable[[], int] | None = None,
    ) -> None:
        self._stream = stream
        self._groups = groups
        self._flusher = flusher
        self._cfg = config or RetentionConfig()
        self._wall_ms = wall_ms or (lambda: time.time_ns() // 1_000_000)
        self._state = RetentionState.STARTING
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # one check at a time: the snapshot is read, extended and replaced
        self._checks = 0
        self._truncations = 0
        self._messages = 0
        self._bytes = 0
        self._last_before: MessageID | None = None
        self._held_by = ""

    @property
    def state(self) -> RetentionState:
        return self._state

    def start(self) -> None:
        if self._state is not RetentionState.STARTING:
            raise InvalidArgumentError("retention was already started")
        self._state = RetentionState.RUNNING
        if self._cfg.enabled:
            self._task = asyncio.get_running_loop().create_task(
                self._loop(), name=f"retention-{self._stream.pchannel}")

    async def aclose(self) -> None:
        """Stop the task (a truncation in progress finishes first).  Idempotent."""
        self._state = RetentionState.CLOSED
        if self._task is not None:
            async with self._lock:  # taken first: a truncation in progress finishes before the cancel
                await cancel_and_wait(self._task)
            self._task = None

    def stats(self) -> RetentionStats:
        return RetentionStats(
            checks=self._checks, truncations=self._truncations, messages_truncated=self._messages,
            bytes_truncated=self._bytes, first_id=self._stream.wal.first_id,
            last_truncated_before=self._last_before, held_by=self._held_by,
        )

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._cfg.check_seconds)
            try:
                await self.check()
            except StreamingError as exc:
                if self._stream.wal.state is not WALState.RUNNING:
                    return  # closing, fenced or destroyed: nothing left to truncate here
                log.warning("retention check failed", pchannel=self._stream.pchannel, error=repr(exc))

    # --- one check -------------------------------------------------------------------------------
    async def bound(self) -> tuple[MessageID, str]:
        """The largest id the log may be truncated before, and which bound set it."""
        wal = self._stream.wal
        last = wal.last_id
        if last is None:
            return wal.first_id, "empty"
        # In the order ties are reported: the time index already stops at open transactions, and the
        # last message is only the bound when nothing else is.
        bounds: list[tuple[MessageID, str]] = []
        if self._flusher is not None:
            bounds.append((self._flusher.checkpoint.message_id, "flusher"))
        if self._groups is not None:
            for name in self._groups.names():
                for mid, _ in self._groups.require(name).values():
                    bounds.append((mid, f"group:{name}"))
        oldest_txn = self._stream.txns.min_open_begin_id()
        if oldest_txn is not None:
            bounds.append((oldest_txn, "txn"))
        if self._cfg.retention_seconds >= 0:
            cutoff_ms = self._wall_ms() - int(self._cfg.retention_seconds * 1000)
            bounds.append((await wal.seek_time(compose(max(cutoff_ms, 0))), "retention"))
        bounds.append((last, "last"))
        return min(bounds, key=lambda b: b[0])

    async def check(self) -> Truncation | None:
        """Truncate as far as every bound allows; None when nothing could go."""
        async with self._lock:
            if self._state is RetentionState.CLOSED:
                return None
            self._checks += 1
            return await self._check()

    async def _check(self) -> Truncation | None:
        wal = self._stream.wal
        first = wal.first_id
        bound, held_by = await self.bound()
        self._held_by = held_by
        if bound <= first:
            return None
        snapshot = await load_snapshot(wal)
        base = snapshot.message_id if snapshot is not None else first
        payload = 0
        for _ in range(_MAX_CUT_TRIES):
            cut = await wal.block_start(bound)
            if cut <= first:
                return None
            if cut < base:
                # Below the snapshot (a group sought back after a crash left the snapshot above the
                # first id): whether a transaction spans the cut is unknown without replay from below.
                return None
            if cut == base:
                break  # the stored snapshot was taken here (and here no transaction was open)
            steps, _, txns, _ = default_interceptors(wal, self._stream.config)
            shadow = ShadowReplay(wal, steps, txns)
            shadow.load(snapshot)
            await shadow.advance(cut)
            floor = shadow.open_txn_floor()
            if floor is None:
                await store_snapshot(wal, shadow.capture())
                crash_point("snapshot")
                payload = shadow.payload_bytes
                break
            bound, held_by = floor, "txn"
        else:
            log.info("retention: transactions span every cut tried", pchannel=wal.pchannel, bound=bound)
            return None
        if base > first:  # the messages below the snapshot were not replayed: count them for the stats
            payload += await _payload_bytes(self._stream, first, base)
        new_first = await wal.truncate(cut)
        crash_point("truncate")
        done = Truncation(first, new_first, new_first - first, payload, held_by)
        self._truncations += 1
        self._messages += done.messages
        self._bytes += payload
        self._last_before = new_first
        self._held_by = held_by
        log.info("wal truncated", pchannel=wal.pchannel, term=wal.term, first_id=first, before_id=new_first,
                 messages=done.messages, payload_bytes=payload, held_by=held_by)
        return done


async def _payload_bytes(stream: StreamingWAL, start: MessageID, stop: MessageID) -> int:
    total = 0
    nid = start
    while nid < stop:
        batch = await stream.wal.read_stored(nid)
        for m in batch:
            if m.message_id is not None and m.message_id < stop:
                total += len(m.payload)
        nid = batch[-1].message_id + 1  # type: ignore[operator]
    return total


__all__ = ["KILL_ENV", "STEPS", "ChannelRetention", "RetentionConfig", "RetentionState", "RetentionStats",
           "Truncation"]
