"""timetick: timestamps, last-confirmed ids, MVCC, and the TimeTick barriers readers release by.

Every batch gets consecutive timestamps from the hybrid clock, allocated and registered with the ack
manager synchronously (no await in between), so allocation order is timestamp order.  A background
task emits TimeTick messages: every ``interval`` (persisted when data was written since the last
persisted tick, otherwise handed only to tailing scanners), and promptly whenever appends finish while
a prompt reader is open, so a tailing reader sees a message within milliseconds.  With only lazy
readers (the flusher) an append costs no tick of its own; they read by the interval's ticks, or ask
for one (``WAL.want_tick``).  A tick at T is emitted only after every allocation
below T has finished, which is what makes it a barrier.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import structlog

from interceptors.base import AppendNext
from interceptors.timetick.ack import AckManager, Pending
from wal.clock import TICK_INTERVAL, WINDOW_META, WINDOW_MS, HybridClock, decode_window, encode_window
from wal.message import AppendResult, Message, MessageID, MessageType, new_time_tick, stamp_times
from wal.tasks import cancel_and_wait
from wal.wal import WAL

log = structlog.get_logger(__name__)

_TIME_TICK = MessageType.TIME_TICK


def _log_extend_failure(task: asyncio.Task[None]) -> None:
    # A failed early extension is harmless: allocation extends synchronously when the window ends.
    if not task.cancelled() and task.exception() is not None:
        log.warning("timestamp window extension failed", error=repr(task.exception()))


class TimeTickInterceptor:
    name = "timetick"

    def __init__(
        self,
        wal: WAL,
        *,
        interval: float = TICK_INTERVAL,
        window_ms: int = WINDOW_MS,
        min_open_txn_id: Callable[[], MessageID | None] | None = None,
        wall_ms: Callable[[], int] | None = None,
        on_tick: Callable[[int], object] | None = None,
    ) -> None:
        self._wal = wal
        self._interval = interval
        self._window_ms = window_ms
        self._wall_ms = wall_ms
        self._on_tick = on_tick
        self._clock: HybridClock | None = None
        self.acks = AckManager(lambda: wal.next_id, wal.last_timetick, min_open_txn_id)
        self._dirty = False  # data written since the last persisted tick
        self._poke = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._extender: asyncio.Task[None] | None = None
        self._clock_queue = asyncio.Lock()  # FIFO: batches waiting for a new allocation window
        self._clock_waiters = 0
        self._tick_asked = False  # someone called WAL.want_tick since the last tick
        self.last_tick = wal.last_timetick

    # --- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the allocation window and start the tick task.  Called by the adaptor after replay."""
        window = decode_window(await self._wal.get_meta(WINDOW_META))
        self._clock = HybridClock(
            self._wal.last_timetick + 1, window, self._persist_window,
            window_ms=self._window_ms, wall_ms=self._wall_ms,
        )
        self._ready.set()
        self._task = asyncio.get_running_loop().create_task(self._tick_loop(), name=f"timetick-{self._wal.pchannel}")
        self._wal.tick_wanted = self._ask_tick

    def _ask_tick(self) -> None:
        self._tick_asked = True
        self._poke.set()

    async def _persist_window(self, end: int) -> None:
        await self._wal.put_meta(WINDOW_META, encode_window(end))

    async def ready(self) -> None:
        await self._ready.wait()

    async def close(self) -> None:
        if self._wal.tick_wanted == self._ask_tick:
            self._wal.tick_wanted = None
        if self._extender is not None and not self._extender.done():
            with contextlib.suppress(Exception):
                await self._extender
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    @property
    def clock(self) -> HybridClock:
        assert self._clock is not None, "timetick not started"
        return self._clock

    @property
    def started(self) -> bool:
        """``start`` has loaded the clock: ``clock`` may be read."""
        return self._clock is not None

    def mvcc_timetick(self) -> int:
        """Every message with a timestamp at or below this is acknowledged (or failed for good)."""
        return self.acks.confirmed_ts

    # --- append ----------------------------------------------------------------------------------
    async def _allocate(self, batch: list[Message]) -> Pending:
        clock = self.clock
        n = len(batch)
        first = None if self._clock_waiters else clock.try_allocate(n)
        if first is None:
            # The window is used up: wait for its extension in arrival order.  While anyone waits,
            # a later batch queues too instead of taking the new window first, so batches keep the
            # order in which they reached the clock (a producer's pipelined batches, one vchannel).
            self._clock_waiters += 1
            try:
                async with self._clock_queue:
                    while (first := clock.try_allocate(n)) is None:
                        await clock.extend(n)
            finally:
                self._clock_waiters -= 1
        if clock.wants_extension() and (self._extender is None or self._extender.done()):
            self._extender = asyncio.get_running_loop().create_task(clock.extend_ahead())
            self._extender.add_done_callback(_log_extend_failure)
        # Synchronous from here to register: allocation order stays timestamp order.
        lc = self.acks.last_confirmed_id()
        return self.acks.register(stamp_times(batch, first, lc) - 1)

    async def do_append(self, batch: list[Message], append_next: AppendNext) -> list[AppendResult]:
        p = await self._allocate(batch)
        try:
            results = await append_next(batch)
        except BaseException:
            self.acks.finish(p, None)
            self._poke.set()
            raise
        self.acks.finish(p, results[0].message_id if results else None)
        self._dirty = True
        if self._wal.prompt_readers or self._tick_asked:  # else the beat carries it (see _tick_loop)
            self._poke.set()
        return results

    # --- ticks -----------------------------------------------------------------------------------
    async def emit_tick(self, persist: bool) -> int:
        """Emit one TimeTick after every earlier allocation finished; return its timestamp."""
        tick = new_time_tick(0, persist=persist)
        p = await self._allocate([tick])
        if persist:
            # Cleared at allocation, not after the write: every append finished by now has a smaller
            # timestamp, so this tick covers it.  One that finishes while the tick is written sets it
            # again; a lone append can complete inside its caller's turn, before this task resumes,
            # and clearing after the write would drop it (no persisted tick until the next data).
            self._dirty = False
        written = False
        try:
            await self.acks.wait_first(p)
            tick.with_last_confirmed(self.acks.last_confirmed_id())
            if persist:
                await self._wal.append_batch([tick])
                written = True
            else:
                self._wal.deliver_unpersisted(tick)
        finally:
            if persist and not written:
                self._dirty = True  # nothing was covered (the write failed, or its caller was cancelled)
            self.acks.finish(p, tick.message_id)
        self.last_tick = tick.timetick
        if self._on_tick is not None:
            self._on_tick(tick.timetick)  # e.g. expire idle transactions on the same clock readers use
        return tick.timetick

    async def _tick_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_beat = loop.time() + self._interval
        while True:
            timeout = next_beat - loop.time()
            if timeout > 0:
                # asyncio.timeout rather than wait_for: in 3.11 wait_for can lose a cancellation that
                # arrives as the event fires, which would leave close() waiting forever.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._poke.wait()
            self._poke.clear()
            beat = loop.time() >= next_beat
            if beat:
                next_beat = loop.time() + self._interval
            elif not self._tick_asked and not self._wal.prompt_readers:
                # Appends finished but no reader waits on the tail: a tick now would only cost the
                # loop (the tick itself and every lazy reader it wakes); the beat will carry them.
                continue
            self._tick_asked = False
            try:
                # The beat persists a tick if data was written since the last one; a poke (appends
                # finished) only hands a volatile tick to tailing readers, which costs no write.
                await self.emit_tick(persist=beat and self._dirty)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001  (keep ticking; the WAL state decides what is possible)
                if self._wal.state.value != "running":
                    return
                log.warning("time tick failed", pchannel=self._wal.pchannel, error=repr(exc))
                await asyncio.sleep(self._interval)


__all__ = ["TimeTickInterceptor"]
