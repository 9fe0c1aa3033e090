"""The owner lookup (``Router._resolve``) during an outage: a seed that answers DescribeChannels with a
transient error -- DEADLINE_EXCEEDED (a node whose shared log does not answer), UNAVAILABLE, or any
retriable code -- makes the lookup ask the next seed instead of failing the caller; when no seed
answers, the lookup fails with UNAVAILABLE, which a reopening stream retries.  A definite refusal
(a channel that does not exist) still ends it at once.  Each seed gets at most ``lookup_timeout``.

The seeds are fakes that answer as gRPC does: a failed call raises ``grpc.aio.AioRpcError`` with the
status a node (or the transport) gives, which the SDK translates as it does a real one."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from streamingnode.client._routing import LOOKUP_TIMEOUT, Router
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.wire.codes import to_grpc_status
from wal.errors import (
    ChannelNotExistError,
    DeadlineExceededError,
    RedoError,
    StreamingError,
    UnavailableError,
)


def _status_error(code: grpc.StatusCode, details: str, exc: StreamingError | None = None) -> grpc.aio.AioRpcError:
    """What grpc.aio raises for a call that ended with ``code``: with the node's ErrorInfo when ``exc``
    is given (the node refused), without it otherwise (the transport or the deadline ended it)."""
    trailing = grpc.aio.Metadata()
    if exc is not None:
        status = to_grpc_status(exc)
        code, details = status.code, status.details
        trailing = grpc.aio.Metadata(*status.trailing_metadata)
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, details=details)


def _described(pchannel: str, owner: str) -> spb.DescribeChannelsResponse:
    return spb.DescribeChannelsResponse(descriptions=[pb.ChannelDescription(
        channel_name=pchannel, term=3, owner=pb.OwnerDescription(role="streamingnode", address=owner))])


class _Seeds(Router):
    """A Router whose seeds are fakes: ``answers[seed]`` is what that seed's DescribeChannels returns or
    raises, the last one again and again; ``asked`` the seeds asked, in order, with the timeout given."""

    def __init__(self, answers: dict[str, list[object]]) -> None:
        super().__init__(list(answers), lambda addr: (None, None))
        self.answers = answers
        self.asked: list[tuple[str, float | None]] = []

    def stub_at(self, addr: str) -> Any:
        router = self

        class Stub:
            async def DescribeChannels(self, request: spb.DescribeChannelsRequest, timeout: float | None) -> object:
                router.asked.append((addr, timeout))
                queue = router.answers[addr]
                answer = queue.pop(0) if len(queue) > 1 else queue[0]
                if isinstance(answer, BaseException):
                    raise answer
                return answer

        return Stub()


def _deadline() -> grpc.aio.AioRpcError:
    return _status_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")


async def test_a_seed_whose_lookup_times_out_is_passed_for_the_next() -> None:
    router = _Seeds({"a:1": [_deadline()], "b:1": [_described("p", "b:1")]})
    assert await router.owner("p", 30.0) == "b:1"
    assert [seed for seed, _ in router.asked] == ["a:1", "b:1"]
    assert router.cached_owner("p") == "b:1"
    # The next lookup starts after the seed that timed out.
    router.answers["b:1"] = [_described("q", "a:1")]
    assert await router.owner("q", 30.0) == "a:1"
    assert router.asked[-1][0] == "b:1"


async def test_a_node_answering_deadline_exceeded_in_its_status_is_passed_too() -> None:
    # The node's own refusal (ErrorInfo DEADLINE_EXCEEDED: its handler ran out of time on the log).
    refused = _status_error(grpc.StatusCode.OK, "", DeadlineExceededError("DescribeChannels: its deadline ran out"))
    router = _Seeds({"a:1": [refused], "b:1": [refused], "c:1": [_described("p", "a:1")]})
    assert await router.owner("p", 30.0) == "a:1"


@pytest.mark.parametrize("failure", [
    _status_error(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses"),
    _status_error(grpc.StatusCode.OK, "", UnavailableError("NATS did not answer in time")),
    _status_error(grpc.StatusCode.OK, "", RedoError("again")),
], ids=["transport", "node-unavailable", "redo"])
async def test_every_transient_answer_asks_the_next_seed(failure: grpc.aio.AioRpcError) -> None:
    router = _Seeds({"a:1": [failure], "b:1": [_described("p", "b:1")]})
    assert await router.owner("p", 30.0) == "b:1"


async def test_no_seed_answering_fails_as_unavailable_naming_the_seeds() -> None:
    router = _Seeds({"a:1": [_deadline()], "b:1": [_deadline()]})
    with pytest.raises(UnavailableError, match=r"no seed answered for pchannel 'p' \(tried a:1, b:1\)") as info:
        await router.owner("p", 30.0)
    assert isinstance(info.value.__cause__, DeadlineExceededError)
    assert router.cached_owner("p") is None
    router.answers["a:1"] = [_described("p", "a:1")]  # the log answers again
    assert await router.owner("p", 30.0) == "a:1"


async def test_a_definite_refusal_ends_the_lookup_at_once() -> None:
    missing = _status_error(grpc.StatusCode.OK, "", ChannelNotExistError("pchannel 'p' does not exist", channel="p"))
    router = _Seeds({"a:1": [missing], "b:1": [_described("p", "b:1")]})
    with pytest.raises(ChannelNotExistError):
        await router.owner("p", 30.0)
    assert [seed for seed, _ in router.asked] == ["a:1"]


async def test_each_seed_has_at_most_the_lookup_timeout() -> None:
    router = _Seeds({"a:1": [_deadline()], "b:1": [_described("p", "b:1")]})
    await router.owner("p", None)  # no deadline of the caller's: a hung seed must still be left
    # (``unary`` hands on what is left of the deadline: a hair under it.)
    assert [t is not None and LOOKUP_TIMEOUT - 1 < t <= LOOKUP_TIMEOUT for _, t in router.asked] == [True, True]
    router = _Seeds({"a:1": [_described("p", "a:1")]})
    router.seeds.append("b:1")  # two seeds: a cluster, so the lookup is made
    await router.owner("p", 1.5)  # a shorter deadline of the caller's wins
    [(seed, t)] = router.asked
    assert seed == "a:1" and t is not None and 0.5 < t <= 1.5


def test_a_call_that_timed_out_forgets_the_owner_but_is_not_repeated() -> None:
    router = _Seeds({"a:1": [_described("p", "a:1")], "b:1": [_described("p", "a:1")]})
    router._owners["p"] = "a:1"
    assert router.learn("p", "a:1", DeadlineExceededError("the call's deadline ran out")) is False
    assert router.cached_owner("p") is None  # the next call resolves again: a hung owner is not kept
    router._owners["p"] = "a:1"
    assert router.learn("p", "a:1", UnavailableError("gone")) is True
    assert router.cached_owner("p") is None


async def test_a_node_that_failed_a_call_is_not_the_first_seed_the_next_lookup_asks() -> None:
    router = _Seeds({"a:1": [_described("p", "b:1")], "b:1": [_described("p", "b:1")]})
    assert await router.owner("p", 30.0) == "b:1"  # asked of a (the first seed): b owns p
    router.learn("p", "a:1", UnavailableError("a's connection failed its keepalive"))
    router._owners.pop("p", None)
    await router.owner("p", 30.0)
    assert [seed for seed, _ in router.asked] == ["a:1", "b:1"]  # b first now: a may be hung
