"""The KV-safe encoding of a name: one reversible rule for every key and file name built from user text.

NATS KV keys allow only ``[-/_=.a-zA-Z0-9]`` and file names must not hold ``/`` or NUL, while channel,
group and producer names may hold any character.  Base32 (lower case, no padding) maps any text onto
``[a-z2-7]``: reversible, and distinct names stay distinct (also on a case-insensitive file system).
Used for the JetStream backend's KV keys, the cluster's membership and lease keys, and the client's
spool file names; the encoded forms are stored, so this rule never changes.
"""

from __future__ import annotations

import base64


def encode_key(text: str) -> str:
    """``text`` as a KV-safe key: base32 of its UTF-8, lower case, no padding."""
    return base64.b32encode(text.encode()).decode().rstrip("=").lower()


def decode_key(key: str) -> str:
    """The text ``encode_key`` made ``key`` from."""
    padded = key.upper() + "=" * (-len(key) % 8)
    return base64.b32decode(padded).decode()


__all__ = ["decode_key", "encode_key"]
