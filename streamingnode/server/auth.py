"""Bearer-token authentication and per-pchannel permissions, as one grpc.aio server interceptor.

The tokens file (TOML, ``NodeConfig.auth_tokens``) holds only SHA-256 hashes of tokens, each with a
principal and its permissions::

    [[token]]
    principal = "ingest"
    sha256 = "<64 hex digits: streamingnode token hash < token-file>"
    permissions = ["produce:orders-*", "consume:*"]

A permission is ``admin``, ``produce:<glob>``, ``consume:<glob>`` or ``consume:<glob>:<group glob>``,
each glob matched as ``fnmatch.fnmatchcase`` does (the first against the pchannel name, the second
against a consumer group's).  ``RULES`` says which permission each RPC needs.

Consumer groups are shared: whoever reads with a group moves its position for every reader of it.
``consume:<glob>:<group glob>`` grants reading the pchannels and using the groups the group glob
names there (an empty group glob names none: reading without a group only).  A token that has at
least one such rule may use only the groups its rules name; a token with none (every token written
before group rules existed) keeps the behaviour documented for it then: any group of the pchannels
it may consume.

Clients send ``authorization: Bearer <token>``.  The interceptor sees only the method and the
metadata, so it authenticates there (one hash and one dict lookup per call) and, for RPCs whose
permission depends on a pchannel, wraps the handler's behaviour to check it against the request: a
unary request as it arrives; a stream's first request (its ``open``) by handing the handler a context
whose first ``read`` checks and then steps aside, so later reads cost nothing extra.  Health and
reflection are other services and pass untouched.  The token itself is never stored, logged, or put
into an error; only its hash is kept.

A call refused from its metadata alone (no token, an unknown one, an admin RPC without ``admin``) is
answered before its request is read (``_refused``); refusals end the call by setting its status, never
by an abort, whose kept exception would hold the request in a reference cycle (``errors.end_call``).
The tokens file must not be writable by group or others.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import fnmatch
import functools
import hashlib
import os
import re
import stat
import tomllib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.message import DecodeError, Message

from streamingnode.node.memory_trim import Trimmer
from streamingnode.server.errors import TRIM_AFTER_BYTES, end_call
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.wire.codes import to_grpc_status
from wal.errors import InvalidArgumentError, PermissionDeniedError, StreamingError, UnauthenticatedError

_SERVICE = spb.DESCRIPTOR.services_by_name["StreamingNode"]
_PREFIX = f"/{_SERVICE.full_name}/"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_ENTRY_KEYS = ("principal", "sha256", "permissions")
_BEARER = "bearer "
_REFUSAL_READ_SECONDS = 5.0


class Need(enum.Enum):
    """What an RPC needs: a permission on its request's pchannel, or ``admin``."""

    PRODUCE = "produce"
    CONSUME = "consume"
    ADMIN = "admin"
    # DescribeChannels: any permission on every named pchannel (a producer's or consumer's probe that
    # its channel exists); naming none means every channel, which needs admin.
    DESCRIBE = "describe"
    # DescribeConsumerGroups: consume on the pchannel (a group consumer reads its committed position);
    # an empty pchannel means every pchannel, which needs admin.
    CONSUME_OR_ALL = "consume-or-all"


RULES: Mapping[str, Need] = {
    "Produce": Need.PRODUCE,
    "BeginTxn": Need.PRODUCE,
    "CommitTxn": Need.PRODUCE,
    "RollbackTxn": Need.PRODUCE,
    "Consume": Need.CONSUME,
    "GetLatestPosition": Need.CONSUME,
    "DescribeConsumerGroups": Need.CONSUME_OR_ALL,
    "DescribeChannels": Need.DESCRIBE,
    "CreateChannels": Need.ADMIN,
    "DestroyChannels": Need.ADMIN,
    "CreateConsumerGroup": Need.ADMIN,
    "DestroyConsumerGroup": Need.ADMIN,
    "SeekConsumerGroup": Need.ADMIN,
    "Flush": Need.ADMIN,
    "Backup": Need.ADMIN,
}
"""The permission each RPC of ``streaming.proto`` needs (a test keeps it covering all of them)."""


