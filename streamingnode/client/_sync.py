"""Client: the AsyncClient API for synchronous code, run on a private event loop thread.

Every object made by the sync client (producer, consumer, transaction, data client, msgstream) is a thin handle on
its async twin, which lives on that loop; calls hop over with ``run_coroutine_threadsafe`` and block
until done.  The handles may be used from several threads: concurrent ``send`` calls from different
threads are batched together like concurrent sends on the async side.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from typing import Any, Literal, TypeVar

import pyarrow as pa

from streamingnode.client._async import DEFAULT_ADDR, AsyncClient
from streamingnode.client._consumer import Consumer
from streamingnode.client._data import DataClient
from streamingnode.client._msgstream import MsgStream, MsgStreamPack, Repack
from streamingnode.client._producer import Producer
from streamingnode.client._sync_data import SyncDataClient
from streamingnode.client._txn import Transaction
from streamingnode.client._types import ChannelDescription, GroupDescription, Owner, TxnInfo
from streamingnode.wire.defaults import (
    CALL_TIMEOUT,
    KEEPALIVE_TIME,
    KEEPALIVE_TIMEOUT,
    MAX_MESSAGE_BYTES,
    RECONNECT_TIMEOUT,
    RESPONSE_BYTES,
)
from wal import bodies
from wal.message import AppendResult, Message, MessageType, Position
from wal.options import DeliverFilter, DeliverPolicy
from wal.scanner import MsgPack

R = TypeVar("R")


class _Portal:
    """A private event loop on a daemon thread, and a way to run coroutines on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="streamingnode-client", daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, R]) -> R:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("a sync client method was called from its own event loop thread")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
        self.loop.close()


def _copy_outcome(src: asyncio.Future[R], dst: concurrent.futures.Future[R]) -> None:
    if src.cancelled():
        dst.cancel()
    elif (exc := src.exception()) is not None:
        dst.set_exception(exc)
    else:
        dst.set_result(src.result())


