"""The client commands of ``streamingnode``: produce, consume, channels, groups and flush.

They talk to a running node over gRPC through ``streamingnode.client.AsyncClient``.  The node's
address is ``--addr``, else ``$STREAMINGNODE_ADDR``, else ``localhost:19530``.  Every failure the node
reports prints ``error: CODE: message`` on stderr and exits 1.

Only the standard library is imported at module level: ``streamingnode --help`` builds these parsers,
and it must not pay for grpc, protobuf and the WAL.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import concurrent.futures
import contextlib
import json
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamingnode.client import AsyncClient, ChannelDescription, Consumer, GroupDescription
    from wal.errors import StreamingError
    from wal.message import Message, Position
    from wal.options import DeliverPolicy
    from wal.scanner import MsgPack

ADDR_ENV = "STREAMINGNODE_ADDR"
# Equal to streamingnode.config.DEFAULT_ADDR (a test keeps them in step); not imported from there
# because that module pulls in the storage backend, which --help must not load.
DEFAULT_ADDR = "localhost:19530"
LOGICAL_BITS = 18  # the hybrid timestamp is physical_ms << 18 | logical (interceptors/_clock.py)

CLIENT_COMMANDS = frozenset({"produce", "consume", "channels", "groups", "flush"})

# Keys of a produce envelope, plus the keys consume prints that produce accepts and ignores, so that
# `consume | produce` copies messages from one channel to another.
_ENVELOPE_KEYS = frozenset({"vchannel", "payload", "payload_b64", "properties"})
_CONSUME_ONLY_KEYS = frozenset({"id", "type", "timetick", "txn_id"})
# The dedup stamps of an idempotent producer (interceptors/dedup.py).  Copied from consume's output
# they would make the node answer with the original message's result and write nothing, so produce
# drops them; --producer-id stamps fresh ones.
_DEDUP_PROPERTIES = ("producer_id", "producer_seq")

# How much produce keeps unacknowledged: enough to fill the producer's pipeline (8 batches of up
# to 1,000 messages), bounded in bytes so that large messages cannot exhaust memory.
_WINDOW_MESSAGES = 8 * 1000
_WINDOW_BYTES = 64 << 20

Handler = Callable[[argparse.Namespace, str], Coroutine[Any, Any, int]]


class CliError(Exception):
    """A mistake in the command's input or arguments: printed as ``error: <message>``, exit 1."""


