"""Storage backends: ``memory`` for tests and ``rocksdb`` (through rocksdict), the default."""

from wal.backends.memory import MemoryBackend
from wal.backends.rocks import RocksBackend, SyncMethod

__all__ = ["MemoryBackend", "RocksBackend", "SyncMethod"]
