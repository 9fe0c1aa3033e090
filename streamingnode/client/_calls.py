"""The boundary between grpc and the SDK: every failure leaves here as a ``StreamingError``.

The node puts its error code into the status (ErrorInfo) or into an in-band ``ErrorDetail``;
``streamingnode.wire.codes`` turns either back into the same ``wal.errors`` class the node raised, so a
caller catches ``ChannelNotExistError`` whether it talks to an embedded WAL or to a remote node.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from streamingnode.wire.codes import from_rpc_error
from wal.error_codes import Behaviour, codes_with
from wal.errors import StreamingError, UnavailableError

R = TypeVar("R")

# Errors after which opening the stream again is the cure: the transport broke, the node restarted
# (ON_SHUTDOWN), or the channel was reopened under a newer term (CHANNEL_FENCED: a new stream gets the
# new term), or another node owns the pchannel (NOT_OWNER: the Router learned the owner, or resolves
# it again), or a call ran out of time (DEADLINE_EXCEEDED: a hung node, or one cut off from the shared
# log; what was in flight on a broken stream without a producer_id still fails as of unknown fate).
# Everything else (a missing channel, a bad argument) fails the same way on every attempt.
_RECONNECT = codes_with(Behaviour.RECONNECT)


def reconnectable(exc: BaseException) -> bool:
    """True when a broken stream should be opened again rather than failed."""
    return isinstance(exc, StreamingError) and exc.code in _RECONNECT


def translate(exc: grpc.RpcError) -> StreamingError:
    """The StreamingError behind a failed call (``raise translate(exc) from exc``)."""
    return from_rpc_error(exc)


READY_WAIT_S = 3.0
"""Seconds a unary call keeps trying to reach a node its channel cannot connect to (within its deadline):
long enough for the channel's reconnect backoff (at most 1 s in this SDK) to find a node that was just
restarted, short enough that a node that is really gone is reported (and, in a cluster, left for
another) soon."""

READ_REQUESTS = frozenset({"DescribeChannelsRequest", "DescribeConsumerGroupsRequest", "GetLatestPositionRequest"})
"""Requests of the calls that only read: repeating one after the connection broke under it is harmless."""


def _never_sent(exc: grpc.RpcError) -> bool:
    """True when the call failed because no connection could be made, so the node never saw it.  gRPC
    says so only in its text ("failed to connect to all addresses", from the channel's connectivity
    state), which has been stable across its releases; a call broken after it was sent says otherwise."""
    details = (exc.details() if callable(getattr(exc, "details", None)) else None) or ""
    return _code(exc) == grpc.StatusCode.UNAVAILABLE and "failed to connect" in details


def _code(exc: grpc.RpcError) -> grpc.StatusCode | None:
    code = getattr(exc, "code", None)
    return code() if callable(code) else None


async def unary(method: Callable[..., Awaitable[Any]], request: Any, deadline_s: float | None, *,
                ready_wait: float = READY_WAIT_S) -> Any:
    """One unary call with a gRPC deadline of ``deadline_s`` seconds; a failed status becomes its
    StreamingError.

    Right after a node restarts, the channel may still be backing off from the connections refused
    while it was down, and gRPC fails a call at once with UNAVAILABLE "Connection refused" although
    the node serves.  So a call that could not be sent is tried again (any call: the node never saw
    it), and a read (``READ_REQUESTS``) whose connection broke with UNAVAILABLE is too (repeating it is
    harmless), for at most ``ready_wait`` seconds after the first failure and within the deadline.
    Anything else, and a write that may have reached the node, fails at once.
    """
    loop = asyncio.get_running_loop()
    deadline = None if deadline_s is None else loop.time() + deadline_s
    read = type(request).__name__ in READ_REQUESTS
    give_up: list[float] = []  # ready_wait after the first failure

    def safe_to_repeat(exc: BaseException) -> bool:
        return isinstance(exc, grpc.RpcError) and (
            _never_sent(exc) or (read and _code(exc) == grpc.StatusCode.UNAVAILABLE))

    def past_time(rs: RetryCallState) -> bool:  # a pause that would end past either bound is not taken
        now = loop.time()
        if not give_up:
            give_up.append(now + ready_wait)
        end = now + rs.upcoming_sleep
        return end >= give_up[0] or (deadline is not None and end >= deadline)

    retrying = AsyncRetrying(retry=retry_if_exception(safe_to_repeat), stop=past_time,
                             wait=wait_exponential(multiplier=0.02, max=0.25), reraise=True)
    try:
        async for attempt in retrying:
            with attempt:
                remaining = None if deadline is None else max(deadline - loop.time(), 0.0)
                return await method(request, timeout=remaining)
    except grpc.RpcError as exc:
        raise translate(exc) from exc
    raise AssertionError("unreachable: tenacity either returns or re-raises")  # pragma: no cover


async def write(call: Any, request: Any) -> None:
    """Write one request to a stream.  A stream that already ended refuses writes with a grpc error
    or, in grpc.aio, with ``asyncio.InvalidStateError``; both mean the stream is gone, and its status
    (read from the response side) says why."""
    try:
        await call.write(request)
    except grpc.RpcError as exc:
        raise translate(exc) from exc
    except asyncio.InvalidStateError as exc:
        raise UnavailableError("the stream already ended") from exc


OPEN_TIMEOUT = 10.0
"""Seconds a node has to answer a stream's open.  A stream has no deadline (it lives as long as its
producer or consumer), and a node that accepts connections but does not run (paused, hung) would hold
an open forever: the connection's keepalive only starts once its HTTP/2 handshake is done."""


