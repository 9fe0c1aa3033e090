"""The one rule for the wall-clock times people type: a time names its zone, or it is refused.

Every place that reads a time from a person or a job refuses a time without a zone
(``2026-01-01T12:00:00``) instead of guessing: the CLI's ``--from``, the Spark source's ``start``
option, the offline reader's ``as_of`` and ``python -m flusher.spark_job --as-of``.  Local time would
make the same command read other messages on another machine, and UTC would be wrong for whoever meant
local time; for a log either guess silently skips or repeats hours of messages.  The client SDK seeks by
timetick (``DeliverPolicy.start_at_time``), never by a wall-clock time, so it has nothing to guess.

The sentence for the user documentation: *A time is ISO 8601 with its zone, ``Z`` for UTC or an
offset such as ``+01:00`` (``2026-01-01T12:00:00Z``); a time without a zone is refused everywhere,
never taken as local time or UTC.*

Standard library only: the CLI imports it before anything heavy.
"""

from __future__ import annotations

from datetime import datetime

ZONE_FORMS = "an ISO 8601 time with its zone, such as 2026-01-01T12:00:00Z (UTC) or 2026-01-01T13:00:00+01:00"
"""The accepted forms, as error messages name them."""


class NaiveTimeError(ValueError):
    """A time without a zone: refused rather than guessed to be local time or UTC."""


def require_zone(when: datetime, what: str = "time") -> datetime:
    """``when`` itself when it carries a zone; ``NaiveTimeError`` (naming the accepted forms) when not."""
    if when.tzinfo is None or when.utcoffset() is None:
        raise NaiveTimeError(f"{what} {when.isoformat()} has no time zone (it is not guessed to be local time "
                             f"or UTC); give {ZONE_FORMS}")
    return when


def parse_zoned(text: str, what: str = "time") -> datetime:
    """An ISO 8601 time with a zone from ``text``; ``ValueError`` naming the accepted forms for anything
    else (``NaiveTimeError`` when only the zone is missing)."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{what} {text!r} is not {ZONE_FORMS}") from None
    return require_zone(when, what)


__all__ = ["ZONE_FORMS", "NaiveTimeError", "parse_zoned", "require_zone"]
