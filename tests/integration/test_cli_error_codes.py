"""The CLI decides on error codes, never on message text, and does not guess codes a status lacks.

Each test puts a stand-in gRPC server in front of the CLI that answers every call with one status,
as a proxy, a foreign service on the node's port, or a node would.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import pytest

from streamingnode.client import Client
from streamingnode.wire.codes import to_grpc_status
from wal.errors import ErrorCode, StreamingError, UnavailableError

pytestmark = pytest.mark.integration

TIMEOUT = 30


class _AnswerEveryCall(grpc.GenericRpcHandler):
    def __init__(self, answer: Callable[[grpc.ServicerContext], None]) -> None:
        self._answer = answer

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
            self._answer(context)
            raise AssertionError("the answer aborts the call")

        return grpc.unary_unary_rpc_method_handler(handle)


def _serve(answer: Callable[[grpc.ServicerContext], None]) -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((_AnswerEveryCall(answer),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None).wait()


@pytest.fixture
def bare_not_found() -> Iterator[str]:
    """A server whose every call fails NOT_FOUND with no ErrorInfo: not a node's answer."""
    yield from _serve(lambda context: context.abort(grpc.StatusCode.NOT_FOUND, "no route to that method"))


@pytest.fixture
def node_unavailable() -> Iterator[str]:
    """A server that answers as a node does (ErrorInfo with the code) with UNAVAILABLE, in words
    that happen to speak of connecting and of refusals."""
    err = UnavailableError("the channel's owner refused the hand-off; connect again once it settled")
    yield from _serve(lambda context: context.abort_with_status(to_grpc_status(err)))


def _cli(addr: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streamingnode", *args, "--addr", addr], capture_output=True,
                          text=True, timeout=TIMEOUT, check=False)


def _error_of(addr: str) -> StreamingError:
    with Client(addr) as client, pytest.raises(StreamingError) as err:
        client.describe_channels(["p"])
    return err.value


def test_a_bare_not_found_is_not_taken_for_a_missing_channel(bare_not_found: str) -> None:
    err = _error_of(bare_not_found)
    assert err.code is ErrorCode.UNKNOWN
    assert err.fields["grpc_status"] == "NOT_FOUND"  # what the transport said is kept, as a field

    proc = _cli(bare_not_found, "channels", "describe", "p")
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: UNKNOWN: NOT_FOUND: ")
    assert "CHANNEL_NOT_EXIST" not in proc.stderr


def test_the_hint_follows_the_code_not_the_words(node_unavailable: str) -> None:
    err = _error_of(node_unavailable)
    assert err.code is ErrorCode.UNAVAILABLE and "grpc_status" not in err.fields  # the node answered

    proc = _cli(node_unavailable, "channels", "list")
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: UNAVAILABLE: the channel's owner refused the hand-off")
    assert "hint:" not in proc.stderr  # a node answered: asking whether one runs there would mislead

