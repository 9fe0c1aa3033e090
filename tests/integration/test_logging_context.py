"""Background work logs in its own context: a channel's flusher, ticks and retention started while a
CreateChannels call opened the channel carry the pchannel and term, never that call's rpc or
request_id (they run long after it ended); a unary call on no pchannel binds none (no pchannel=None)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import grpc
import pytest
import structlog

from streamingnode.observability.logs import configure_logging
from streamingnode.server import ServerThread
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc
from tests.integration.conftest import node_config
from tests.integration.rpc_helpers import data
from tests.waiting import until

pytestmark = pytest.mark.integration


async def test_channel_background_work_does_not_log_in_the_creating_calls_context(tmp_path: Path) -> None:
    out = io.StringIO()
    configure_logging("debug", out, cache=False)
    try:
        with ServerThread(node_config(tmp_path / "data", snapshot_every_messages=1,
                                      snapshot_every_seconds=0.05)) as srv:
            async with grpc.aio.insecure_channel(srv.address) as channel:
                stub = streaming_pb2_grpc.StreamingNodeStub(channel)
                await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p1"]),
                                          metadata=(("x-request-id", "create-1"),))
                call = stub.Produce()
                await call.write(spb.ProduceRequest(open=spb.ProduceOpen(pchannel="p1")))
                await call.read()
                await call.write(spb.ProduceRequest(batch=spb.ProduceBatch(request_id=1, messages=[data("v1", b"a")])))
                await call.read()
                await call.done_writing()
                await call.read()
                # Retention stores a recovery snapshot from its own task, started when the channel opened.
                await until(lambda: '"recovery snapshot stored"' in out.getvalue(), "a periodic recovery snapshot")
    finally:
        structlog.reset_defaults()
    records: list[dict[str, Any]] = [json.loads(line) for line in out.getvalue().splitlines() if line]
    (created,) = [r for r in records if r["event"] == "channels created"]
    assert created["rpc"] == "CreateChannels" and created["request_id"] == "create-1"
    assert "pchannel" not in created, "CreateChannels names no single pchannel: none is bound"
    opened = ("wal opened", "pchannel recovered", "flusher started", "recovery snapshot stored")
    channel_lines = [r for r in records if r.get("pchannel") == "p1" and r["event"] in opened]
    assert {r["event"] for r in channel_lines} == set(opened)
    for r in channel_lines:
        assert r["term"] == 1, r
        assert "rpc" not in r and "request_id" not in r, f"the channel's own work logged in a call's context: {r}"
