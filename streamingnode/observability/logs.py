"""structlog set-up for the node process: JSON lines unless a person is watching, readable otherwise.

Logs go to stderr so that stdout stays for a command's own output (JSON lines of ``consume``, the
address line of ``serve``).  ``log_format`` ``auto`` chooses the readable form only when both stdout
and the log stream are terminals: a node started by a supervisor, a container runtime or a pipe
(``serve | tee``) writes JSON, which log collectors parse without guessing; ``json`` and ``console``
choose one form whatever the streams are.

A node embedded in another program (``ServerThread``, ``start_server``) logs to stderr too:
structlog's own default prints to stdout, which is the host program's output.  ``default_to_stderr``
configures that only when the program has not configured structlog itself.

Context travels in contextvars: the server binds ``rpc`` and ``request_id`` for each call (and
``pchannel``, ``term`` once a stream knows them), the node binds ``pchannel`` and ``term`` while it
opens a channel, so the tasks started there (time ticks, recovery, flusher) carry them in every line.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog


def configure_logging(level: str = "info", stream: TextIO | None = None, *, cache: bool = True,
                      fmt: str = "auto") -> None:
    """Configure structlog once per process; ``cache=False`` keeps loggers re-configurable (tests).

    ``fmt``: ``json``, ``console`` or ``auto`` (console when stdout and the stream are terminals).
    """
    out = sys.stderr if stream is None else stream
    readable = fmt == "console" or (fmt == "auto" and sys.stdout.isatty() and out.isatty())
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


class _Stderr:
    """sys.stderr as it is at each write (not at configuration): tests and hosts may replace it."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


def default_to_stderr() -> None:
    """Log to stderr at INFO, as JSON, unless structlog was configured already (by ``serve`` or by the
    program embedding the node, whose choice stands)."""
    if not structlog.is_configured():
        configure_logging("info", _Stderr(), cache=False, fmt="json")  # type: ignore[arg-type]


__all__ = ["configure_logging", "default_to_stderr"]
