"""flusher.read.spark.as_of: wall clock to timetick (no Spark needed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from flusher.read.spark import as_of

from .layout import BASE_MS, timetick


def test_datetime_bounds_its_whole_millisecond() -> None:
    moment = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(milliseconds=7, microseconds=999)
    assert as_of(moment) == (BASE_MS + 7) << 18 | 0x3FFFF
    assert timetick(7, 0x3FFFF) == as_of(moment) < timetick(8)


def test_timezone_offset_is_honoured() -> None:
    paris = datetime(2026, 1, 1, 1, 0, tzinfo=timezone(timedelta(hours=1)))
    assert as_of(paris) == as_of(datetime(2026, 1, 1, tzinfo=UTC))


def test_int_is_a_timetick_passed_through() -> None:
    assert as_of(timetick(3, 5)) == timetick(3, 5)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (datetime(2026, 1, 1), ValueError),  # naive: local time or UTC would be a guess
        (datetime(1969, 12, 31, tzinfo=UTC), ValueError),
        (-1, ValueError),
        (1 << 63, ValueError),
        (True, TypeError),
        ("2026-01-01", TypeError),
    ],
)
def test_refused(value: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        as_of(value)  # type: ignore[arg-type]
