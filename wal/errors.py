"""One error type for the whole node: a code, structured fields and behaviour flags.

Callers branch on ``code`` or on the predicates (``retriable``, ``is_fenced``), never on message text.
The numeric codes are part of the wire contract (``proto/streamingnode/v1/common.proto``
``ErrorCode``); a test keeps the two in step.  The gRPC status mapping lives with the service, which
is the only layer that speaks gRPC.
"""

from __future__ import annotations

import enum
from typing import Any


class ErrorCode(enum.IntEnum):
    """Why an operation failed.  Values are stable on the wire."""

    UNKNOWN = 0
    CHANNEL_NOT_EXIST = 1
    CHANNEL_EXIST = 2
    CHANNEL_FENCED = 3
    ON_SHUTDOWN = 4
    INVALID_ARGUMENT = 5
    INVALID_MESSAGE = 6
    MESSAGE_TOO_LARGE = 7
    OUT_OF_RANGE = 8
    CORRUPTED = 9
    UNRECOVERABLE = 10
    UNAVAILABLE = 11
    RESOURCE_EXHAUSTED = 12
    TXN_NOT_FOUND = 13
    TXN_EXPIRED = 14
    INVALID_TXN_STATE = 15
    COLLECTION_NOT_EXIST = 16
    COLLECTION_EXIST = 17
    PARTITION_NOT_EXIST = 18
    PARTITION_EXIST = 19
    SCHEMA_MISMATCH = 20
    CONSUMER_GROUP_NOT_EXIST = 21
    CONSUMER_GROUP_EXIST = 22
    DEADLINE_EXCEEDED = 23
    REDO = 24
    UNAUTHENTICATED = 25
    PERMISSION_DENIED = 26
    TXN_TOO_LARGE = 27
    OUT_OF_ORDER_SEQUENCE = 28
    STORAGE_FULL = 29
    NOT_OWNER = 30
    PRODUCER_FENCED = 31
    DUPLICATE_SEQUENCE_MISMATCH = 32


# Codes whose failure is transient: the same request may succeed if tried again (NOT_OWNER: at the
# owner the error names).
_RETRIABLE = frozenset({ErrorCode.UNAVAILABLE, ErrorCode.RESOURCE_EXHAUSTED, ErrorCode.REDO, ErrorCode.STORAGE_FULL,
                        ErrorCode.NOT_OWNER})


class StreamingError(Exception):
    """Base error.  ``fields`` carries structured context (channel, term, txn_id, message_id, path)."""

    default_code: ErrorCode = ErrorCode.UNKNOWN

    def __init__(self, message: str, *, code: ErrorCode | None = None, **fields: Any) -> None:
        super().__init__(message)
        self.code: ErrorCode = code if code is not None else self.default_code
        self.fields: dict[str, Any] = fields
        self.held_seconds: float | None = None
        """Inside the node only: the group committer already held this failed write and tried it
        again, in order, for that long (``wal._committer``), so the redo step must not try its appends
        again one by one.  An attribute, not a field: fields travel to clients, this never does."""

    @property
    def retriable(self) -> bool:
        """True when retrying the same request may succeed."""
        return self.code in _RETRIABLE

    @property
    def is_fenced(self) -> bool:
        return self.code is ErrorCode.CHANNEL_FENCED

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self.fields.items())
        return f"{type(self).__name__}({self.code.name}, {str(self)!r}{extra})"


class ChannelNotExistError(StreamingError):
    """The pchannel does not exist (never created, or destroyed)."""

    default_code = ErrorCode.CHANNEL_NOT_EXIST


class ChannelExistError(StreamingError):
    """A pchannel of that name already exists."""

    default_code = ErrorCode.CHANNEL_EXIST


class ChannelFencedError(StreamingError):
    """A newer owner (a later WAL term) opened the pchannel; this handle may no longer write."""

    default_code = ErrorCode.CHANNEL_FENCED


class OnShutdownError(StreamingError):
    """The WAL (or node) is closing or closed; nothing was written."""

    default_code = ErrorCode.ON_SHUTDOWN


class InvalidArgumentError(StreamingError):
    """The request is malformed or names something in a way the rules refuse; nothing was done."""

    default_code = ErrorCode.INVALID_ARGUMENT


class CodecError(StreamingError):
    """Bytes that do not decode as a message or block of this format."""

    default_code = ErrorCode.INVALID_MESSAGE


class MessageTooLargeError(StreamingError):
    """A message or batch is larger than the limit; nothing was written."""

    default_code = ErrorCode.MESSAGE_TOO_LARGE


class OutOfRangeError(StreamingError):
    """A position before the first retained message (truncated) or after the end of the log."""

    default_code = ErrorCode.OUT_OF_RANGE


class CorruptedError(StreamingError):
    """Stored bytes fail their checksum or do not decode, or a database directory is damaged."""

    default_code = ErrorCode.CORRUPTED


class UnrecoverableError(StreamingError):
    """The WAL hit a storage failure it cannot undo (a failed write or sync); reopen the pchannel."""

    default_code = ErrorCode.UNRECOVERABLE


class TxnNotFoundError(StreamingError):
    """The transaction id is unknown on this pchannel (never begun here, or long finished)."""

    default_code = ErrorCode.TXN_NOT_FOUND


class TxnExpiredError(StreamingError):
    """The transaction was idle longer than its keepalive and can no longer commit."""

    default_code = ErrorCode.TXN_EXPIRED


