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
manager; ``msgstream`` is the Milvus MsgStream shape.  Every failure raises the ``StreamingError``
subclass the node raised.

``client.data(pchannel)`` holds collections of Arrow rows (``sharded`` spreads one over several
vchannels by primary key).  Everything a user of the SDK touches is importable from here: the clients, the message model
(``Message``, ``MessageType``, ``Position``, ``MsgPack``, ``AppendResult``), how to read
(``DeliverPolicy``, ``DeliverFilter``), every error class with its ``ErrorCode``, and
``message_links`` (a consumer's span linked to the producers of a pack).
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
from streamingnode.client._shards import ShardedCollection, shard_of
from streamingnode.client._sync import Client, SyncConsumer, SyncMsgStream, SyncProducer, SyncTransaction
from streamingnode.client._sync_data import SyncDataClient, SyncShardedCollection
from streamingnode.client._txn import Transaction
from streamingnode.client._types import ChannelDescription, GroupDescription, GroupProgress, Owner, TxnInfo
from streamingnode.observability.trace_context import message_links
from wal.errors import (
    ChannelExistError,
    ChannelFencedError,
    ChannelNotExistError,
    CodecError,
    CollectionExistError,
    CollectionNotExistError,
    ConsumerGroupExistError,
    ConsumerGroupNotExistError,
    CorruptedError,
    DeadlineExceededError,
    DuplicateSequenceMismatchError,
    ErrorCode,
    ImmutableMessageError,
    InvalidArgumentError,
    InvalidTxnStateError,
    MessageTooLargeError,
    NotOwnerError,
    OnShutdownError,
    OutOfOrderSequenceError,
    OutOfRangeError,
    PartitionExistError,
    PartitionNotExistError,
    PermissionDeniedError,
    ProducerFencedError,
    RedoError,
    ResourceExhaustedError,
    SchemaMismatchError,
    StorageFullError,
    StreamingError,
    TxnExpiredError,
    TxnNotFoundError,
    TxnTooLargeError,
    UnauthenticatedError,
    UnavailableError,
    UnrecoverableError,
)
from wal.message import AppendResult, Message, MessageType, Position
from wal.options import DeliverFilter, DeliverPolicy
from wal.scanner import MsgPack

__all__ = [
    "DEFAULT_ADDR",
    "HASH_KEY_PROPERTY",
    "AppendResult",
    "AsyncClient",
    "ChannelDescription",
    "ChannelExistError",
    "ChannelFencedError",
    "ChannelNotExistError",
    "Client",
    "CodecError",
    "CollectionExistError",
    "CollectionNotExistError",
    "Consumer",
    "ConsumerGroupExistError",
    "ConsumerGroupNotExistError",
    "CorruptedError",
    "DataClient",
    "DeadlineExceededError",
    "DeliverFilter",
    "DeliverPolicy",
    "DuplicateSequenceMismatchError",
    "ErrorCode",
    "GroupDescription",
    "GroupProgress",
    "ImmutableMessageError",
    "InvalidArgumentError",
    "InvalidTxnStateError",
    "Message",
    "MessageTooLargeError",
    "MessageType",
    "MsgPack",
    "MsgStream",
    "MsgStreamPack",
    "NotOwnerError",
    "OnShutdownError",
    "OutOfOrderSequenceError",
    "OutOfRangeError",
    "Owner",
    "PartitionExistError",
    "PartitionNotExistError",
    "PermissionDeniedError",
    "Position",
    "Producer",
    "ProducerFencedError",
    "RedoError",
    "Repack",
    "ResourceExhaustedError",
    "SchemaMismatchError",
    "ShardedCollection",
    "StorageFullError",
    "StreamingError",
    "SyncConsumer",
    "SyncDataClient",
    "SyncMsgStream",
    "SyncProducer",
    "SyncShardedCollection",
    "SyncTransaction",
    "Transaction",
    "TxnExpiredError",
    "TxnInfo",
    "TxnNotFoundError",
    "TxnTooLargeError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnrecoverableError",
    "default_repack",
    "hash_key",
    "message_links",
    "resume_read",
    "shard_of",
]
