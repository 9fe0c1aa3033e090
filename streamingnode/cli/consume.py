"""``streamingnode consume``: print messages as JSON lines (or raw payloads), acking as a consumer group if asked.

Standard library only at module level (see ``streamingnode.cli``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from streamingnode.cli.connection import connect
from streamingnode.cli.parsing import CliError, parse_where, ts_text
from wal.tasks import cancel_and_wait

if TYPE_CHECKING:
    from streamingnode.client import AsyncClient, Consumer
    from wal.message import Message, MessageType, Position
    from wal.scanner import MsgPack


def message_json(m: Message) -> dict[str, Any]:
    """What consume prints for one message."""
    out: dict[str, Any] = {"id": m.message_id, "vchannel": m.vchannel, "type": m.message_type.name,
                           "timetick": m.timetick, "time": ts_text(m.timetick)}
    if m.txn is not None:
        out["txn_id"] = m.txn.txn_id
    out["properties"] = dict(m.properties)
    try:
        out["payload"] = m.payload.decode("utf-8")
    except UnicodeDecodeError:
        out["payload_b64"] = base64.b64encode(m.payload).decode("ascii")
    return out


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\"}


def parse_delimiter(text: str, option: str) -> bytes:
    """A delimiter of ``consume --format raw`` with kcat's escapes (\\n \\t \\r \\0 \\\\) decoded, as bytes."""
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            escaped = _ESCAPES.get(text[i + 1:i + 2])
            if escaped is None:
                raise CliError(f"{option}: unknown escape {text[i:i + 2]!r}; known: \\n \\t \\r \\0 \\\\")
            out.append(escaped)
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out).encode()


class RawFormat:
    """``consume --format raw``, as kcat prints a message: ``[VCHANNEL KEY_DELIM] PAYLOAD DELIM``, the
    payload's bytes unchanged (no escaping: a payload that holds the delimiter is ambiguous, so pick
    one it cannot hold, such as ``-D '\\0'``)."""

    def __init__(self, delimiter: bytes, vchannel_delimiter: bytes | None) -> None:
        self.delimiter = delimiter
        self.vchannel_delimiter = vchannel_delimiter

    def render(self, messages: list[Message]) -> bytes:
        end, key = self.delimiter, self.vchannel_delimiter
        if key is None:
            return b"".join(m.payload + end for m in messages)
        return b"".join(m.vchannel.encode() + key + m.payload + end for m in messages)


def raw_format(args: argparse.Namespace) -> RawFormat | None:
    """The raw output ``args`` ask for (None: JSON lines); -K and -D need ``--format raw``."""
    if args.format != "raw":
        if args.vchannel_delimiter is not None or args.delimiter is not None:
            raise CliError("-K/--vchannel-delimiter and -D/--delimiter need --format raw")
        return None
    delimiter = b"\n" if args.delimiter is None else parse_delimiter(args.delimiter, "-D/--delimiter")
    key = None if args.vchannel_delimiter is None else args.vchannel_delimiter.encode()
    return RawFormat(delimiter, key)


def _printable(pack: MsgPack, limit: int | None,
               types: frozenset[MessageType] | None = None) -> tuple[list[Message], Position | None]:
    """(messages to print, position to ack) for one pack, at most ``limit`` printed, only those of
    ``types`` when given (the others count as printed for the ack: they were read).

    When ``limit`` cuts the pack, the ack position is the end of the last whole delivery unit printed
    (``streamingnode.wire.packs.delivery_units``: a transaction is one unit from BeginTxn to its end), as the node
    ends the parts of a pack it splits: the pack's start id with the unit's timetick.  A transaction
    cut in the middle is then delivered again, whole, to the group's next consumer.
    """
    from streamingnode.wire.packs import delivery_units  # noqa: PLC0415
    from wal.message import MessageType, Position  # noqa: PLC0415

    messages = pack.messages
    chosen: list[Message] = []
    boundary: Position | None = None
    for start, stop in delivery_units(messages):
        for m in messages[start:stop]:
            if m.message_type is not MessageType.TIME_TICK and (types is None or m.message_type in types):
                if limit is not None and len(chosen) >= limit:
                    return chosen, boundary
                chosen.append(m)
        boundary = Position(pack.start_position.pchannel, pack.start_position.message_id, messages[stop - 1].timetick)
    return chosen, pack.end_position


def _install_stop(stop: asyncio.Event) -> Callable[[], None]:
    """SIGINT and SIGTERM set ``stop`` (a clean end, exit 0); returns the undo."""
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)

    def undo() -> None:
        for sig in installed:
            loop.remove_signal_handler(sig)

    return undo


