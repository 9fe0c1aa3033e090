"""Caps on open streams: per node (``max_streams``) and per client connection
(``max_streams_per_connection``).

Produce and Consume streams hold a task, buffers and (for Consume) a scanner each for as long as they
stay open, so their number is what bounds the node's memory against many clients, or one client that
opens streams in a loop.  A stream over a cap is refused with RESOURCE_EXHAUSTED naming the cap: a
retriable code, so a client backs off and tries again, and a slot frees as soon as any stream ends.
The refusal first reads the client's opening request (waiting at most ``REFUSAL_READ_SECONDS``):
ending the call while that write is still on its way makes the write fail in the client's own gRPC
core (INTERNAL, "Internal error from Core"), and the client would never see why.

A connection is what ``context.peer()`` names: the address and port of the client's socket.  Several
client channels may share one connection (gRPC pools them when their options match), and then share
its cap.  Everything here runs on the node's event loop: plain counters, no locks.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import grpc

from wal.errors import ResourceExhaustedError

if TYPE_CHECKING:
    from streamingnode.observability.metrics import NodeMetrics

REFUSAL_READ_SECONDS = 1.0
"""How long a refused stream waits for the client's opening request before answering anyway (a
client that sends nothing must not keep the refusal, and its task, waiting)."""


class StreamLimits:
    """Counts open streams, node-wide and per connection; ``hold`` takes a slot for one stream."""

    def __init__(self, max_streams: int, max_per_connection: int, metrics: NodeMetrics | None = None) -> None:
        self.max_streams = max_streams
        self.max_per_connection = max_per_connection
        self.open = 0
        """Streams open on the node now."""
        self.per_connection: collections.Counter[str] = collections.Counter()
        """Streams open per connection (``context.peer()``); a connection with none is not kept."""
        self._metrics = metrics

    @contextlib.asynccontextmanager
    async def hold(self, context: grpc.aio.ServicerContext, rpc: str) -> AsyncIterator[None]:
        """A slot for one ``rpc`` stream on the connection of ``context`` while the block runs,
        however it ends (the client cancels, the stream fails, the node drains); ResourceExhaustedError
        when a cap is full."""
        refusal = self.refusal(context.peer(), rpc)
        if refusal is not None:
            with contextlib.suppress(Exception):  # whatever the first request is, the answer is the refusal
                async with asyncio.timeout(REFUSAL_READ_SECONDS):
                    await context.read()
            raise refusal
        with self.take(context.peer()):
            yield

    def refusal(self, peer: str, rpc: str) -> ResourceExhaustedError | None:
        """The error one more ``rpc`` stream from ``peer`` is refused with now (None: it fits)."""
        if self.open >= self.max_streams:
            self._refused("node")
            return ResourceExhaustedError(
                f"{rpc} refused: the node has max_streams={self.max_streams} streams open; retry later",
                limit="max_streams", max_streams=self.max_streams, rpc=rpc)
        if self.per_connection[peer] >= self.max_per_connection:
            self._refused("connection")
            return ResourceExhaustedError(
                f"{rpc} refused: this connection ({peer[:200]}) has max_streams_per_connection="
                f"{self.max_per_connection} streams open; close one or open another connection",
                limit="max_streams_per_connection", max_streams_per_connection=self.max_per_connection,
                peer=peer[:200], rpc=rpc)
        return None

    @contextlib.contextmanager
    def take(self, peer: str) -> Iterator[None]:
        """Count one stream from ``peer`` while the block runs (``refusal`` said it fits: the loop has
        not run anything between the two)."""
        self.open += 1
        self.per_connection[peer] += 1
        gauge = self._metrics.open_streams if self._metrics is not None else None
        if gauge is not None:
            gauge.inc()
        try:
            yield
        finally:
            self.open -= 1
            self.per_connection[peer] -= 1
            if self.per_connection[peer] <= 0:
                del self.per_connection[peer]  # a closed connection leaves nothing behind
            if gauge is not None:
                gauge.dec()

    def _refused(self, cap: str) -> None:
        if self._metrics is not None:
            self._metrics.streams_refused.labels(cap).inc()


__all__ = ["StreamLimits"]
