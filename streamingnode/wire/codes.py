"""Error codes as gRPC statuses (the table is ``wal.error_codes``), and the conversions both ends of the wire use.

A failed call carries a gRPC status whose code comes from ``GRPC_CODE`` and whose details hold a
``google.rpc.ErrorInfo`` (reason = the ``ErrorCode`` name, domain = ``streamingnode``, metadata = the
error's structured fields).  An error that leaves a stream open travels in-band as an ``ErrorDetail``.
The client turns either back into the same ``StreamingError`` subclass the node raised, so code that
runs against the embedded WAL and code that runs against a remote node catch the same exceptions.
"""

from __future__ import annotations

import re
from typing import Any, cast

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from streamingnode.v1 import common_pb2 as pb
from wal import errors as werr
from wal.error_codes import TABLE
from wal.errors import ErrorCode, StreamingError

DOMAIN = "streamingnode"

# The table of codes (wal.error_codes) names each code's status; here the names become grpc's members.
GRPC_CODE: dict[ErrorCode, grpc.StatusCode] = {code: grpc.StatusCode[rule.grpc_status] for code, rule in TABLE.items()}

# What a status without ErrorInfo (raised by gRPC itself: transport failure, deadline, oversize frame)
# means to the client.
_CODE_OF_STATUS: dict[grpc.StatusCode, ErrorCode] = {
    grpc.StatusCode.UNAVAILABLE: ErrorCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: ErrorCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ErrorCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.INVALID_ARGUMENT: ErrorCode.INVALID_ARGUMENT,
    # Not NOT_FOUND: a node names what is missing (channel, txn, group, ...) in its ErrorInfo; a bare
    # NOT_FOUND comes from something else (a proxy, another service) and stays UNKNOWN.
    grpc.StatusCode.CANCELLED: ErrorCode.UNAVAILABLE,
    grpc.StatusCode.OUT_OF_RANGE: ErrorCode.OUT_OF_RANGE,
    grpc.StatusCode.DATA_LOSS: ErrorCode.CORRUPTED,
    grpc.StatusCode.UNAUTHENTICATED: ErrorCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED: ErrorCode.PERMISSION_DENIED,
}


_LOCAL_CORE_FAILURE = "Internal error from Core"

# gRPC's own refusal of a frame over a receive or send limit (RESOURCE_EXHAUSTED, no ErrorInfo), in the
# words of its core: "Received message larger than max (5000000 vs. 4194304)".  RESOURCE_EXHAUSTED is
# retriable, but the same frame never fits: without this rule a consumer reconnected forever.
_OVERSIZE = re.compile(r"message larger than max \((\d+) vs\. (\d+)\)")


def _classes() -> dict[ErrorCode, type[StreamingError]]:
    """The canonical exception class of each code: the first class of wal.errors that claims it."""
    found: dict[ErrorCode, type[StreamingError]] = {}
    for name in werr.__all__:
        cls = getattr(werr, name)
        if isinstance(cls, type) and issubclass(cls, StreamingError) and cls is not StreamingError:
            found.setdefault(cls.default_code, cls)
    # Several classes carry INVALID_ARGUMENT (ImmutableMessageError sorts first); the general one is
    # what a client should catch.
    found[ErrorCode.INVALID_ARGUMENT] = werr.InvalidArgumentError
    return found


_CLASS_OF_CODE = _classes()


def error_class(code: ErrorCode) -> type[StreamingError]:
    """The exception class raised for ``code`` (StreamingError itself for codes without their own)."""
    return _CLASS_OF_CODE.get(code, StreamingError)


def make_error(code: ErrorCode, message: str, fields: dict[str, Any] | None = None) -> StreamingError:
    return error_class(code)(message, code=code, **(fields or {}))


# gRPC refuses response headers over 16 KiB (the default max_metadata_size) and the client then sees
# RESOURCE_EXHAUSTED, a code it retries, instead of the error.  The status message travels twice (in
# grpc-message, percent-encoded: up to 3 characters per UTF-8 byte, and inside the base64 details), so
# every part is bounded in UTF-8 bytes: at most 1 KiB of message and 2 KiB of metadata stay under
# 8 KiB of headers whatever the error holds.
MAX_MESSAGE_BYTES = 1024
MAX_METADATA_KEYS = 16
MAX_METADATA_KEY_BYTES = 64
MAX_METADATA_VALUE_BYTES = 256
MAX_METADATA_BYTES = 2048


