"""The limits and settings of one flusher (``Flusher(stream, root, config)``)."""

from __future__ import annotations

from dataclasses import dataclass

from flusher.checkpoint import CHECKPOINT_META
from flusher.compaction_config import CompactionConfig
from wal.errors import InvalidArgumentError


@dataclass(frozen=True, slots=True)
class FlusherConfig:
    """Limits of one flusher.  A buffer is written when any of its limits is reached."""

    max_rows: int = 1_000_000
    max_bytes: int = 64 << 20
    """Per buffer, counted as the payload bytes it holds."""
    max_age_seconds: float = 50.0
    """Since the buffer's first row arrived (checked at every TimeTick); the node's default too
    (``flush_max_age_seconds``): an idle insert reaches Parquet within a minute."""
    memory_cap_bytes: int = 256 << 20
    """All buffers together; above it the largest buffer is written first."""
    compression: str = "zstd"
    checkpoint_interval_seconds: float = 1.0
    """How often the checkpoint moves when no file was written (after a write it moves at once)."""
    read_batch_bytes: int = 1 << 20
    checkpoint_name: str = CHECKPOINT_META
    """The WAL meta key of the checkpoint: one per (pchannel, root); a second flusher of the same
    pchannel writing elsewhere needs its own."""
    compaction: CompactionConfig | None = None
    """Compaction of small files (``flusher/compact.py``); None: never in the background."""
    compaction_interval_seconds: float = 300.0

    def __post_init__(self) -> None:
        if self.max_rows < 1 or self.max_bytes < 1 or self.memory_cap_bytes < 1 or not self.max_age_seconds > 0:
            raise InvalidArgumentError("flusher limits must be positive")


__all__ = ["FlusherConfig"]
