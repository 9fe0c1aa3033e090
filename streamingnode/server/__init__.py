"""The gRPC service: every RPC of ``streaming.proto`` over a ``Node``, plus health and reflection.

- ``produce``: the Produce stream (batches appended pipelined, results in order).
- ``consume``: the Consume stream (MsgPacks out, group acks in).
- ``admin``: the unary RPCs (transactions, channels, consumer groups, latest position, Flush).
- ``errors``: how failures become gRPC statuses, the same way on every RPC.
- ``service``: the servicer that puts them together, and its registration.
- ``auth``: the interceptor that authenticates bearer tokens and checks each call's permission.
- ``lifecycle``: start, serve, drain and stop a node's server (TLS and the protected mode there).
"""

from streamingnode.server.serve import RunningServer, ServerThread, serve, start_server
from streamingnode.server.service import SERVICE_NAME, StreamingNodeService

__all__ = ["SERVICE_NAME", "RunningServer", "ServerThread", "StreamingNodeService", "serve", "start_server"]
