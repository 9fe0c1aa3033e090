"""Tracing on the chain: a produce span with one nested child per step, the W3C context stored with
each message, links on the consumer side, and nothing at all when tracing is off.

Each test has its own TracerProvider and in-memory exporter (the global provider is never touched,
so the tests do not leak spans into one another).
"""

from __future__ import annotations

import sys

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind

from interceptors.chain import STEP_SPAN_PREFIX
from interceptors.recovery.streaming_wal import ChainConfig, StreamingWAL, open_streaming_wal
from streamingnode.observability.tracing import (
    CONSUME_SPAN,
    MAX_LINKS,
    PRODUCE_SPAN,
    TRACEPARENT,
    TRACESTATE,
    Tracing,
    context_from_properties,
    message_links,
    with_current_context,
)
from tests.factories import data
from wal import Message, WALManager
from wal.errors import InvalidArgumentError

STEPS = ["dedup", "lock", "shard", "timetick", "redo", "txn"]
FAST = ChainConfig(tick_interval=0.02)


async def _open(manager: WALManager, tracing: Tracing | None) -> StreamingWAL:
    await manager.create_channel("p")
    swal = await open_streaming_wal(manager, "p", FAST, tracer=None if tracing is None else tracing.tracer)
    await swal.ready()
    return swal


def _by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    out = {s.name: s for s in spans}
    assert len(out) == len(spans), [s.name for s in spans]  # every name once
    return out


def _traceparent(span: ReadableSpan) -> str:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


async def test_produce_span_has_one_nested_child_per_step_and_its_context_is_stored(
    manager: WALManager, provider: TracerProvider, exporter: InMemorySpanExporter,
) -> None:
    tracing = Tracing(provider)
    swal = await _open(manager, tracing)
    exporter.clear()  # recovery's own appends ran under no span; nothing of them is wanted here
    batch = [data("v0", b"a"), data("v1", b"b", keep="me")]
    results = await tracing.produce("p", 7, batch, swal.append_batch)

    spans = _by_name(exporter.get_finished_spans())
    assert set(spans) == {PRODUCE_SPAN, *(STEP_SPAN_PREFIX + s for s in STEPS)}
    produce = spans[PRODUCE_SPAN]
    assert produce.parent is None and produce.kind is SpanKind.PRODUCER
    assert produce.attributes is not None
    assert produce.attributes["messaging.destination.name"] == "p"
    assert produce.attributes["streamingnode.request_id"] == 7
    assert produce.attributes["messaging.batch.message_count"] == 2
    # Nested as the steps call one another: dedup under produce, lock under dedup, ... txn under redo.
    parent = produce
    for step in STEPS:
        span = spans[STEP_SPAN_PREFIX + step]
        assert span.parent is not None and parent.context is not None
        assert span.parent.span_id == parent.context.span_id, step
        assert span.context is not None and span.context.trace_id == parent.context.trace_id
        assert span.start_time is not None and parent.start_time is not None and span.start_time >= parent.start_time
        parent = span

    # The context goes through the WAL: what is stored (and read back) carries the produce span's.
    stored = await swal.wal.read_stored(results[0].message_id, 1 << 20)
    stored = [m for m in stored if m.message_id in {r.message_id for r in results}]
    assert [m.properties[TRACEPARENT] for m in stored] == [_traceparent(produce)] * 2
    assert stored[1].properties["keep"] == "me"
    assert all(TRACESTATE not in m.properties for m in stored)  # an empty tracestate is not stored
    await swal.aclose()


async def test_tracing_off_makes_no_spans_and_adds_no_properties(
    manager: WALManager, provider: TracerProvider, exporter: InMemorySpanExporter,
) -> None:
    swal = await _open(manager, None)
    # Even under a recording span of the caller, an untraced chain makes no span of its own.
    with provider.get_tracer("test").start_as_current_span("caller"):
        results = await swal.append_batch([data("v0", b"a"), data("v0", b"b", k="v")])
    assert [s.name for s in exporter.get_finished_spans()] == ["caller"]
    stored = await swal.wal.read_stored(results[0].message_id, 1 << 20)
    by_id = {m.message_id: m for m in stored}
    assert by_id[results[0].message_id].properties == {}
    assert by_id[results[1].message_id].properties == {"k": "v"}
    await swal.aclose()


async def test_a_traced_chain_makes_no_spans_for_appends_outside_a_request(
    manager: WALManager, provider: TracerProvider, exporter: InMemorySpanExporter,
) -> None:
    swal = await _open(manager, Tracing(provider))
    results = await swal.append_batch([data("v0", b"a")])  # as an age seal or recovery would
    assert exporter.get_finished_spans() == ()
    stored = await swal.wal.read_stored(results[0].message_id, 1 << 20)
    assert TRACEPARENT not in stored[0].properties
    await swal.aclose()


