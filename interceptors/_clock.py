"""Moved to :mod:`wal.clock`; kept only while the server and CLI move to their packages."""

from wal.clock import LOGICAL_BITS, compose, physical_ms

__all__ = ["LOGICAL_BITS", "compose", "physical_ms"]
