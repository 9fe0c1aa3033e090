"""Process-wide settings the node applies at start-up (not the library: embedding apps decide)."""

from __future__ import annotations

import gc

GC_THRESHOLDS = (100_000, 50, 100)


def tune_gc() -> None:
    """Collect the young generation every 100k allocations instead of 700.

    The WAL's tail buffer keeps tens of thousands of live messages; with the default thresholds the
    cyclic collector walks them several times a second under load (about 8% of append time measured
    in bench/wal_append.py).  Messages form no cycles, so collecting less often frees nothing later.
    """
    gc.set_threshold(*GC_THRESHOLDS)
