"""The gRPC service: every RPC of ``streaming.proto`` over a ``Node``, plus health and reflection.

- ``produce``: the Produce stream (batches appended pipelined, results in order).
- ``consume``: the Consume stream (MsgPacks out, group acks in).
- ``txn``: BeginTxn, CommitTxn, RollbackTxn.
- ``channels``: CreateChannels, DestroyChannels, DescribeChannels.
- ``groups``: consumer-group administration (create, destroy, describe with lag, seek).
- ``positions``: GetLatestPosition.
- ``flush``: Flush (returns when the files exist).
- ``errors``: how failures become gRPC statuses, the same way on every RPC.
- ``service``: the servicer that puts them together, and its registration.
- ``auth``: the interceptor that authenticates bearer tokens and checks each call's permission.
- ``serve``: start, serve, drain and stop a node's server (TLS and the protected mode there).
"""

from streamingnode.server.serve import RunningServer, ServerThread, serve, start_server
from streamingnode.server.service import SERVICE_NAME, StreamingNodeService

__all__ = ["SERVICE_NAME", "RunningServer", "ServerThread", "StreamingNodeService", "serve", "start_server"]
