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


__all__ = ["CALL_TIMEOUT", "LINGER", "MAX_BATCH_BYTES", "MAX_BATCH_MESSAGES", "MAX_MESSAGE_BYTES", "NODE_ADDR",
           "NODE_PORT", "RECONNECT_TIMEOUT", "RESPONSE_BYTES"]
