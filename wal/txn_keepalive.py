"""The bound of a transaction's keepalive, checked in one place for every way a transaction begins.

A keepalive is an int of milliseconds (0: never expires) that the message header stores in 32 bits
(``wal._codec`` checks at import that its header agrees), so it lies in ``0..MAX_KEEPALIVE_MS``.  The
gRPC BeginTxn, the embedded ``begin_txn`` (through the txn manager), the node's ``txn_keepalive_ms``
setting and the codec's width check all refuse a value outside it here, the first three before a
transaction id is handed out.

Light (``wal.errors`` only): the node's config checks its setting when ``--help`` is printed.
"""

from __future__ import annotations

from wal.errors import InvalidArgumentError

MAX_KEEPALIVE_MS = (1 << 32) - 1
"""The largest keepalive the message header holds (an unsigned 32-bit field)."""


def check_keepalive(keepalive_ms: object, field: str = "keepalive_ms") -> int:
    """``keepalive_ms`` when it is an int within ``0..MAX_KEEPALIVE_MS``; else ``InvalidArgumentError``
    naming ``field`` and the bounds (``fields``: ``field``, ``limit``)."""
    if not isinstance(keepalive_ms, int) or isinstance(keepalive_ms, bool):
        raise InvalidArgumentError(f"{field} must be an int of milliseconds, got {keepalive_ms!r}", field=field)
    if not 0 <= keepalive_ms <= MAX_KEEPALIVE_MS:
        raise InvalidArgumentError(
            f"{field}: value (ms) {keepalive_ms} is outside what the log can store (0 to {MAX_KEEPALIVE_MS})",
            field=field, limit=MAX_KEEPALIVE_MS)
    return keepalive_ms


__all__ = ["MAX_KEEPALIVE_MS", "check_keepalive"]
