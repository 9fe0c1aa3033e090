"""The error table: every code has a gRPC status, and an error survives the trip through a status or
an in-band ErrorDetail as the same class with the same code, message and fields."""

from __future__ import annotations

import grpc
import pytest

from streamingnode.status import (
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


def test_every_code_has_a_status() -> None:
    assert set(GRPC_CODE) == set(ErrorCode)
    assert GRPC_CODE[ErrorCode.CHANNEL_NOT_EXIST] is grpc.StatusCode.NOT_FOUND
    assert GRPC_CODE[ErrorCode.TXN_EXPIRED] is grpc.StatusCode.ABORTED


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
