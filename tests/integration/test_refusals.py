"""Every refusal is visible: counted by RPC and error code (``streamingnode_refusals_total``, the
dashboard's refusal panel), whether it ended the call or was answered in-band, and logged at
INFO/WARNING, rate-limited, with the request_id, peer, RPC and code.  Streams log their open and close
at DEBUG; a transaction's expiry is logged at INFO."""

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
from streamingnode.server.refusals import Refusals
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc
from tests.integration.conftest import node_config
from tests.integration.rpc_helpers import data
from tests.waiting import until
from wal.errors import InvalidArgumentError, OnShutdownError

pytestmark = pytest.mark.integration

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "dashboards" / "streamingnode.json"
REQUEST_ID = (("x-request-id", "r-7"),)


@pytest.fixture
def captured() -> Any:
    out = io.StringIO()
    configure_logging("debug", out, cache=False)
    try:
        yield out
    finally:
        structlog.reset_defaults()


def _records(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines() if line]


async def _refuse_some(address: str) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = streaming_pb2_grpc.StreamingNodeStub(channel)
        await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p1"]))
        # In-band: a batch over max_message_bytes and a batch with a reserved property; the stream goes on.
        call = stub.Produce(metadata=REQUEST_ID)
        await call.write(spb.ProduceRequest(open=spb.ProduceOpen(pchannel="p1")))
        await call.read()
        bad = [[data("v1", b"x" * 2000)], [data("v1", b"y", producer_id="z")]]
        for i, msgs in enumerate(bad):
            await call.write(spb.ProduceRequest(batch=spb.ProduceBatch(request_id=i + 1, messages=msgs)))
        codes = [(await call.read()).result.error.code for _ in bad]
        assert len(codes) == 2 and all(codes), codes
        await call.done_writing()
        assert (await call.read()).WhichOneof("response") == "closed"
        # A failed unary call, and a failed stream.
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.GetLatestPosition(spb.GetLatestPositionRequest(pchannel="nope"), metadata=REQUEST_ID)
        consume = stub.Consume(metadata=REQUEST_ID)
        await consume.write(spb.ConsumeRequest(open=spb.ConsumeOpen(pchannel="nope")))
        with pytest.raises(grpc.aio.AioRpcError):
            await consume.read()
        # An ack refused in-band (no consumer group on open).
        consume = stub.Consume(metadata=REQUEST_ID)
        await consume.write(spb.ConsumeRequest(open=spb.ConsumeOpen(pchannel="p1", vchannel="v1")))
        await consume.read()
        await consume.write(spb.ConsumeRequest(ack=spb.ConsumeAck()))
        while (await consume.read()).WhichOneof("response") != "error":
            pass
        await consume.write(spb.ConsumeRequest(close=spb.ConsumeClose()))
        while (await consume.read()).WhichOneof("response") != "closed":
            pass


async def test_every_refusal_is_counted_by_rpc_and_code(tmp_path: Path, captured: io.StringIO) -> None:
    with ServerThread(node_config(tmp_path / "data", max_message_bytes=1024)) as srv:
        await _refuse_some(srv.address)
        registry = srv.node.metrics.registry

        def count(rpc: str, code: str) -> float | None:
            return registry.get_sample_value("streamingnode_refusals_total", {"rpc": rpc, "code": code})

        assert count("Produce", "message_too_large") == 1
        assert count("Produce", "invalid_argument") == 1
        assert count("GetLatestPosition", "channel_not_exist") == 1
        assert count("Consume", "channel_not_exist") == 1
        assert count("Consume", "invalid_argument") == 1

    # Each is logged once, at WARNING, with what an operator needs to find the caller.
    refusals = [r for r in _records(captured) if r["event"] == "request refused"]
    assert sorted((r["rpc"], r["code"]) for r in refusals) == [
        ("Consume", "CHANNEL_NOT_EXIST"), ("Consume", "INVALID_ARGUMENT"), ("GetLatestPosition", "CHANNEL_NOT_EXIST"),
        ("Produce", "INVALID_ARGUMENT"), ("Produce", "MESSAGE_TOO_LARGE")]
    for r in refusals:
        assert r["level"] == "warning" and r["request_id"] == "r-7" and r["peer"].startswith("ipv4:127.0.0.1:"), r
    # Streams log their open and close at DEBUG.
    events = [(r["event"], r["level"]) for r in _records(captured)]
    for event in ("produce stream opened", "produce stream closed", "consume stream opened", "consume stream closed"):
        assert (event, "debug") in events, event


def test_the_refusal_log_is_rate_limited_per_rpc_and_code_and_says_how_many_it_left_out(
    captured: io.StringIO,
) -> None:
    now = [0.0]
    refusals = Refusals(None, burst=3, interval=10.0, clock=lambda: now[0])
    bad = InvalidArgumentError("bad")
    for _ in range(20):
        refusals.note("Produce", bad, "ipv4:1.2.3.4:5")
    refusals.note("Flush", bad)  # another (RPC, code) has its own budget
    refusals.note("Produce", OnShutdownError("draining"))  # and another code
    now[0] = 10.0
    refusals.note("Produce", bad)
    lines = [r for r in _records(captured) if r["event"] == "request refused"]
    produce_bad = [r for r in lines if r["rpc"] == "Produce" and r["code"] == "INVALID_ARGUMENT"]
    assert len(produce_bad) == 4 and [r.get("suppressed") for r in produce_bad] == [None, None, None, 17]
    assert [r["level"] for r in lines if r["code"] == "ON_SHUTDOWN"] == ["info"]  # routine in a drain
    assert [r["rpc"] for r in lines if r["rpc"] == "Flush"] == ["Flush"]


def test_the_dashboard_refusal_panel_queries_the_refusal_counter() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    (panel,) = [p for p in panels if p["title"] == "Refused requests by RPC and error code"]
    (target,) = panel["targets"]
    assert "streamingnode_refusals_total{" in target["expr"] and "by (rpc, code)" in target["expr"]
    assert "{{rpc}}" in target["legendFormat"] and "{{code}}" in target["legendFormat"]


async def test_a_transaction_expiry_is_logged_at_info(tmp_path: Path, captured: io.StringIO) -> None:
    with ServerThread(node_config(tmp_path / "data")) as srv:
        async with grpc.aio.insecure_channel(srv.address) as channel:
            stub = streaming_pb2_grpc.StreamingNodeStub(channel)
            await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p1"]))
            begun = await stub.BeginTxn(spb.BeginTxnRequest(pchannel="p1", vchannel="v1", keepalive_ms=1))
            # Idle past its keepalive: the next time tick expires it (no message needed), and says so.
            await until(lambda: '"transaction expired"' in captured.getvalue(), "the expiry to be logged")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.CommitTxn(spb.CommitTxnRequest(pchannel="p1", vchannel="v1", txn_id=begun.txn_id))
            assert refused.value.code() == grpc.StatusCode.ABORTED, refused.value
    (expired,) = [r for r in _records(captured) if r["event"] == "transaction expired"]
    assert expired["level"] == "info" and expired["txn_id"] == begun.txn_id and expired["pchannel"] == "p1"

