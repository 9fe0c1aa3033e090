"""Storage backends: ``memory`` for tests, ``rocksdb`` (through rocksdict), the default, and
``jetstream`` (NATS JetStream, cluster mode; imported on first use, since nats-py is the ``cluster``
extra)."""

from typing import TYPE_CHECKING, Any

from wal.backends.memory import MemoryBackend
from wal.backends.rocks import RocksBackend, SyncMethod

if TYPE_CHECKING:
    from wal.backends.jetstream import JetStreamBackend


def __getattr__(name: str) -> Any:
    if name == "JetStreamBackend":
        from wal.backends.jetstream import JetStreamBackend  # noqa: PLC0415  (nats-py only when asked for)

        return JetStreamBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["JetStreamBackend", "MemoryBackend", "RocksBackend", "SyncMethod"]
