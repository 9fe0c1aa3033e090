"""The chain builder: composes interceptors outermost-first and times every step.

Each step's time is its own: the time spent inside it minus the time spent in the steps it called.
The builder, not each interceptor, measures, so an interceptor stays oblivious of metrics.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from interceptors.base import AppendNext, Interceptor, NamedInterceptor, ReadyInterceptor
from wal.message import AppendResult, Message


@dataclass(slots=True)
class StepTiming:
    """Cumulative own-time of one interceptor (seconds), its batch count and its message count."""

    name: str
    seconds: float = 0.0
    batches: int = 0
    messages: int = 0


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


def build_chain(interceptors: Sequence[Interceptor], terminal: AppendNext) -> Chain:
    """Compose ``interceptors`` (outermost first) in front of ``terminal`` (the WAL append)."""
    timings = [StepTiming(step_name(i)) for i in interceptors]
    nxt: AppendNext = terminal
    for idx in range(len(interceptors) - 1, -1, -1):
        nxt = _timed_step(interceptors[idx], nxt, timings[idx])
    return Chain(list(interceptors), nxt, timings)


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
            timing.seconds += perf() - t0 - below
            timing.batches += 1
            timing.messages += len(batch)

    return step


__all__ = ["Chain", "StepTiming", "build_chain", "step_name"]
