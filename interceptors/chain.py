"""The chain builder: composes interceptors outermost-first and times every step.

Each step's time is its own: the time spent inside it minus the time spent in the steps it called.
The builder, not each interceptor, measures, so an interceptor stays oblivious of metrics.  Timing a
batch costs four clock reads and a coroutine per step (about a sixth of a lone append's work), so one
batch in ``SAMPLE_EVERY`` goes through the timed steps and the others through steps that only count;
a timed batch's own time counts for it and for the untimed batches the step saw since the last
timed one.  Batch and message counts are exact.

Given a ``tracer``, the builder also wraps every step in a span (``streamingnode.interceptor.<name>``),
so the spans nest as the steps call one another.  Without one (tracing off, the default) the chain is
exactly the timed one: the choice is made here, once, not on every append.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field

from opentelemetry.trace import Tracer, get_current_span

from interceptors.base import AppendNext, Interceptor, NamedInterceptor, ReadyInterceptor
from wal.message import AppendResult, Message

STEP_SPAN_PREFIX = "streamingnode.interceptor."


SAMPLE_EVERY = 16
"""One batch in this many is timed step by step (the first one included)."""


@dataclass(slots=True)
class StepTiming:
    """Own time of one interceptor (seconds), its batch count and its message count."""

    name: str
    seconds: float = 0.0
    """Cumulative own time: each timed batch's own time counts for itself and for the batches this
    step saw untimed since the one timed before it (so the total only grows, as a counter must)."""
    batches: int = 0
    messages: int = 0
    untimed: int = 0
    """Batches seen since the last timed one."""


@dataclass
class Chain:
    """A built chain: call ``append`` with a batch; ``timings`` holds each step's own time."""

    interceptors: list[Interceptor]
    append: AppendNext
    timings: list[StepTiming] = field(default_factory=list)

    async def ready(self) -> None:
        """Wait until every interceptor with a ``ready`` ability is ready."""
        waits = [i.ready() for i in self.interceptors if isinstance(i, ReadyInterceptor)]
        if waits:
            await asyncio.gather(*waits)

    async def close(self) -> None:
        """Close innermost first, so an outer step never sees an inner one already gone."""
        for i in reversed(self.interceptors):
            await i.close()


def step_name(interceptor: Interceptor) -> str:
    if isinstance(interceptor, NamedInterceptor):
        return interceptor.name
    return type(interceptor).__name__.removesuffix("Interceptor").lower()


def build_chain(interceptors: Sequence[Interceptor], terminal: AppendNext, *, tracer: Tracer | None = None) -> Chain:
    """Compose ``interceptors`` (outermost first) in front of ``terminal`` (the WAL append).

    With ``tracer``, each step also runs in a span, made only while a recording span is current (a
    produce request's): the node's own appends (age seals, recovery) make no root spans.
    """
    timings = [StepTiming(step_name(i)) for i in interceptors]
    timed: AppendNext = terminal
    counted: AppendNext = terminal
    for idx in range(len(interceptors) - 1, -1, -1):
        timed = _timed_step(interceptors[idx], timed, timings[idx])
        counted = _counted_step(interceptors[idx], counted, timings[idx])
        if tracer is not None:
            timed = _traced_step(timed, timings[idx].name, tracer)
            counted = _traced_step(counted, timings[idx].name, tracer)
    batches = 0

    def append(batch: list[Message]) -> Awaitable[list[AppendResult]]:
        nonlocal batches
        batches += 1
        return timed(batch) if batches % SAMPLE_EVERY == 1 else counted(batch)

    return Chain(list(interceptors), append, timings)


def _traced_step(timed: AppendNext, name: str, tracer: Tracer) -> AppendNext:
    # Outside the timed step: the span's own cost is in no step's time (the step above subtracts all
    # of its call below, and the step's own clock starts inside the span).
    span_name = STEP_SPAN_PREFIX + name

    async def step(batch: list[Message]) -> list[AppendResult]:
        if not get_current_span().is_recording():
            return await timed(batch)
        with tracer.start_as_current_span(span_name, attributes={"messaging.batch.message_count": len(batch)}):
            return await timed(batch)

    return step


def _timed_step(interceptor: Interceptor, inner: AppendNext, timing: StepTiming) -> AppendNext:
    perf = time.perf_counter
    do_append = interceptor.do_append

    async def step(batch: list[Message]) -> list[AppendResult]:
        below = 0.0  # time spent in the steps below during this call, subtracted from this step's

        async def call_inner(b: list[Message]) -> list[AppendResult]:
            nonlocal below
            t = perf()
            try:
                return await inner(b)
            finally:
                below += perf() - t

        t0 = perf()
        try:
            return await do_append(batch, call_inner)
        finally:
            timing.seconds += (perf() - t0 - below) * (timing.untimed + 1)
            timing.untimed = 0
            timing.batches += 1
            timing.messages += len(batch)

    return step


def _counted_step(interceptor: Interceptor, inner: AppendNext, timing: StepTiming) -> AppendNext:
    # A plain function handing back the step's own coroutine: no clock, no coroutine of its own.
    do_append = interceptor.do_append

    def step(batch: list[Message]) -> Awaitable[list[AppendResult]]:
        timing.batches += 1
        timing.messages += len(batch)
        timing.untimed += 1
        return do_append(batch, inner)

    return step


__all__ = ["SAMPLE_EVERY", "STEP_SPAN_PREFIX", "Chain", "StepTiming", "build_chain", "step_name"]
