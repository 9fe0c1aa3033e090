"""The client's unary call tries again only what is safe (a call never sent; a read whose connection
broke), backing off 0.02 s doubling to 0.25 s, for at most ``ready_wait`` after the first failure and
within the deadline; everything else fails at once as its StreamingError."""

from __future__ import annotations

import grpc
import pytest

from streamingnode.client._calls import unary
from tests.pauses import Scripted, record_pauses
from wal.errors import PermissionDeniedError, UnavailableError

SCHEDULE = [0.02, 0.04, 0.08, 0.16, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25]


class _RpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> None:
        return None


NEVER_SENT = _RpcError(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
BROKEN = _RpcError(grpc.StatusCode.UNAVAILABLE, "Socket closed")
DENIED = _RpcError(grpc.StatusCode.PERMISSION_DENIED, "no")
Write = type("ProduceRequest", (), {})
Read = type("DescribeChannelsRequest", (), {})


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    return record_pauses(monkeypatch)


def _method(*failures: grpc.RpcError) -> tuple[Scripted, list[float | None]]:
    method = Scripted(*failures)
    return method, method.timeouts


async def test_a_call_never_sent_is_tried_again(pauses: list[float]) -> None:
    method, calls = _method(NEVER_SENT, NEVER_SENT)
    assert await unary(method, Write(), None) == "answer"
    assert pauses == [0.02, 0.04] and calls == [None, None, None]


async def test_a_write_whose_connection_broke_fails_at_once(pauses: list[float]) -> None:
    method, calls = _method(BROKEN)
    with pytest.raises(UnavailableError):
        await unary(method, Write(), 10.0)
    assert pauses == [] and len(calls) == 1


async def test_other_errors_fail_at_once_as_their_class(pauses: list[float]) -> None:
    method, calls = _method(DENIED, DENIED)
    with pytest.raises(PermissionDeniedError):
        await unary(method, Read(), 10.0)
    assert pauses == [] and len(calls) == 1


async def test_a_read_is_tried_again_until_ready_wait_passes(pauses: list[float]) -> None:
    method, calls = _method(*[BROKEN] * 100)
    with pytest.raises(UnavailableError):
        await unary(method, Read(), None, ready_wait=0.5)
    assert pauses == SCHEDULE[: len(pauses)] and len(calls) == len(pauses) + 1
    assert sum(pauses) < 0.5  # no pause is taken that would end past the give-up time


async def test_the_deadline_bounds_the_tries(pauses: list[float]) -> None:
    method, calls = _method(*[NEVER_SENT] * 100)
    with pytest.raises(UnavailableError):
        await unary(method, Write(), 0.2, ready_wait=10.0)
    assert pauses == SCHEDULE[: len(pauses)] and sum(pauses) < 0.2
    assert all(t is not None and 0 <= t <= 0.2 for t in calls)
