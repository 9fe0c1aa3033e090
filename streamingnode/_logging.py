"""structlog set-up for the node process: JSON lines unless a person is watching, readable otherwise.

Logs go to stderr so that stdout stays for a command's own output (JSON lines of ``consume``, the
address line of ``serve``).  The readable form is chosen only when both stdout and the log stream are
terminals: a node started by a supervisor, a container runtime or a pipe (``serve | tee``) writes
JSON, which log collectors parse without guessing.

Context travels in contextvars: the server binds ``rpc`` and ``request_id`` for each call (and
``pchannel``, ``term`` once a stream knows them), the node binds ``pchannel`` and ``term`` while it
opens a channel, so the tasks started there (time ticks, recovery, flusher) carry them in every line.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog


def configure_logging(level: str = "info", stream: TextIO | None = None, *, cache: bool = True) -> None:
    """Configure structlog once per process; ``cache=False`` keeps loggers re-configurable (tests)."""
    out = sys.stderr if stream is None else stream
    readable = sys.stdout.isatty() and out.isatty()
    renderer: structlog.types.Processor = (
        structlog.dev.ConsoleRenderer(colors=False) if readable else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=cache,
    )


__all__ = ["configure_logging"]