async def test_a_clients_context_is_kept_and_parents_the_produce_span(
    manager: WALManager, provider: TracerProvider, exporter: InMemorySpanExporter,
) -> None:
    tracing = Tracing(provider)
    swal = await _open(manager, tracing)
    tracer = provider.get_tracer("client")
    with tracer.start_as_current_span("client-a") as a:
        first = with_current_context(None)
    with tracer.start_as_current_span("client-b") as b:
        second = with_current_context({"user": "x"})
    assert first is not None and second is not None
    batch = [data("v0", b"1", **first), data("v0", b"2", **second), data("v0", b"3")]
    exporter.clear()
    results = await tracing.produce("p", 1, batch, swal.append_batch)

    produce = _by_name(exporter.get_finished_spans())[PRODUCE_SPAN]
    assert produce.parent is not None and produce.parent.span_id == a.get_span_context().span_id
    assert produce.context is not None and produce.context.trace_id == a.get_span_context().trace_id
    assert [link.context.span_id for link in produce.links] == [b.get_span_context().span_id]
    stored = {m.message_id: m for m in await swal.wal.read_stored(results[0].message_id, 1 << 20)}
    got = [stored[r.message_id].properties[TRACEPARENT] for r in results]
    assert got == [first[TRACEPARENT], second[TRACEPARENT], _traceparent(produce)]
    assert stored[results[1].message_id].properties["user"] == "x"
    await swal.aclose()


def test_message_links_are_deduplicated_and_capped(provider: TracerProvider) -> None:
    tracer = provider.get_tracer("t")
    contexts = []
    for _ in range(MAX_LINKS + 20):
        with tracer.start_as_current_span("p"):
            props = with_current_context(None)
            assert props is not None
            contexts.append(props)
    # Each context on two messages, plus messages without one and one with a malformed value.
    messages = [data("v", b"", **c) for c in contexts for _ in range(2)]
    messages[1:1] = [data("v", b""), data("v", b"", traceparent="not-a-traceparent")]
    links = message_links(messages)
    assert len(links) == MAX_LINKS
    assert len({link.context.span_id for link in links}) == MAX_LINKS
    first = context_from_properties(contexts[0])
    assert first is not None and links[0].context.span_id == first.span_id
    assert message_links([data("v", b"")]) == []


def test_with_current_context_without_a_span_costs_nothing_and_never_edits_the_callers_dict(
    provider: TracerProvider,
) -> None:
    props = {"a": "b"}
    assert with_current_context(props) is props  # no span: the very same dict, nothing added
    assert with_current_context(None) is None
    with provider.get_tracer("t").start_as_current_span("s") as span:
        out = with_current_context(props)
        kept = with_current_context({TRACEPARENT: "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
    assert out is not None and out is not props and props == {"a": "b"}
    ctx = context_from_properties(out)
    assert ctx is not None and ctx.span_id == span.get_span_context().span_id
    assert kept == {TRACEPARENT: "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    # A non-recording span (a context extracted from elsewhere) is not "the caller's span".
    remote = trace.NonRecordingSpan(span.get_span_context())
    with trace.use_span(remote):
        assert with_current_context(None) is None


def test_consume_span_links_the_producers(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    tracing = Tracing(provider)
    with provider.get_tracer("t").start_as_current_span("producer") as producer:
        props = with_current_context(None)
    assert props is not None
    messages: list[Message] = [data("v0", b"x", **props), data("v0", b"y", **props)]
    exporter.clear()
    with tracing.consume_span("p", "v0", messages):
        pass
    (span,) = exporter.get_finished_spans()
    assert span.name == CONSUME_SPAN and span.kind is SpanKind.CONSUMER
    assert [(link.context.trace_id, link.context.span_id) for link in span.links] == [
        (producer.get_span_context().trace_id, producer.get_span_context().span_id)]
    assert span.attributes is not None and span.attributes["messaging.batch.message_count"] == 2


def test_exporter_none_is_no_tracing_and_console_names_the_service() -> None:
    assert Tracing.from_exporter("none") is None
    tracing = Tracing.from_exporter("console")
    assert tracing is not None
    try:
        resource = getattr(tracing.provider, "resource", None)
        assert resource is not None and resource.attributes["service.name"] == "streamingnode"
    finally:
        tracing.shutdown()


def test_otlp_without_its_package_fails_at_once_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes the import fail, whether or not the package happens to be installed.
    for module in ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
                   "opentelemetry.exporter.otlp.proto.http.trace_exporter"):
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(InvalidArgumentError, match="pip install opentelemetry-exporter-otlp"):
        Tracing.from_exporter("otlp")
    with pytest.raises(InvalidArgumentError, match="trace_exporter must be one of"):
        Tracing.from_exporter("jaeger")


async def test_a_request_the_sampler_drops_costs_no_step_spans_and_no_properties(
    manager: WALManager, exporter: InMemorySpanExporter,
) -> None:
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(provider)
    swal = await _open(manager, tracing)
    results = await tracing.produce("p", 1, [data("v0", b"a")], swal.append_batch)
    assert exporter.get_finished_spans() == ()
    stored = await swal.wal.read_stored(results[0].message_id, 1 << 20)
    assert stored[0].properties == {}
    await swal.aclose()
    provider.shutdown()
