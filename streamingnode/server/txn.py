"""Transactions: BeginTxn, CommitTxn and RollbackTxn (the rules: ``interceptors.txn``)."""

from __future__ import annotations

import grpc

from streamingnode.node.channel import Channel
from streamingnode.node.node import Node
from streamingnode.server.errors import call_deadline, require, unary
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.wire import codec
from wal.errors import InvalidTxnStateError
from wal.names import VCHANNEL


class TxnHandlers:
    """The transaction RPCs (mixed into the servicer, over ``self.node``)."""

    node: Node

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
        # Its bounds are checked where every transaction begins (the txn manager: wal.txn_keepalive).
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


__all__ = ["TxnHandlers"]
