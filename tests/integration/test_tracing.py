"""Tracing through a real node: the consumer's span links to the producer's span across the WAL.

The node runs on a thread of this process (``ServerThread``) with its own TracerProvider and an
in-memory exporter, so the test sees the node's spans without touching the global provider.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from interceptors.chain import STEP_SPAN_PREFIX
from streamingnode.client import AsyncClient, Client
from streamingnode.observability.tracing import (
    CONSUME_SPAN,
    PRODUCE_SPAN,
    TRACEPARENT,
    Tracing,
    context_from_properties,
)
from streamingnode.server import ServerThread, start_server
from tests.integration.conftest import node_config
from tests.waiting import until
from wal.errors import InvalidArgumentError
from wal.message import Message, MessageType

pytestmark = pytest.mark.integration


@pytest.fixture
def traced_server(tmp_path: Path, provider: TracerProvider) -> Iterator[ServerThread]:
    with ServerThread(node_config(tmp_path / "data", channels=("p",)), tracing=Tracing(provider)) as srv:
        yield srv


def _named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


async def _read(client: AsyncClient, count: int) -> list[Message]:
    out: list[Message] = []
    async with asyncio.timeout(10), client.consumer("p", "v0") as consumer:
        async for pack in consumer:
            out.extend(m for m in pack.messages if m.message_type is MessageType.DATA)
            if len(out) >= count:
                return out
    raise AssertionError("the read ended early")


async def _consume_spans(exporter: InMemorySpanExporter, count: int) -> list[ReadableSpan]:
    # The node ends a consume span after the write, which may come just after the client got the pack.
    await until(lambda: len(_named(exporter, CONSUME_SPAN)) >= count, f"{count} finished consume spans")
    return _named(exporter, CONSUME_SPAN)


async def test_the_consumers_span_links_to_the_producers_span_across_the_wal(
    traced_server: ServerThread, exporter: InMemorySpanExporter,
) -> None:
    async with AsyncClient(traced_server.address, timeout=10.0) as client:
        async with client.producer("p") as producer:
            await asyncio.gather(producer.send("v0", b"a"), producer.send("v0", b"b"))
        delivered = await _read(client, 2)

    (produce,) = _named(exporter, PRODUCE_SPAN)  # one batch: both sends went out together
    assert produce.context is not None and produce.parent is None  # the client had no span
    assert produce.attributes is not None and produce.attributes["messaging.batch.message_count"] == 2
    # Every step of the chain ran in its own span, inside the produce span's trace.
    steps = [s for s in exporter.get_finished_spans() if s.name.startswith(STEP_SPAN_PREFIX)]
    assert len(steps) == 6 and {s.context.trace_id for s in steps if s.context} == {produce.context.trace_id}

    # What the consumer received carries the producer's context ...
    for m in delivered:
        ctx = context_from_properties(m.properties)
        assert ctx is not None and (ctx.trace_id, ctx.span_id) == (produce.context.trace_id, produce.context.span_id)
    # ... and the node's consume span links to the produce span (once, though two messages carry it).
    (consume,) = await _consume_spans(exporter, 1)
    assert [(link.context.trace_id, link.context.span_id) for link in consume.links] == [
        (produce.context.trace_id, produce.context.span_id)]
    assert consume.attributes is not None
    assert consume.attributes["messaging.destination.name"] == "p"
    assert consume.attributes["streamingnode.vchannel"] == "v0"
    assert consume.attributes["messaging.batch.message_count"] == 2


async def test_a_producing_clients_span_is_the_parent_and_what_the_consumer_links_to(
    traced_server: ServerThread, provider: TracerProvider, exporter: InMemorySpanExporter,
) -> None:
    app = provider.get_tracer("app")
    async with AsyncClient(traced_server.address, timeout=10.0) as client:
        async with client.producer("p") as producer:
            with app.start_as_current_span("order placed") as caller:
                await producer.send("v0", b"a", properties={"k": "v"})
        (m,) = await _read(client, 1)

    want = caller.get_span_context()
    (produce,) = _named(exporter, PRODUCE_SPAN)
    assert produce.parent is not None and produce.parent.span_id == want.span_id
    assert produce.context is not None and produce.context.trace_id == want.trace_id
    ctx = context_from_properties(m.properties)
    assert ctx is not None and ctx.span_id == want.span_id  # the client's own value was kept
    assert m.properties["k"] == "v"
    (consume,) = await _consume_spans(exporter, 1)
    assert [link.context.span_id for link in consume.links] == [want.span_id]


def test_the_blocking_client_sends_the_callers_context_from_its_own_thread(
    traced_server: ServerThread, provider: TracerProvider, exporter: InMemorySpanExporter,
) -> None:
    # The sync client runs its producer on the loop of another thread; the caller's context must
    # still be the one the message gets (run_coroutine_threadsafe carries the caller's contextvars).
    app = provider.get_tracer("app")
    with Client(traced_server.address, timeout=10.0) as client, client.producer("p") as producer, \
            app.start_as_current_span("sync caller") as caller:
        producer.send("v0", b"a")
    (produce,) = _named(exporter, PRODUCE_SPAN)
    assert produce.parent is not None and produce.parent.span_id == caller.get_span_context().span_id


async def test_without_tracing_nothing_is_added_to_the_messages(server: str) -> None:
    async with AsyncClient(server, timeout=10.0) as client:
        await client.create_channels(["p"])
        async with client.producer("p") as producer:
            await producer.send("v0", b"a", properties={"k": "v"})
        (m,) = await _read(client, 1)
    assert m.properties == {"k": "v"}
    assert TRACEPARENT not in m.properties


async def test_otlp_without_its_package_stops_the_node_from_starting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # None in sys.modules fails the import whether or not the exporter happens to be installed.
    for module in ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
                   "opentelemetry.exporter.otlp.proto.http.trace_exporter"):
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(InvalidArgumentError, match="needs the opentelemetry-exporter-otlp package"):
        await start_server(node_config(tmp_path / "data", trace_exporter="otlp"))
    assert not (tmp_path / "data").exists()  # refused before anything was opened


def test_a_configured_exporter_is_set_up_by_the_server_and_flushed_when_it_stops(
    tmp_path: Path, capfd: pytest.CaptureFixture[str],
) -> None:
    # The console exporter writes to the process's stdout; the spans are batched, so they appear only
    # if stopping the server shuts the provider down (which flushes them).
    with ServerThread(node_config(tmp_path / "data", channels=("p",), trace_exporter="console")) as srv, \
            Client(srv.address, timeout=10.0) as client, client.producer("p") as producer:
        producer.send("v0", b"a")
    out = capfd.readouterr().out
    assert f'"name": "{PRODUCE_SPAN}"' in out
    assert '"service.name": "streamingnode"' in out
