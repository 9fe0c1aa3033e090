"""The error table: every code has a gRPC status, and an error survives the trip through a status or
an in-band ErrorDetail as the same class with the same code, message and fields."""

from __future__ import annotations

import grpc
import pytest

from streamingnode.wire.codes import (
    GRPC_CODE,
    error_class,
    from_error_detail,
    from_rpc_error,
    make_error,
    to_error_detail,
    to_grpc_status,
)
from wal.errors import ChannelNotExistError, ErrorCode, InvalidArgumentError, TxnExpiredError, UnavailableError


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str, trailing: tuple = ()) -> None:
        self._code, self._details, self._trailing = code, details, trailing

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return self._trailing


# Written out by hand, not derived from the code's table: this is the contract a client in any language
# relies on (retry UNAVAILABLE and RESOURCE_EXHAUSTED, never FAILED_PRECONDITION), and a change to it
# must be a change to this test too.
EXPECTED_STATUS = {
    "UNKNOWN": "UNKNOWN",
    "CHANNEL_NOT_EXIST": "NOT_FOUND",
    "CHANNEL_EXIST": "ALREADY_EXISTS",
    "CHANNEL_FENCED": "FAILED_PRECONDITION",
    "ON_SHUTDOWN": "UNAVAILABLE",
    "INVALID_ARGUMENT": "INVALID_ARGUMENT",
    "INVALID_MESSAGE": "INVALID_ARGUMENT",
    "MESSAGE_TOO_LARGE": "INVALID_ARGUMENT",
    "OUT_OF_RANGE": "OUT_OF_RANGE",
    "CORRUPTED": "DATA_LOSS",
    "UNRECOVERABLE": "INTERNAL",
    "UNAVAILABLE": "UNAVAILABLE",
    "RESOURCE_EXHAUSTED": "RESOURCE_EXHAUSTED",
    "TXN_NOT_FOUND": "NOT_FOUND",
    "TXN_EXPIRED": "ABORTED",
    "INVALID_TXN_STATE": "FAILED_PRECONDITION",
    "COLLECTION_NOT_EXIST": "NOT_FOUND",
    "COLLECTION_EXIST": "ALREADY_EXISTS",
    "PARTITION_NOT_EXIST": "NOT_FOUND",
    "PARTITION_EXIST": "ALREADY_EXISTS",
    "SCHEMA_MISMATCH": "INVALID_ARGUMENT",
    "CONSUMER_GROUP_NOT_EXIST": "NOT_FOUND",
    "CONSUMER_GROUP_EXIST": "ALREADY_EXISTS",
    "DEADLINE_EXCEEDED": "DEADLINE_EXCEEDED",
    "REDO": "UNAVAILABLE",
    "UNAUTHENTICATED": "UNAUTHENTICATED",
    "PERMISSION_DENIED": "PERMISSION_DENIED",
    "TXN_TOO_LARGE": "ABORTED",
    "OUT_OF_ORDER_SEQUENCE": "FAILED_PRECONDITION",
    "STORAGE_FULL": "RESOURCE_EXHAUSTED",
    "NOT_OWNER": "FAILED_PRECONDITION",
    "PRODUCER_FENCED": "FAILED_PRECONDITION",
    "DUPLICATE_SEQUENCE_MISMATCH": "FAILED_PRECONDITION",
}


def test_every_code_has_exactly_the_expected_status() -> None:
    assert sorted(EXPECTED_STATUS) == sorted(c.name for c in ErrorCode), "a code was added or removed: pin it here"
    got = {code.name: GRPC_CODE[code].name for code in ErrorCode}
    assert got == EXPECTED_STATUS


@pytest.mark.parametrize("name", sorted(EXPECTED_STATUS))
def test_the_status_a_call_fails_with_is_the_expected_one(name: str) -> None:
    status = to_grpc_status(make_error(ErrorCode[name], "boom"))
    assert status.code.name == EXPECTED_STATUS[name]


@pytest.mark.parametrize("code", list(ErrorCode))
def test_round_trip_through_status_and_detail(code: ErrorCode) -> None:
    err = make_error(code, f"boom {code.name}", {"channel": "p", "txn_id": 7})
    status = to_grpc_status(err)
    assert status.code is GRPC_CODE[code]
    back = from_rpc_error(FakeRpcError(status.code, status.details, status.trailing_metadata))
    assert type(back) is error_class(code) and back.code is code and str(back) == f"boom {code.name}"
    assert back.fields == {"channel": "p", "txn_id": "7"}
    inband = from_error_detail(to_error_detail(err))
    assert type(inband) is type(back) and inband.code is code and inband.retriable == err.retriable


def test_classes_are_the_nodes() -> None:
    assert error_class(ErrorCode.CHANNEL_NOT_EXIST) is ChannelNotExistError
    assert error_class(ErrorCode.INVALID_ARGUMENT) is InvalidArgumentError
    assert error_class(ErrorCode.TXN_EXPIRED) is TxnExpiredError


def test_statuses_made_by_grpc_itself() -> None:
    gone = from_rpc_error(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "Socket closed"))
    assert isinstance(gone, UnavailableError) and gone.retriable
    # The local core's answer to an operation on a call the transport lost: a broken stream.
    lost = from_rpc_error(FakeRpcError(grpc.StatusCode.INTERNAL, "Internal error from Core"))
    assert lost.code is ErrorCode.UNAVAILABLE and lost.retriable
    other = from_rpc_error(FakeRpcError(grpc.StatusCode.INTERNAL, "Exception deserializing request!"))
    assert other.code is ErrorCode.UNKNOWN and not other.retriable
    garbled = from_rpc_error(FakeRpcError(grpc.StatusCode.NOT_FOUND, "x", (("grpc-status-details-bin", b"\xff\x00"),)))
    assert garbled.code is ErrorCode.UNKNOWN and garbled.fields["grpc_status"] == "NOT_FOUND"  # names nothing
