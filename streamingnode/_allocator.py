"""The C allocator's arenas: how many the node's threads may spread over.

glibc gives each thread that allocates its own arena, up to 8 per core, and an arena keeps what was
freed in it for reuse by its own threads.  The node's threads (the event loop, the WAL's writer,
sync and reader threads, gRPC's and RocksDB's) each churn through messages, so each arena ends up
holding tens of MB that no other thread can use: in ``bench/soak.py`` freed-but-held memory was
77 MB of a 236 MB node, 36 MB with two arenas (bench/RESULTS.md).  Most of the node's work holds
the GIL anyway, so two arenas cost no measurable contention.
"""

from __future__ import annotations

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


__all__ = ["limit_arenas"]
