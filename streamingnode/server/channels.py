"""Channel administration: CreateChannels, DestroyChannels and DescribeChannels (the rules:
``streamingnode.node.node``; in cluster mode the owner comes from the leases)."""

from __future__ import annotations

import grpc

from streamingnode.node.channel import Owner
from streamingnode.node.node import Node
from streamingnode.server.errors import unary
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.wire import codec


class ChannelHandlers:
    """The channel administration RPCs (mixed into the servicer, over ``self.node``)."""

    node: Node

    @unary
    async def CreateChannels(
        self, request: spb.CreateChannelsRequest, context: grpc.aio.ServicerContext
    ) -> spb.CreateChannelsResponse:
        owner = Owner(request.owner.role, request.owner.address, request.owner.description_text)
        names = await self.node.create_channels(list(request.channel_names), request.num_channels, owner)
        return spb.CreateChannelsResponse(channel_names=names)

    @unary
    async def DestroyChannels(
        self, request: spb.DestroyChannelsRequest, context: grpc.aio.ServicerContext
    ) -> spb.DestroyChannelsResponse:
        await self.node.destroy_channels(list(request.channel_names))
        return spb.DestroyChannelsResponse()

    @unary
    async def DescribeChannels(
        self, request: spb.DescribeChannelsRequest, context: grpc.aio.ServicerContext
    ) -> spb.DescribeChannelsResponse:
        infos = await self.node.describe_channels(list(request.channel_names))
        out = []
        for info in infos:
            owner = Owner.from_properties(info.properties)
            term = info.term
            lease = self.node.lease(info.name)
            if self.node.ownership is not None:
                # Cluster mode: the lease names who serves the pchannel, wherever the call landed.
                address = lease.address if lease is not None and lease.held() else ""
                owner = Owner("streamingnode" if address else "", address)
                term = lease.term if lease is not None else 0
            d = pb.ChannelDescription(
                channel_name=info.name, term=term, last_timetick=info.last_timetick,
                owner=pb.OwnerDescription(role=owner.role, address=owner.address,
                                          description_text=owner.description_text),
                state=pb.CHANNEL_STATE_SERVING, problems=self.node.problems(info.name),
            )
            failure = self.node.failure(info.name)
            if failure is not None:
                d.state = pb.CHANNEL_STATE_FAILED
                d.failure = failure.reason
                d.failure_code = pb.ErrorCode.ValueType(failure.code)
            if info.last_id is not None:
                d.first_id.CopyFrom(codec.message_id_to_pb(info.first_id))
                d.last_id.CopyFrom(codec.message_id_to_pb(info.last_id))
            out.append(d)
        return spb.DescribeChannelsResponse(descriptions=out)


__all__ = ["ChannelHandlers"]
