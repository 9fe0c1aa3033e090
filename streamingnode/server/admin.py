"""The unary handlers: transactions, channels, consumer groups, the latest position and Flush.

Each one translates its request into a call on the node or a channel's streaming WAL and the result
back into its response; the rules live below (``streamingnode.node.node``, ``streamingnode.node.groups``,
``interceptors.recovery.streaming_wal``).  Errors leave through ``errors.unary``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from streamingnode.node.groups import check_group_name
from streamingnode.node.node import Channel, Node, Owner
from streamingnode.server.errors import call_deadline, require, unary
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.wire import codec
from wal._record import check_keepalive
from wal.bodies import PROP_COLLECTION
from wal.errors import InvalidArgumentError, InvalidTxnStateError, OutOfRangeError, StreamingError
from wal.message import Message, MessageType, Position
from wal.names import COLLECTION, VCHANNEL
from wal.options import DeliverPolicy, PolicyKind, ReadOption


class AdminHandlers:
    """The unary RPCs of the StreamingNode service, over ``self.node`` (mixed into the servicer)."""

    node: Node

    def call_failed(self, request: Any, exc: StreamingError) -> None:
        """A unary call on a pchannel failed with ``exc``: damaged storage moves the pchannel to FAILED
        (``Node.fail_on``), as a produce or consume that meets it does."""
        pchannel = getattr(request, "pchannel", "")
        if pchannel and isinstance(pchannel, str):
            self.node.fail_on(pchannel, exc)

    # --- transactions ----------------------------------------------------------------------------
    def _txn_channel(self, pchannel: str, vchannel: str, txn_id: int) -> Channel:
        channel = self.node.channel(require(pchannel, "pchannel"))
        VCHANNEL.check(vchannel, "vchannel")
        session = channel.stream.txns.get(txn_id)
        if session is not None and session.vchannel != vchannel:
            raise InvalidTxnStateError(
                f"transaction {txn_id} belongs to vchannel {session.vchannel!r}, not {vchannel!r}", txn_id=txn_id)
        return channel

    @unary
    async def BeginTxn(self, request: spb.BeginTxnRequest, context: grpc.aio.ServicerContext) -> spb.BeginTxnResponse:
        channel = self.node.channel(require(request.pchannel, "pchannel"))
        vchannel = VCHANNEL.check(request.vchannel, "vchannel")
        if request.keepalive_ms < 0:
            raise InvalidArgumentError(f"keepalive_ms must be >= 0, got {request.keepalive_ms}", field="keepalive_ms")
        check_keepalive(request.keepalive_ms)  # the message header holds it in 32 bits
        keepalive = request.keepalive_ms or self.node.config.txn_keepalive_ms
        txn, result = await channel.stream.begin_txn(vchannel, keepalive, deadline=call_deadline(context))
        return spb.BeginTxnResponse(
            txn_id=txn.txn_id, begin_timetick=result.timetick, message_id=codec.message_id_to_pb(result.message_id),
            keepalive_ms=txn.keepalive_ms,
        )

    @unary
    async def CommitTxn(
        self, request: spb.CommitTxnRequest, context: grpc.aio.ServicerContext
    ) -> spb.CommitTxnResponse:
        channel = self._txn_channel(request.pchannel, request.vchannel, request.txn_id)
        result = await channel.stream.commit_txn(request.txn_id, deadline=call_deadline(context))
        return spb.CommitTxnResponse(
            commit_timetick=result.timetick, message_id=codec.message_id_to_pb(result.message_id))

    @unary
    async def RollbackTxn(
        self, request: spb.RollbackTxnRequest, context: grpc.aio.ServicerContext
    ) -> spb.RollbackTxnResponse:
        channel = self._txn_channel(request.pchannel, request.vchannel, request.txn_id)
        result = await channel.stream.rollback_txn(request.txn_id, deadline=call_deadline(context))
        return spb.RollbackTxnResponse(
            rollback_timetick=result.timetick, message_id=codec.message_id_to_pb(result.message_id))

    # --- channels --------------------------------------------------------------------------------
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

    # --- consumer groups -------------------------------------------------------------------------
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

    # --- positions and flush ---------------------------------------------------------------------
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


__all__ = ["AdminHandlers"]
