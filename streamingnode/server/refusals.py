"""Refusals: every error a call or an in-band answer carries back to a client, counted and logged.

A refusal is counted by RPC and error code in ``streamingnode_refusals_total`` (the dashboard's
"refused requests by error code" panel), whether it ended the call (a failed unary call or stream) or
was answered in-band (a refused produce batch, a refused ack).  It is also logged, at INFO for what a
healthy node answers in normal operation (the node draining, a channel moving to another node) and at
WARNING for the rest, with the call's request_id (bound by ``errors``), the peer, the RPC and the code.

A misbehaving client could refuse itself thousands of times a second, so the log is rate-limited per
(RPC, code): at most ``burst`` lines per ``interval`` seconds; the first line after a quiet spell says
how many were left out (``suppressed``).  The counter counts every one.  Bugs (UNKNOWN) are not
refusals: ``errors.internal`` logs them at ERROR with their traceback.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

from streamingnode.observability.metrics import NodeMetrics
from wal.error_codes import Behaviour, codes_with
from wal.errors import ErrorCode, StreamingError

log = structlog.get_logger(__name__)

_ROUTINE = codes_with(Behaviour.ROUTINE)
"""Codes a healthy node answers in normal operation (a drain, a channel reopened or moved): INFO."""

LOG_BURST = 10
"""Lines per (RPC, code) per ``LOG_INTERVAL``; the rest are counted and summed into the next line."""
LOG_INTERVAL = 10.0
"""Seconds of the log's rate window."""


class Refusals:
    """Counts and logs the refusals of one node (one per servicer)."""

    def __init__(self, metrics: NodeMetrics | None, *, burst: int = LOG_BURST, interval: float = LOG_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._metrics = metrics
        self._burst = burst
        self._interval = interval
        self._clock = clock
        # (rpc, code) -> [window start, lines logged in it, refusals left out since the last line]
        self._windows: dict[tuple[str, str], list[float]] = {}

    def note(self, rpc: str, exc: StreamingError, peer: str = "", *, in_band: bool = False) -> None:
        """``exc`` was answered to the caller of ``rpc`` (``in_band``: inside a stream that goes on)."""
        code = exc.code.name
        if self._metrics is not None:
            self._metrics.refused(rpc, code)
        if exc.code is ErrorCode.UNKNOWN:
            return  # a bug: errors.internal logged it at ERROR with its traceback
        now = self._clock()
        window = self._windows.get((rpc, code))
        if window is None or now - window[0] >= self._interval:
            suppressed = int(window[2]) if window is not None else 0
            window = self._windows[(rpc, code)] = [now, 0.0, float(suppressed)]
        if window[1] >= self._burst:
            window[2] += 1
            return
        window[1] += 1
        suppressed, window[2] = int(window[2]), 0.0
        level = log.info if exc.code in _ROUTINE else log.warning
        fields: dict[str, object] = {"rpc": rpc, "code": code, "peer": peer[:200], "error": str(exc)[:300]}
        if in_band:
            fields["in_band"] = True
        if suppressed:
            fields["suppressed"] = suppressed  # like this one, left out of the log since the last line
        level("request refused", **fields)


__all__ = ["LOG_BURST", "LOG_INTERVAL", "Refusals"]
