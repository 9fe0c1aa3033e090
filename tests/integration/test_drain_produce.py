"""An idle Produce stream ends promptly when the node drains, with ON_SHUTDOWN in its ErrorInfo (as a
Consume stream does), instead of being cut without a status once the whole drain period ran out."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest

from streamingnode.server import ServerThread
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc
from streamingnode.wire.codes import from_rpc_error
from tests.integration.conftest import node_config
from tests.integration.rpc_helpers import data
from tests.waiting import until
from wal.errors import ErrorCode

pytestmark = pytest.mark.integration


async def test_an_idle_produce_stream_ends_with_on_shutdown_before_the_drain_period_ends(tmp_path: Path) -> None:
    # A drain period of several seconds: the stream must end on the drain, not when the period runs out
    # (then gRPC cancels it: CANCELLED, no ErrorInfo, and only after the server's stop began to finish).
    srv = ServerThread(node_config(tmp_path / "data", drain_seconds=8.0)).start()
    stopper: threading.Thread | None = None
    events: list[str] = []
    try:
        async with grpc.aio.insecure_channel(srv.address) as channel:
            stub = streaming_pb2_grpc.StreamingNodeStub(channel)
            await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p1"]))
            call = stub.Produce()
            call.add_done_callback(lambda _: events.append("stream ended"))
            await call.write(spb.ProduceRequest(open=spb.ProduceOpen(pchannel="p1")))
            assert (await call.read()).WhichOneof("response") == "opened"
            await call.write(spb.ProduceRequest(batch=spb.ProduceBatch(
                request_id=1, messages=[data("v1", b"a")])))
            assert not (await call.read()).result.HasField("error")

            # Idle from here on.  Drain in the background: stop() returns once every call has ended.
            def stop() -> None:
                srv.stop(grace=8.0)
                events.append("server stopped")

            stopper = threading.Thread(target=stop)
            stopper.start()
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                await call.read()
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE, ended.value
            assert from_rpc_error(ended.value).code is ErrorCode.ON_SHUTDOWN
            await until(lambda: len(events) == 2, "the server to stop")
            assert events == ["stream ended", "server stopped"]
    finally:
        if stopper is not None:
            stopper.join()
        srv.stop()
