"""OpenTelemetry tracing: a span per produce request, a child per interceptor step, a span per
delivered MsgPack, and the W3C trace context carried from producer to consumer in message properties.

Off by default (``trace_exporter = "none"``), and then free: the node holds no ``Tracing``, the chain
is built without its traced steps, and no message is touched.  Whether tracing is on is decided once,
when the server starts; nothing on the hot path asks again.

When on:

* ``streamingnode.produce`` (kind PRODUCER): one per produce request (batch), with the pchannel, the
  request id and the message count.  Every message of the batch gets this span's context as the
  properties ``traceparent`` / ``tracestate`` (W3C trace context), unless the client already put a
  ``traceparent`` there: that value is kept, and the produce span becomes a child of the first such
  context (and links to the others).  A request the sampler drops adds nothing to its messages.
* ``streamingnode.interceptor.<step>``: one per chain step, nested as the steps call one another
  (dedup > lock > shard > timetick > redo > txn), made only under a recording parent span, so the
  node's own background appends (age seals, recovery) make no orphan spans.
* ``streamingnode.consume`` (kind CONSUMER): one per delivered MsgPack that holds messages, with the
  pchannel, the vchannel and the message count, linked to the (deduplicated, at most ``MAX_LINKS``)
  producer contexts found in its messages.

The provider is passed in (``Tracing(provider)``), never read from the global: tests give each node
its own provider with an in-memory exporter, and the process-wide provider can only be set once.

The trace context in message properties, the part a client needs, lives in
``streamingnode.observability.trace_context`` (re-exported here); this module is the node's side.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind
from opentelemetry.util.types import Attributes

from interceptors.chain import STEP_SPAN_PREFIX
from streamingnode.observability.trace_context import (
    MAX_LINKS,
    TRACEPARENT,
    TRACESTATE,
    context_from_properties,
    message_links,
    span_properties,
    with_current_context,
)
from wal.errors import InvalidArgumentError
from wal.message import AppendResult, Message

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

EXPORTERS = ("none", "console", "otlp")
SERVICE_NAME = "streamingnode"
OTLP_PACKAGE = "opentelemetry-exporter-otlp"

PRODUCE_SPAN = "streamingnode.produce"
CONSUME_SPAN = "streamingnode.consume"


class Tracing:
    """The node's tracer and the spans it makes.  ``provider`` is any TracerProvider; the creator
    of the provider shuts it down (``shutdown`` does so for one made by ``from_exporter``)."""

    def __init__(self, provider: trace.TracerProvider, *, owns_provider: bool = False) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("streamingnode")
        self._owns_provider = owns_provider

    @classmethod
    def from_exporter(cls, exporter: str) -> Tracing | None:
        """A provider (service.name ``streamingnode``) exporting with ``exporter`` in batches, or None
        for ``"none"``.  ``"otlp"`` needs the ``opentelemetry-exporter-otlp`` package; without it this
        fails at once, naming the package, instead of dropping every span later."""
        if exporter == "none":
            return None
        # The SDK is imported only here: a node with tracing off, and every client, never loads it.
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter  # noqa: PLC0415

        span_exporter: SpanExporter
        if exporter == "console":
            # sys.stdout as it is now: the exporter's default is the one of when it was imported.
            span_exporter = ConsoleSpanExporter(service_name=SERVICE_NAME, out=sys.stdout)
        elif exporter == "otlp":
            span_exporter = _otlp_exporter()
        else:
            raise InvalidArgumentError(
                f"trace_exporter must be one of {', '.join(EXPORTERS)}, got {exporter!r}", field="trace_exporter")
        provider = TracerProvider(resource=Resource.create({"service.name": SERVICE_NAME}))
        provider.add_span_processor(BatchSpanProcessor(span_exporter))
        return cls(provider, owns_provider=True)

    def shutdown(self) -> None:
        """Flush and stop the exporter if this object made the provider (blocks; call off the loop)."""
        if self._owns_provider:
            shutdown = getattr(self.provider, "shutdown", None)
            if shutdown is not None:
                shutdown()

    async def produce(
        self,
        pchannel: str,
        request_id: int,
        messages: list[Message],
        append: Callable[[list[Message]], Awaitable[list[AppendResult]]],
    ) -> list[AppendResult]:
        """``append(messages)`` under a produce span whose context goes into each message's properties
        (a client's own ``traceparent`` is kept, and becomes the span's parent)."""
        # The client's contexts: the first valid one is the parent, the others are linked.
        parent_ctx = None
        links: list[Link] = []
        seen: set[str] = set()
        for m in messages:
            props = m.properties
            if len(links) >= MAX_LINKS:
                break
            tp = props.get(TRACEPARENT) if props else None
            if tp is None or tp in seen:
                continue
            seen.add(tp)
            span_context = context_from_properties(props)
            if span_context is None:
                continue
            if parent_ctx is None:
                parent_ctx = trace.set_span_in_context(trace.NonRecordingSpan(span_context))
            else:
                links.append(Link(span_context))
        attributes: Attributes = {
            "messaging.system": SERVICE_NAME,
            "messaging.destination.name": pchannel,
            "messaging.batch.message_count": len(messages),
            "streamingnode.request_id": request_id,
        }
        with self.tracer.start_as_current_span(
            PRODUCE_SPAN, context=parent_ctx, kind=SpanKind.PRODUCER, attributes=attributes, links=links,
        ) as span:
            # A span the sampler dropped is not worth a link: its messages stay as they came (which
            # also keeps them on the codec's fast path for records without properties).
            carrier = span_properties(span) if span.is_recording() else {}
            if carrier:
                for m in messages:
                    props = m.properties
                    if TRACEPARENT not in props:
                        props.update(carrier)
            return await append(messages)

    @contextmanager
    def consume_span(self, pchannel: str, vchannel: str, messages: list[Message]) -> Iterator[trace.Span]:
        """A span around delivering one MsgPack, linked to the producers of its messages."""
        attributes: Attributes = {
            "messaging.system": SERVICE_NAME,
            "messaging.destination.name": pchannel,
            "streamingnode.vchannel": vchannel,
            "messaging.batch.message_count": len(messages),
        }
        with self.tracer.start_as_current_span(
            CONSUME_SPAN, kind=SpanKind.CONSUMER, attributes=attributes, links=message_links(messages),
        ) as span:
            yield span


def _otlp_exporter() -> SpanExporter:
    # gRPC first (the collector's default port 4317), then HTTP; both come with the meta package.
    # Endpoint, headers and timeout come from the standard OTEL_EXPORTER_OTLP_* environment variables.
    for module in ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
                   "opentelemetry.exporter.otlp.proto.http.trace_exporter"):
        try:
            found = importlib.import_module(module)
        except ImportError:
            continue
        exporter: SpanExporter = found.OTLPSpanExporter()
        return exporter
    raise InvalidArgumentError(
        f"trace_exporter 'otlp' needs the {OTLP_PACKAGE} package, which is not installed: "
        f"pip install {OTLP_PACKAGE}", field="trace_exporter")


__all__ = [
    "CONSUME_SPAN",
    "EXPORTERS",
    "MAX_LINKS",
    "PRODUCE_SPAN",
    "STEP_SPAN_PREFIX",
    "TRACEPARENT",
    "TRACESTATE",
    "Tracing",
    "context_from_properties",
    "message_links",
    "with_current_context",
]
