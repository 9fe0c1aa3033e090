"""Caps on open streams: per node (``max_streams``) and per client connection
(``max_streams_per_connection``).

Produce and Consume streams hold a task, buffers and (for Consume) a scanner each for as long as they
stay open, so their number is what bounds the node's memory against many clients, or one client that
opens streams in a loop.  A stream over a cap is refused before it reads its first request, with
RESOURCE_EXHAUSTED naming the cap: a retriable code, so a client backs off and tries again, and a slot
frees as soon as any stream ends.

A connection is what ``context.peer()`` names: the address and port of the client's socket.  Several
client channels may share one connection (gRPC pools them when their options match), and then share
its cap.  Everything here runs on the node's event loop: plain counters, no locks.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from wal.errors import ResourceExhaustedError

if TYPE_CHECKING:
    from streamingnode.metrics import NodeMetrics


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

    @contextlib.contextmanager
    def hold(self, peer: str, rpc: str) -> Iterator[None]:
        """A slot for one ``rpc`` stream from ``peer`` while the block runs, however it ends (the
        client cancels, the stream fails, the node drains); ResourceExhaustedError when a cap is full."""
        if self.open >= self.max_streams:
            self._refused("node")
            raise ResourceExhaustedError(
                f"{rpc} refused: the node has max_streams={self.max_streams} streams open; retry later",
                limit="max_streams", max_streams=self.max_streams, rpc=rpc)
        if self.per_connection[peer] >= self.max_per_connection:
            self._refused("connection")
            raise ResourceExhaustedError(
                f"{rpc} refused: this connection ({peer[:200]}) has max_streams_per_connection="
                f"{self.max_per_connection} streams open; close one or open another connection",
                limit="max_streams_per_connection", max_streams_per_connection=self.max_per_connection,
                peer=peer[:200], rpc=rpc)
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
