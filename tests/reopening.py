"""A RocksDB-backed streaming WAL of pchannel ``p`` that a test can close and reopen, and the rows
its collections take: shared by the retention and recovery-snapshot tests."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from interceptors.recovery.streaming_wal import ChainConfig, StreamingWAL, open_streaming_wal
from streamingnode.node.retention import RetentionConfig
from wal import WALManager

FAST = ChainConfig(tick_interval=0.01, segment_max_rows=10)
SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("s", pa.string())])


def rows(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(range(start, start + n), pa.int64()),
                            pa.array([f"s{i}" for i in range(start, start + n)])], schema=SCHEMA)


class Opened:
    """A RocksDB manager and the streaming WAL of pchannel ``p``; ``reopen`` restarts both."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.manager_options: dict[str, object] = {}
        self.manager: WALManager | None = None
        self.swal: StreamingWAL | None = None

    async def open(self) -> StreamingWAL:
        self.manager = await WALManager.start_rocksdb(self.path, **self.manager_options)
        if "p" not in await self.manager.list_channels():
            await self.manager.create_channel("p")
        self.swal = await open_streaming_wal(self.manager, "p", FAST)
        await self.swal.ready()
        return self.swal

    async def close(self) -> None:
        if self.swal is not None:
            await self.swal.aclose()
            self.swal = None
        if self.manager is not None:
            await self.manager.aclose()
            self.manager = None

    async def reopen(self) -> StreamingWAL:
        await self.close()
        return await self.open()


BY_HAND = RetentionConfig(retention_seconds=-1, check_seconds=3600, snapshot_every_messages=0,
                          snapshot_every_seconds=0)
"""No truncation, no periodic task: snapshots are taken by hand (``snapshot(force=True)``)."""
