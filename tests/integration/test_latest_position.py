"""GetLatestPosition while a transaction is open: the position lies at or before its BeginTxn, so a
reader resuming there receives the transaction when it commits."""

from __future__ import annotations

import pytest

from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from tests.integration.rpc_helpers import consume, data, payloads, produce

pytestmark = pytest.mark.integration


def _id(mid: pb.MessageID) -> int:
    return int.from_bytes(mid.id, "big")


async def test_latest_position_with_an_open_transaction_still_delivers_it(stub) -> None:
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    await produce(stub, "p", [[data("v", b"before")]])
    begun = await stub.BeginTxn(spb.BeginTxnRequest(pchannel="p", vchannel="v", keepalive_ms=60_000))
    txn = pb.TxnContext(txn_id=begun.txn_id, keepalive_ms=begun.keepalive_ms)
    await produce(stub, "p", [[data("v", b"in the transaction")]], txn=txn)
    _, results = await produce(stub, "p", [[data("w", b"after")]])
    after = results[0].appended.results[0]

    latest = await stub.GetLatestPosition(spb.GetLatestPositionRequest(pchannel="p", vchannel="v"))
    assert latest.HasField("last")
    assert _id(latest.last.message_id) <= _id(begun.message_id) < _id(after.id)

    await stub.CommitTxn(spb.CommitTxnRequest(pchannel="p", vchannel="v", txn_id=begun.txn_id))
    await produce(stub, "p", [[data("v", b"marker")]])
    got = await consume(stub, spb.ConsumeOpen(
        pchannel="p", vchannel="v", policy=pb.DeliverPolicy(start_from=latest.last.message_id),
        filters=[pb.DeliverFilter(timetick_gt=latest.last.timetick)]), until=4)  # begin, body, commit, marker
    assert payloads(got) == [b"in the transaction", b"marker"]
    assert [m.type for p in got for m in p.messages if m.type != pb.MESSAGE_TYPE_TIME_TICK] == [
        pb.MESSAGE_TYPE_BEGIN_TXN, pb.MESSAGE_TYPE_DATA, pb.MESSAGE_TYPE_COMMIT_TXN, pb.MESSAGE_TYPE_DATA]
