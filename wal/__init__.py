"""wal: the write-ahead log core — messages, codec, backends, WALs and Scanners.

Lifetime: a Backend outlives the WALManager over it, which outlives every WAL it opened, which
outlives its Scanners.  Nothing here knows about gRPC, interceptors or Parquet.
"""

from wal._codec import decode_block, decode_message, encode_block, encode_message
from wal.backend import Backend, ChannelInfo, Durability
from wal.errors import (
    ChannelExistError,
    ChannelFencedError,
    ChannelNotExistError,
    CodecError,
    CollectionExistError,
    CollectionNotExistError,
    CorruptedError,
    ErrorCode,
    ImmutableMessageError,
    InvalidArgumentError,
    InvalidTxnStateError,
    MessageTooLargeError,
    OnShutdownError,
    OutOfRangeError,
    PartitionExistError,
    PartitionNotExistError,
    RedoError,
    SchemaMismatchError,
    StreamingError,
    TxnExpiredError,
    TxnNotFoundError,
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
    "CorruptedError",
    "DeliverFilter",
    "DeliverPolicy",
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
    "OnShutdownError",
    "OutOfRangeError",
    "PartitionExistError",
    "PartitionNotExistError",
    "Position",
    "ReadOption",
    "RedoError",
    "Scanner",
    "SchemaMismatchError",
    "StreamingError",
    "TxnContext",
    "TxnExpiredError",
    "TxnNotFoundError",
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
