"""Flush: seal a vchannel's (or one collection's) growing segments and return once the flusher
has written their files."""

from __future__ import annotations

import asyncio

import grpc

from streamingnode.node.node import Node
from streamingnode.server.errors import call_deadline, require, unary
from streamingnode.v1 import streaming_pb2 as spb
from wal.bodies import PROP_COLLECTION
from wal.message import Message, MessageType
from wal.names import COLLECTION, VCHANNEL


class FlushHandlers:
    """The Flush RPC (mixed into the servicer, over ``self.node``)."""

    node: Node

    @unary
    async def Flush(self, request: spb.FlushRequest, context: grpc.aio.ServicerContext) -> spb.FlushResponse:
        channel = self.node.channel(require(request.pchannel, "pchannel"))
        vchannel = VCHANNEL.check(request.vchannel, "vchannel")
        props: dict[str, str] = {}
        if request.HasField("collection"):
            props[PROP_COLLECTION] = COLLECTION.check(request.collection, "collection")
        deadline = call_deadline(context)
        result = await channel.stream.append(
            Message(MessageType.MANUAL_FLUSH, vchannel, b"", props), deadline=deadline)
        if channel.flusher is None:  # no flusher: the flush is done once the seal is durable in the log
            return spb.FlushResponse(files=[], flush_timetick=result.timetick)
        async with asyncio.timeout_at(deadline):
            files = await channel.flusher.wait_flushed(result.timetick)
        return spb.FlushResponse(files=files, flush_timetick=result.timetick)


__all__ = ["FlushHandlers"]
