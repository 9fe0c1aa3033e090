"""The one home of the hybrid timestamp: ``physical_ms << 18 | logical``, and the rules built on it.

Every component that reads or writes a timetick goes through this module: the writer's clock, the
reader's expiry of transactions, the flusher's lag, the Spark reader's ``as_of``, the CLI's times.
Writer and reader must agree on the layout and on when a transaction expires, so both live here once.

The clock itself, like a TSO, persists an allocation *window*: before handing out a timestamp at or
beyond the stored window end, it durably moves the end forward.  After a restart allocation resumes
above the stored end, so no timestamp is ever handed out twice — not even one carried by a
not-persisted tick that a consumer saw just before a crash.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Awaitable, Callable

LOGICAL_BITS = 18
"""Bits of the logical counter below the physical milliseconds."""
LOGICAL_MAX = (1 << LOGICAL_BITS) - 1
"""The largest logical part: ``compose(ms, LOGICAL_MAX)`` is the last timestamp of millisecond ``ms``."""
TIMETICK_MAX = (1 << 63) - 1
"""Timeticks are stored as signed 64-bit integers (Parquet ``_ts``, protobuf int64 readers)."""
_U64 = struct.Struct(">Q")
WINDOW_META = "ts_window_end"
WINDOW_MS = 3000
"""How far ahead the persisted window reaches by default (one durable write per window)."""
TICK_INTERVAL = 0.2
"""Seconds between TimeTicks by default: the timetick step's, the chain's and the node's setting."""


def physical_ms(ts: int) -> int:
    """The wall-clock milliseconds of a timestamp."""
    return ts >> LOGICAL_BITS


def compose(ms: int, logical: int = 0) -> int:
    """The timestamp of millisecond ``ms`` with logical part ``logical``."""
    return (ms << LOGICAL_BITS) | logical


def wall_ms() -> int:
    """The wall clock in milliseconds since the epoch, as the clock reads it."""
    return time.time_ns() // 1_000_000


_system_wall_ms = wall_ms  # the constructor's parameter of the same name shadows it


def wall_ts() -> int:
    """The first timestamp of the current wall-clock millisecond (not allocated: for bounds and lag)."""
    return compose(wall_ms())


def txn_expired(keepalive_ms: int, last_ts: int, ts: int) -> bool:
    """The transaction expiry rule, used by the writer (the txn interceptor) and every reader (the
    scanner) alike: a session whose last activity was at ``last_ts`` has expired at ``ts`` when it has
    been idle more than ``keepalive_ms`` physical milliseconds.  ``keepalive_ms <= 0`` never expires."""
    return keepalive_ms > 0 and physical_ms(ts) > physical_ms(last_ts) + keepalive_ms


def encode_window(end: int) -> bytes:
    return _U64.pack(end)


def decode_window(raw: bytes | None) -> int:
    return _U64.unpack(raw)[0] if raw is not None and len(raw) == 8 else 0


class HybridClock:
    """Allocates timestamps; ``try_allocate`` is synchronous so allocation order is call order."""

    def __init__(
        self,
        floor: int,
        window_end: int,
        persist_window: Callable[[int], Awaitable[None]],
        *,
        window_ms: int = 3000,
        wall_ms: Callable[[], int] | None = None,
    ) -> None:
        # Everything below max(floor, window_end) may have been handed out before a restart.
        self._last = max(floor, window_end) - 1 if max(floor, window_end) > 0 else 0
        self._window_end = max(window_end, self._last + 1)
        self._persist = persist_window
        self._window = window_ms << LOGICAL_BITS
        self._wall_ms = wall_ms or _system_wall_ms
        self._extending: asyncio.Lock = asyncio.Lock()

    @property
    def last(self) -> int:
        """The last timestamp handed out."""
        return self._last

    def now(self) -> int:
        """A timestamp for 'now' that is not allocated (for expiry checks and lag)."""
        return max(self._last, self._wall_ms() << LOGICAL_BITS)

    def try_allocate(self, n: int) -> int | None:
        """First of ``n`` consecutive timestamps, or None when the window must be extended first."""
        first = max(self._last + 1, self._wall_ms() << LOGICAL_BITS)
        last = first + n - 1
        if last >= self._window_end:
            return None
        self._last = last
        return first

    async def extend(self, n: int) -> None:
        """Durably move the window end past the next ``n`` timestamps."""
        async with self._extending:
            need = max(self._last + 1, self._wall_ms() << LOGICAL_BITS) + n
            if need < self._window_end:
                return  # another caller extended it meanwhile
            end = need + self._window
            await self._persist(end)
            self._window_end = end

    def wants_extension(self) -> bool:
        """True when less than half the window is left: extend it in the background now, so that no
        append ever waits for the synced write of a new window."""
        floor = max(self._last, self._wall_ms() << LOGICAL_BITS)
        return self._window_end - floor < self._window // 2 and not self._extending.locked()

    async def extend_ahead(self) -> None:
        """Move the window end a whole window past now (durably), if still wanted."""
        async with self._extending:
            floor = max(self._last + 1, self._wall_ms() << LOGICAL_BITS)
            if self._window_end - floor >= self._window // 2:
                return
            end = floor + self._window
            await self._persist(end)
            self._window_end = max(self._window_end, end)

    async def allocate(self, n: int) -> int:
        """``try_allocate``, extending the window as needed.  Order across awaits is not guaranteed:
        callers that need allocation order = call order use ``try_allocate`` under their own rule."""
        while True:
            first = self.try_allocate(n)
            if first is not None:
                return first
            await self.extend(n)
