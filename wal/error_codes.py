"""Every error code and what it means for behaviour, in one table.

A code's row says how the node and the client act on it: its gRPC status on the wire, whether
retrying the same request may succeed, whether a client opens a broken stream again, and so on (the
``Behaviour`` flags, one per decision somebody takes on a code).  The modules that act on a code read
the set of codes they need from here (``codes_with``) rather than keeping a list of their own, so two
of them can no longer disagree about a code by accident, and a new code is decided in one place.

``ErrorCode`` values are part of the wire contract (``proto/streamingnode/v1/common.proto``
``ErrorCode``; a test keeps the two in step).  The gRPC status is named here as text: the WAL speaks no
gRPC, ``streamingnode.wire.codes`` turns the names into ``grpc.StatusCode`` members.
"""

from __future__ import annotations

import enum
from typing import NamedTuple


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


class Behaviour(enum.Flag):
    """What a code makes somebody do; each flag names the module that acts on it."""

    NONE = 0
    RETRIABLE = enum.auto()
    """The same request may succeed if tried again (``StreamingError.retriable``)."""
    NOT_REDONE = enum.auto()
    """Retriable, but the redo step hands it straight back (``interceptors.redo``): it clears in
    seconds to minutes, not within the step's backoff, and the client backs off on its own."""
    RECONNECT = enum.auto()
    """The client opens a broken stream again rather than failing it (``client._calls.reconnectable``)."""
    NODE_GONE = enum.auto()
    """The client forgets the node as the owner and asks the seeds again (``client._routing``)."""
    ENDS_PRODUCE_STREAM = enum.auto()
    """The node ends a produce stream after answering a batch with it (``server.produce``): the
    channel changed owner or went away, the node is closing, or the stream's producer was fenced."""
    RESEND_ON_NEW_STREAM = enum.auto()
    """Sent in band just before the stream ends, with nothing of the batch written: an idempotent
    producer resends the batch on its next stream (``client._producer``)."""
    ROUTINE = enum.auto()
    """A healthy node answers it in normal operation (a drain, a channel reopened or moved): the
    refusal is logged at INFO, not WARNING (``server.refusals``)."""
    OUTCOME_UNKNOWN = enum.auto()
    """The request may or may not have taken effect (its deadline ran out first).  Not ``RETRIABLE``:
    a write is repeated only where the repeat is recognised (an idempotent producer's batch, which the
    node's dedup answers with the first result, ``client._sender``), never silently otherwise; a
    read, which any node may answer, is asked of the next one (``client._routing``)."""


class CodeRule(NamedTuple):
    """One row: the gRPC status (a ``grpc.StatusCode`` name) and the behaviour."""

    grpc_status: str
    behaviour: Behaviour = Behaviour.NONE