# --- arguments -----------------------------------------------------------------------------------
def add_client_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register produce, consume, channels, groups and flush on the top-level subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--addr", help=f"node address (default ${ADDR_ENV} or {DEFAULT_ADDR})")
    json_out = argparse.ArgumentParser(add_help=False)
    json_out.add_argument("--json", action="store_true", help="print JSON instead of a table")

    produce = sub.add_parser(
        "produce", parents=[common], help="append messages: JSON lines from stdin, or generated load",
        description="Append messages to a pchannel and wait until every one is durable.  Without --count, "
        "each stdin line is a JSON object {\"vchannel\"?, \"payload\" (string) or \"payload_b64\", "
        "\"properties\"?: {str: str}} or any other JSON value, whose JSON text becomes the payload.  "
        "With --count N, N generated messages of --size bytes are sent.  A summary line (messages, bytes, "
        "rate, ack latency) goes to stderr.")
    produce.add_argument("--channel", required=True, help="the pchannel")
    produce.add_argument("--vchannel", default="",
                         help="vchannel of messages that name none (default '': broadcast to every vchannel)")
    produce.add_argument("--count", type=_positive_int, help="send N generated messages instead of reading stdin")
    produce.add_argument("--size", type=_non_negative_int, help="payload bytes of generated messages (default 1024)")
    produce.add_argument("--producer-id",
                         help="make the producer idempotent under this id (use a fresh one per run): batches "
                              "unanswered when the connection breaks are resent without duplicates.  The node "
                              "stamps producer_id/producer_seq properties on each message.  Without it, such "
                              "a batch fails the command (it may or may not have been appended)")
    produce.add_argument("--linger", type=_non_negative_float, default=0.005,
                         help="seconds a batch waits for more messages (default 0.005)")
    produce.add_argument("--batch-bytes", type=_positive_int, default=1 << 20,
                         help="largest batch in bytes (default 1 MiB)")
    produce.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                         help="progress bar on stderr (default: when stderr is a terminal)")
    produce.set_defaults(client_handler=_produce)

    consume = sub.add_parser(
        "consume", parents=[common], help="print messages as JSON lines",
        description="Print messages as JSON lines {id, vchannel, type, timetick, txn_id?, properties, payload "
        "or payload_b64}, until --count messages or Ctrl-C / SIGTERM (exit 0).  TimeTicks are not printed.")
    consume.add_argument("--channel", required=True, help="the pchannel")
    consume.add_argument("--vchannel", default="", help="read one vchannel (default: the whole pchannel)")
    consume.add_argument("--from", dest="start", default="earliest", metavar="WHERE",
                         help="earliest (default), latest, a message id (an integer), or a time: ISO-8601 "
                              "(local time when it names no zone) or @UNIX_SECONDS")
    consume.add_argument("--group", help="consume as this consumer group: start at its committed position "
                                         "(when it has one) and ack each pack once printed")
    consume.add_argument("--count", type=_positive_int, help="stop after N messages")
    consume.add_argument("--quiet", action="store_true", help="no status line on stderr")
    consume.set_defaults(client_handler=_consume)

    channels = sub.add_parser("channels", help="create, list, describe, destroy pchannels")
    csub = channels.add_subparsers(dest="action", required=True)
    create = csub.add_parser("create", parents=[common, json_out], help="create pchannels")
    create.add_argument("names", nargs="*", metavar="NAME")
    create.add_argument("--num", type=_positive_int, help="create N channels named by the node (without NAMEs)")
    create.add_argument("--role", default="", help="owner role")
    create.add_argument("--address", default="", help="owner address")
    create.add_argument("--description", default="", help="owner description")
    create.set_defaults(client_handler=_channels_create)
    lst = csub.add_parser("list", parents=[common, json_out], help="every pchannel of the node")
    lst.set_defaults(client_handler=_channels_list)
    describe = csub.add_parser("describe", parents=[common, json_out], help="owner, term, ids, last time")
    describe.add_argument("names", nargs="+", metavar="NAME")
    describe.set_defaults(client_handler=_channels_describe)
    destroy = csub.add_parser("destroy", parents=[common], help="remove pchannels with their data and groups")
    destroy.add_argument("names", nargs="+", metavar="NAME")
    destroy.set_defaults(client_handler=_channels_destroy)

    groups = sub.add_parser("groups", help="create, destroy, list, describe, seek consumer groups")
    gsub = groups.add_subparsers(dest="action", required=True)
    gcreate = gsub.add_parser("create", parents=[common], help="create consumer groups on a pchannel")
    gcreate.add_argument("--channel", required=True, help="the pchannel")
    gcreate.add_argument("names", nargs="+", metavar="GROUP")
    gcreate.set_defaults(client_handler=_groups_create)
    gdestroy = gsub.add_parser("destroy", parents=[common], help="remove consumer groups")
    gdestroy.add_argument("--channel", required=True, help="the pchannel")
    gdestroy.add_argument("names", nargs="+", metavar="GROUP")
    gdestroy.set_defaults(client_handler=_groups_destroy)
    glist = gsub.add_parser("list", parents=[common, json_out], help="consumer groups (of every pchannel)")
    glist.add_argument("--channel", default="", help="only this pchannel")
    glist.set_defaults(client_handler=_groups_list)
    gdescribe = gsub.add_parser("describe", parents=[common, json_out], help="committed positions and lag")
    gdescribe.add_argument("--channel", default="", help="only this pchannel")
    gdescribe.add_argument("names", nargs="*", metavar="GROUP", help="default: every group")
    gdescribe.set_defaults(client_handler=_groups_describe)
    gseek = gsub.add_parser("seek", parents=[common, json_out], help="move a group's committed position")
    gseek.add_argument("--channel", required=True, help="the pchannel")
    gseek.add_argument("name", metavar="GROUP")
    gseek.add_argument("--vchannel", default="", help="the vchannel (default '': whole-pchannel consumers)")
    gseek.add_argument("--to", dest="target", required=True, metavar="WHERE",
                       help="earliest, latest, a message id, or a time (ISO-8601 or @UNIX_SECONDS)")
    gseek.set_defaults(client_handler=_groups_seek)

    flush = sub.add_parser("flush", parents=[common, json_out], help="flush a vchannel to Parquet")
    flush.add_argument("--channel", required=True, help="the pchannel")
    flush.add_argument("--vchannel", required=True, help="the vchannel")
    flush.add_argument("--collection", help="only this collection")
    flush.set_defaults(client_handler=_flush)


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def resolve_addr(args: argparse.Namespace) -> str:
    return str(getattr(args, "addr", None) or os.environ.get(ADDR_ENV) or DEFAULT_ADDR)


