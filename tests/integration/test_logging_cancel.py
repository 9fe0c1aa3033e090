"""A client that cancels its Consume stream mid-delivery is normal: the node prints no traceback and
logs no error for it (neither an unretrieved task exception nor "unexpected error in RPC")."""

from __future__ import annotations

import asyncio
import gc
import io
import json
import logging
import sys
from pathlib import Path

import grpc
import pytest
import structlog

from streamingnode.client import AsyncClient
from streamingnode.observability.logs import configure_logging
from streamingnode.server import ServerThread
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc
from tests.integration.conftest import node_config
from tests.waiting import until

pytestmark = pytest.mark.integration


async def _writes_pending() -> bool:
    return any("_locked_write" in repr(t.get_coro()) for t in asyncio.all_tasks() if not t.done())


async def test_cancelling_consume_mid_delivery_logs_no_error_and_no_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    out = io.StringIO()
    configure_logging("info", out, cache=False)
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)  # asyncio's "Task exception was never retrieved" lands here
    try:
        with ServerThread(node_config(tmp_path / "data")) as srv:
            async with AsyncClient(srv.address) as client:
                await client.create_channels(["p1"])
                async with client.producer("p1") as producer:
                    sent = [producer.send_nowait("v1", b"x" * 4000) for _ in range(2000)]
                    await asyncio.gather(*sent)
            async with grpc.aio.insecure_channel(srv.address) as channel:
                stub = streaming_pb2_grpc.StreamingNodeStub(channel)
                for _ in range(30):
                    call = stub.Consume()
                    await call.write(spb.ConsumeRequest(open=spb.ConsumeOpen(
                        pchannel="p1", vchannel="v1", max_pack_messages=10)))
                    await call.read()  # opened
                    await call.read()  # a first pack: delivery is under way
                    call.cancel()
                    assert await call.code() == grpc.StatusCode.CANCELLED
            # Each cancelled stream's handler has ended.
            registry = srv.node.metrics.registry
            await until(lambda: registry.get_sample_value("streamingnode_open_streams") == 0, "the streams ended")
            await until(lambda: not srv.run(_writes_pending()), "the node's writes to them ended")
            gc.collect()  # a task that failed unseen reports it when it is collected
    finally:
        structlog.reset_defaults()
    records = [json.loads(line) for line in out.getvalue().splitlines() if line]
    errors = [r for r in records if r["level"] in ("error", "critical")]
    assert not errors, errors
    assert "Traceback" not in stderr.getvalue() and "never retrieved" not in stderr.getvalue(), stderr.getvalue()
    # asyncio reports an exception nobody retrieved through the logging module (captured here).
    unretrieved = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not unretrieved, unretrieved
