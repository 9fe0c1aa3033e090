"""WAL retention of one pchannel: truncate what nobody needs any more, keeping recovery whole.

The rules are stated once, in ``flusher/README.md`` ("Retention (truncating the WAL)"): which bounds
hold the cut, how it is rounded to a block and moved below a spanning transaction, the two steps
(``snapshot`` into ``interceptors.recovery.snapshot``, then ``truncate``), what a crash between them leaves,
and what a reader of a truncated id gets (``OutOfRangeError``).  This module implements them, one
``ChannelRetention`` task per pchannel.

It also writes the periodic recovery snapshots (every ``snapshot_every_messages`` messages or
``snapshot_every_seconds`` seconds, independent of truncation; see ``interceptors.recovery.snapshot``), so a
restart replays only what came after the newest one.  A second task keeps a shadow replay of the log
in memory, a little behind its end, and stores its state at the first point no transaction spans
once a snapshot is due.  Every shadow replay (this one and the truncation's) decodes and applies in a
worker thread: a check never stalls the appends on the event loop.  Crash tests set ``STREAMINGNODE_RETENTION_KILL_AT``
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
from interceptors.recovery.snapshot import (
    PERIODIC_METAS,
    SNAPSHOT_META,
    RecoverySnapshot,
    ShadowReplay,
    load_snapshot,
    store_snapshot,
    stored_snapshots,
)
from interceptors.recovery.streaming_wal import StreamingWAL, default_interceptors
from streamingnode.node.groups import ConsumerGroups
from wal.clock import compose
from wal.crashpoints import CrashPoints
from wal.errors import CorruptedError, ErrorCode, InvalidArgumentError, StreamingError
from wal.message import MessageID, MessageType
from wal.tasks import cancel_and_wait
from wal.wal import WALState

log = structlog.get_logger(__name__)

KILL_ENV = "STREAMINGNODE_RETENTION_KILL_AT"
STEPS = ("snapshot", "truncate")
# A cut moves down while a transaction spans it; each try replays from the snapshot again.  Nested
# transactions that long-lived are rare: give up for this check rather than replay without end.
_MAX_CUT_TRIES = 8
# How often the periodic shadow catches up with the log (at most): short, so each catch-up is small
# and, under a burst, a crash leaves little to replay (an idle pass costs a comparison).
_SNAPSHOT_POLL_SECONDS = 0.25
# The shortest wait between two catch-ups while the log grows fast (see ``next_snapshot_poll``).
_SNAPSHOT_MIN_POLL_SECONDS = 0.01
# What a close may spend on a last snapshot (the shadow catching up): a drain must stay short.
_CLOSE_SNAPSHOT_SECONDS = 5.0


def next_snapshot_poll(poll: float, elapsed: float, grown: int, held: int) -> float:
    """How long the periodic shadow may wait before its next catch-up: ``poll`` while the log is
    quiet, less while it grows fast, so that the next pass finds what it has not replayed still in
    the WAL's memory.  ``grown`` messages were appended in the last ``elapsed`` seconds; the WAL's
    tail holds ``held`` messages now.  The wait covers half of what the tail holds at that rate.

    Why it matters: a pass that finds its messages evicted reads them back from storage and decodes
    each a second time (at 100k messages/s a 16 MiB tail holds about a tenth of a second, and the
    fixed quarter-second poll made every bulk message cost that read and decode)."""
    if grown <= 0 or elapsed <= 0 or held <= 0:
        return poll
    return max(_SNAPSHOT_MIN_POLL_SECONDS, min(poll, elapsed * held / (2 * grown)))


crash_point = CrashPoints(KILL_ENV, STEPS)
"""Called after the snapshot and the truncate steps (see ``wal.crashpoints``)."""


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    retention_seconds: float = 86400.0
    """Keep messages at least this long.  0: no time floor (truncate as soon as the flusher, the
    groups and the transactions allow); negative: keep everything (no retention task runs)."""
    check_seconds: float = 60.0
    """How often the bounds are checked."""
    snapshot_every_messages: int = 10_000
    """Store a periodic recovery snapshot once this many messages were written since the last one
    (0: no message trigger).  A restart replays about this many messages at most."""
    snapshot_every_seconds: float = 60.0
    """... or once this long passed since the last one and something was written (0: no time trigger)."""
    snapshot_every_bytes: int = 64 << 20
    """... or once the payloads replayed since the last one reach this (0: no size trigger): big
    messages take longer to replay than their count says."""

    def __post_init__(self) -> None:
        if not self.check_seconds > 0:
            raise InvalidArgumentError(f"retention check_seconds must be > 0, got {self.check_seconds!r}")
        if self.snapshot_every_messages < 0 or not self.snapshot_every_seconds >= 0 or self.snapshot_every_bytes < 0:
            raise InvalidArgumentError(
                f"snapshot_every_messages, snapshot_every_seconds and snapshot_every_bytes must be >= 0, got "
                f"{self.snapshot_every_messages!r}, {self.snapshot_every_seconds!r} and {self.snapshot_every_bytes!r}")

    @property
    def enabled(self) -> bool:
        return self.retention_seconds >= 0

    @property
    def snapshots(self) -> bool:
        """Whether periodic recovery snapshots are written."""
        return self.snapshot_every_messages > 0 or self.snapshot_every_seconds > 0


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
    snapshots_stored: int = 0
    """Periodic recovery snapshots stored (each also logged, at DEBUG)."""
    snapshot_seconds: float = 0.0
    """Time spent in the passes that stored them (catching up with the log, capturing, writing)."""


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
        on_damage: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._stream = stream
        self._on_damage = on_damage
        """Told when a task stops on damaged storage (a CORRUPTED error from its reads of the WAL); the
        node moves the pchannel to FAILED.  Called from the task itself, which then ends: it must not
        wait for this retention to close (the node schedules the close instead).  Without it, such an
        error is logged and retried like any other."""
        self._groups = groups
        self._flusher = flusher
        self._cfg = config or RetentionConfig()
        self._wall_ms = wall_ms or (lambda: time.time_ns() // 1_000_000)
        self._state = RetentionState.STARTING
        self._task: asyncio.Task[None] | None = None
        self._snapshot_task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # one check at a time: the snapshot is read, extended and replaced
        self._monotonic = time.monotonic
        self._snapshot_lock = asyncio.Lock()
        self._shadow: ShadowReplay | None = None
        """The periodic snapshots' replay, kept between passes (None: seeded again on the next pass)."""
        self._stored_id: MessageID = 0
        self._stored_at = 0.0
        self._stored_bytes = 0
        self._slot = 0
        self._due_from: MessageID | None = None
        self._epoch = 0  # +1 per seeded shadow: its payload counts are comparable within one epoch only
        self._payload_at: dict[MessageID, tuple[int, int]] = {}
        """Stored periodic snapshot id -> (epoch, the shadow's payload bytes replayed up to it)."""
        self._cut_payload: tuple[int, int] | None = None
        """(epoch, payload bytes replayed up to the last cut), when the last cut was taken at a periodic snapshot."""
        self.snapshots_stored = 0
        self._snapshot_seconds = 0.0
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
        loop = asyncio.get_running_loop()
        if self._cfg.enabled:
            self._task = loop.create_task(self._loop(), name=f"retention-{self._stream.pchannel}")
        if self._cfg.snapshots:
            self._snapshot_task = loop.create_task(self._snapshot_loop(), name=f"snapshots-{self._stream.pchannel}")

    async def aclose(self) -> None:
        """Store a last snapshot (bounded in time) so the next start replays little, then stop the
        tasks (a truncation or a snapshot store in progress finishes first).  Idempotent."""
        if self._snapshot_task is not None and self._state is RetentionState.RUNNING:
            try:
                await asyncio.wait_for(self.snapshot(force=True), _CLOSE_SNAPSHOT_SECONDS)
            except (StreamingError, TimeoutError) as exc:  # the periodic ones are still there
                log.info("no recovery snapshot at close", pchannel=self._stream.pchannel, error=repr(exc))
        self._state = RetentionState.CLOSED
        if self._task is not None or self._snapshot_task is not None:
            async with self._lock:  # taken first: a truncation in progress finishes before the cancel
                for task in (self._task, self._snapshot_task):
                    if task is not None:
                        await cancel_and_wait(task)
            self._task = self._snapshot_task = None

    async def abandon(self) -> None:
        """Stop at once, storing nothing: the pchannel's lease went, so no write of this node may
        land on its log any more (a truncation in progress is cut short, as a crash would cut it).
        Idempotent; ``aclose`` afterwards does nothing."""
        self._state = RetentionState.CLOSED
        for task in (self._task, self._snapshot_task):
            if task is not None:
                await cancel_and_wait(task)
        self._task = self._snapshot_task = None

    def stats(self) -> RetentionStats:
        return RetentionStats(
            checks=self._checks, truncations=self._truncations, messages_truncated=self._messages,
            bytes_truncated=self._bytes, first_id=self._stream.wal.first_id,
            last_truncated_before=self._last_before, held_by=self._held_by,
            snapshots_stored=self.snapshots_stored, snapshot_seconds=self._snapshot_seconds,
        )

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._cfg.check_seconds)
            try:
                await self.check()
            except StreamingError as exc:
                if self._stream.wal.state is not WALState.RUNNING:
                    return  # closing, fenced or destroyed: nothing left to truncate here
                if self._report_damage(exc, "retention stopped: the WAL it reads is damaged"):
                    return
                log.warning("retention check failed", pchannel=self._stream.pchannel, error=repr(exc))

    def _report_damage(self, exc: StreamingError, what: str) -> bool:
        """Hand damaged storage (CORRUPTED) to ``on_damage``; True when it was handed over.  Retrying
        would meet the same damage every time; a full disk or a fence is not damage."""
        if self._on_damage is None or exc.code is not ErrorCode.CORRUPTED:
            return False
        # A warning: the node logs the failure of the pchannel (the one error line).
        log.warning(what, pchannel=self._stream.pchannel, error=repr(exc))
        self._on_damage(exc)
        return True

    # --- periodic snapshots ----------------------------------------------------------------------
    async def _snapshot_loop(self) -> None:
        poll = min(_SNAPSHOT_POLL_SECONDS, self._cfg.snapshot_every_seconds or _SNAPSHOT_POLL_SECONDS)
        wal = self._stream.wal
        wait, since, head = poll, self._monotonic(), wal.next_id
        while True:
            await asyncio.sleep(wait)
            now, grown = self._monotonic(), wal.next_id - head
            wait = next_snapshot_poll(poll, now - since, grown, wal.next_id - wal.cached_from)
            since, head = now, head + grown
            try:
                await self.snapshot()
            except StreamingError as exc:
                self._shadow = self._due_from = None  # seeded again (e.g. a truncation passed it)
                if self._stream.wal.state is not WALState.RUNNING:
                    return
                if self._report_damage(exc, "recovery snapshots stopped: the WAL they read is damaged"):
                    return
                log.warning("recovery snapshot failed", pchannel=self._stream.pchannel, error=repr(exc))

    async def _seed(self) -> ShadowReplay:
        wal = self._stream.wal
        stored = await stored_snapshots(wal)
        periodic = {n: s for n, s in stored.items() if n in PERIODIC_METAS}
        if periodic:  # the next store goes to the other slot: the newest stays until it is replaced
            newest = max(periodic, key=lambda n: periodic[n].message_id)
            self._slot = 1 - PERIODIC_METAS.index(newest)
        self._stored_id = max((s.message_id for s in stored.values()), default=wal.first_id)
        self._stored_at = self._monotonic()
        self._stored_bytes = 0
        # Recovery's own state at its end spares a second replay; else the newest stored snapshot.
        seed: RecoverySnapshot | None = self._stream.recovered_snapshot
        if seed is None and stored:
            seed = max(stored.values(), key=lambda s: s.message_id)
        steps, _, txns, _ = default_interceptors(wal, self._stream.config)
        shadow = ShadowReplay(wal, steps, txns)
        shadow.load(seed)
        shadow.position = max(shadow.position, wal.first_id)  # truncated past it: as recovery does
        self._epoch += 1
        self._payload_at.clear()
        return shadow

    async def snapshot(self, *, force: bool = False) -> RecoverySnapshot | None:
        """Catch the periodic shadow up with the log and store a snapshot when one is due (or
        ``force``); the stored snapshot, or None.  Run by the snapshot task; tests call it."""
        async with self._snapshot_lock:  # one pass at a time: the shadow is not shared between threads
            return await self._snapshot(force)

    async def _snapshot(self, force: bool) -> RecoverySnapshot | None:
        if self._state is RetentionState.CLOSED:
            return None
        if self._shadow is None:
            self._shadow = await self._seed()
        shadow = self._shadow
        wal = self._stream.wal
        head = wal.next_id
        written = head - self._stored_id
        every_n, every_s, every_b = (self._cfg.snapshot_every_messages, self._cfg.snapshot_every_seconds,
                                     self._cfg.snapshot_every_bytes)
        due = written > 0 and (force or (every_n > 0 and written >= every_n)
                               or (every_s > 0 and self._monotonic() - self._stored_at >= every_s)
                               or (every_b > 0 and shadow.payload_bytes - self._stored_bytes >= every_b))
        if not due:
            await shadow.advance(head)
            return None
        started = time.perf_counter()
        # The first point no transaction spans at or above the end of the log when the snapshot fell
        # due (kept while transactions span every point after it, so the next pass stops at the first).
        if self._due_from is None:
            self._due_from = head
        if not await shadow.advance(head, clear_from=self._due_from) or shadow.position <= self._stored_id:
            return None
        self._due_from = None
        snapshot = shadow.capture()
        async with self._lock:
            if self.state is RetentionState.CLOSED:  # closed while the shadow was replaying
                return None
            await store_snapshot(wal, snapshot, PERIODIC_METAS[self._slot])
        self._slot = 1 - self._slot
        self._payload_at[snapshot.message_id] = (self._epoch, shadow.payload_bytes)
        for stale in sorted(self._payload_at)[:-len(PERIODIC_METAS)]:
            del self._payload_at[stale]
        self._stored_id = snapshot.message_id
        self._stored_at = self._monotonic()
        self._stored_bytes = shadow.payload_bytes
        self.snapshots_stored += 1
        self._snapshot_seconds += time.perf_counter() - started
        # DEBUG: under load one is stored every few seconds, routine work an operator follows in the
        # streamingnode_recovery_snapshots counters rather than in the log.
        log.debug("recovery snapshot stored", pchannel=wal.pchannel, snapshot_id=snapshot.message_id,
                  behind=head - snapshot.message_id)
        return snapshot

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
            bounds.append((self._flusher.retained_from, "flusher"))
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
        try:
            snapshot = await load_snapshot(wal)
        except CorruptedError as exc:
            # A damaged snapshot is not damage to the log (recovery passes over it too, with a
            # warning): the pchannel keeps serving.  The state below the first retained message is
            # known from no other snapshot, so nothing is truncated while it stays damaged.
            log.warning("retention: the truncation snapshot is damaged, nothing is truncated",
                        pchannel=wal.pchannel, snapshot=SNAPSHOT_META, error=str(exc))
            return None
        if snapshot is not None and snapshot.message_id > wal.next_id:
            # Past the end, it describes messages this log never had: not the state at the first
            # retained id either.  Treated as damaged, and said at each check (the cut waits on it).
            log.warning("retention: the truncation snapshot is damaged, nothing is truncated",
                        pchannel=wal.pchannel, snapshot=SNAPSHOT_META,
                        error=f"at id {snapshot.message_id}, past the end of the log ({wal.next_id})")
            return None
        base = snapshot.message_id if snapshot is not None else first
        payload = 0
        shortcut = await self._cut_at_periodic(bound, first, base)
        if shortcut is _WAIT:
            return None
        if shortcut is not None:
            assert not isinstance(shortcut, _Wait)
            cut, periodic, payload = shortcut
            await store_snapshot(wal, periodic)
            crash_point("snapshot")
            return await self._truncate(first, cut, payload, held_by)
        self._cut_payload = None
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
        return await self._truncate(first, cut, payload, held_by)

    async def _cut_at_periodic(
        self, bound: MessageID, first: MessageID, base: MessageID,
    ) -> tuple[MessageID, RecoverySnapshot, int] | _Wait | None:
        """A cut that needs no replay: at the newest periodic snapshot at or below ``bound``, which
        becomes the truncation snapshot.  The periodic task's shadow has already replayed up to it, so
        a check costs a few reads and writes instead of a second replay of everything written since
        the last cut (which held the GIL for milliseconds while appends waited).

        Truncation drops whole blocks: the cut is the start of the block holding the snapshot's id,
        and the messages between stay in the log above the cut but below the snapshot (recovery
        starts at the snapshot, as after a crash between the two steps).  No transaction may span
        the cut, so a block holding any transaction message before the snapshot's id falls back to
        the replay.  Returns (cut, snapshot, payload bytes truncated); ``_WAIT`` when the periodic
        task has stored snapshots but none above the last cut yet (the next one lets the log go: a
        truncation lags by at most the snapshot interval, and never replays); None: replay."""
        if not self._cfg.snapshots:
            return None
        wal = self._stream.wal
        periodic = [s for n, s in (await stored_snapshots(wal)).items() if n in PERIODIC_METAS]
        candidates = [s for s in periodic if max(first, base) < s.message_id <= bound]
        if not candidates:
            return _WAIT if periodic and self._snapshot_task is not None else None
        newest = max(candidates, key=lambda s: s.message_id)
        cut = await wal.block_start(newest.message_id)
        if cut <= first or cut < base:  # in the first block still: the next snapshot will be past it
            return _WAIT if self._snapshot_task is not None else None
        between = 0  # payload bytes of [cut, snapshot id): kept, though the snapshot holds them
        nid = cut
        while nid < newest.message_id:
            batch = await wal.read_stored(nid)
            for m in batch:
                if m.message_id is None or m.message_id >= newest.message_id:
                    continue
                if m.txn is not None or m.message_type in _TXN_TYPES:
                    return None
                between += len(m.payload)
            nid = batch[-1].message_id + 1  # type: ignore[operator]
        # The stats: what the periodic shadow replayed between the last cut and this one, when both
        # were counted by the same shadow; else the truncated messages are read to count them.
        at = self._payload_at.get(newest.message_id)
        payload: int | None = None
        if at is not None:
            upto = (at[0], at[1] - between)
            if self._cut_payload is not None and self._cut_payload[0] == at[0]:
                payload = upto[1] - self._cut_payload[1]
            self._cut_payload = upto
        else:
            self._cut_payload = None
        if payload is None:
            payload = await _payload_bytes(self._stream, first, cut)
        return cut, newest, payload

    async def _truncate(self, first: MessageID, cut: MessageID, payload: int, held_by: str) -> Truncation:
        wal = self._stream.wal
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


class _Wait:
    """See ``ChannelRetention._cut_at_periodic``."""


_WAIT = _Wait()
_TXN_TYPES = frozenset({MessageType.BEGIN_TXN, MessageType.COMMIT_TXN, MessageType.ROLLBACK_TXN})


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
