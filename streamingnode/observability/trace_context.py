"""The W3C trace context carried in message properties, from producer to consumer.

This is the part of tracing a client needs: reading a producer's context out of a message
(``context_from_properties``, ``message_links``) and putting the caller's current context into the
properties of a message it sends (``with_current_context``).  It depends on the OpenTelemetry API
and the message model only, so the client SDK can import it without the node, the server or the
interceptor chain; the node's spans live in ``streamingnode.observability.tracing``.
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry import trace
from opentelemetry.trace import Link, SpanContext
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from wal.message import Message

TRACEPARENT = "traceparent"
"""Message property with the W3C ``traceparent`` of the span that produced the message."""
TRACESTATE = "tracestate"
"""Message property with the W3C ``tracestate`` of that span (absent when it is empty)."""
MAX_LINKS = 128
"""At most this many producer contexts are linked from one span (a pack may hold thousands)."""
# Only the trace context, not the global composite propagator: baggage would put arbitrary caller
# entries into every stored message.
_propagator = TraceContextTextMapPropagator()


def context_from_properties(properties: dict[str, str]) -> SpanContext | None:
    """The valid remote span context in ``properties`` (``traceparent``/``tracestate``), or None."""
    if TRACEPARENT not in properties:
        return None
    ctx = _propagator.extract(properties)
    span_context = trace.get_current_span(ctx).get_span_context()
    return span_context if span_context.is_valid else None


def message_links(messages: Iterable[Message], limit: int = MAX_LINKS) -> list[Link]:
    """Links to the producer contexts carried by ``messages``: each distinct one once, at most
    ``limit``.  For a consumer's own processing span: ``tracer.start_as_current_span("process",
    links=message_links(pack.messages))``."""
    seen: set[str] = set()  # every distinct traceparent met, valid or not: each is parsed once
    links: list[Link] = []
    for m in messages:
        props = m.properties
        if not props:
            continue
        tp = props.get(TRACEPARENT)
        if tp is None or tp in seen:
            continue
        seen.add(tp)
        span_context = context_from_properties(props)
        if span_context is not None:
            links.append(Link(span_context))
            if len(links) >= limit:
                break
    return links


def with_current_context(properties: dict[str, str] | None) -> dict[str, str] | None:
    """``properties`` plus the caller's current span context, when a recording span is current and
    the properties carry no ``traceparent`` yet; otherwise ``properties`` unchanged.  The caller's
    dict is never modified (a copy gets the context).  For clients: one context-variable read."""
    span = trace.get_current_span()
    if not span.is_recording() or (properties and TRACEPARENT in properties):
        return properties
    out = dict(properties) if properties else {}
    out.update(span_properties(span))
    return out


def span_properties(span: trace.Span) -> dict[str, str]:
    """The message properties (``traceparent``, and ``tracestate`` when not empty) that carry
    ``span``'s context; empty for a span without a valid context."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, trace.set_span_in_context(span))
    return carrier


__all__ = [
    "MAX_LINKS",
    "TRACEPARENT",
    "TRACESTATE",
    "context_from_properties",
    "message_links",
    "span_properties",
    "with_current_context",
]
