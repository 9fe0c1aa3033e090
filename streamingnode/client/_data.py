"""Data calls: collections with an Arrow schema, inserts and upserts of Arrow rows, deletes by primary key, flush.

``client.data(pchannel)`` binds them to a pchannel.  The node checks every insert against the
collection's schema before it reaches the log (SchemaMismatchError, CollectionNotExistError: nothing
written), and the flusher turns what was committed into Parquet.  Inside ``client.txn`` the same calls
exist on the Transaction and commit or roll back together.  ``sharded`` spreads one collection
over several vchannels by primary key (``ShardedCollection``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from streamingnode.client._shards import ShardedCollection
from wal import bodies
from wal.message import AppendResult, Message

if TYPE_CHECKING:
    from streamingnode.client._async import AsyncClient
    from streamingnode.client._producer import Producer


class DataClient:
    """Collections and rows on one pchannel.  Writes go through one idempotent producer."""

    def __init__(self, client: AsyncClient, pchannel: str) -> None:
        self._client = client
        self.pchannel = pchannel
        self._producer: Producer | None = None

    def _writer(self) -> Producer:
        if self._producer is None or self._producer.closed:
            self._producer = self._client.producer(self.pchannel, producer_id=f"data-{uuid.uuid4().hex}", linger=0)
        return self._producer

    async def _send(self, message: Message) -> AppendResult:
        return await self._writer().send(
            message.vchannel, message.payload, properties=dict(message.properties), type=message.message_type)

    async def send_all(self, messages: Sequence[Message]) -> list[AppendResult]:
        """Send ``messages`` together (queued at once, so they batch), in order; their results, once
        every one is durable.  Each message is atomic, the whole is not: on an error some may be
        written (the first error is raised)."""
        writer = self._writer()
        futures = [writer.send_nowait(m.vchannel, m.payload, properties=dict(m.properties), type=m.message_type)
                   for m in messages]
        return list(await asyncio.gather(*futures))

    def sharded(self, vchannel: str, name: str, shards: int, primary_key: str) -> ShardedCollection:
        """Collection ``name`` spread over ``shards`` vchannels ``<vchannel>_0`` .. by a stable hash
        of ``primary_key`` (see ``ShardedCollection``); ``create(schema)`` creates it.  No call is made."""
        return ShardedCollection(self, vchannel, name, shards, primary_key)

    async def create_collection(self, vchannel: str, name: str, schema: pa.Schema, primary_key: str) -> AppendResult:
        """Create ``name`` on ``vchannel`` with ``schema``; ``primary_key`` is an int64 or string column."""
        return await self._send(bodies.create_collection(vchannel, name, schema, primary_key))

    async def drop_collection(self, vchannel: str, name: str) -> AppendResult:
        return await self._send(bodies.drop_collection(vchannel, name))

    async def create_partition(self, vchannel: str, collection: str, partition: str) -> AppendResult:
        return await self._send(bodies.create_partition(vchannel, collection, partition))

    async def drop_partition(self, vchannel: str, collection: str, partition: str) -> AppendResult:
        return await self._send(bodies.drop_partition(vchannel, collection, partition))

    async def insert(
        self, vchannel: str, collection: str, data: pa.RecordBatch | pa.Table,
        partition: str = bodies.DEFAULT_PARTITION,
    ) -> AppendResult:
        """Append the rows of ``data``; durable (and checked against the schema) when it returns."""
        return await self._send(bodies.insert(vchannel, collection, data, partition))

    async def upsert(
        self, vchannel: str, collection: str, data: pa.RecordBatch | pa.Table,
        partition: str = bodies.DEFAULT_PARTITION,
    ) -> AppendResult:
        """Insert the rows of ``data``, each replacing every older version of its primary key (in any
        partition), in one atomic message; a key may appear once.  Durable when it returns."""
        return await self._send(bodies.upsert(vchannel, collection, data, partition))

    async def delete(
        self, vchannel: str, collection: str, keys: pa.Array | pa.ChunkedArray | Sequence[Any],
    ) -> AppendResult:
        """Delete the rows whose primary key is in ``keys`` (rows inserted later stay)."""
        return await self._send(bodies.delete(vchannel, collection, keys))

    async def flush(self, vchannel: str, collection: str | None = None) -> tuple[list[str], int]:
        """Seal what ``vchannel`` (one collection of it) has buffered; returns the Parquet files written
        (relative to the flusher's root) and the flush timetick, once they are durable."""
        return await self._client.flush(self.pchannel, vchannel, collection)

    async def aclose(self) -> None:
        if self._producer is not None:
            await self._producer.aclose()


__all__ = ["DataClient"]
