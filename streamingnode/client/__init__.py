"""Client SDK for a streaming node: ``AsyncClient`` (asyncio) and ``Client`` (blocking).

    async with AsyncClient("localhost:19530") as client:
        await client.create_channels(["orders"])
        async with client.producer("orders", producer_id=uuid.uuid4().hex) as producer:
            result = await producer.send("shard-0", b"hello")
        async with client.consumer("orders", "shard-0") as consumer:
            async for pack in consumer:
                ...

Producers batch and pipeline, and with a ``producer_id`` resend across reconnects without
duplicates; consumers resume after a reconnect without loss or duplicates; ``txn`` is a context
manager; ``msgstream`` is the Milvus MsgStream shape.  Every failure raises the ``wal.errors``
``StreamingError`` subclass the node raised.
"""

from streamingnode.client._async import DEFAULT_ADDR, AsyncClient
from streamingnode.client._consumer import Consumer, resume_read
from streamingnode.client._data import DataClient
from streamingnode.client._msgstream import (
    HASH_KEY_PROPERTY,
    MsgStream,
    MsgStreamPack,
    Repack,
    default_repack,
    hash_key,
)
from streamingnode.client._producer import Producer
from streamingnode.client._sync import Client, SyncConsumer, SyncMsgStream, SyncProducer, SyncTransaction
from streamingnode.client._txn import Transaction
from streamingnode.client._types import ChannelDescription, GroupDescription, GroupProgress, Owner, TxnInfo

__all__ = [
    "DEFAULT_ADDR",
    "HASH_KEY_PROPERTY",
    "AsyncClient",
    "ChannelDescription",
    "Client",
    "Consumer",
    "DataClient",
    "GroupDescription",
    "GroupProgress",
    "MsgStream",
    "MsgStreamPack",
    "Owner",
    "Producer",
    "Repack",
    "SyncConsumer",
    "SyncMsgStream",
    "SyncProducer",
    "SyncTransaction",
    "Transaction",
    "TxnInfo",
    "default_repack",
    "hash_key",
    "resume_read",
]
