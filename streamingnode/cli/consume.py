"""``streamingnode consume``: print messages as JSON lines, acking as a consumer group if asked.

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
from streamingnode.cli.parsing import parse_where
from wal.lifecycle import cancel_and_wait

if TYPE_CHECKING:
    from streamingnode.client import Consumer
    from wal.message import Message, Position
    from wal.scanner import MsgPack


def message_json(m: Message) -> dict[str, Any]:
    """What consume prints for one message."""
    out: dict[str, Any] = {"id": m.message_id, "vchannel": m.vchannel, "type": m.message_type.name,
                           "timetick": m.timetick}
    if m.txn is not None:
        out["txn_id"] = m.txn.txn_id
    out["properties"] = dict(m.properties)
    try:
        out["payload"] = m.payload.decode("utf-8")
    except UnicodeDecodeError:
        out["payload_b64"] = base64.b64encode(m.payload).decode("ascii")
    return out


def _printable(pack: MsgPack, limit: int | None) -> tuple[list[Message], Position | None]:
    """(messages to print, position to ack) for one pack, at most ``limit`` printed.

    When ``limit`` cuts the pack, the ack position is the end of the last whole delivery unit printed
    (``wal.packs.delivery_units``: a transaction is one unit from BeginTxn to its end), as the node
    ends the parts of a pack it splits: the pack's start id with the unit's timetick.  A transaction
    cut in the middle is then delivered again, whole, to the group's next consumer.
    """
    from wal.message import MessageType, Position  # noqa: PLC0415
    from wal.packs import delivery_units  # noqa: PLC0415

    messages = pack.messages
    chosen: list[Message] = []
    boundary: Position | None = None
    for start, stop in delivery_units(messages):
        for m in messages[start:stop]:
            if m.message_type is not MessageType.TIME_TICK:
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


async def consume(args: argparse.Namespace, addr: str) -> int:
    """Run ``consume``; the exit code."""
    policy = parse_where(args.start, "--from")
    stop = asyncio.Event()
    undo = _install_stop(stop)
    out = sys.stdout
    try:
        client = await connect(addr, args.channel)
        try:
            consumer = client.consumer(args.channel, args.vchannel, policy=policy, group=args.group)
            async with consumer:
                if not args.quiet:
                    # Also the signal scripts and tests wait for: from here, a 'latest' read is
                    # anchored and sees everything appended later.
                    where = f"vchannel {args.vchannel!r}" if args.vchannel else "every vchannel"
                    group = f" as group {args.group!r}" if args.group else ""
                    print(f"consuming {args.channel!r} ({where}) from {args.start}{group}", file=sys.stderr,
                          flush=True)
                printed = 0
                while args.count is None or printed < args.count:
                    pack = await _next_pack(consumer, stop)
                    if pack is None:
                        break
                    limit = None if args.count is None else args.count - printed
                    messages, ack_at = _printable(pack, limit)
                    if messages:
                        out.write("".join(
                            json.dumps(message_json(m), ensure_ascii=False, separators=(",", ":")) + "\n"
                            for m in messages))
                        out.flush()
                        printed += len(messages)
                    if args.group and ack_at is not None:
                        await consumer.ack(ack_at)
        finally:
            await client.aclose()
    finally:
        undo()
    return 0


__all__ = ["consume", "message_json"]
