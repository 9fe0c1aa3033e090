"""The defaults a client and the node must agree on, and those the SDK, the CLI and the Spark source
share: one value each, imported wherever it is a default.

Standard library only: the CLI builds its ``--help`` from these.
"""

from __future__ import annotations

NODE_PORT = 19530
"""The port a node listens on and clients dial by default (Milvus's)."""
NODE_ADDR = f"localhost:{NODE_PORT}"
"""Where a client looks for a node when told nothing (``--addr``, ``AsyncClient(addr=)``)."""

CALL_TIMEOUT = 30.0
"""Seconds: the deadline of a unary call (``AsyncClient(timeout=)``, the Spark source's ``timeout``)."""
RECONNECT_TIMEOUT = 30.0
"""Seconds a broken stream keeps trying to reopen before it fails (``reconnect_timeout``,
``--reconnect-timeout``)."""

LINGER = 0.005
"""Seconds a producer's batch waits for more messages (``linger``, ``--linger``)."""
MAX_BATCH_BYTES = 1 << 20
"""Largest producer batch in bytes (``max_batch_bytes``, ``--batch-bytes``)."""
MAX_BATCH_MESSAGES = 1000
"""Most messages in a producer batch (``max_batch_messages``)."""

MAX_MESSAGE_BYTES = 64 << 20
"""Largest gRPC message a client sends (``max_message_bytes``)."""
RESPONSE_BYTES = 4 << 20
"""Largest consume response: what the SDK receives by default (``max_receive_bytes``) and what the node
sends a client that names no limit (gRPC's default receive limit, so any client can take it)."""

KEEPALIVE_TIME = 3.0
"""Seconds between the HTTP/2 pings a client sends on each node's connection, with calls or without
(``keepalive_time``): a node that stops answering them (hung, paused, cut off by a partition) fails
the connection's streams, and the client goes to another node instead of waiting on it."""
KEEPALIVE_TIMEOUT = 3.0
"""Seconds a client waits for a ping's answer before it closes the connection (``keepalive_timeout``)."""
MIN_PING_INTERVAL = 1.0
"""Seconds: the most often a node accepts a client's pings without data (a client that pings more often
is told GOAWAY too_many_pings); ``keepalive_time`` may not go below it."""


__all__ = ["CALL_TIMEOUT", "KEEPALIVE_TIME", "KEEPALIVE_TIMEOUT", "LINGER", "MAX_BATCH_BYTES", "MAX_BATCH_MESSAGES",
           "MAX_MESSAGE_BYTES", "MIN_PING_INTERVAL", "NODE_ADDR", "NODE_PORT", "RECONNECT_TIMEOUT", "RESPONSE_BYTES"]