def hash_token(token: str) -> str:
    """The hex SHA-256 of ``token`` (UTF-8): what the tokens file stores."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a token stands for and what it may do (patterns are pchannel globs)."""

    name: str
    admin: bool = False
    produce: tuple[str, ...] = ()
    consume: tuple[str, ...] = ()
    groups: tuple[tuple[str, str], ...] | None = None
    """(pchannel glob, group glob) of each ``consume:<glob>:<group glob>`` rule; None when the token
    has none, and so may use any group of the pchannels it may consume (the rule before groups had
    permissions of their own)."""

    def may(self, action: Need, pchannel: str) -> bool:
        """True when ``action`` (PRODUCE or CONSUME) on ``pchannel`` is allowed.  admin is not a
        superset: an operator token does not also write data unless it says so."""
        patterns = self.produce if action is Need.PRODUCE else self.consume
        return any(fnmatch.fnmatchcase(pchannel, p) for p in patterns)

    def may_use_group(self, pchannel: str, group: str) -> bool:
        """True when this principal may read with (and so commit) consumer group ``group`` on
        ``pchannel``; consuming the pchannel is checked separately (``may``)."""
        if self.groups is None:
            return True
        return any(fnmatch.fnmatchcase(pchannel, p) and fnmatch.fnmatchcase(group, g) for p, g in self.groups)

    def _group_denial(self, pchannel: str, groups: list[str], what: str) -> StreamingError | None:
        for group in groups:
            if not self.may_use_group(pchannel, group):
                return self._denied(f"consume:{pchannel}:{group}", pchannel, what)
        return None

    def denial(self, need: Need, request: Any) -> StreamingError | None:
        """Why this principal may not make the call ``request`` (None: it may)."""
        if need is Need.ADMIN:
            return None if self.admin else self._denied("admin", None)
        if need is Need.DESCRIBE:
            names = list(request.channel_names)
            if not names:
                return None if self.admin else self._denied("admin", None, "describing every pchannel")
            for name in names:
                if not (self.admin or self.may(Need.PRODUCE, name) or self.may(Need.CONSUME, name)):
                    return self._denied(f"produce:{name} or consume:{name}", name)
            return None
        if need is Need.CONSUME_OR_ALL:
            if not request.pchannel:
                return None if self.admin else self._denied("admin", None, "describing the groups of every pchannel")
            if not self.may(Need.CONSUME, request.pchannel):
                return self._denied(f"consume:{request.pchannel}", request.pchannel)
            if not request.groups and self.groups is not None:
                # Listing every group would name other teams' groups and positions.
                return self._denied(f"consume:{request.pchannel}:*", request.pchannel,
                                    "describing every group of the pchannel: name the groups")
            return self._group_denial(request.pchannel, list(request.groups), "consumer group")
        streamed = isinstance(request, (spb.ProduceRequest, spb.ConsumeRequest))
        pchannel: str = request.open.pchannel if streamed else request.pchannel
        if not self.may(need, pchannel):
            return self._denied(f"{need.value}:{pchannel}", pchannel)
        if need is Need.CONSUME and streamed and request.open.consumer_group:
            return self._group_denial(pchannel, [request.open.consumer_group], "consumer group")
        return None

    def _denied(self, permission: str, pchannel: str | None, what: str = "") -> PermissionDeniedError:
        shown = permission if len(permission) <= 200 else permission[:200] + "..."
        target = f" ({what})" if what else ""
        fields: dict[str, Any] = {"permission": shown, "principal": self.name}
        if pchannel is not None:
            fields["pchannel"] = pchannel[:200]
        return PermissionDeniedError(f"principal {self.name!r} lacks permission {shown!r}{target}", **fields)


class TokenTable:
    """The tokens file, loaded: token hash → principal."""

    def __init__(self, principals: Mapping[str, Principal]) -> None:
        self._by_hash = dict(principals)

    def __repr__(self) -> str:
        return f"TokenTable({len(self._by_hash)} tokens)"

    def authenticate(self, token: str) -> Principal | None:
        """The principal of ``token``, or None when it is unknown."""
        return self._by_hash.get(hash_token(token))

    def __len__(self) -> int:
        return len(self._by_hash)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TokenTable:
        """Read and check a tokens file; INVALID_ARGUMENT naming the entry and the problem.  A file that
        group or others may write is refused, as ssh refuses such a key: whoever may write it may give
        themselves an admin token."""
        where = f"tokens file {os.fspath(path)!r}"
        try:
            with open(path, "rb") as f:
                _check_mode(os.fstat(f.fileno()).st_mode, where, os.fspath(path))  # the file read, not a path
                doc = tomllib.load(f)
        except OSError as exc:
            raise InvalidArgumentError(f"cannot read {where}: {exc.strerror}", field="auth_tokens") from None
        except tomllib.TOMLDecodeError as exc:
            raise InvalidArgumentError(f"{where} is not valid TOML: {exc}", field="auth_tokens") from None
        return cls(_parse(doc, where))


