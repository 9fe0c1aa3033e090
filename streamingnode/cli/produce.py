"""``streamingnode produce``: append JSON lines from stdin, or generated load, and wait until every
message is durable.

Standard library only at module level (see ``streamingnode.cli``).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import math
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from streamingnode.cli.connection import connect
from streamingnode.cli.parsing import CliError, Record, parse_raw_record, parse_record
from wal.tasks import cancel_and_wait

# How much produce keeps unacknowledged: enough to fill the producer's pipeline (8 batches of up
# to 1,000 messages), bounded in bytes so that large messages cannot exhaust memory.
_WINDOW_MESSAGES = 8 * 1000
_WINDOW_BYTES = 64 << 20


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
            put = queue.put(item)
            try:
                asyncio.run_coroutine_threadsafe(put, loop).result()
            except (RuntimeError, concurrent.futures.CancelledError):
                # The loop is gone (the command ended, on an error or a refusal): nobody reads any
                # more.  The put is closed here, or Python warns on stderr that it was never awaited.
                put.close()
                return
            if isinstance(item, OSError):
                return

    threading.Thread(target=pump, name="stdin-reader", daemon=True).start()
    return queue


async def _stdin_lines() -> AsyncIterator[tuple[int, bytes]]:
    """(line number, line without its end) of the non-blank stdin lines."""
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
        from streamingnode.cli.progress import rate  # noqa: PLC0415

        lat = sorted(self.latencies_ms)
        return (f"produced {self.acked} msgs, {self.bytes} bytes in {seconds:.3f} s: "
                f"{rate(self.acked, seconds):.1f} msgs/s, {rate(self.bytes, seconds) / (1 << 20):.3f} MiB/s, "
                f"ack latency p50 {_percentile(lat, 0.50):.2f} ms p99 {_percentile(lat, 0.99):.2f} ms")


def _percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of sorted values (0 for none)."""
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(math.ceil(q * len(ordered)) - 1, 0))]


async def produce(args: argparse.Namespace, addr: str) -> int:
    """Run ``produce``; the exit code."""
    from streamingnode.cli.progress import ProgressBar  # noqa: PLC0415

    if args.size is not None and args.count is None:
        raise CliError("--size needs --count (generated load)")
    if args.vchannel_delimiter is not None and args.format != "raw":
        raise CliError("-K/--vchannel-delimiter needs --format raw")
    # A bar redrawn in place on a terminal where someone types the input would be drawn over what they
    # type (and the other way round): by default only when stdin is not that terminal.
    default_show = sys.stderr.isatty() and (args.count is not None or not sys.stdin.isatty())
    show = default_show if args.progress is None else args.progress
    bar = ProgressBar(sys.stderr, args.count) if show else None
    stats = _ProduceStats()
    window = _Window(_WINDOW_MESSAGES, _WINDOW_BYTES)
    loop = asyncio.get_running_loop()
    input_error: CliError | None = None
    client = await connect(addr, args.channel, reconnect_timeout=args.reconnect_timeout)
    start = time.perf_counter()
    ticker: asyncio.Task[None] | None = None
    failed = False
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
    except Exception:
        failed = True
        raise
    finally:
        await cancel_and_wait(ticker)
        await client.aclose()
        # Also when interrupted (Ctrl-C cancels this task): what was acknowledged is durable, and
        # the summary says how much that was.  A run that fails with nothing acknowledged has nothing
        # to sum up: only its error is printed (a line of zeros before it reads like a success).
        seconds = time.perf_counter() - start
        if bar is not None:
            bar.draw(stats.acked, stats.bytes, force=True)
            bar.clear()
        if stats.acked or not (failed or stats.error is not None or input_error is not None):
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
    if args.format == "raw":
        delimiter = None if args.vchannel_delimiter is None else args.vchannel_delimiter.encode()
        async for _, line in _stdin_lines():
            yield parse_raw_record(line.removesuffix(b"\r"), args.vchannel, delimiter)
        return
    async for lineno, line in _stdin_lines():
        yield parse_record(line, lineno, args.vchannel)


__all__ = ["produce"]
