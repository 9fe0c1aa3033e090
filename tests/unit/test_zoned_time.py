"""A time without a zone is refused at every entry point that reads a wall-clock time (wal.zoned_time).

The CLI took it as local time and the Spark source as UTC, while the offline reader refused it; now
each refuses it with an error that names the accepted forms."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta, timezone

import pytest

from flusher.read.spark import as_of
from flusher.spark_job import parse_as_of
from streamingnode.cli.parsing import CliError, parse_time, parse_where
from streamingnode.spark._options import Offset, OptionError, parse_start
from wal.clock import LOGICAL_MAX, compose
from wal.zoned_time import ZONE_FORMS, NaiveTimeError, parse_zoned, require_zone

NAIVE = "2026-01-01T12:00:00"
MS = 1_767_268_800_000  # 2026-01-01T12:00:00Z


def test_the_rule() -> None:
    assert parse_zoned(NAIVE + "Z") == datetime(2026, 1, 1, 12, tzinfo=UTC)
    assert parse_zoned("2026-01-01T13:00:00+01:00") == datetime(2026, 1, 1, 12, tzinfo=UTC)
    with pytest.raises(NaiveTimeError, match="no time zone") as caught:
        parse_zoned(NAIVE)
    assert ZONE_FORMS in str(caught.value)
    with pytest.raises(ValueError, match="is not an ISO 8601 time with its zone"):
        parse_zoned("yesterday")
    with pytest.raises(NaiveTimeError):
        require_zone(datetime(2026, 1, 1))
    aware = datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=-5)))
    assert require_zone(aware) is aware


def test_cli() -> None:
    with pytest.raises(CliError, match=r"no time zone.*@UNIX_SECONDS"):
        parse_time(NAIVE)
    with pytest.raises(CliError, match=r"--from: .*no time zone"):
        parse_where(NAIVE, "--from")
    assert parse_time(NAIVE + "Z") == compose(MS)
    assert parse_time("2026-01-01T13:00:00+01:00") == compose(MS)
    assert parse_time(f"@{MS // 1000}") == compose(MS)


def test_spark_source_option() -> None:
    with pytest.raises(OptionError, match=r"startingOffsets.*no time zone") as caught:
        parse_start(NAIVE, "p", "startingOffsets")
    assert ZONE_FORMS in str(caught.value)
    assert parse_start(NAIVE + "Z", "p", "startingOffsets") == Offset("p", -1, compose(MS) - 1)
    with pytest.raises(OptionError, match="expected earliest, latest"):
        parse_start("soon", "p", "startingOffsets")


def test_offline_reader() -> None:
    with pytest.raises(NaiveTimeError, match="as_of"):
        as_of(datetime(2026, 1, 1, 12))
    assert as_of(datetime(2026, 1, 1, 12, tzinfo=UTC)) == compose(MS, LOGICAL_MAX)


def test_spark_job() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"--as-of .*no time zone"):
        parse_as_of(NAIVE)
    with pytest.raises(argparse.ArgumentTypeError, match="not a timetick or an ISO 8601 time with its zone"):
        parse_as_of("noon")
    assert parse_as_of(NAIVE + "Z") == compose(MS, LOGICAL_MAX)
    assert parse_as_of(str(compose(MS))) == compose(MS)