# --- running -------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    """Run the client command ``args`` selected; the process exit code."""
    from wal.errors import StreamingError  # noqa: PLC0415

    addr = resolve_addr(args)
    handler: Handler = args.client_handler
    try:
        return asyncio.run(handler(args, addr))
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except StreamingError as exc:
        _print_error(exc, addr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of stdout went away (`consume | head`): not an error of ours.  Point stdout at
        # /dev/null so the interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _print_error(exc: StreamingError, addr: str) -> None:
    from wal.errors import ErrorCode  # noqa: PLC0415

    print(f"error: {exc.code.name}: {exc}", file=sys.stderr)
    text = str(exc).lower()
    if exc.code is ErrorCode.UNAVAILABLE and ("connect" in text or "refused" in text or "resolve" in text):
        print(f"hint: is the node running at {addr}?  Start one with `streamingnode serve`, or point "
              f"--addr / ${ADDR_ENV} at it.", file=sys.stderr)


async def _connect(addr: str, pchannel: str | None = None) -> AsyncClient:
    """A client, after one cheap call that fails fast when the node is unreachable or the pchannel is
    missing: streams would otherwise keep reconnecting for their reconnect timeout first."""
    from streamingnode.client import AsyncClient  # noqa: PLC0415

    client = AsyncClient(addr)
    try:
        await client.describe_channels([pchannel] if pchannel else [])
    except BaseException:
        await client.aclose()
        raise
    return client


# --- positions and times -------------------------------------------------------------------------
_INT = re.compile(r"\d+")
_SECONDS = re.compile(r"@?\d+(\.\d*)?|@\.\d+|\d*\.\d+")


def parse_time(text: str) -> int:
    """A hybrid timestamp (physical_ms << 18) from ``@UNIX_SECONDS``, ``SECONDS.FRACTION`` or ISO-8601
    (naive = local time); raises CliError."""
    if _SECONDS.fullmatch(text):
        seconds = float(text.removeprefix("@"))
    else:
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            raise CliError(f"not a time: {text!r} (use ISO-8601 like 2025-01-31T12:00:00Z, or @UNIX_SECONDS)") \
                from None
        if when.tzinfo is None:
            when = when.astimezone()  # a naive time is the user's local time
        seconds = when.timestamp()
    return max(int(seconds * 1000), 0) << LOGICAL_BITS


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


def _ts_text(ts: int) -> str:
    """A hybrid timestamp as UTC ISO-8601 with milliseconds ('-' for 0: never set)."""
    if ts <= 0:
        return "-"
    return datetime.fromtimestamp((ts >> LOGICAL_BITS) / 1000, UTC).isoformat(timespec="milliseconds")


# --- produce -------------------------------------------------------------------------------------
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


def _read_stdin_in_thread(loop: asyncio.AbstractEventLoop) -> asyncio.Queue[bytes | OSError]:
    """Chunks of stdin (b"" at its end) from a daemon thread.

    os.read returns what the pipe has (at least one byte) instead of waiting for a full buffer, so a
    slow pipe is sent as it comes; and it takes no lock, unlike sys.stdin.buffer, whose lock held by a
    blocked daemon thread aborts the interpreter at exit.  A daemon thread rather than the loop's
    executor: a read blocked on an idle pipe must not keep an interrupted process alive (asyncio.run
    joins its executor).
    """
    queue: asyncio.Queue[bytes | OSError] = asyncio.Queue(maxsize=16)  # bounded: backpressure on stdin
    fd = sys.stdin.fileno()

    def read(size: int) -> bytes:
        return os.read(fd, size)

    def pump() -> None:
        item: bytes | OSError = b"x"
        while item:
            try:
                item = read(1 << 16)
            except OSError as exc:
                item = exc
            try:
                asyncio.run_coroutine_threadsafe(queue.put(item), loop).result()
            except (RuntimeError, concurrent.futures.CancelledError):
                return  # the loop is gone: nobody reads any more
            if isinstance(item, OSError):
                return

    threading.Thread(target=pump, name="stdin-reader", daemon=True).start()
    return queue


async def _stdin_lines() -> AsyncIterator[tuple[int, bytes]]:
    """(line number, line) of the non-blank stdin lines."""
    chunks = _read_stdin_in_thread(asyncio.get_running_loop())
    rest = b""
    lineno = 0
    while chunk := await chunks.get():
        if isinstance(chunk, OSError):
            raise CliError(f"reading stdin: {chunk}")
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        for line in lines:
            lineno += 1
            if line.strip():
                yield lineno, line
    if rest.strip():
        yield lineno + 1, rest


class _Window:
    """Bounds what produce keeps unacknowledged (``send_nowait`` itself applies no backpressure)."""

    def __init__(self, max_messages: int, max_bytes: int) -> None:
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self.messages = 0
        self.bytes = 0
        self._freed = asyncio.Event()

    async def acquire(self, size: int) -> None:
        # An empty window always admits one message, however large: the node judges its size.
        while self.messages and (self.messages >= self._max_messages or self.bytes + size > self._max_bytes):
            self._freed.clear()
            await self._freed.wait()
        self.messages += 1
        self.bytes += size

    def release(self, size: int) -> None:
        self.messages -= 1
        self.bytes -= size
        self._freed.set()

    async def drained(self) -> None:
        while self.messages:
            self._freed.clear()
            await self._freed.wait()


class _ProduceStats:
    def __init__(self) -> None:
        self.acked = 0
        self.bytes = 0
        self.latencies_ms: list[float] = []
        self.error: BaseException | None = None

    def summary(self, seconds: float) -> str:
        from streamingnode._progress import rate  # noqa: PLC0415

        lat = sorted(self.latencies_ms)
        return (f"produced {self.acked} msgs, {self.bytes} bytes in {seconds:.3f} s: "
                f"{rate(self.acked, seconds):.1f} msgs/s, {rate(self.bytes, seconds) / (1 << 20):.3f} MiB/s, "
                f"ack latency p50 {_percentile(lat, 0.50):.2f} ms p99 {_percentile(lat, 0.99):.2f} ms")


def _percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of sorted values (0 for none)."""
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(math.ceil(q * len(ordered)) - 1, 0))]


async def _produce(args: argparse.Namespace, addr: str) -> int:
    from streamingnode._progress import ProgressBar  # noqa: PLC0415

    if args.size is not None and args.count is None:
        raise CliError("--size needs --count (generated load)")
    show = sys.stderr.isatty() if args.progress is None else args.progress
    bar = ProgressBar(sys.stderr, args.count) if show else None
    stats = _ProduceStats()
    window = _Window(_WINDOW_MESSAGES, _WINDOW_BYTES)
    loop = asyncio.get_running_loop()
    input_error: CliError | None = None
    client = await _connect(addr, args.channel)
    start = time.perf_counter()
    ticker: asyncio.Task[None] | None = None
    try:
        producer = client.producer(args.channel, producer_id=args.producer_id or None,
                                   linger=args.linger, max_batch_bytes=args.batch_bytes)

        def on_ack(sent_at: float, size: int) -> Callable[[asyncio.Future[Any]], None]:
            return lambda fut: acked(sent_at, size, fut)

        def acked(sent_at: float, size: int, fut: asyncio.Future[Any]) -> None:
            window.release(size)
            if fut.cancelled():
                return
            exc = fut.exception()
            if exc is None:
                stats.acked += 1
                stats.bytes += size
                stats.latencies_ms.append((loop.time() - sent_at) * 1000)
            elif stats.error is None:
                stats.error = exc  # the first failure ends the run; later ones are its echoes

        async def redraw(bar: ProgressBar) -> None:
            # A timer, not a redraw per ack: the acks come in bursts of whole batches.
            while True:
                bar.draw(stats.acked, stats.bytes)
                await asyncio.sleep(0.1)

        if bar is not None:
            ticker = loop.create_task(redraw(bar))
        try:
            async for vchannel, payload, properties in _records(args):
                if stats.error is not None:
                    break
                await window.acquire(len(payload))
                fut = producer.send_nowait(vchannel, payload, properties=properties)
                fut.add_done_callback(on_ack(loop.time(), len(payload)))
        except CliError as exc:
            input_error = exc  # report it after what was already sent is acknowledged
        await producer.flush()
        await window.drained()
        await producer.aclose()
    finally:
        if ticker is not None:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
        await client.aclose()
        # Also when interrupted (Ctrl-C cancels this task): what was acknowledged is durable, and
        # the summary says how much that was.
        seconds = time.perf_counter() - start
        if bar is not None:
            bar.draw(stats.acked, stats.bytes, force=True)
            bar.clear()
        print(stats.summary(seconds), file=sys.stderr)
    if input_error is not None:
        raise input_error
    if stats.error is not None:
        raise stats.error
    return 0


async def _records(args: argparse.Namespace) -> AsyncIterator[Record]:
    if args.count is not None:
        # One random payload reused: generating bytes per message would measure os.urandom.
        payload = os.urandom(1024 if args.size is None else args.size)
        for _ in range(args.count):
            yield args.vchannel, payload, None
        return
    async for lineno, line in _stdin_lines():
        yield parse_record(line, lineno, args.vchannel)


# --- consume -------------------------------------------------------------------------------------
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

    When ``limit`` cuts the pack, the ack position is the end of the last whole unit printed (a
    transaction is a unit from BeginTxn to its commit), by the same rule the node uses to split packs
    (``server._split_pack``): the pack's start id with the unit's timetick.  A transaction cut in the
    middle is then delivered again, whole, to the group's next consumer.
    """
    from wal.message import MessageType, Position  # noqa: PLC0415

    chosen: list[Message] = []
    boundary: Position | None = None
    in_txn = False
    for m in pack.messages:
        t = m.message_type
        if t is not MessageType.TIME_TICK:
            if limit is not None and len(chosen) >= limit:
                return chosen, boundary
            chosen.append(m)
        if t is MessageType.BEGIN_TXN:
            in_txn = True
        elif t in (MessageType.COMMIT_TXN, MessageType.ROLLBACK_TXN):
            in_txn = False
        if not in_txn:
            boundary = Position(pack.start_position.pchannel, pack.start_position.message_id, m.timetick)
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
        getter.cancel()
        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
            await getter
        return None
    try:
        return getter.result()
    except StopAsyncIteration:
        return None


async def _consume(args: argparse.Namespace, addr: str) -> int:
    policy = parse_where(args.start, "--from")
    stop = asyncio.Event()
    undo = _install_stop(stop)
    out = sys.stdout
    try:
        client = await _connect(addr, args.channel)
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


# --- channels ------------------------------------------------------------------------------------
def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [headers, *rows]]
    return "\n".join(lines)