def _check_mode(mode: int, where: str, path: str) -> None:
    writers = [who for who, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if mode & bit]
    if writers:
        raise InvalidArgumentError(
            f"{where} is writable by {' and '.join(writers)} (mode {stat.S_IMODE(mode):04o}): whoever may write it "
            f"may add a token with any permission; make it writable by its owner only (chmod go-w {path[:300]})",
            field="auth_tokens")


def _parse(doc: dict[str, Any], where: str) -> dict[str, Principal]:
    def bad(message: str) -> InvalidArgumentError:
        return InvalidArgumentError(f"{where}: {message}", field="auth_tokens")

    unknown = sorted(set(doc) - {"token"})
    if unknown:
        raise bad(f"unknown key {unknown[0][:200]!r} (only [[token]] tables are allowed)")
    entries = doc.get("token", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise bad("'token' must be an array of tables ([[token]])")
    found: dict[str, Principal] = {}
    for number, entry in enumerate(entries, 1):
        at = f"token #{number}"
        for key in entry:
            if key not in _ENTRY_KEYS:
                raise bad(f"{at}: unknown key {key[:200]!r} (allowed: {', '.join(_ENTRY_KEYS)})")
        for key in _ENTRY_KEYS:
            if key not in entry:
                raise bad(f"{at}: missing key {key!r}")
        name = entry["principal"]
        if not isinstance(name, str) or not name:
            raise bad(f"{at}: principal must be a non-empty string")
        at = f"token #{number} (principal {name[:200]!r})"
        digest = entry["sha256"]
        # The value is never quoted: a raw token pasted here by mistake must not reach a log.
        if not isinstance(digest, str) or not _HEX64.fullmatch(digest.lower()):
            size = f"{len(digest)} characters" if isinstance(digest, str) else type(digest).__name__
            raise bad(f"{at}: sha256 must be 64 hex digits (the SHA-256 of the token, from `streamingnode "
                      f"token hash`), got {size}")
        digest = digest.lower()
        if digest in found:
            raise bad(f"{at}: the same sha256 as principal {found[digest].name!r}")
        found[digest] = _principal(name, entry["permissions"], functools.partial(_prefixed, bad, at))
    return found


def _prefixed(bad: Callable[[str], InvalidArgumentError], at: str, message: str) -> InvalidArgumentError:
    return bad(f"{at}: {message}")


def _principal(name: str, permissions: Any, bad: Callable[[str], InvalidArgumentError]) -> Principal:
    if not isinstance(permissions, list) or not all(isinstance(p, str) for p in permissions):
        raise bad("permissions must be a list of strings")
    admin = False
    produce: list[str] = []
    consume: list[str] = []
    groups: list[tuple[str, str]] | None = None
    for permission in permissions:
        kind, sep, pattern = permission.partition(":")
        if permission == "admin":
            admin = True
        elif sep and kind == "produce" and pattern:
            produce.append(pattern)
        elif sep and kind == "consume" and pattern and not pattern.startswith(":"):
            # A pchannel name has no ':', so the first one after the kind ends the pchannel glob; the
            # group glob is the rest (a group name may hold ':').
            pchannels, scoped, group_glob = pattern.partition(":")
            consume.append(pchannels)
            if scoped:
                groups = [*(groups or []), (pchannels, group_glob)]
        else:
            raise bad(f"unknown permission {permission[:200]!r} (expected 'admin', 'produce:<pchannel glob>', "
                      "'consume:<pchannel glob>' or 'consume:<pchannel glob>:<group glob>')")
    return Principal(name, admin, tuple(produce), tuple(consume), None if groups is None else tuple(groups))


def bearer_token(metadata: Any) -> str | None:
    """The token of an ``authorization: Bearer <token>`` metadata entry (None: there is none)."""
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str) and value[:7].lower() == _BEARER:
            return value[7:].strip() or None
    return None


