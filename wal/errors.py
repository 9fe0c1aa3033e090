"""One error type for the whole node: a code, structured fields and behaviour flags.

Callers branch on ``code`` or on the predicates (``retriable``, ``is_fenced``), never on message text.
The codes, and what each means for behaviour (retriable or not, its gRPC status, ...), are one table
in ``wal.error_codes``; ``ErrorCode`` is importable from here too.
"""

from __future__ import annotations

from typing import Any

from wal.error_codes import RETRIABLE, ErrorCode


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
        return self.code in RETRIABLE

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
