"""GetLatestPosition while a transaction is open: the position lies at or before its BeginTxn, so a
reader resuming there receives the transaction when it commits."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from streamingnode.server import ServerThread
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from tests.integration.conftest import node_config
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


async def test_latest_position_is_the_last_append_on_a_quiet_log(tmp_path: Path) -> None:
    # No beat can persist a TimeTick during the test (an hour apart): the newest confirmed position is
    # exactly the last append's, not merely at or after it.
    with ServerThread(node_config(tmp_path / "data", tick_interval=3600.0, channels=("p",))) as srv:
        async with grpc.aio.insecure_channel(srv.address) as channel:
            stub = sgrpc.StreamingNodeStub(channel)
            _, results = await produce(stub, "p", [[data("v", b"%d" % i)] for i in range(3)])
            last = results[-1].appended.results[0]
            latest = await stub.GetLatestPosition(spb.GetLatestPositionRequest(pchannel="p", vchannel="v"))
            # A vchannel never written has the pchannel's newest position, named for itself.
            never = await stub.GetLatestPosition(spb.GetLatestPositionRequest(pchannel="p", vchannel="never"))
    assert latest.HasField("last")
    assert (_id(latest.last.message_id), latest.last.timetick) == (_id(last.id), last.timetick)
    assert never.HasField("last")
    assert (never.last.pchannel, never.last.vchannel, _id(never.last.message_id), never.last.timetick) == (
        "p", "never", _id(last.id), last.timetick)
