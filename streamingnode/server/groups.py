"""Consumer-group administration: create, destroy, describe (with lag) and seek (the rules:
``streamingnode.node.groups``)."""

from __future__ import annotations

import grpc

from streamingnode.node.channel import Channel
from streamingnode.node.groups import check_group_name
from streamingnode.node.node import Node
from streamingnode.server.errors import require, unary
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.wire import codec
from wal.errors import InvalidArgumentError, OutOfRangeError
from wal.message import Position
from wal.names import VCHANNEL
from wal.options import DeliverPolicy, PolicyKind, ReadOption


class GroupHandlers:
    """The consumer-group RPCs (mixed into the servicer, over ``self.node``)."""

    node: Node

    @unary
    async def CreateConsumerGroup(
        self, request: spb.CreateConsumerGroupRequest, context: grpc.aio.ServicerContext
    ) -> spb.CreateConsumerGroupResponse:
        channel = self.node.channel(require(request.pchannel, "pchannel"))
        await channel.groups.create(require(request.group, "group"))
        return spb.CreateConsumerGroupResponse()

    @unary
    async def DestroyConsumerGroup(
        self, request: spb.DestroyConsumerGroupRequest, context: grpc.aio.ServicerContext
    ) -> spb.DestroyConsumerGroupResponse:
        channel = self.node.channel(require(request.pchannel, "pchannel"))
        await channel.groups.destroy(require(request.group, "group"))
        return spb.DestroyConsumerGroupResponse()

    @unary
    async def DescribeConsumerGroups(
        self, request: spb.DescribeConsumerGroupsRequest, context: grpc.aio.ServicerContext
    ) -> spb.DescribeConsumerGroupsResponse:
        names = [request.pchannel] if request.pchannel else self.node.channel_names()
        for i, group in enumerate(request.groups):
            check_group_name(group, f"groups[{i}]")
        out = []
        for name in names:
            channel = self.node.channel(name)
            wanted = list(request.groups) or channel.groups.names()
            if not request.pchannel:  # across every pchannel: a named group is listed where it exists
                wanted = [g for g in wanted if channel.groups.exists(g)]
            await channel.groups.refresh()  # after a restart: the high-water of what groups lag behind
            for group in wanted:
                problems = channel.groups.problems(group)
                progress = [
                    spb.ConsumerGroupProgress(
                        vchannel=p.vchannel, committed=codec.position_to_pb(p.committed, p.vchannel),
                        lag_messages=p.lag_messages, lag_ms=p.lag_ms, problem=problems.get(p.vchannel, ""),
                    )
                    for p in channel.groups.progress(group)
                ]
                out.append(spb.ConsumerGroupDescription(pchannel=name, group=group, vchannels=progress))
        return spb.DescribeConsumerGroupsResponse(groups=out)

    @unary
    async def SeekConsumerGroup(
        self, request: spb.SeekConsumerGroupRequest, context: grpc.aio.ServicerContext
    ) -> spb.SeekConsumerGroupResponse:
        channel = self.node.channel(require(request.pchannel, "pchannel"))
        group = require(request.group, "group")
        channel.groups.require(group)
        vchannel = VCHANNEL.check(request.vchannel, "vchannel", allow_empty=True)
        target = request.WhichOneof("target")
        if target == "position":
            pos, _ = codec.position_from_pb(request.position)
            if not pos.pchannel:
                pos = pos._replace(pchannel=channel.stream.pchannel)
            why = channel.groups.problem(pos.message_id, 0) if pos.pchannel == channel.stream.pchannel else None
            if why is not None:  # past the end is refused, not read as "latest": seek with policy latest for that
                raise OutOfRangeError(f"position: cannot seek consumer group {group!r} on pchannel "
                                      f"{channel.stream.pchannel!r}: {why}", channel=channel.stream.pchannel,
                                      group=group, field="position", message_id=pos.message_id)
            if pos.timetick == 0 and pos.pchannel == channel.stream.pchannel:
                # An id without a time resumes as StartFrom(id) does: store that position's real time.
                pos = await self._resolve(channel, DeliverPolicy.start_from(pos.message_id))
        elif target == "policy":
            pos = await self._resolve(channel, codec.policy_from_pb(request.policy))
        else:
            raise InvalidArgumentError("seek needs a policy or a position", field="target")
        # Checked as an ack is, against the pchannel's range instead of a stream's: a position past the
        # newest message or the read point is refused (OUT_OF_RANGE), never stored to stall the group.
        await channel.groups.commit(group, [(vchannel, pos)], fields=[target])
        return spb.SeekConsumerGroupResponse(position=codec.position_to_pb(pos, vchannel))

    async def _resolve(self, channel: Channel, policy: DeliverPolicy) -> Position:
        """The position a fresh scanner with ``policy`` would start from, with the real timetick
        of that point (a scanner's own starts at 0, and lag would be measured from 1970):

        - latest: the read point now: every message at or below the MVCC timetick is acknowledged,
          and the ack manager's id is where every later one is found (open transactions included);
        - earliest, an id, after an id: just below the timetick of the first message from there;
        - a time ``T``: ``T - 1``, from the id the time index gives for it.
        """
        stream = channel.stream
        if policy.kind is PolicyKind.LATEST:
            acks = stream.timetick.acks  # both read in one step of the loop: one consistent point
            return Position(stream.pchannel, acks.last_confirmed_id(), acks.confirmed_ts)
        # Lazy: it is never iterated, so opening it need not ask for a tick.  It checks the range.
        scanner = stream.read(ReadOption(None, policy, lazy=True))
        try:
            pos = scanner.position
        finally:
            await scanner.aclose()
        if policy.kind is PolicyKind.START_AT_TIME:
            return pos._replace(message_id=await stream.wal.seek_time(pos.timetick))
        if pos.message_id >= stream.wal.next_id:  # nothing stored from there: everything later is newer
            return pos._replace(timetick=stream.mvcc_timetick())
        return pos._replace(timetick=await channel.groups.first_timetick(pos.message_id))


__all__ = ["GroupHandlers"]
