"""The hybrid clock: ``physical_ms << 18 | logical``, strictly increasing, never reused after restart.

Like a TSO, it persists an allocation *window*: before handing out a timestamp at or beyond the stored
window end, it durably moves the end forward.  After a restart allocation resumes above the stored end,
so no timestamp is ever handed out twice — not even one carried by a not-persisted tick that a
consumer saw just before a crash.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Awaitable, Callable

LOGICAL_BITS = 18
_U64 = struct.Struct(">Q")
WINDOW_META = "ts_window_end"


def physical_ms(ts: int) -> int:
    return ts >> LOGICAL_BITS


def compose(ms: int, logical: int = 0) -> int:
    return (ms << LOGICAL_BITS) | logical


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
        self._wall_ms = wall_ms or (lambda: time.time_ns() // 1_000_000)
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
