"""Server reflection under both names clients ask for: ``grpc.reflection.v1`` and ``grpc.reflection.v1alpha``.

grpcio-reflection implements only v1alpha, while current tools (grpcurl, grpcui, Postman) ask for v1
first.  The two protocols are the same messages, field for field and number for number; only the
package differs.  So one servicer answers both: the v1 method is registered by hand with the v1alpha
message classes as (de)serializers, which read and write exactly the bytes a v1 client sends and
expects.  The v1 file is also added to the default descriptor pool (the v1alpha one with its package
renamed), so a client that lists services and then asks for each one's descriptor finds the v1
service too.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2

V1_PACKAGE = "grpc.reflection.v1"
V1_SERVICE_NAME = f"{V1_PACKAGE}.ServerReflection"
_V1_FILE = "grpc/reflection/v1/reflection.proto"


def _register_v1_descriptor() -> None:
    """Put the v1 reflection file in the default pool, once (a later grpcio-reflection may bring its own)."""
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(_V1_FILE)
    except KeyError:
        pass
    else:
        return
    file = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(file)
    file.name = _V1_FILE
    file.package = V1_PACKAGE
    file.ClearField("options")  # language options of the v1alpha file (Java package names)
    # Field types name messages by full name (".grpc.reflection.v1alpha.X"): point them at the copy.
    old, new = f".{reflection_pb2.DESCRIPTOR.package}.", f".{V1_PACKAGE}."
    for message in file.message_type:
        for field in message.field:
            if field.type_name.startswith(old):
                field.type_name = new + field.type_name.removeprefix(old)
    for service in file.service:
        for method in service.method:
            method.input_type = new + method.input_type.removeprefix(old)
            method.output_type = new + method.output_type.removeprefix(old)
    pool.AddSerializedFile(file.SerializeToString())


def enable_reflection(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Serve reflection (v1 and v1alpha) listing ``service_names`` plus the two reflection services."""
    _register_v1_descriptor()
    names = (*service_names, V1_SERVICE_NAME, reflection.SERVICE_NAME)
    servicer = reflection.aio.ReflectionServicer(names)
    reflection.enable_server_reflection(names, server)  # v1alpha, with its own servicer
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(V1_SERVICE_NAME, {
        "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
            servicer.ServerReflectionInfo,
            request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
            response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
        ),
    }),))


__all__ = ["V1_SERVICE_NAME", "enable_reflection"]
