"""Error translation: how every handler turns a failure into the status its call ends with.

A ``StreamingError`` becomes a gRPC status through the one table in ``streamingnode.wire.codes``
(ErrorInfo in the details); anything else is a bug, logged with its traceback and answered with
UNKNOWN, and the node keeps serving.  Errors of one produce batch or one consume ack travel in-band
(see ``produce`` and ``consume``) and leave their stream open; these wrappers handle what ends a call.

The wrappers also bind the call's log context (rpc name, request id, pchannel), and the helpers below
translate the rest of what a handler reads from its call: the deadline and required fields.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import structlog
from google.protobuf import message_factory
from google.protobuf.message import DecodeError, Message

from streamingnode.node.memory_trim import Trimmer
from streamingnode.server.refusals import Refusals
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.wire.codes import to_grpc_status
from wal.errors import (
    DeadlineExceededError,
    ErrorCode,
    InvalidArgumentError,
    ResourceExhaustedError,
    StreamingError,
)

log = structlog.get_logger(__name__)

_SERVICE = spb.DESCRIPTOR.services_by_name["StreamingNode"]

R = TypeVar("R")
S = TypeVar("S")
"""The servicer a handler is a method of."""


def internal(exc: BaseException) -> StreamingError:
    """The error a bug is answered with (UNKNOWN), after logging it with its traceback."""
    log.error("unexpected error in RPC", exc_info=exc)
    return StreamingError(f"internal error: {type(exc).__name__}: {exc}", code=ErrorCode.UNKNOWN)


def _request_class(method: str) -> type[Message] | None:
    """The request message class of the service's method ``method`` (None: no such method)."""
    desc = _SERVICE.methods_by_name.get(method)
    return None if desc is None else message_factory.GetMessageClass(desc.input_type)


def unary(
    fn: Callable[[S, Any, grpc.aio.ServicerContext], Awaitable[R]],
) -> Callable[[S, Any, grpc.aio.ServicerContext], Awaitable[R | None]]:
    """Run a unary handler; turn its StreamingError (or a bug) into the status it fails with.

    The wrapper parses the request when it arrives as bytes (``service.add_service`` registers unary
    methods without a deserializer): gRPC turns a deserializer's exception into UNKNOWN, while here an
    unparsable request is answered INVALID_ARGUMENT with ErrorInfo, like every other bad request.
    Before that, a request longer than the servicer's ``max_unary_request_bytes`` is refused
    (RESOURCE_EXHAUSTED) unparsed: a parse would copy it.  ``fn`` always receives the parsed message.
    """
    cls = _request_class(fn.__name__)

    @functools.wraps(fn)
    async def wrapper(self: S, request: Any, context: grpc.aio.ServicerContext) -> R | None:
        # Bound around the whole call, so its refusal (or bug) is logged with its rpc and request_id too.
        with structlog.contextvars.bound_contextvars(rpc=fn.__name__, request_id=request_id(context)):
            return await _unary_trimmed(fn, cls, self, request, context)

    return wrapper


async def _unary_call(fn: Callable[[S, Any, grpc.aio.ServicerContext], Awaitable[R]], cls: type[Message] | None,
                      servicer: S, request: Any, context: grpc.aio.ServicerContext) -> R | None:
    # Each failure becomes its status inside its own except block, where the exception (whose
    # traceback holds the handler's frames, and with them the request) dies with the block: kept in
    # a local, it would form a cycle with this frame (see ``end_call``).
    try:
        if isinstance(request, bytes):
            request = _parse(request, cls, fn.__name__, getattr(servicer, "max_unary_request_bytes", None))
        # pchannel only when the request names one: a line never says pchannel=None.
        pchannel = getattr(request, "pchannel", None)
        with structlog.contextvars.bound_contextvars(**({"pchannel": pchannel} if pchannel else {})):
            return await fn(servicer, request, context)
    except StreamingError as exc:
        # The domain decides what an error means beyond this call (damaged storage fails its pchannel).
        noted = getattr(servicer, "call_failed", None)
        if noted is not None:
            noted(request, exc)
        status = _refusal(servicer, fn.__name__, exc, context)
    except TimeoutError:
        # The caller's deadline (asyncio.timeout_at in a handler) ran out: say so, do not log a bug.
        status = _refusal(servicer, fn.__name__, DeadlineExceededError(
            f"{fn.__name__}: the call's deadline ran out; it may or may not have taken effect"), context)
    except (asyncio.CancelledError, grpc.aio.AbortError):
        raise
    except Exception as exc:  # noqa: BLE001  (a bug must not take the node down; it is logged)
        status = _refusal(servicer, fn.__name__, internal(exc), context)
    del request
    end_call(context, status)
    return None


async def _unary_trimmed(fn: Callable[[S, Any, grpc.aio.ServicerContext], Awaitable[R]], cls: type[Message] | None,
                         servicer: S, request: Any, context: grpc.aio.ServicerContext) -> R | None:
    """``_unary_call``; after a large request (answered or refused), give the buffers gRPC read it into
    back to the system once the burst it came in has passed (``_allocator.Trimmer``)."""
    # Bytes as gRPC handed them over, or the message the authentication layer parsed from them.
    size = len(request) if isinstance(request, bytes) else request.ByteSize() if isinstance(request, Message) else 0
    large = size >= TRIM_AFTER_BYTES
    try:
        return await _unary_call(fn, cls, servicer, request, context)
    finally:
        trimmer: Trimmer | None = getattr(servicer, "trimmer", None)
        if large and trimmer is not None:
            trimmer.soon()