def _cut(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes (on a character boundary), marked when cut."""
    raw = text.encode("utf-8", "backslashreplace")
    if len(raw) <= limit:
        return raw.decode()  # the text itself, with any lone surrogate (unencodable) escaped
    marker = f"... ({len(raw)} bytes)"
    return raw[: limit - len(marker)].decode("utf-8", "ignore") + marker


def bounded_message(err: StreamingError) -> str:
    """The error's message as a status carries it: at most ``MAX_MESSAGE_BYTES``."""
    return _cut(str(err), MAX_MESSAGE_BYTES)


def _metadata(err: StreamingError) -> dict[str, str]:
    """The error's fields as ErrorInfo metadata: each key and value and the whole bounded."""
    out: dict[str, str] = {}
    total = 0
    for k, v in err.fields.items():
        if v is None:
            continue
        if len(out) == MAX_METADATA_KEYS:
            break
        key, value = _cut(str(k), MAX_METADATA_KEY_BYTES), _cut(str(v), MAX_METADATA_VALUE_BYTES)
        size = len(key.encode()) + len(value.encode())
        if total + size > MAX_METADATA_BYTES:
            break
        out[key] = value
        total += size
    return out


def to_grpc_status(err: StreamingError) -> grpc.Status:
    """The status a call fails with: code from the table, ErrorInfo in the details."""
    info = error_details_pb2.ErrorInfo(reason=err.code.name, domain=DOMAIN, metadata=_metadata(err))
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(code=GRPC_CODE[err.code].value[0], message=bounded_message(err), details=[detail])
    return rpc_status.to_status(status)


def to_error_detail(err: StreamingError) -> pb.ErrorDetail:
    """The in-band form, for errors that leave a stream open."""
    code = cast(Any, int(err.code))
    return pb.ErrorDetail(code=code, message=bounded_message(err), metadata=_metadata(err), retriable=err.retriable)


def from_error_detail(detail: pb.ErrorDetail) -> StreamingError:
    try:
        code = ErrorCode(detail.code)
    except ValueError:
        code = ErrorCode.UNKNOWN
    return make_error(code, detail.message, dict(detail.metadata))


def from_rpc_error(exc: grpc.RpcError) -> StreamingError:
    """The StreamingError behind a failed call (a status from the node, or one made by gRPC itself)."""
    code_fn = getattr(exc, "code", None)
    status_code: grpc.StatusCode = code_fn() if callable(code_fn) else grpc.StatusCode.UNKNOWN
    details_fn = getattr(exc, "details", None)
    text = (details_fn() if callable(details_fn) else None) or str(exc)
    status = _rich_status(exc)
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                if info.domain == DOMAIN and info.reason in ErrorCode.__members__:
                    return make_error(ErrorCode[info.reason], status.message or text, dict(info.metadata))
    code = _CODE_OF_STATUS.get(status_code, ErrorCode.UNKNOWN)
    oversize = _OVERSIZE.search(text) if status_code is grpc.StatusCode.RESOURCE_EXHAUSTED else None
    if oversize is not None:
        size, limit = int(oversize[1]), int(oversize[2])
        return make_error(ErrorCode.MESSAGE_TOO_LARGE, (
            f"{status_code.name}: {text}: a {size}-byte gRPC message over the limit of {limit} bytes; not "
            "retried, the same message never fits.  Raise the limit: the SDK's max_receive_bytes= to receive "
            "(it also sets ConsumeOpen.max_response_bytes) or max_message_bytes= to send; other clients: the "
            "channel options grpc.max_receive_message_length / grpc.max_send_message_length"),
            {"grpc_status": status_code.name, "size": size, "limit": limit})
    if status_code is grpc.StatusCode.INTERNAL and text.startswith(_LOCAL_CORE_FAILURE):
        # Made by the local gRPC core when an operation hits a call the transport already lost (the
        # node died mid-stream): a broken connection, so retriable, not a failure of the node.
        code = ErrorCode.UNAVAILABLE
    return make_error(code, f"{status_code.name}: {text}", {"grpc_status": status_code.name})


def _rich_status(exc: grpc.RpcError) -> status_pb2.Status | None:
    # grpc.aio errors carry trailing metadata as an object, sync errors as a tuple; from_call reads both.
    try:
        trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    except Exception:  # noqa: BLE001  (a broken call has no metadata; fall back to the plain status)
        return None
    if not trailing:
        return None
    for key, value in trailing:
        if key == "grpc-status-details-bin":
            status = status_pb2.Status()
            try:
                status.MergeFromString(value)
            except Exception:  # noqa: BLE001  (garbled details: use the plain status)
                return None
            return status
    return None


__all__ = [
    "DOMAIN",
    "GRPC_CODE",
    "MAX_MESSAGE_BYTES",
    "MAX_METADATA_BYTES",
    "bounded_message",
    "error_class",
    "from_error_detail",
    "from_rpc_error",
    "make_error",
    "to_error_detail",
    "to_grpc_status",
]
