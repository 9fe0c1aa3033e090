"""The C allocator: how many arenas the node's threads may spread over, and trimming after bursts.

glibc gives each thread that allocates its own arena, up to 8 per core, and an arena keeps what was
freed in it for reuse by its own threads.  The node's threads (the event loop, the WAL's writer,
sync and reader threads, gRPC's and RocksDB's) each churn through messages, so each arena ends up
holding tens of MB that no other thread can use: in ``bench/soak.py`` freed-but-held memory was
77 MB of a 236 MB node, 36 MB with two arenas (bench/RESULTS.md).  Most of the node's work holds
the GIL anyway, so two arenas cost no measurable contention.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools

import structlog

log = structlog.get_logger(__name__)

_M_ARENA_MAX = -8
"""mallopt's parameter number for the arena limit (malloc.h)."""


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") else None


def limit_arenas(count: int) -> bool:
    """Let at most ``count`` malloc arenas exist from now on (arenas already made stay); 0 leaves the
    allocator's default.  Whether the limit was set: False where the C library is not glibc."""
    if count <= 0:
        return False
    libc = _libc()
    if libc is None or not libc.mallopt(_M_ARENA_MAX, count):
        log.info("malloc arena limit not applied (not glibc?)", malloc_arena_max=count)
        return False
    return True


def trim() -> bool:
    """Give the memory the allocator holds free back to the system (glibc's ``malloc_trim(0)``, which
    also releases free pages inside its heaps); False where the C library cannot."""
    libc = _libc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    libc.malloc_trim(0)
    return True


class Trimmer:
    """Trims (``trim``) once a burst of large dropped buffers has passed: ``delay`` seconds after the
    last drop (at most ``longest`` after the first, so that a steady flow of them still trims).

    gRPC reads a request into buffers of 64 to 128 KiB, below the size glibc maps on its own once its
    threshold has risen: they come from the heaps, and after a burst of large unary requests the heaps
    keep hundreds of MB free but not returned, and reuse them unevenly (in ``bench/refused_memory.py``
    the node's RSS still rose by a quarter over four rounds of 12 x 60 MiB after the requests were
    freed).  One trim after the burst, when its calls have ended and let go of their buffers, rather
    than one per drop: it runs on a worker thread (it walks every heap), one at a time; a drop during
    a trim asks for one more."""

    def __init__(self, delay: float = 0.5, longest: float = 2.0) -> None:
        self.delay = delay
        self.longest = longest
        self.trims = 0
        """Trims done (tests read it)."""
        self._first = self._last = 0.0
        self._state = "idle"  # idle | waiting | running | again (a drop came while running)

    def soon(self) -> None:
        """A large buffer was just dropped: trim once the drops stop for ``delay`` seconds."""
        loop = asyncio.get_running_loop()
        self._last = loop.time()
        if self._state == "running":
            self._state = "again"
        elif self._state == "idle":
            self._state = "waiting"
            self._first = self._last
            loop.call_later(self.delay, self._check, loop)

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        if now - self._last < self.delay and now - self._first < self.longest:
            loop.call_later(self._last + self.delay - now, self._check, loop)  # the burst goes on
            return
        self._state = "running"
        loop.run_in_executor(None, trim).add_done_callback(lambda _: self._done(loop))

    def _done(self, loop: asyncio.AbstractEventLoop) -> None:
        self.trims += 1
        again, self._state = self._state == "again", "idle"
        if again and not loop.is_closed():
            self.soon()


__all__ = ["Trimmer", "limit_arenas", "trim"]