class InvalidTxnStateError(StreamingError):
    """The transaction exists but is not in a state that allows the operation (e.g. committed)."""

    default_code = ErrorCode.INVALID_TXN_STATE


class CollectionNotExistError(StreamingError):
    """DML or DDL names a collection that does not exist (or was dropped) on the vchannel."""

    default_code = ErrorCode.COLLECTION_NOT_EXIST


class CollectionExistError(StreamingError):
    """A collection of that name already exists on the vchannel."""

    default_code = ErrorCode.COLLECTION_EXIST


class PartitionNotExistError(StreamingError):
    """The partition does not exist (or was dropped) in the collection."""

    default_code = ErrorCode.PARTITION_NOT_EXIST


class PartitionExistError(StreamingError):
    """A partition of that name already exists in the collection."""

    default_code = ErrorCode.PARTITION_EXIST


class SchemaMismatchError(StreamingError):
    """Rows (or a schema) that do not match the collection's schema; nothing was written."""

    default_code = ErrorCode.SCHEMA_MISMATCH


class ConsumerGroupNotExistError(StreamingError):
    """The named consumer group does not exist on the pchannel."""

    default_code = ErrorCode.CONSUMER_GROUP_NOT_EXIST


class ConsumerGroupExistError(StreamingError):
    """A consumer group of that name already exists on the pchannel."""

    default_code = ErrorCode.CONSUMER_GROUP_EXIST


class DeadlineExceededError(StreamingError):
    """The caller's deadline ran out; the operation may or may not have taken effect."""

    default_code = ErrorCode.DEADLINE_EXCEEDED


class UnavailableError(StreamingError):
    """Transient: the node or storage cannot serve right now; retriable."""

    default_code = ErrorCode.UNAVAILABLE


class ResourceExhaustedError(StreamingError):
    """Transient: a limit was hit (in-flight, memory); retriable after backing off."""

    default_code = ErrorCode.RESOURCE_EXHAUSTED


class RedoError(StreamingError):
    """An inner step asks the chain to run again (its state moved under it); retried by redo."""

    default_code = ErrorCode.REDO


class UnauthenticatedError(StreamingError):
    """The call carries no credentials the node accepts (no token, an unknown token)."""

    default_code = ErrorCode.UNAUTHENTICATED


class PermissionDeniedError(StreamingError):
    """The caller is known but lacks the permission the call needs (named in ``permission``)."""

    default_code = ErrorCode.PERMISSION_DENIED


class TxnTooLargeError(StreamingError):
    """A transaction went over its bound on messages or bytes; it was rolled back."""

    default_code = ErrorCode.TXN_TOO_LARGE


class OutOfOrderSequenceError(StreamingError):
    """An idempotent producer's sequence skipped ahead: a batch between was never written here."""

    default_code = ErrorCode.OUT_OF_ORDER_SEQUENCE


class ProducerFencedError(StreamingError):
    """A stream of an idempotent producer's older epoch: a newer open of the same ``producer_id`` took
    over (``fields``: ``producer_id``, ``epoch`` of the stream, ``current_epoch``).  Nothing of the
    batch was written; not retriable: this producer instance is a zombie and must stop."""

    default_code = ErrorCode.PRODUCER_FENCED


class DuplicateSequenceMismatchError(StreamingError):
    """A batch reuses a sequence the node already holds for its producer, with different content
    (``fields``: ``producer_id``, ``sequence``).  Nothing of the batch was written: a resend must be
    the same batch, and new messages need new sequences."""

    default_code = ErrorCode.DUPLICATE_SEQUENCE_MISMATCH


class StorageFullError(StreamingError):
    """Transient: the node's free disk space is under its low-water mark (or a write hit ENOSPC);
    nothing was written.  Retriable: the node frees space (flush, retention) and writes resume by
    themselves once it returns."""

    default_code = ErrorCode.STORAGE_FULL


class NotOwnerError(StreamingError):
    """Cluster mode: another node owns the pchannel.  ``fields``: ``owner`` (its advertised address,
    empty while nobody owns it) and ``term``; retriable at that owner."""

    default_code = ErrorCode.NOT_OWNER


class ImmutableMessageError(StreamingError):
    """A message that already has an id was modified."""

    default_code = ErrorCode.INVALID_ARGUMENT


__all__ = [
    "ChannelExistError",
    "ChannelFencedError",
    "ChannelNotExistError",
    "CodecError",
    "CollectionExistError",
    "CollectionNotExistError",
    "ConsumerGroupExistError",
    "ConsumerGroupNotExistError",
    "CorruptedError",
    "DeadlineExceededError",
    "DuplicateSequenceMismatchError",
    "ErrorCode",
    "ImmutableMessageError",
    "InvalidArgumentError",
    "InvalidTxnStateError",
    "MessageTooLargeError",
    "NotOwnerError",
    "OnShutdownError",
    "OutOfOrderSequenceError",
    "OutOfRangeError",
    "PartitionExistError",
    "PartitionNotExistError",
    "PermissionDeniedError",
    "ProducerFencedError",
    "RedoError",
    "ResourceExhaustedError",
    "SchemaMismatchError",
    "StorageFullError",
    "StreamingError",
    "TxnExpiredError",
    "TxnNotFoundError",
    "TxnTooLargeError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnrecoverableError",
]