Behaviour = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
Check = Callable[[Any], StreamingError | None]
"""Why a request may not be served (None: it may)."""
Note = Callable[[StreamingError, grpc.aio.ServicerContext], None]
"""Told of each refusal, before it is answered (the node counts and logs it: ``server.refusals``)."""


def _quiet(_err: StreamingError, _context: grpc.aio.ServicerContext) -> None:
    return None


class _CheckFirstRead:
    """The servicer context a stream's handler sees: its first ``read`` checks the request, then
    ``read`` is the real one again.  Everything else goes to the real context; what is looked up once
    is kept on the instance, so a stream's writes pay the indirection only on the first."""

    def __init__(self, context: grpc.aio.ServicerContext, check: Check) -> None:
        self._context = context
        self._check = check
        self.read: Callable[[], Awaitable[Any]] = self._first_read

    async def _first_read(self) -> Any:
        request = await self._context.read()
        self.read = self._context.read
        # Only an open names the pchannel; anything else the handler refuses with INVALID_ARGUMENT.
        if request is not grpc.aio.EOF and request.WhichOneof("request") == "open":
            denied = self._check(request)
            if denied is not None:
                # Raised into the handler, whose error translation counts, logs and answers it
                # (``errors.stream_errors``), without an abort that would keep the request (``end_call``).
                # Not kept in this frame, which its traceback holds: that would make a cycle holding
                # the request too.
                try:
                    raise denied
                finally:
                    del denied, request
        return request

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._context, name)
        setattr(self, name, value)
        return value


def _refusing(err: StreamingError, *, streaming: bool, note: Note, trimmer: Trimmer | None = None) -> Behaviour:
    """The behaviour of a call refused before its request is needed (no token, an unknown one, a
    missing admin permission)."""
    status = to_grpc_status(err)

    async def refuse(_requests: Any, context: grpc.aio.ServicerContext) -> None:
        note(err, context)
        if streaming:
            # Take the client's first request before answering: a status sent while the client's
            # first write is still under way makes that write fail locally with INTERNAL ("Internal
            # error from Core"), which the client then sees instead of this status.  Bounded: a caller
            # that never writes cannot hold the call open.  (A unary call is answered at once, its
            # request unread: the client takes the status as the call's, and the node holds nothing.)
            # A large first request is dropped at once, and the buffers it was read into are given
            # back after the burst (``errors.TRIM_AFTER_BYTES``).
            first: Any = None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_REFUSAL_READ_SECONDS):
                    first = await context.read()
            if trimmer is not None and isinstance(first, bytes) and len(first) >= TRIM_AFTER_BYTES:
                trimmer.soon()
            del first
        end_call(context, status)

    return refuse


def _request_class(method: str) -> type[Message]:
    cls: type[Message] = message_factory.GetMessageClass(_SERVICE.methods_by_name[method].input_type)
    return cls


def _unary_checked(behaviour: Behaviour, check: Check, cls: type[Message], note: Note, limit: int) -> Behaviour:
    async def checked(request: Any, context: grpc.aio.ServicerContext) -> Any:
        # A request over the unary limit goes unparsed to the handler, which refuses it for its size
        # (``errors.unary``): parsing it here would copy it first.
        if isinstance(request, (bytes, bytearray, memoryview)) and len(request) <= limit:
            # The handler parses its own request (and answers INVALID_ARGUMENT when it cannot): an
            # authenticated caller with an unparsable request is left to it.  A parsed one is handed
            # on as it is, parsed once.
            with contextlib.suppress(DecodeError):
                request = cls.FromString(bytes(request))
        if isinstance(request, Message):
            denied = check(request)
            if denied is not None:
                note(denied, context)
                del request  # nothing of a refused call outlives it
                end_call(context, to_grpc_status(denied))
                return None
        return await behaviour(request, context)

    return checked


