"""The text forms the commands read and print: times and positions, produce's input lines, and
argument values.

Standard library only (see ``streamingnode.cli``).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING

# The clock is standard library only (wal loads the rest lazily), so --help stays fast.
from wal.clock import compose, physical_ms
from wal.zoned_time import parse_zoned

if TYPE_CHECKING:
    from wal.options import DeliverPolicy


# Keys of a produce envelope, plus the keys consume prints that produce accepts and ignores, so that
# `consume | produce` copies messages from one channel to another.
_ENVELOPE_KEYS = frozenset({"vchannel", "payload", "payload_b64", "properties"})
_CONSUME_ONLY_KEYS = frozenset({"id", "type", "timetick", "time", "txn_id"})
# The dedup stamps of an idempotent producer (interceptors/dedup.py).  Copied from consume's output
# they would make the node answer with the original message's result and write nothing, so produce
# drops them; --producer-id stamps fresh ones.
_DEDUP_PROPERTIES = ("producer_id", "producer_seq")


class CliError(Exception):
    """A mistake in the command's input or arguments: printed as ``error: <message>``, exit 1."""


_INT = re.compile(r"\d+")
_SECONDS = re.compile(r"@?\d+(\.\d*)?|@\.\d+|\d*\.\d+")


def parse_time(text: str) -> int:
    """A hybrid timestamp (physical_ms << 18) from ``@UNIX_SECONDS``, ``SECONDS.FRACTION`` or ISO-8601
    with a zone (one without is refused: ``wal.zoned_time``); raises CliError."""
    if _SECONDS.fullmatch(text):
        seconds = float(text.removeprefix("@"))
    else:
        try:
            when = parse_zoned(text)
        except ValueError as exc:
            raise CliError(f"{exc}, or @UNIX_SECONDS") from None
        seconds = when.timestamp()
    return compose(max(int(seconds * 1000), 0))


def parse_where(text: str, option: str) -> DeliverPolicy:
    """earliest | latest | <message id> | <time> as a DeliverPolicy."""
    from wal.options import DeliverPolicy  # noqa: PLC0415

    word = text.strip().lower()
    if word in ("earliest", "all"):
        return DeliverPolicy.all()
    if word == "latest":
        return DeliverPolicy.latest()
    if _INT.fullmatch(word):
        return DeliverPolicy.start_from(int(word))
    try:
        return DeliverPolicy.start_at_time(parse_time(text.strip()))
    except CliError as exc:
        raise CliError(f"{option}: expected earliest, latest, a message id or a time; {exc}") from None


def ts_text(ts: int) -> str:
    """A hybrid timestamp as UTC ISO-8601 with milliseconds ('-' for 0: never set)."""
    if ts <= 0:
        return "-"
    return datetime.fromtimestamp(physical_ms(ts) / 1000, UTC).isoformat(timespec="milliseconds")


Record = tuple[str, bytes, dict[str, str] | None]


def parse_record(line: bytes, lineno: int, default_vchannel: str) -> Record:
    """One stdin line as (vchannel, payload, properties); raises CliError naming the line."""
    text = line.strip()
    try:
        value = json.loads(text)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise CliError(f"stdin line {lineno}: not JSON ({exc})") from None
    if not (isinstance(value, dict) and ("payload" in value or "payload_b64" in value)):
        return default_vchannel, text, None
    unknown = value.keys() - _ENVELOPE_KEYS - _CONSUME_ONLY_KEYS
    if unknown:
        raise CliError(f"stdin line {lineno}: unknown key(s) {', '.join(sorted(unknown))}; a message object has "
                       "vchannel, payload or payload_b64, properties")
    if "payload" in value and "payload_b64" in value:
        raise CliError(f"stdin line {lineno}: give payload or payload_b64, not both")
    if "payload" in value:
        if not isinstance(value["payload"], str):
            raise CliError(f"stdin line {lineno}: payload must be a string (binary data goes in payload_b64)")
        payload = value["payload"].encode()
    else:
        if not isinstance(value["payload_b64"], str):
            raise CliError(f"stdin line {lineno}: payload_b64 must be a base64 string")
        try:
            payload = base64.b64decode(value["payload_b64"], validate=True)
        except binascii.Error as exc:
            raise CliError(f"stdin line {lineno}: payload_b64 is not base64 ({exc})") from None
    vchannel = value.get("vchannel", default_vchannel)
    if not isinstance(vchannel, str):
        raise CliError(f"stdin line {lineno}: vchannel must be a string")
    properties = value.get("properties")
    if properties is not None and not (
        isinstance(properties, dict) and all(isinstance(v, str) for v in properties.values())
    ):
        raise CliError(f"stdin line {lineno}: properties must be an object of strings")
    if properties is not None and any(k in properties for k in _DEDUP_PROPERTIES):
        properties = {k: v for k, v in properties.items() if k not in _DEDUP_PROPERTIES}
    return vchannel, payload, properties


def parse_raw_record(line: bytes, default_vchannel: str, delimiter: bytes | None) -> Record:
    """One stdin line of ``produce --format raw``: its bytes are the payload; with ``delimiter``, what
    comes before its first occurrence is the vchannel (a line without it goes to ``default_vchannel``)."""
    if delimiter:
        vchannel, found, payload = line.partition(delimiter)
        if found:
            try:
                return vchannel.decode("utf-8"), payload, None
            except UnicodeDecodeError:
                raise CliError(f"vchannel {vchannel[:200]!r} is not UTF-8") from None
    return default_vchannel, line, None


# --- argument values -----------------------------------------------------------------------------
def positive_int(text: str) -> int:
    """An argument that must be an integer > 0."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An argument that must be an integer >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def non_negative_float(text: str) -> float:
    """An argument that must be a number >= 0."""
    value = float(text)
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


__all__ = [
    "CliError",
    "Record",
    "non_negative_float",
    "non_negative_int",
    "parse_raw_record",
    "parse_record",
    "parse_time",
    "parse_where",
    "positive_int",
    "ts_text",
]