def _dump(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def _id_text(mid: int | None) -> str:
    return "-" if mid is None else str(mid)


def channel_json(d: ChannelDescription) -> dict[str, Any]:
    return {
        "name": d.name,
        "owner": {"role": d.owner.role, "address": d.owner.address, "description": d.owner.description},
        "term": d.term, "first_id": d.first_id, "last_id": d.last_id, "last_timetick": d.last_timetick,
    }


def _channel_rows(descriptions: list[ChannelDescription]) -> str:
    rows = [[d.name, str(d.term), _id_text(d.first_id), _id_text(d.last_id),
             str(0 if d.first_id is None or d.last_id is None else d.last_id - d.first_id + 1),
             _ts_text(d.last_timetick), d.owner.role or "-"] for d in descriptions]
    return _table(["NAME", "TERM", "FIRST_ID", "LAST_ID", "MESSAGES", "LAST_TIME", "OWNER"], rows)


async def _channels_create(args: argparse.Namespace, addr: str) -> int:
    from streamingnode.client import Owner  # noqa: PLC0415

    if bool(args.names) == bool(args.num):
        raise CliError("channels create: give channel NAMEs or --num N (not both)")
    client = await _connect(addr)
    try:
        names = await client.create_channels(args.names, args.num or 0,
                                              owner=Owner(args.role, args.address, args.description))
    finally:
        await client.aclose()
    if args.json:
        _dump(names)
    else:
        print("\n".join(f"created {n}" for n in names))
    return 0


async def _channels_list(args: argparse.Namespace, addr: str) -> int:
    client = await _connect(addr)
    try:
        descriptions = await client.describe_channels()
    finally:
        await client.aclose()
    if args.json:
        _dump([channel_json(d) for d in descriptions])
    elif descriptions:
        print(_channel_rows(descriptions))
    else:
        print("no channels", file=sys.stderr)
    return 0


async def _channels_describe(args: argparse.Namespace, addr: str) -> int:
    client = await _connect(addr)
    try:
        descriptions = await client.describe_channels(args.names)
    finally:
        await client.aclose()
    if args.json:
        _dump([channel_json(d) for d in descriptions])
        return 0
    blocks = []
    for d in descriptions:
        owner = ", ".join(f"{k}={v}" for k, v in (("role", d.owner.role), ("address", d.owner.address),
                                                  ("description", d.owner.description)) if v) or "-"
        blocks.append(_table(["FIELD", "VALUE"], [
            ["name", d.name], ["owner", owner], ["term", str(d.term)],
            ["first_id", _id_text(d.first_id)], ["last_id", _id_text(d.last_id)],
            ["last_timetick", f"{d.last_timetick} ({_ts_text(d.last_timetick)})"],
        ]).split("\n", 1)[1])  # the header adds nothing to a key/value list
    print("\n\n".join(blocks))
    return 0


async def _channels_destroy(args: argparse.Namespace, addr: str) -> int:
    client = await _connect(addr)
    try:
        await client.destroy_channels(args.names)
    finally:
        await client.aclose()
    print("\n".join(f"destroyed {n}" for n in args.names))
    return 0


# --- groups --------------------------------------------------------------------------------------
def group_json(g: GroupDescription) -> dict[str, Any]:
    return {"pchannel": g.pchannel, "group": g.group, "vchannels": [
        {"vchannel": p.vchannel, "committed": {"message_id": p.committed.message_id,
                                               "timetick": p.committed.timetick},
         "lag_messages": p.lag_messages, "lag_ms": p.lag_ms} for p in g.vchannels]}


async def _groups_create(args: argparse.Namespace, addr: str) -> int:
    client = await _connect(addr)
    try:
        for name in args.names:
            await client.create_group(args.channel, name)
            print(f"created group {name} on {args.channel}")
    finally:
        await client.aclose()
    return 0


async def _groups_destroy(args: argparse.Namespace, addr: str) -> int:
    client = await _connect(addr)
    try:
        for name in args.names:
            await client.destroy_group(args.channel, name)
            print(f"destroyed group {name} on {args.channel}")
    finally:
        await client.aclose()
    return 0


async def _describe_groups(args: argparse.Namespace, addr: str, names: list[str]) -> list[GroupDescription]:
    client = await _connect(addr)
    try:
        return await client.describe_groups(args.channel, names)
    finally:
        await client.aclose()


async def _groups_list(args: argparse.Namespace, addr: str) -> int:
    groups = await _describe_groups(args, addr, [])
    if args.json:
        _dump([{"pchannel": g.pchannel, "group": g.group} for g in groups])
    elif groups:
        print(_table(["PCHANNEL", "GROUP", "VCHANNELS"], [
            [g.pchannel, g.group, ",".join(repr(p.vchannel) for p in g.vchannels) or "-"] for g in groups]))
    else:
        print("no consumer groups", file=sys.stderr)
    return 0


async def _groups_describe(args: argparse.Namespace, addr: str) -> int:
    groups = await _describe_groups(args, addr, args.names)
    if args.json:
        _dump([group_json(g) for g in groups])
        return 0
    rows: list[list[str]] = []
    for g in groups:
        if not g.vchannels:
            rows.append([g.pchannel, g.group, "-", "-", "-", "-", "-"])  # created, never consumed or sought
        rows.extend([g.pchannel, g.group, repr(p.vchannel), str(p.committed.message_id),
                     _ts_text(p.committed.timetick), str(p.lag_messages), str(p.lag_ms)] for p in g.vchannels)
    if rows:
        print(_table(["PCHANNEL", "GROUP", "VCHANNEL", "COMMITTED_ID", "COMMITTED_TIME", "LAG_MSGS", "LAG_MS"],
                     rows))
    else:
        print("no consumer groups", file=sys.stderr)
    return 0


async def _groups_seek(args: argparse.Namespace, addr: str) -> int:
    policy = parse_where(args.target, "--to")
    client = await _connect(addr)
    try:
        pos = await client.seek_group(args.channel, args.name, args.vchannel, policy=policy)
    finally:
        await client.aclose()
    if args.json:
        _dump({"pchannel": pos.pchannel, "vchannel": args.vchannel, "message_id": pos.message_id,
               "timetick": pos.timetick})
    else:
        print(f"group {args.name} on {args.channel} vchannel {args.vchannel!r} now at message id "
              f"{pos.message_id}, timetick {pos.timetick} ({_ts_text(pos.timetick)})")
    return 0


# --- flush ---------------------------------------------------------------------------------------
async def _flush(args: argparse.Namespace, addr: str) -> int:
    client = await _connect(addr)
    try:
        files, flush_ts = await client.flush(args.channel, args.vchannel, args.collection)
    finally:
        await client.aclose()
    if args.json:
        _dump({"files": files, "flush_timetick": flush_ts})
    else:
        print(f"flush timetick {flush_ts} ({_ts_text(flush_ts)})")
        print(f"{len(files)} file(s)" + "".join(f"\n  {f}" for f in files))
    return 0


__all__ = ["CLIENT_COMMANDS", "DEFAULT_ADDR", "add_client_commands", "parse_record", "parse_where", "run"]
