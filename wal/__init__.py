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
    CorruptedError,
    ErrorCode,
    ImmutableMessageError,
    InvalidArgumentError,
    MessageTooLargeError,
    OnShutdownError,
    OutOfRangeError,
    StreamingError,
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
    "CorruptedError",
    "DeliverFilter",
    "DeliverPolicy",
    "Durability",
    "ErrorCode",
    "ImmutableMessageError",
    "InvalidArgumentError",
    "Message",
    "MessageID",
    "MessageTooLargeError",
    "MessageType",
    "MsgPack",
    "OnShutdownError",
    "OutOfRangeError",
    "Position",
    "ReadOption",
    "Scanner",
    "StreamingError",
    "TxnContext",
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