class SyncProducer:
    """Blocking handle on a ``Producer``."""

    def __init__(self, portal: _Portal, producer: Producer) -> None:
        self._portal = portal
        self._producer = producer

    @property
    def pchannel(self) -> str:
        return self._producer.pchannel

    def send(
        self, vchannel: str, payload: bytes, *, properties: dict[str, str] | None = None,
        type: MessageType = MessageType.DATA, timeout: float | None = None,
    ) -> AppendResult:
        """Append one message; return once it is durable (see ``Producer.send`` for ``timeout``)."""
        return self._portal.call(self._producer.send(vchannel, payload, properties=properties, type=type,
                                                     timeout=timeout))

    def send_nowait(
        self, vchannel: str, payload: bytes, *, properties: dict[str, str] | None = None,
        type: MessageType = MessageType.DATA,
    ) -> concurrent.futures.Future[AppendResult]:
        """Queue one message (in call order); the future resolves once it is durable."""
        out: concurrent.futures.Future[AppendResult] = concurrent.futures.Future()

        async def submit() -> None:
            fut = self._producer.send_nowait(vchannel, payload, properties=properties, type=type)
            fut.add_done_callback(lambda f: _copy_outcome(f, out))

        self._portal.call(submit())
        return out

    def flush(self) -> None:
        self._portal.call(self._producer.flush())

    def close(self) -> None:
        self._portal.call(self._producer.aclose())

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncConsumer:
    """Blocking handle on a ``Consumer``: an iterator of MsgPacks."""

    def __init__(self, portal: _Portal, consumer: Consumer) -> None:
        self._portal = portal
        self._consumer = consumer

    @property
    def position(self) -> Position | None:
        return self._consumer.position

    def wait_opened(self) -> None:
        self._portal.call(self._consumer.wait_opened())

    def __iter__(self) -> Iterator[MsgPack]:
        return self

    def __next__(self) -> MsgPack:
        try:
            return self._portal.call(self._consumer.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def next(self, timeout: float | None = None) -> MsgPack | None:
        """The next pack, or None when ``timeout`` seconds pass first or the read ended."""
        consumer = self._consumer

        async def run() -> MsgPack | None:
            try:
                async with asyncio.timeout(timeout):
                    return await anext(consumer)
            except (TimeoutError, StopAsyncIteration):
                return None

        return self._portal.call(run())

    def ack(self, what: MsgPack | Position | Iterable[Position]) -> None:
        self._portal.call(self._consumer.ack(what))

    def process(self, handler: Callable[[Message], object], *, workers: int = 4,
                key: Callable[[Message], object] | None = None, max_in_flight: int = 1000) -> int:
        """``Consumer.process`` with a plain function, run on ``workers`` threads; blocks until the
        read ends (``close`` from another thread) or the handler raises."""
        return self._portal.call(self._consumer.process(handler, workers=workers, key=key,
                                                        max_in_flight=max_in_flight))

    def close(self) -> None:
        self._portal.call(self._consumer.aclose())

    def __enter__(self) -> SyncConsumer:
        self.wait_opened()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncTransaction:
    """Blocking handle on a ``Transaction``.  After the ``with`` block, ``committed`` and
    ``commit_timetick`` are the commit's (as on the async one)."""

    def __init__(self, portal: _Portal, tx: Transaction) -> None:
        self._portal = portal
        self._tx = tx

    @property
    def txn_id(self) -> int:
        return self._tx.txn_id

    @property
    def info(self) -> TxnInfo:
        return self._tx.info

    def send(
        self, payload: bytes, *, properties: dict[str, str] | None = None, type: MessageType = MessageType.DATA,
    ) -> AppendResult:
        return self._portal.call(self._tx.send(payload, properties=properties, type=type))

    def insert(
        self, collection: str, data: pa.RecordBatch | pa.Table, partition: str = bodies.DEFAULT_PARTITION,
    ) -> AppendResult:
        """Insert rows as part of the transaction (see ``Transaction.insert``)."""
        return self._portal.call(self._tx.insert(collection, data, partition))

    def upsert(
        self, collection: str, data: pa.RecordBatch | pa.Table, partition: str = bodies.DEFAULT_PARTITION,
    ) -> AppendResult:
        """Upsert rows as part of the transaction (see ``Transaction.upsert``)."""
        return self._portal.call(self._tx.upsert(collection, data, partition))

    def delete(self, collection: str, keys: pa.Array | pa.ChunkedArray | Sequence[Any]) -> AppendResult:
        """Delete by primary key as part of the transaction."""
        return self._portal.call(self._tx.delete(collection, keys))

    @property
    def finished(self) -> bool:
        return self._tx.finished

    @property
    def committed(self) -> AppendResult | None:
        return self._tx.committed

    @property
    def commit_timetick(self) -> int:
        return self._tx.commit_timetick

    def commit(self) -> AppendResult:
        return self._portal.call(self._tx.commit())

    def rollback(self) -> AppendResult:
        return self._portal.call(self._tx.rollback())


class SyncMsgStream:
    """Blocking handle on a ``MsgStream``."""

    def __init__(self, portal: _Portal, stream: MsgStream) -> None:
        self._portal = portal
        self._stream = stream

    def as_producer(self, channels: Sequence[str], *, producer_id: str | None = None) -> None:
        async def run() -> None:
            self._stream.as_producer(channels, producer_id=producer_id)

        self._portal.call(run())

    def as_consumer(
        self, channels: Sequence[str], group: str, position: Literal["earliest", "latest"] = "earliest",
    ) -> None:
        self._portal.call(self._stream.as_consumer(channels, group, position))

    def produce(self, messages: Sequence[Message], repack: Repack | None = None) -> list[AppendResult]:
        return self._portal.call(self._stream.produce(messages, repack))

    def broadcast(self, message: Message) -> list[AppendResult]:
        return self._portal.call(self._stream.broadcast(message))

    def consume(self, timeout: float | None = None) -> MsgStreamPack | None:
        """The next pack, or None when ``timeout`` seconds pass first."""
        stream = self._stream

        async def run() -> MsgStreamPack | None:
            try:
                async with asyncio.timeout(timeout):
                    return await stream.consume()
            except TimeoutError:
                return None

        return self._portal.call(run())

    def ack(self, pack: MsgStreamPack) -> None:
        self._portal.call(self._stream.ack(pack))

    def seek(self, positions: Sequence[Position]) -> None:
        self._portal.call(self._stream.seek(positions))

    def close(self) -> None:
        self._portal.call(self._stream.aclose())

    def __enter__(self) -> SyncMsgStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Client:
    """The synchronous client: the same API as ``AsyncClient``, blocking.  Use ``with`` or ``close``.
    ``token``, ``tls_ca``, ``tls_cert``, ``tls_key`` and the keepalive options are as for ``AsyncClient``."""

    def __init__(
        self,
        addr: str | Sequence[str] = DEFAULT_ADDR,
        *,
        timeout: float | None = CALL_TIMEOUT,
        reconnect_timeout: float = RECONNECT_TIMEOUT,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        max_receive_bytes: int = RESPONSE_BYTES,
        options: Sequence[tuple[str, Any]] = (),
        token: str | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        keepalive_time: float | None = KEEPALIVE_TIME,
        keepalive_timeout: float = KEEPALIVE_TIMEOUT,
    ) -> None:
        self._portal = _Portal()

        async def make() -> AsyncClient:
            # grpc.aio channels belong to the loop they are made on.
            return AsyncClient(addr, timeout=timeout, reconnect_timeout=reconnect_timeout,
                               max_message_bytes=max_message_bytes, max_receive_bytes=max_receive_bytes,
                               options=options, token=token, tls_ca=tls_ca,
                               tls_cert=tls_cert, tls_key=tls_key, keepalive_time=keepalive_time,
                               keepalive_timeout=keepalive_timeout)

        try:
            self._client = self._portal.call(make())
        except BaseException:
            self._portal.close()
            raise
        self._closed = False

    @property
    def aio(self) -> AsyncClient:
        """The AsyncClient underneath (usable only on its own loop)."""
        return self._client

    def close(self) -> None:
        """Close producers (draining them), consumers and the connection, then stop the loop thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._portal.call(self._client.aclose())
        finally:
            self._portal.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- admin -----------------------------------------------------------------------------------
    def create_channels(
        self, names: Sequence[str] | None = None, num: int = 0, *, owner: Owner | None = None,
    ) -> list[str]:
        return self._portal.call(self._client.create_channels(names, num, owner=owner))

    def destroy_channels(self, names: Sequence[str]) -> None:
        self._portal.call(self._client.destroy_channels(names))

    def describe_channels(self, names: Sequence[str] = ()) -> list[ChannelDescription]:
        return self._portal.call(self._client.describe_channels(names))

    def create_group(self, pchannel: str, group: str) -> None:
        self._portal.call(self._client.create_group(pchannel, group))

    def destroy_group(self, pchannel: str, group: str) -> None:
        self._portal.call(self._client.destroy_group(pchannel, group))

    def describe_groups(self, pchannel: str = "", groups: Sequence[str] = ()) -> list[GroupDescription]:
        return self._portal.call(self._client.describe_groups(pchannel, groups))

    def seek_group(
        self, pchannel: str, group: str, vchannel: str = "", *,
        policy: DeliverPolicy | None = None, position: Position | None = None,
    ) -> Position:
        return self._portal.call(self._client.seek_group(pchannel, group, vchannel, policy=policy, position=position))

    def latest_position(self, pchannel: str, vchannel: str = "") -> tuple[Position | None, int]:
        return self._portal.call(self._client.latest_position(pchannel, vchannel))

    def flush(self, pchannel: str, vchannel: str, collection: str | None = None) -> tuple[list[str], int]:
        return self._portal.call(self._client.flush(pchannel, vchannel, collection))

    def begin_txn(self, pchannel: str, vchannel: str, keepalive_ms: int = 0) -> TxnInfo:
        return self._portal.call(self._client.begin_txn(pchannel, vchannel, keepalive_ms))

    def commit_txn(self, pchannel: str, vchannel: str, txn_id: int) -> AppendResult:
        return self._portal.call(self._client.commit_txn(pchannel, vchannel, txn_id))

    def rollback_txn(self, pchannel: str, vchannel: str, txn_id: int) -> AppendResult:
        return self._portal.call(self._client.rollback_txn(pchannel, vchannel, txn_id))

    # --- streams ---------------------------------------------------------------------------------
    def producer(self, pchannel: str, **kwargs: Any) -> SyncProducer:
        """See ``AsyncClient.producer`` for the keyword arguments."""
        async def make() -> Producer:
            return self._client.producer(pchannel, **kwargs)

        return SyncProducer(self._portal, self._portal.call(make()))

    def consumer(
        self, pchannel: str, vchannel: str = "", *, policy: DeliverPolicy | None = None,
        filters: Iterable[DeliverFilter] = (), group: str | None = None, max_pack_messages: int = 0,
    ) -> SyncConsumer:
        async def make() -> Consumer:
            return self._client.consumer(pchannel, vchannel, policy=policy, filters=filters, group=group,
                                         max_pack_messages=max_pack_messages)

        return SyncConsumer(self._portal, self._portal.call(make()))

    @contextlib.contextmanager
    def txn(self, pchannel: str, vchannel: str, keepalive_ms: int = 0) -> Iterator[SyncTransaction]:
        """Commits when the block ends normally, rolls back when it raises."""
        scope = self._client.txn(pchannel, vchannel, keepalive_ms)
        tx = self._portal.call(scope.__aenter__())
        try:
            yield SyncTransaction(self._portal, tx)
        except BaseException as exc:
            if not self._portal.call(scope.__aexit__(type(exc), exc, exc.__traceback__)):
                raise
        else:
            self._portal.call(scope.__aexit__(None, None, None))

    def data(self, pchannel: str) -> SyncDataClient:
        """Collections, inserts, deletes and flush on ``pchannel`` (see ``DataClient``), blocking."""
        async def make() -> DataClient:
            return self._client.data(pchannel)

        return SyncDataClient(self._portal, self._portal.call(make()))

    def msgstream(self) -> SyncMsgStream:
        async def make() -> MsgStream:
            return self._client.msgstream()

        return SyncMsgStream(self._portal, self._portal.call(make()))


__all__ = ["Client", "SyncConsumer", "SyncMsgStream", "SyncProducer", "SyncTransaction"]
