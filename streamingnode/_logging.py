"""structlog set-up for the node process: JSON lines when stderr is not a terminal, readable otherwise.

Logs go to stderr so that stdout stays for a command's own output (JSON lines of ``consume``, the
address line of ``serve``).
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(level: str = "info") -> None:
    renderer: structlog.types.Processor = (
        structlog.dev.ConsoleRenderer(colors=False) if sys.stderr.isatty() else structlog.processors.JSONRenderer()
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
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )


__all__ = ["configure_logging"]
