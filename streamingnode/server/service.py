"""The StreamingNode servicer and its registration on a gRPC server.

One RPC family, one module: the Produce stream is served in ``produce``, the Consume stream in
``consume``, and the unary RPCs by family in ``txn`` (Begin/Commit/RollbackTxn), ``channels``
(Create/Destroy/DescribeChannels), ``groups`` (consumer-group administration and seek), ``positions``
(GetLatestPosition) and ``flush`` (Flush); the servicer here puts them together.  A unary handler
translates its request into a call on the node or a channel's streaming WAL and the result back into
its response; errors leave through ``errors.unary``.  ``errors`` turns
what they raise into statuses and ``serve`` starts and stops the server this module registers the
service on.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import message_factory

from streamingnode.node.memory_trim import Trimmer
from streamingnode.node.node import Node
from streamingnode.server.backup import BackupHandlers
from streamingnode.server.channels import ChannelHandlers
from streamingnode.server.consume import ConsumeStream
from streamingnode.server.errors import stream_errors
from streamingnode.server.flush import FlushHandlers
from streamingnode.server.groups import GroupHandlers
from streamingnode.server.limits import StreamLimits
from streamingnode.server.positions import PositionHandlers
from streamingnode.server.produce import ProduceStream
from streamingnode.server.refusals import Refusals
from streamingnode.server.txn import TxnHandlers
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from wal.errors import StreamingError

SERVICE_NAME = spb.DESCRIPTOR.services_by_name["StreamingNode"].full_name
"""The full gRPC name of the service (for health, reflection and registration)."""


class StreamingNodeService(
    TxnHandlers, ChannelHandlers, GroupHandlers, PositionHandlers, FlushHandlers, BackupHandlers,
    sgrpc.StreamingNodeServicer,  # type: ignore[misc]
):
    """Every RPC of ``streaming.proto`` over one ``Node``."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.limits = StreamLimits(node.config.max_streams, node.config.max_streams_per_connection, node.metrics)
        self.refusals = Refusals(node.metrics)
        """Every error answered to a client, counted and logged (``errors.refused``)."""
        self.max_unary_request_bytes = node.config.max_unary_request_bytes
        """Longer unary requests are refused unparsed (``errors.unary``)."""
        self.trimmer = Trimmer()
        """Gives the read buffers of refused large requests back to the system (``errors.unary``)."""

    def call_failed(self, request: Any, exc: StreamingError) -> None:
        """A unary call on a pchannel failed with ``exc``: damaged storage moves the pchannel to FAILED
        (``Node.fail_on``), as a produce or consume that meets it does."""
        pchannel = getattr(request, "pchannel", "")
        if pchannel and isinstance(pchannel, str):
            self.node.fail_on(pchannel, exc)

    @stream_errors
    async def Produce(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        async with self.limits.hold(context, "Produce"):
            await ProduceStream(self.node, context, self).run()

    @stream_errors
    async def Consume(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        async with self.limits.hold(context, "Consume"):
            await ConsumeStream(self.node, context, self).run()


def _serialize_consume(response: spb.ConsumeResponse | bytes) -> bytes:
    return response if type(response) is bytes else response.SerializeToString()  # type: ignore[union-attr]


def add_service(service: StreamingNodeService, server: grpc.aio.Server) -> None:
    """Register the service as the generated code does, except for two things.

    Consume may write ready-made response bytes (packs are encoded by ``convert.consume_pack_response``
    or ``convert.consume_columns_response``).

    Unary methods are registered without a request deserializer: their handlers (and any server
    interceptor that wraps them) receive the request as the raw ``bytes`` from the wire, and
    ``errors.unary`` parses it inside the error translation, so that an unparsable request is answered
    INVALID_ARGUMENT with ErrorInfo (gRPC would answer a deserializer's exception with UNKNOWN).  A
    server stream with a single request (Backup) gets it as bytes too, and parses it itself.  An
    interceptor that needs a field must parse the bytes itself and leave a ``DecodeError`` to the
    handler.  The streams (Produce, Consume) keep their deserializer: it runs in the handler's own
    ``context.read()``, where ``errors.stream_errors`` turns a ``DecodeError`` into INVALID_ARGUMENT;
    an interceptor sees their messages parsed.
    """
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in spb.DESCRIPTOR.services_by_name["StreamingNode"].methods:
        request = message_factory.GetMessageClass(method.input_type)
        response = message_factory.GetMessageClass(method.output_type)
        serialize = _serialize_consume if method.name == "Consume" else response.SerializeToString
        make = {
            (False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler,
        }[(method.client_streaming, method.server_streaming)]
        # A single request (unary, or a server stream such as Backup) comes as bytes, parsed by its
        # handler; only client streams keep the deserializer (their reads translate its errors).
        raw_request = not method.client_streaming
        handlers[method.name] = make(getattr(service, method.name),
                                     request_deserializer=None if raw_request else request.FromString,
                                     response_serializer=serialize)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


__all__ = ["SERVICE_NAME", "StreamingNodeService", "add_service"]
