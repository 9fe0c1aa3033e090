"""The boundary between grpc and the SDK: every failure leaves here as a ``StreamingError``.

The node puts its error code into the status (ErrorInfo) or into an in-band ``ErrorDetail``;
``streamingnode.status`` turns either back into the same ``wal.errors`` class the node raised, so a
caller catches ``ChannelNotExistError`` whether it talks to an embedded WAL or to a remote node.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential, wait_random

from streamingnode.status import from_rpc_error
from wal.errors import ErrorCode, StreamingError, UnavailableError

R = TypeVar("R")

# Errors after which opening the stream again is the cure: the transport broke, the node restarted
# (ON_SHUTDOWN), or the channel was reopened under a newer term (CHANNEL_FENCED: a new stream gets the
# new term), or another node owns the pchannel (NOT_OWNER: the Router learned the owner, or resolves
# it again).  Everything else (a missing channel, a bad argument) fails the same way on every attempt.
_RECONNECT = frozenset(
    {
        ErrorCode.UNAVAILABLE,
        ErrorCode.ON_SHUTDOWN,
        ErrorCode.CHANNEL_FENCED,
        ErrorCode.RESOURCE_EXHAUSTED,
        ErrorCode.REDO,
        ErrorCode.NOT_OWNER,
    }
)


def reconnectable(exc: BaseException) -> bool:
    """True when a broken stream should be opened again rather than failed."""
    return isinstance(exc, StreamingError) and exc.code in _RECONNECT


def translate(exc: grpc.RpcError) -> StreamingError:
    """The StreamingError behind a failed call (``raise translate(exc) from exc``)."""
    return from_rpc_error(exc)


async def unary(method: Callable[..., Awaitable[Any]], request: Any, deadline_s: float | None) -> Any:
    """One unary call with a gRPC deadline of ``deadline_s`` seconds; a failed status becomes its
    StreamingError."""
    try:
        return await method(request, timeout=deadline_s)
    except grpc.RpcError as exc:
        raise translate(exc) from exc


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
