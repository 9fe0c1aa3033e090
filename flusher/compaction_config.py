"""The settings of a compaction pass, and their defaults: the one home of both for the node
(``NodeConfig.compaction_*``) and the offline ``streamingnode compact`` command.

Standard library only, so the node's configuration and the command line read the defaults without
loading pyarrow (``flusher.compact`` does the work).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CompactionConfig:
    """What a pass compacts and how (flusher/README.md "Compaction")."""

    target_bytes: int = 128 * 1024 * 1024
    """Size of an output file (estimated from the inputs' sizes); files under half of it are small."""
    target_rows: int | None = None
    """When set, an output also holds at most this many rows (and files under half of it are small)."""
    min_files: int = 8
    """A partition is compacted once it has this many small files (or a file with many dead rows)."""
    horizon_seconds: float = 3600.0
    """As-of reads stay exact for timeticks of the last this many seconds."""
    grace_seconds: float = 60.0
    """How long inputs stay after a record is committed, for readers that listed them before."""
    io_bytes_per_second: int = 0
    """Read plus write rate limit; 0 means none."""
    compression: str = "zstd"

    def __post_init__(self) -> None:
        if self.target_bytes <= 0:
            raise ValueError(f"target_bytes must be positive, got {self.target_bytes}")
        if self.target_rows is not None and self.target_rows <= 0:
            raise ValueError(f"target_rows must be positive or None, got {self.target_rows}")
        if self.min_files < 1:
            raise ValueError(f"min_files must be at least 1, got {self.min_files}")
        if self.horizon_seconds < 0 or self.grace_seconds < 0 or self.io_bytes_per_second < 0:
            raise ValueError("horizon_seconds, grace_seconds and io_bytes_per_second must not be negative")


DEFAULT_COMPACTION = CompactionConfig()
"""The defaults, readable as values (a slotted dataclass keeps none on the class)."""

__all__ = ["DEFAULT_COMPACTION", "CompactionConfig"]
