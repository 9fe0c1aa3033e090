"""wal: the write-ahead log core — messages, codec, backends, WALs and Scanners.

Lifetime: a Backend outlives the WALManager over it, which outlives every WAL it opened, which
outlives its Scanners.  Nothing here knows about gRPC, interceptors or Parquet.

The names below are loaded on first use (PEP 562), so ``import wal.clock`` or ``import wal.errors``
costs only those modules: the Spark reader and the CLI's ``--help`` need the clock, not RocksDB.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wal._codec import decode_block, encode_block
    from wal._record import decode_message, encode_message
    from wal.backend import Backend, ChannelInfo, Durability
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
    from wal.manager import WALManager
    from wal.message import (
        BROADCAST_VCHANNEL,
        AppendResult,
        Message,
        MessageID,
        MessageType,
        Position,
        TxnContext,
        decode_message_id,
        encode_message_id,
        new_time_tick,
    )
    from wal.options import DeliverFilter, DeliverPolicy, ReadOption
    from wal.scanner import MsgPack, Scanner
    from wal.wal import WAL, WALState

_LAZY = {
    "AppendResult": "wal.message",
    "BROADCAST_VCHANNEL": "wal.message",
    "Backend": "wal.backend",
    "ChannelExistError": "wal.errors",
    "ChannelFencedError": "wal.errors",
    "ChannelInfo": "wal.backend",
    "ChannelNotExistError": "wal.errors",
    "CodecError": "wal.errors",
    "CollectionExistError": "wal.errors",
    "CollectionNotExistError": "wal.errors",
    "ConsumerGroupExistError": "wal.errors",
    "ConsumerGroupNotExistError": "wal.errors",
    "CorruptedError": "wal.errors",
    "DeadlineExceededError": "wal.errors",
    "DuplicateSequenceMismatchError": "wal.errors",
    "DeliverFilter": "wal.options",
    "DeliverPolicy": "wal.options",
    "Durability": "wal.backend",
    "ErrorCode": "wal.errors",
    "ImmutableMessageError": "wal.errors",
    "InvalidArgumentError": "wal.errors",
    "InvalidTxnStateError": "wal.errors",
    "Message": "wal.message",
    "MessageID": "wal.message",
    "MessageTooLargeError": "wal.errors",
    "NotOwnerError": "wal.errors",
    "MessageType": "wal.message",
    "MsgPack": "wal.scanner",
    "OnShutdownError": "wal.errors",
    "OutOfOrderSequenceError": "wal.errors",
    "OutOfRangeError": "wal.errors",
    "PartitionExistError": "wal.errors",
    "PartitionNotExistError": "wal.errors",
    "PermissionDeniedError": "wal.errors",
    "ProducerFencedError": "wal.errors",
    "Position": "wal.message",
    "ReadOption": "wal.options",
    "RedoError": "wal.errors",
    "ResourceExhaustedError": "wal.errors",
    "Scanner": "wal.scanner",
    "SchemaMismatchError": "wal.errors",
    "StorageFullError": "wal.errors",
    "StreamingError": "wal.errors",
    "TxnContext": "wal.message",
    "TxnExpiredError": "wal.errors",
    "TxnNotFoundError": "wal.errors",
    "TxnTooLargeError": "wal.errors",
    "UnauthenticatedError": "wal.errors",
    "UnavailableError": "wal.errors",
    "UnrecoverableError": "wal.errors",
    "WAL": "wal.wal",
    "WALManager": "wal.manager",
    "WALState": "wal.wal",
    "decode_block": "wal._codec",
    "decode_message": "wal._record",
    "decode_message_id": "wal.message",
    "encode_block": "wal._codec",
    "encode_message": "wal._record",
    "encode_message_id": "wal.message",
    "new_time_tick": "wal.message",
}

__all__ = [
    "BROADCAST_VCHANNEL",
    "WAL",
    "AppendResult",
    "Backend",
    "ChannelExistError",
    "ChannelFencedError",
    "ChannelInfo",
    "ChannelNotExistError",
    "CodecError",
    "CollectionExistError",
    "CollectionNotExistError",
    "ConsumerGroupExistError",
    "ConsumerGroupNotExistError",
    "CorruptedError",
    "DeadlineExceededError",
    "DeliverFilter",
    "DeliverPolicy",
    "DuplicateSequenceMismatchError",
    "Durability",
    "ErrorCode",
    "ImmutableMessageError",
    "InvalidArgumentError",
    "InvalidTxnStateError",
    "Message",
    "MessageID",
    "MessageTooLargeError",
    "MessageType",
    "MsgPack",
    "NotOwnerError",
    "OnShutdownError",
    "OutOfOrderSequenceError",
    "OutOfRangeError",
    "PartitionExistError",
    "PartitionNotExistError",
    "PermissionDeniedError",
    "Position",
    "ProducerFencedError",
    "ReadOption",
    "RedoError",
    "ResourceExhaustedError",
    "Scanner",
    "SchemaMismatchError",
    "StorageFullError",
    "StreamingError",
    "TxnContext",
    "TxnExpiredError",
    "TxnNotFoundError",
    "TxnTooLargeError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnrecoverableError",
    "WALManager",
    "WALState",
    "decode_block",
    "decode_message",
    "decode_message_id",
    "encode_block",
    "encode_message",
    "encode_message_id",
    "new_time_tick",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'wal' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
