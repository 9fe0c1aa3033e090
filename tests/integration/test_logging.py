"""The node's logs: JSON lines when no one watches a terminal, call and channel context bound to every
line, and nothing logged per message at INFO."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import structlog

from streamingnode.client import AsyncClient
from streamingnode.observability.logs import configure_logging
from streamingnode.server import ServerThread
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc
from tests.integration.conftest import node_config

pytestmark = pytest.mark.integration


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    out = io.StringIO()
    configure_logging("info", out, cache=False)
    try:
        yield out
    finally:
        structlog.reset_defaults()


def lines(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines() if line]


async def _produce(address: str, n: int) -> None:
    async with AsyncClient(address) as client, client.producer("p1") as producer:
        for i in range(n):
            await producer.send("v1", b"x" * (i % 50))
        last = await producer.send("v1", b"end")
        async with client.consumer("p1", "v1") as consumer:
            async for pack in consumer:
                if pack.end_ts >= last.timetick:
                    break


async def test_json_lines_with_bound_context_and_none_per_message(captured: io.StringIO, tmp_path: Path) -> None:
    with ServerThread(node_config(tmp_path / "data")) as srv:
        async with grpc.aio.insecure_channel(srv.address) as channel:
            stub = streaming_pb2_grpc.StreamingNodeStub(channel)
            await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p1"]),
                                      metadata=(("x-request-id", "req-42"),))
        await _produce(srv.address, 10)
        after_small = len(lines(captured))
        await _produce(srv.address, 300)
        after_large = len(lines(captured))

    records = lines(captured)  # every line parses as JSON (the stream is not a terminal)
    assert all({"event", "level", "timestamp"} <= r.keys() for r in records)
    (created,) = [r for r in records if r["event"] == "channels created"]
    assert created["rpc"] == "CreateChannels" and created["request_id"] == "req-42"
    # The channel's own lines carry pchannel and term, not the call that opened it (its tasks outlive it).
    (started,) = [r for r in records if r["event"] == "flusher started"]
    assert started["pchannel"] == "p1" and started["term"] == 1 and "request_id" not in started
    (ready,) = [r for r in records if r["event"] == "node ready"]
    assert "term" not in ready and "pchannel" not in ready, "a channel's context does not leak to the node's"
    # 300 more messages produced and consumed added not one line at INFO.
    assert after_large == after_small


def test_readable_only_when_both_streams_are_terminals(monkeypatch: pytest.MonkeyPatch) -> None:
    log = structlog.get_logger("t")
    try:
        monkeypatch.setattr("sys.stdout.isatty", lambda: True)
        term = _Terminal()
        configure_logging("info", term, cache=False)
        log.info("hello", pchannel="p")
        assert "hello" in term.getvalue() and not term.getvalue().startswith("{")

        monkeypatch.setattr("sys.stdout.isatty", lambda: False)  # e.g. `serve | tee`: a collector reads it
        piped = _Terminal()
        configure_logging("info", piped, cache=False)
        log.info("hello", pchannel="p")
        assert json.loads(piped.getvalue()) | {"timestamp": None} == {
            "event": "hello", "pchannel": "p", "level": "info", "timestamp": None}

        configure_logging("warning", piped, cache=False)
        log.info("quiet")
        assert "quiet" not in piped.getvalue()
    finally:
        structlog.reset_defaults()
