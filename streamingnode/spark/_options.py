"""The options of the ``streamingnode`` Spark source and sink, parsed once on the driver.

Every check runs in ``DataSource.schema()`` (or ``__init__``) so that a bad option fails the query at
start: Spark reports it as ``AnalysisException [PYTHON_DATA_SOURCE_ERROR]`` whose text carries this
module's message, which names the option.  The parsed result is a frozen dataclass of plain values,
so the readers and writers that Spark pickles to its Python workers stay picklable.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from streamingnode.wire.defaults import CALL_TIMEOUT
from streamingnode.wire.host_port import split_host_port
from wal import clock
from wal.message import MessageType
from wal.zoned_time import ZONE_FORMS, NaiveTimeError, parse_zoned

_QUOTE = 200  # at most this much of a bad value goes into a message


class OptionError(ValueError):
    """A source or sink option is missing or malformed; ``option`` names it."""

    def __init__(self, option: str, problem: str) -> None:
        super().__init__(f"streamingnode option {option!r}: {problem}")
        self.option = option


def _quote(value: str) -> str:
    return repr(value if len(value) <= _QUOTE else value[:_QUOTE] + "...")


@dataclass(frozen=True, slots=True)
class Offset:
    """A node position as Spark keeps it in its checkpoint.

    ``message_id`` -1 means "from the beginning of the log" (no id to resume from yet); otherwise the
    pair is a ``Position``: reading after it is ``DeliverPolicy.start_from(message_id)`` plus
    ``DeliverFilter.timetick_gt(timetick)``.  A message (a transaction's body: its commit) lies
    before the offset iff its timetick is <= ``timetick``.
    """

    pchannel: str
    message_id: int
    timetick: int

    def to_json(self) -> dict[str, Any]:
        return {"pchannel": self.pchannel, "message_id": self.message_id, "timetick": self.timetick}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], pchannel: str, option: str = "offset") -> Offset:
        try:
            mid, ts = raw["message_id"], raw["timetick"]
            got = raw.get("pchannel", pchannel)
        except (KeyError, TypeError, AttributeError) as exc:
            raise OptionError(option, 'an offset is {"message_id": <int>, "timetick": <int>}, '
                                      f"got {_quote(json.dumps(raw, default=str))}") from exc
        if not (isinstance(mid, int) and isinstance(ts, int)) or isinstance(mid, bool) or isinstance(ts, bool) \
                or mid < -1 or ts < 0:
            raise OptionError(option, "message_id must be an integer >= -1 and timetick an integer >= 0, "
                                      f"got {_quote(json.dumps(raw, default=str))}")
        if got != pchannel:
            raise OptionError(option, f"the offset is of pchannel {_quote(str(got))}, the source reads {pchannel!r}")
        return cls(pchannel, mid, ts)


EARLIEST = "earliest"
LATEST = "latest"


def parse_start(raw: str, pchannel: str, option: str) -> Offset | str:
    """``earliest`` and ``latest`` (returned as they are: latest is resolved against the node), an
    offset's JSON, or an ISO-8601 time (messages from that time on)."""
    text = raw.strip()
    if text.lower() in (EARLIEST, LATEST):
        return text.lower()
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as exc:
            raise OptionError(option, f"malformed JSON ({exc.msg} at {exc.pos}): {_quote(text)}") from exc
        return Offset.from_json(parsed, pchannel, option)
    try:
        when = parse_zoned(text, "the time")
    except NaiveTimeError as exc:
        raise OptionError(option, str(exc)) from exc
    except ValueError as exc:
        raise OptionError(option, "expected earliest, latest, an offset's JSON "
                                  f'({{"message_id": ..., "timetick": ...}}) or {ZONE_FORMS}, '
                                  f"got {_quote(text)}") from exc
    ms = int(when.timestamp() * 1000)
    if ms <= 0:
        raise OptionError(option, f"the time must be after 1970-01-01, got {_quote(text)}")
    # Everything at or after the time: after the last timetick of the millisecond before.
    return Offset(pchannel, -1, clock.compose(ms) - 1)


def _positive(options: Mapping[str, str], name: str, default: float | None) -> float | None:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise OptionError(name, f"expected a positive number, got {_quote(raw)}")
    return value


def _names(raw: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(part.strip() for part in raw.split(",") if part.strip()))


@dataclass(frozen=True, slots=True)
class Connection:
    """How to reach the node: enough to open a ``Client`` in any process."""

    addrs: tuple[str, ...]
    token: str | None
    tls_ca: str | None
    tls_cert: str | None
    tls_key: str | None
    timeout: float

    def client(self) -> Any:
        from streamingnode.client import Client  # noqa: PLC0415  (not needed to parse options)

        return Client(list(self.addrs), timeout=self.timeout, reconnect_timeout=self.timeout, token=self.token,
                      tls_ca=self.tls_ca, tls_cert=self.tls_cert, tls_key=self.tls_key)


def parse_connection(options: Mapping[str, str]) -> Connection:
    addrs = _names(options.get("addr", ""))
    if not addrs:
        raise OptionError("addr", "required: host:port of the node (several, comma-separated, for a cluster)")
    for a in addrs:
        try:
            host, port = split_host_port(a)
        except ValueError:
            host, port = "", 0
        if not host or not port:
            raise OptionError("addr", f"expected host:port or [IPv6]:port, got {_quote(a)}")
    timeout = _positive(options, "timeout", CALL_TIMEOUT)
    assert timeout is not None
    return Connection(addrs, options.get("token") or None, options.get("tlsCa") or None,
                      options.get("tlsCert") or None, options.get("tlsKey") or None, timeout)


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """What to read.  ``vchannels`` empty: the whole pchannel, in one Spark partition."""

    conn: Connection
    pchannel: str
    vchannels: tuple[str, ...]
    types: tuple[int, ...]
    collection: str | None
    starting: Offset | str | None
    """None: the reader's default (latest when streaming, earliest in a batch read)."""
    ending: Offset | str
    max_messages: int | None


def _types(raw: str | None) -> tuple[int, ...]:
    if raw is None:
        return ()
    out = []
    for name in _names(raw):
        try:
            out.append(int(MessageType[name.upper()]))
        except KeyError:
            known = ", ".join(t.name.lower() for t in MessageType if not t.is_system and t is not MessageType.UNDEFINED)
            raise OptionError("types", f"unknown message type {_quote(name)}; known: {known}") from None
    return tuple(out)


def parse_source(options: Mapping[str, str]) -> SourceOptions:
    conn = parse_connection(options)
    pchannel = (options.get("pchannel") or "").strip()
    if not pchannel:
        raise OptionError("pchannel", "required: the pchannel to read")
    max_raw = options.get("maxMessagesPerTrigger")
    max_messages = None
    if max_raw is not None:
        if not max_raw.strip().isdigit() or int(max_raw) <= 0:
            raise OptionError("maxMessagesPerTrigger", f"expected a positive integer, got {_quote(max_raw)}")
        max_messages = int(max_raw)
    ending = parse_start(options.get("endingOffsets", LATEST), pchannel, "endingOffsets")
    if ending == EARLIEST:
        raise OptionError("endingOffsets", "expected latest or an offset's JSON, got 'earliest'")
    collection = (options.get("collection") or "").strip() or None
    types = _types(options.get("types"))
    starting = options.get("startingOffsets")
    if collection is not None and types:
        raise OptionError("types", "collection mode reads the collection's inserts and deletes: leave types out")
    return SourceOptions(conn, pchannel, _names(options.get("vchannel", "")), types, collection,
                         None if starting is None else parse_start(starting, pchannel, "startingOffsets"),
                         ending, max_messages)


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """Where to write.  ``vchannel``: the default target (a ``vchannel`` column overrides it in plain mode)."""

    conn: Connection
    pchannel: str
    vchannel: str | None
    collection: str | None
    write_id: str | None
    rows_per_message: int


def parse_sink(options: Mapping[str, str]) -> SinkOptions:
    conn = parse_connection(options)
    pchannel = (options.get("pchannel") or "").strip()
    if not pchannel:
        raise OptionError("pchannel", "required: the pchannel to write to")
    collection = (options.get("collection") or "").strip() or None
    vchannel = (options.get("vchannel") or "").strip() or None
    if collection is not None and vchannel is None:
        raise OptionError("vchannel", "required in collection mode: the vchannel holding the collection")
    rows = _positive(options, "rowsPerMessage", 1000)
    assert rows is not None
    return SinkOptions(conn, pchannel, vchannel, collection, (options.get("writeId") or "").strip() or None,
                       int(rows))


__all__ = ["EARLIEST", "LATEST", "Connection", "Offset", "OptionError", "SinkOptions", "SourceOptions",
           "parse_connection", "parse_sink", "parse_source", "parse_start"]