def _stream_checked(behaviour: Behaviour, check: Check) -> Behaviour:
    async def checked(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
        return await behaviour(request_iterator, _CheckFirstRead(context, check))

    return checked


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Authenticates every call of the StreamingNode service and checks the permission ``RULES``
    names; other services (health, reflection) pass untouched."""

    def __init__(self, tokens: TokenTable, max_unary_request_bytes: int = 1 << 20) -> None:
        self.tokens = tokens
        self.max_unary_request_bytes = max_unary_request_bytes
        """Longer unary requests are not parsed for the permission check (the handler refuses them)."""
        self._missing = UnauthenticatedError(
            "no bearer token: send metadata 'authorization: Bearer <token>'", reason="missing token")
        self._unknown = UnauthenticatedError("unknown bearer token", reason="unknown token")
        self._classes = {name: _request_class(name) for name in RULES}
        self.trimmer: Trimmer | None = None
        """Told when a refused stream's first request was large (``lifecycle`` sets the servicer's)."""
        self.on_refusal: Callable[[str, StreamingError, str], None] | None = None
        """Told of every call this layer refuses: (RPC name, error, peer).  The node sets it to its
        refusal counter and log once the servicer exists (``lifecycle``)."""

    def _noting(self, rpc: str) -> Note:
        on_refusal = self.on_refusal
        if on_refusal is None:
            return _quiet

        def note(err: StreamingError, context: grpc.aio.ServicerContext) -> None:
            on_refusal(rpc, err, str(context.peer() or ""))

        return note

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or not method.startswith(_PREFIX):
            return handler
        name = method[len(_PREFIX):]
        token = bearer_token(handler_call_details.invocation_metadata)
        principal = None if token is None else self.tokens.authenticate(token)
        note = self._noting(name)
        if principal is None:
            err = self._missing if token is None else self._unknown
            return _refused(handler, _refusing(err, streaming=handler.request_streaming, note=note,
                                               trimmer=self.trimmer))
        need = RULES.get(name, Need.ADMIN)  # a method added later is admin's until RULES says otherwise
        if need is Need.ADMIN:
            denied = principal.denial(need, None)
            if denied is None:
                return handler
            return _refused(handler, _refusing(denied, streaming=handler.request_streaming, note=note,
                                               trimmer=self.trimmer))

        def check(request: Any) -> StreamingError | None:
            return principal.denial(need, request)

        behaviour = _behaviour(handler)
        if handler.request_streaming:
            return _replace(handler, _stream_checked(behaviour, check))
        return _replace(handler, _unary_checked(behaviour, check, self._classes[name], note,
                                                self.max_unary_request_bytes))


_FACTORIES = {
    (False, False): ("unary_unary", grpc.unary_unary_rpc_method_handler),
    (False, True): ("unary_stream", grpc.unary_stream_rpc_method_handler),
    (True, False): ("stream_unary", grpc.stream_unary_rpc_method_handler),
    (True, True): ("stream_stream", grpc.stream_stream_rpc_method_handler),
}


def _behaviour(handler: grpc.RpcMethodHandler) -> Behaviour:
    attribute, _ = _FACTORIES[(handler.request_streaming, handler.response_streaming)]
    behaviour: Behaviour = getattr(handler, attribute)
    return behaviour


def _replace(handler: grpc.RpcMethodHandler, behaviour: Behaviour) -> grpc.RpcMethodHandler:
    """A handler of the same kind and (de)serializers as ``handler`` whose behaviour is ``behaviour``."""
    _, make = _FACTORIES[(handler.request_streaming, handler.response_streaming)]
    return make(behaviour, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)


def _refused(handler: grpc.RpcMethodHandler, behaviour: Behaviour) -> grpc.RpcMethodHandler:
    """The handler of a call refused before its request is needed: ``behaviour`` answers it.

    Requests are never parsed (a refused call's garbage cannot change its answer), and a unary call's
    request is never read: its handler is made one that streams requests (the wire is the same), so
    gRPC does not wait for the request before running it, and the call ends at once.  gRPC buffers
    what arrives while a call is open, read or not, and drops what comes after it ended: an
    unauthenticated caller makes the node take in only what reached it before the refusal went out
    (12 concurrent 60 MiB requests: +5 MB of RSS, ``bench/refused_memory.py``)."""
    _, make = _FACTORIES[(True, handler.response_streaming)]
    return make(behaviour, request_deserializer=None, response_serializer=handler.response_serializer)


__all__ = ["RULES", "AuthInterceptor", "Need", "Principal", "TokenTable", "bearer_token", "hash_token"]
