"""GetLatestPosition: a pchannel's newest acknowledged position and its MVCC timetick."""

from __future__ import annotations

import grpc

from streamingnode.node.node import Node
from streamingnode.server.errors import require, unary
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.wire import codec
from wal.names import VCHANNEL


class PositionHandlers:
    """The latest-position RPC (mixed into the servicer, over ``self.node``)."""

    node: Node

    @unary
    async def GetLatestPosition(
        self, request: spb.GetLatestPositionRequest, context: grpc.aio.ServicerContext
    ) -> spb.GetLatestPositionResponse:
        channel = self.node.channel(require(request.pchannel, "pchannel"))
        VCHANNEL.check(request.vchannel, "vchannel", allow_empty=True)  # echoed in the position
        out = spb.GetLatestPositionResponse(mvcc_timetick=channel.stream.mvcc_timetick())
        latest = channel.stream.latest_position()
        if latest is not None:
            out.last.CopyFrom(codec.position_to_pb(latest, request.vchannel))
        return out


__all__ = ["PositionHandlers"]
