"""Transaction: the body of one BeginTxn .. CommitTxn, produced on its own stream."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from streamingnode.client._producer import Producer
from streamingnode.client._types import TxnInfo
from wal import bodies
from wal.errors import InvalidTxnStateError
from wal.message import AppendResult, MessageType

if TYPE_CHECKING:
    from streamingnode.client._async import AsyncClient


class Transaction:
    """An open transaction on one vchannel.  Made by ``AsyncClient.txn``.

    ``send`` appends a body message (ProduceBatch.txn set); readers see the body only after
    ``commit``, whole, at the commit timetick — or never after ``rollback``.  After the ``async with``
    block, ``committed`` (the CommitTxn's AppendResult) and ``commit_timetick`` say when: an as-of read
    at or after that timetick sees the whole body.
    """

    def __init__(self, client: AsyncClient, info: TxnInfo, producer: Producer) -> None:
        self._client = client
        self.info = info
        self._producer = producer
        self._futures: list[asyncio.Future[AppendResult]] = []
        self._finished = False
        self._committed: AppendResult | None = None

    @property
    def txn_id(self) -> int:
        return self.info.txn_id

    def send_nowait(
        self, payload: bytes, *, properties: dict[str, str] | None = None, type: MessageType = MessageType.DATA,
    ) -> asyncio.Future[AppendResult]:
        """Queue a body message; commit waits for every queued one."""
        if self._finished:
            raise InvalidTxnStateError(f"transaction {self.txn_id} is already finished", txn_id=self.txn_id)
        fut = self._producer.send_nowait(self.info.vchannel, payload, properties=properties, type=type)
        self._futures.append(fut)
        return fut

    async def send(
        self, payload: bytes, *, properties: dict[str, str] | None = None, type: MessageType = MessageType.DATA,
    ) -> AppendResult:
        """Append a body message and wait until it is durable (still invisible to readers)."""
        return await self.send_nowait(payload, properties=properties, type=type)

    async def insert(
        self, collection: str, data: pa.RecordBatch | pa.Table, partition: str = bodies.DEFAULT_PARTITION,
    ) -> AppendResult:
        """Insert rows as part of the transaction: visible (and flushed) only once it commits."""
        m = bodies.insert(self.info.vchannel, collection, data, partition)
        return await self.send(m.payload, properties=dict(m.properties), type=m.message_type)

    async def upsert(
        self, collection: str, data: pa.RecordBatch | pa.Table, partition: str = bodies.DEFAULT_PARTITION,
    ) -> AppendResult:
        """Upsert rows as part of the transaction: each replaces the older versions of its key, including
        rows this transaction inserted before it (statements keep their order)."""
        m = bodies.upsert(self.info.vchannel, collection, data, partition)
        return await self.send(m.payload, properties=dict(m.properties), type=m.message_type)

    async def delete(self, collection: str, keys: pa.Array | pa.ChunkedArray | Sequence[Any]) -> AppendResult:
        """Delete by primary key as part of the transaction."""
        m = bodies.delete(self.info.vchannel, collection, keys)
        return await self.send(m.payload, properties=dict(m.properties), type=m.message_type)

    async def commit(self) -> AppendResult:
        """Wait for every body message, then commit.  If a body message failed, the transaction is
        rolled back and that message's error is raised: a transaction is never committed partly."""
        self._check_open()
        await self._producer.flush()
        failed = next((f.exception() for f in self._futures if not f.cancelled() and f.exception() is not None), None)
        if failed is not None:
            with contextlib.suppress(Exception):
                await self.rollback()
            raise failed
        self._finished = True
        try:
            self._committed = await self._client.commit_txn(self.info.pchannel, self.info.vchannel, self.txn_id)
            return self._committed
        finally:
            await self._producer.aclose()

    async def rollback(self) -> AppendResult:
        """Abandon the transaction: readers never see its body."""
        self._check_open()
        self._finished = True
        try:
            await self._producer.flush()
            return await self._client.rollback_txn(self.info.pchannel, self.info.vchannel, self.txn_id)
        finally:
            await self._producer.aclose()

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def committed(self) -> AppendResult | None:
        """The CommitTxn's AppendResult once the transaction committed; None before, or when it was
        rolled back (or its commit failed)."""
        return self._committed

    @property
    def commit_timetick(self) -> int:
        """The timetick at which readers see the whole body; ``InvalidTxnStateError`` unless committed."""
        if self._committed is None:
            state = "rolled back or failed" if self._finished else "still open"
            raise InvalidTxnStateError(f"transaction {self.txn_id} has no commit timetick: it is {state}",
                                       txn_id=self.txn_id)
        return self._committed.timetick

    def _check_open(self) -> None:
        if self._finished:
            raise InvalidTxnStateError(f"transaction {self.txn_id} is already finished", txn_id=self.txn_id)


__all__ = ["Transaction"]