async def open_stream(call: Any, request: Any, kind: str, pchannel: str) -> Any:
    """Send a bidi stream's open request and return its first response, which must be ``opened``
    within ``OPEN_TIMEOUT`` seconds (else UNAVAILABLE: a new attempt, elsewhere in a cluster, may do);
    whatever fails, the call is cancelled first (a stream half open holds the node's resources)."""
    timeout = OPEN_TIMEOUT
    try:
        async with asyncio.timeout(timeout):
            await write(call, request)
            first = await call.read()
    except grpc.RpcError as exc:
        call.cancel()
        raise translate(exc) from exc
    except TimeoutError:
        call.cancel()
        raise UnavailableError(f"{kind} stream on {pchannel!r}: the node did not answer its open within {timeout:g} s",
                               channel=pchannel) from None
    except BaseException:
        call.cancel()
        raise
    if first is grpc.aio.EOF or first.WhichOneof("response") != "opened":
        call.cancel()
        raise UnavailableError(f"{kind} stream on {pchannel!r} ended before it opened", channel=pchannel)
    return first


async def done_writing(call: Any) -> None:
    """Half-close a stream (see ``write`` for the failures)."""
    try:
        await call.done_writing()
    except grpc.RpcError as exc:
        raise translate(exc) from exc
    except asyncio.InvalidStateError as exc:
        raise UnavailableError("the stream already ended") from exc


async def with_reconnect(connect: Callable[[], Awaitable[R]], deadline_s: float) -> R:
    """Run ``connect`` until it succeeds, backing off between attempts that failed for a reason a new
    attempt can cure, for at most ``deadline_s`` seconds; the last error is raised as is."""
    retrying = AsyncRetrying(
        retry=retry_if_exception(reconnectable),
        stop=stop_after_delay(deadline_s),
        # 50 ms doubling to 1 s, plus jitter so many clients of a restarted node do not reconnect in step
        # (spelled with wait_exponential + wait_random: stable across tenacity versions).
        wait=wait_exponential(multiplier=0.05, max=1.0) + wait_random(0, 0.05),
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            return await connect()
    raise AssertionError("unreachable: tenacity either returns or re-raises")  # pragma: no cover