TRIM_AFTER_BYTES = 1 << 20
"""A unary request this long is large: the allocator is trimmed after it (unary requests are small)."""


def _parse(raw: bytes, cls: type[Message] | None, rpc: str, limit: int | None) -> Any:
    """The request of ``rpc`` from its bytes (as they are when ``cls`` is None), refused unparsed when
    longer than ``limit``."""
    if limit is not None and len(raw) > limit:
        raise unary_too_large(rpc, len(raw), limit)
    if cls is None:
        return raw
    try:
        return cls.FromString(raw)
    except DecodeError as exc:
        raise InvalidArgumentError(f"request is not a valid {cls.DESCRIPTOR.name}: {exc}", field="request") from None


def unary_too_large(rpc: str, size: int, limit: int) -> ResourceExhaustedError:
    """The refusal of a unary request of ``size`` bytes over ``limit`` (max_unary_request_bytes)."""
    return ResourceExhaustedError(
        f"{rpc} request of {size} bytes is over max_unary_request_bytes={limit}: unary requests are small "
        "(name fewer channels or groups per call)", limit="max_unary_request_bytes",
        max_unary_request_bytes=limit, rpc=rpc)


def _refusal(servicer: object, rpc: str, err: StreamingError, context: grpc.aio.ServicerContext) -> grpc.Status:
    refused(servicer, rpc, err, context)
    return to_grpc_status(err)


def end_call(context: grpc.aio.ServicerContext, status: grpc.Status) -> None:
    """Set the status the call ends with when its handler returns (a unary handler then returns None:
    gRPC sends no response with a status that is not OK).

    Not ``context.abort_with_status``: that keeps the AbortError it raises on the call's state, and
    the error's traceback holds the handler's frames (the request among their locals) and, through
    them, the context that holds the state.  That cycle is freed only by the cyclic collector, which
    the node runs rarely (``_process.tune_gc``): refused requests stayed in memory, round after round.
    """
    context.set_code(status.code)
    context.set_details(status.details)
    context.set_trailing_metadata(status.trailing_metadata)


def stream_errors(
    fn: Callable[[S, Any, grpc.aio.ServicerContext], Awaitable[None]],
) -> Callable[[S, Any, grpc.aio.ServicerContext], Awaitable[None]]:
    """Run a streaming handler; end its call with the status of the error that stopped it."""

    @functools.wraps(fn)
    async def wrapper(self: S, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        # The handler runs in a task of its own: what it binds (pchannel and term, once open) stays
        # with this call and the tasks it starts.
        structlog.contextvars.bind_contextvars(rpc=fn.__name__, request_id=request_id(context))
        # As in ``unary``: the status is made inside each except block, so the exception (and the
        # requests its traceback's frames hold) is freed with it, and the call ends without an abort.
        try:
            await fn(self, request_iterator, context)
        except StreamingError as exc:
            status = None if context.done() else _refusal(self, fn.__name__, exc, context)
        except DecodeError as exc:
            status = None if context.done() else _refusal(
                self, fn.__name__, InvalidArgumentError(f"request is not a valid {fn.__name__}Request: {exc}"), context)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:  # noqa: BLE001  (a bug ends the call, not the node)
            # When the client went away (cancelled, deadline) while we wrote, there is nobody to tell.
            status = None if context.done() else _refusal(self, fn.__name__, internal(exc), context)
        else:
            return
        # A stream ended by an error may have been refused a large request (an open of 60 MiB is read
        # whole before it is refused): the allocator gives its buffers back after the burst.
        trimmer: Trimmer | None = getattr(self, "trimmer", None)
        if trimmer is not None:
            trimmer.soon()
        if status is not None:
            end_call(context, status)

    return wrapper


def refused(servicer: object, rpc: str, err: StreamingError, context: grpc.aio.ServicerContext,
            *, in_band: bool = False) -> None:
    """Count and log a refusal answered to the caller (``refusals``), when the servicer keeps them."""
    refusals: Refusals | None = getattr(servicer, "refusals", None)
    if refusals is not None:
        refusals.note(rpc, err, context.peer() or "", in_band=in_band)


_call_ids = itertools.count(1)


def request_id(context: grpc.aio.ServicerContext) -> str:
    """The caller's ``x-request-id`` metadata when it sent one (to follow a call across services),
    else a number unique in this process; bound to every log line of the call."""
    for key, value in context.invocation_metadata() or ():
        if key == "x-request-id" and isinstance(value, str):
            return value[:128]
    return str(next(_call_ids))


def call_deadline(context: grpc.aio.ServicerContext) -> float | None:
    """The call's deadline on the event loop's clock (None: the caller set none)."""
    remaining = context.time_remaining()
    return None if remaining is None else asyncio.get_running_loop().time() + remaining


def require(value: str, field: str) -> str:
    """``value``, or INVALID_ARGUMENT naming ``field`` when the request left it empty."""
    if not value:
        raise InvalidArgumentError(f"{field} is required", field=field)
    return value


__all__ = ["call_deadline", "end_call", "internal", "refused", "request_id", "require", "stream_errors", "unary",
           "unary_too_large"]
