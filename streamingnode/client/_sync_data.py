"""Blocking handles on the data calls: ``Client.data(pchannel)`` and its sharded collections.

Each method runs its ``DataClient`` / ``ShardedCollection`` twin on the sync client's loop thread and
blocks until it is done; the arguments, results and errors are the async ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from wal import bodies
from wal.message import AppendResult

if TYPE_CHECKING:
    from streamingnode.client._data import DataClient
    from streamingnode.client._shards import ShardedCollection
    from streamingnode.client._sync import _Portal


class SyncShardedCollection:
    """Blocking handle on a ``ShardedCollection`` (made by ``SyncDataClient.sharded``)."""

    def __init__(self, portal: _Portal, collection: ShardedCollection) -> None:
        self._portal = portal
        self._collection = collection

    @property
    def name(self) -> str:
        return self._collection.name

    @property
    def vchannels(self) -> list[str]:
        return self._collection.vchannels

    @property
    def shards(self) -> int:
        return self._collection.shards

    def shard_of(self, key: int | str) -> int:
        return self._collection.shard_of(key)

    def create(self, schema: pa.Schema) -> list[AppendResult]:
        return self._portal.call(self._collection.create(schema))

    def drop(self) -> list[AppendResult]:
        return self._portal.call(self._collection.drop())

    def create_partition(self, partition: str) -> list[AppendResult]:
        return self._portal.call(self._collection.create_partition(partition))

    def drop_partition(self, partition: str) -> list[AppendResult]:
        return self._portal.call(self._collection.drop_partition(partition))

    def insert(self, data: pa.RecordBatch | pa.Table, partition: str = bodies.DEFAULT_PARTITION) -> list[AppendResult]:
        return self._portal.call(self._collection.insert(data, partition))

    def delete(self, keys: pa.Array | pa.ChunkedArray | Sequence[Any]) -> list[AppendResult]:
        return self._portal.call(self._collection.delete(keys))

    def upsert(self, data: pa.RecordBatch | pa.Table, partition: str = bodies.DEFAULT_PARTITION) -> list[AppendResult]:
        return self._portal.call(self._collection.upsert(data, partition))

    def flush(self) -> tuple[list[str], int]:
        return self._portal.call(self._collection.flush())


class SyncDataClient:
    """Blocking handle on a ``DataClient``: collections and rows on one pchannel."""

    def __init__(self, portal: _Portal, data: DataClient) -> None:
        self._portal = portal
        self._data = data

    @property
    def pchannel(self) -> str:
        return self._data.pchannel

    def create_collection(self, vchannel: str, name: str, schema: pa.Schema, primary_key: str) -> AppendResult:
        return self._portal.call(self._data.create_collection(vchannel, name, schema, primary_key))

    def drop_collection(self, vchannel: str, name: str) -> AppendResult:
        return self._portal.call(self._data.drop_collection(vchannel, name))

    def create_partition(self, vchannel: str, collection: str, partition: str) -> AppendResult:
        return self._portal.call(self._data.create_partition(vchannel, collection, partition))

    def drop_partition(self, vchannel: str, collection: str, partition: str) -> AppendResult:
        return self._portal.call(self._data.drop_partition(vchannel, collection, partition))

    def insert(
        self, vchannel: str, collection: str, data: pa.RecordBatch | pa.Table,
        partition: str = bodies.DEFAULT_PARTITION,
    ) -> AppendResult:
        return self._portal.call(self._data.insert(vchannel, collection, data, partition))

    def upsert(
        self, vchannel: str, collection: str, data: pa.RecordBatch | pa.Table,
        partition: str = bodies.DEFAULT_PARTITION,
    ) -> AppendResult:
        return self._portal.call(self._data.upsert(vchannel, collection, data, partition))

    def delete(self, vchannel: str, collection: str, keys: pa.Array | pa.ChunkedArray | Sequence[Any]) -> AppendResult:
        return self._portal.call(self._data.delete(vchannel, collection, keys))

    def flush(self, vchannel: str, collection: str | None = None) -> tuple[list[str], int]:
        return self._portal.call(self._data.flush(vchannel, collection))

    def sharded(self, vchannel: str, name: str, shards: int, primary_key: str) -> SyncShardedCollection:
        """See ``DataClient.sharded``."""
        return SyncShardedCollection(self._portal, self._data.sharded(vchannel, name, shards, primary_key))

    def close(self) -> None:
        self._portal.call(self._data.aclose())

    def __enter__(self) -> SyncDataClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["SyncDataClient", "SyncShardedCollection"]