_B = Behaviour
TABLE: dict[ErrorCode, CodeRule] = {
    ErrorCode.UNKNOWN: CodeRule("UNKNOWN"),
    ErrorCode.CHANNEL_NOT_EXIST: CodeRule("NOT_FOUND", _B.ENDS_PRODUCE_STREAM),
    ErrorCode.CHANNEL_EXIST: CodeRule("ALREADY_EXISTS"),
    # Retrying as is cannot help: the caller must reopen (a newer owner holds the channel).
    ErrorCode.CHANNEL_FENCED: CodeRule(
        "FAILED_PRECONDITION", _B.RECONNECT | _B.ENDS_PRODUCE_STREAM | _B.RESEND_ON_NEW_STREAM | _B.ROUTINE),
    ErrorCode.ON_SHUTDOWN: CodeRule(
        "UNAVAILABLE",
        _B.RECONNECT | _B.NODE_GONE | _B.ENDS_PRODUCE_STREAM | _B.RESEND_ON_NEW_STREAM | _B.ROUTINE),
    ErrorCode.INVALID_ARGUMENT: CodeRule("INVALID_ARGUMENT"),
    ErrorCode.INVALID_MESSAGE: CodeRule("INVALID_ARGUMENT"),
    # Not RESOURCE_EXHAUSTED: that code tells clients to retry, and the same message never fits.
    ErrorCode.MESSAGE_TOO_LARGE: CodeRule("INVALID_ARGUMENT"),
    ErrorCode.OUT_OF_RANGE: CodeRule("OUT_OF_RANGE"),
    ErrorCode.CORRUPTED: CodeRule("DATA_LOSS"),
    ErrorCode.UNRECOVERABLE: CodeRule("INTERNAL"),
    ErrorCode.UNAVAILABLE: CodeRule("UNAVAILABLE", _B.RETRIABLE | _B.RECONNECT | _B.NODE_GONE),
    ErrorCode.RESOURCE_EXHAUSTED: CodeRule("RESOURCE_EXHAUSTED", _B.RETRIABLE | _B.RECONNECT),
    ErrorCode.TXN_NOT_FOUND: CodeRule("NOT_FOUND"),
    ErrorCode.TXN_EXPIRED: CodeRule("ABORTED"),
    ErrorCode.INVALID_TXN_STATE: CodeRule("FAILED_PRECONDITION"),
    ErrorCode.COLLECTION_NOT_EXIST: CodeRule("NOT_FOUND"),
    ErrorCode.COLLECTION_EXIST: CodeRule("ALREADY_EXISTS"),
    ErrorCode.PARTITION_NOT_EXIST: CodeRule("NOT_FOUND"),
    ErrorCode.PARTITION_EXIST: CodeRule("ALREADY_EXISTS"),
    ErrorCode.SCHEMA_MISMATCH: CodeRule("INVALID_ARGUMENT"),
    ErrorCode.CONSUMER_GROUP_NOT_EXIST: CodeRule("NOT_FOUND"),
    ErrorCode.CONSUMER_GROUP_EXIST: CodeRule("ALREADY_EXISTS"),
    # A stream that broke with it is opened again (what was in flight without a producer_id fails as
    # of unknown fate, as after any break); a lookup asks the next node.
    ErrorCode.DEADLINE_EXCEEDED: CodeRule("DEADLINE_EXCEEDED", _B.RECONNECT | _B.OUTCOME_UNKNOWN),
    ErrorCode.REDO: CodeRule("UNAVAILABLE", _B.RETRIABLE | _B.RECONNECT),
    ErrorCode.UNAUTHENTICATED: CodeRule("UNAUTHENTICATED"),
    ErrorCode.PERMISSION_DENIED: CodeRule("PERMISSION_DENIED"),
    # The transaction was rolled back (as an expired one is): begin a smaller one.
    ErrorCode.TXN_TOO_LARGE: CodeRule("ABORTED"),
    # Not retriable as is: a batch between was never written, the producer must resend from it.
    ErrorCode.OUT_OF_ORDER_SEQUENCE: CodeRule("FAILED_PRECONDITION"),
    # Retriable: the node frees space (forced flush, retention) and accepts writes again by itself.
    ErrorCode.STORAGE_FULL: CodeRule("RESOURCE_EXHAUSTED", _B.RETRIABLE | _B.NOT_REDONE),
    # Cluster mode: retriable at the owner named in the ErrorInfo (clients follow it).
    ErrorCode.NOT_OWNER: CodeRule(
        "FAILED_PRECONDITION", _B.RETRIABLE | _B.RECONNECT | _B.RESEND_ON_NEW_STREAM | _B.ROUTINE),
    # A newer open of the producer_id took over: this producer must stop, retrying cannot help.
    ErrorCode.PRODUCER_FENCED: CodeRule("FAILED_PRECONDITION", _B.ENDS_PRODUCE_STREAM),
    # A reused sequence with other content: the batch is not the resend it claims to be.
    ErrorCode.DUPLICATE_SEQUENCE_MISMATCH: CodeRule("FAILED_PRECONDITION"),
}


def codes_with(behaviour: Behaviour) -> frozenset[ErrorCode]:
    """The codes whose row has every flag of ``behaviour``."""
    return frozenset(code for code, rule in TABLE.items() if behaviour in rule.behaviour)


RETRIABLE = codes_with(Behaviour.RETRIABLE)
"""Codes whose failure is transient: the same request may succeed if tried again (NOT_OWNER: at the
owner the error names)."""


__all__ = ["RETRIABLE", "TABLE", "Behaviour", "CodeRule", "ErrorCode", "codes_with"]