async def _next_pack(consumer: Consumer, stop: asyncio.Event) -> MsgPack | None:
    """The next pack, or None once ``stop`` is set or the read ended."""
    if stop.is_set():
        return None
    getter = asyncio.ensure_future(anext(consumer))
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((getter, stopper), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if not getter.done():
        with contextlib.suppress(StopAsyncIteration):  # the read may end while it is cancelled
            await cancel_and_wait(getter)
        return None
    try:
        return getter.result()
    except StopAsyncIteration:
        return None


def parse_types(given: list[str] | None) -> frozenset[MessageType] | None:
    """The message types of ``--type`` (repeated, or comma lists), None for every type."""
    from wal.message import MessageType  # noqa: PLC0415

    if not given:
        return None
    names = [n.strip().upper() for g in given for n in g.split(",") if n.strip()]
    unknown = [n for n in names if n not in MessageType.__members__]
    if unknown:
        known = ", ".join(t.name for t in MessageType if t is not MessageType.TIME_TICK)
        raise CliError(f"--type: unknown message type {unknown[0][:200]!r}; one of {known}")
    return frozenset(MessageType[n] for n in names)


async def _start_text(client: AsyncClient, args: argparse.Namespace) -> str:
    """Where the read starts, in words: the group's committed position when it has one."""
    if not args.group:
        return f"from {args.start}"
    groups = await client.describe_groups(args.channel, [args.group])
    committed = next((p.committed for g in groups if g.group == args.group for p in g.vchannels
                      if p.vchannel == args.vchannel), None)
    if committed is None:
        return f"as group {args.group!r}: no committed position yet, from {args.start}"
    return (f"as group {args.group!r}: resuming after its committed position, message id {committed.message_id} "
            f"(timetick {committed.timetick}, {ts_text(committed.timetick)})")


class _ConnectionNotices:
    """One line on stderr when the stream breaks and one when it is back: a consumer that waits
    quietly for a node that is gone looks like one that waits for messages."""

    def __init__(self, consumer: Consumer, addr: str, reconnect_timeout: float) -> None:
        self._consumer = consumer
        self._addr = addr
        self._reconnect_timeout = reconnect_timeout
        self._seen = consumer.reconnects
        self._broken = False

    def check(self) -> None:
        """Say what changed since the last check (also called before each pack is printed, so that the
        notice of a reconnect comes before what it brought)."""
        if self._consumer.reconnects != self._seen:
            self._seen = self._consumer.reconnects
            if self._broken:
                print(f"reconnected to {self._addr}", file=sys.stderr, flush=True)
            self._broken = False
            return
        broken = not self._consumer.connected
        if broken and not self._broken:
            print(f"disconnected from {self._addr}: reconnecting (for up to {self._reconnect_timeout:g} s)",
                  file=sys.stderr, flush=True)
        self._broken = broken

    async def run(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            self.check()


async def _end_of_log(client: AsyncClient, args: argparse.Namespace) -> int | None:
    """``--exit``: the timetick of the newest message at the start (None: nothing to read)."""
    last, _ = await client.latest_position(args.channel, args.vchannel)
    return None if last is None else last.timetick


async def consume(args: argparse.Namespace, addr: str) -> int:
    """Run ``consume``; the exit code."""
    policy = parse_where(args.start, "--from")
    types = parse_types(args.types)
    raw = raw_format(args)
    if raw is not None and types is None:
        # Raw output is payloads: transaction framing carries none, so only asked-for types print it.
        from wal.message import MessageType  # noqa: PLC0415

        types = frozenset(t for t in MessageType if not t.is_system)
    stop = asyncio.Event()
    undo = _install_stop(stop)
    out = sys.stdout
    watcher: asyncio.Task[None] | None = None
    notices: _ConnectionNotices | None = None
    try:
        client = await connect(addr, args.channel, reconnect_timeout=args.reconnect_timeout)
        try:
            end_ts = await _end_of_log(client, args) if args.exit else None
            start_text = await _start_text(client, args)
            consumer = client.consumer(args.channel, args.vchannel, policy=policy, group=args.group)
            async with consumer:
                if not args.quiet:
                    # Also the signal scripts and tests wait for: from here, a 'latest' read is
                    # anchored and sees everything appended later.
                    where = f"vchannel {args.vchannel!r}" if args.vchannel else "every vchannel"
                    print(f"consuming {args.channel!r} ({where}) {start_text}", file=sys.stderr, flush=True)
                    notices = _ConnectionNotices(consumer, addr, args.reconnect_timeout)
                    watcher = asyncio.ensure_future(notices.run())
                try:
                    if args.exit and end_ts is None:
                        stop.set()  # an empty log: its end is here
                    printed = 0
                    while args.count is None or printed < args.count:
                        pack = await _next_pack(consumer, stop)
                        if pack is None:
                            break
                        if notices is not None:
                            notices.check()
                        limit = None if args.count is None else args.count - printed
                        messages, ack_at = _printable(pack, limit, types)
                        if messages and raw is not None:
                            out.buffer.write(raw.render(messages))
                            out.buffer.flush()
                        elif messages:
                            out.write("".join(
                                json.dumps(message_json(m), ensure_ascii=False, separators=(",", ":")) + "\n"
                                for m in messages))
                            out.flush()
                        printed += len(messages)
                        if args.group and ack_at is not None:
                            await consumer.ack(ack_at)
                        if end_ts is not None and pack.end_ts >= end_ts and ack_at == pack.end_position:
                            break  # --exit: everything there was at the start is printed
                finally:
                    # Before the consumer closes: its end is no disconnection.
                    await cancel_and_wait(watcher)
        finally:
            await client.aclose()
    finally:
        undo()
    return 0


__all__ = ["RawFormat", "consume", "message_json", "parse_delimiter", "parse_types", "raw_format"]
