"""The exported surface is what was intended: a name added or dropped is a decision, made here."""

from __future__ import annotations

import importlib
import inspect

import pytest

import wal.errors

CLIENT_ALL = [
    "AppendResult", "AsyncClient", "ChannelDescription", "ChannelExistError", "ChannelFencedError",
    "ChannelNotExistError", "Client", "CodecError", "CollectionExistError", "CollectionNotExistError",
    "Consumer", "ConsumerGroupExistError", "ConsumerGroupNotExistError", "CorruptedError", "DEFAULT_ADDR",
    "DataClient", "DeadlineExceededError", "DeliverFilter", "DeliverPolicy", "DuplicateSequenceMismatchError",
    "ErrorCode", "GroupDescription",
    "GroupProgress", "HASH_KEY_PROPERTY", "ImmutableMessageError", "InvalidArgumentError",
    "InvalidTxnStateError", "Message", "MessageTooLargeError", "MessageType", "MsgPack", "MsgStream",
    "MsgStreamPack", "NotOwnerError", "OnShutdownError", "OutOfOrderSequenceError", "OutOfRangeError", "Owner",
    "PartitionExistError", "PartitionNotExistError", "PermissionDeniedError", "Position", "Producer",
    "ProducerFencedError",
    "RedoError", "Repack", "ResourceExhaustedError", "SchemaMismatchError", "ShardedCollection", "StorageFullError",
    "StreamingError", "SyncConsumer", "SyncDataClient",
    "SyncMsgStream", "SyncProducer", "SyncShardedCollection", "SyncTransaction", "Transaction", "TxnExpiredError",
    "TxnInfo",
    "TxnNotFoundError", "TxnTooLargeError", "UnauthenticatedError", "UnavailableError", "UnrecoverableError",
    "default_repack", "hash_key", "message_links", "resume_read", "shard_of",
]

WAL_ALL = [
    "AppendResult", "BROADCAST_VCHANNEL", "Backend", "ChannelExistError", "ChannelFencedError", "ChannelInfo",
    "ChannelNotExistError", "CodecError", "CollectionExistError", "CollectionNotExistError",
    "ConsumerGroupExistError", "ConsumerGroupNotExistError", "CorruptedError", "DeadlineExceededError",
    "DeliverFilter", "DeliverPolicy", "DuplicateSequenceMismatchError", "Durability", "ErrorCode",
    "ImmutableMessageError",
    "InvalidArgumentError", "InvalidTxnStateError", "Message", "MessageID", "MessageTooLargeError",
    "MessageType", "MsgPack", "NotOwnerError", "OnShutdownError", "OutOfOrderSequenceError", "OutOfRangeError",
    "PartitionExistError", "PartitionNotExistError", "PermissionDeniedError", "Position", "ProducerFencedError",
    "ReadOption",
    "RedoError", "ResourceExhaustedError", "Scanner", "SchemaMismatchError", "StorageFullError", "StreamingError",
    "TxnContext",
    "TxnExpiredError", "TxnNotFoundError", "TxnTooLargeError", "UnauthenticatedError", "UnavailableError",
    "UnrecoverableError", "WAL", "WALManager", "WALState", "decode_block", "decode_message",
    "decode_message_id", "encode_block", "encode_message", "encode_message_id", "new_time_tick",
]

SURFACES = {"streamingnode.client": CLIENT_ALL, "wal": WAL_ALL}


def _error_classes() -> set[str]:
    return {
        name for name, obj in vars(wal.errors).items()
        if inspect.isclass(obj) and issubclass(obj, Exception) and obj.__module__ == "wal.errors"
    }


@pytest.mark.parametrize("module", sorted(SURFACES))
def test_all_is_exactly_the_intended_surface(module: str) -> None:
    assert sorted(importlib.import_module(module).__all__) == SURFACES[module]


@pytest.mark.parametrize("module", sorted(SURFACES))
def test_every_exported_name_resolves(module: str) -> None:
    mod = importlib.import_module(module)
    missing = [name for name in mod.__all__ if not hasattr(mod, name)]
    assert missing == []


@pytest.mark.parametrize("module", sorted(SURFACES))
def test_every_error_class_is_exported(module: str) -> None:
    mod = importlib.import_module(module)
    errors = _error_classes() | {"ErrorCode"}
    assert errors - set(mod.__all__) == set()
    # The same class object, so ``except`` works whichever module the caller imported it from.
    for name in errors:
        assert getattr(mod, name) is getattr(wal.errors, name)


def test_every_sdk_name_is_documented() -> None:
    # ``Repack`` is a type alias: it has no docstring of its own.
    mod = importlib.import_module("streamingnode.client")
    undocumented = [
        name for name in mod.__all__
        if callable(obj := getattr(mod, name)) and name != "Repack" and not obj.__doc__
    ]
    assert undocumented == []


def test_error_classes_are_all_in_wal_errors_all() -> None:
    assert _error_classes() <= set(wal.errors.__all__)
