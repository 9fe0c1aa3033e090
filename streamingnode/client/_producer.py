"""Producer: one Produce stream per pchannel, auto-batching, pipelined, optionally idempotent.

Messages wait in an *open* batch until ``linger`` passes or the batch is full; the batch is then
*sealed* (it gets its sequence numbers, if idempotent) and queued; the stream task writes sealed
batches while fewer than ``max_in_flight`` are unanswered (*in flight*).  The node answers batches in
order, each with one result per message or one in-band error for the whole batch.

When the stream breaks for a reason a new stream cures (see ``_calls.reconnectable``):

- with a ``producer_id`` every in-flight batch goes back to the front of the queue with the sequences
  it already had, and is written again on the new stream; the node's dedup step answers a sequence
  it already appended with the original result, so nothing is lost and nothing is written twice;
- without one, a batch that was written but not answered may or may not have been appended, and
  sending it again could duplicate it, so its futures fail with ``UnavailableError``.  Batches never
  written are sent on the new stream.

Producer identity is the node's (with a ``producer_id``): the first open of a producer gets an epoch
from the node, which fences every older stream of the id (its next batch fails with
``ProducerFencedError``), and the next sequence the node expects from the id.  Without an explicit
``first_sequence`` the producer numbers its messages from there, so a producer made again with the
same id (after a restart, with or without a spool) continues the id's sequences instead of reusing
them; batches sealed before that first open are numbered when it answers.  Reconnects present the
epoch, and keep it unless a newer producer of the id opened meanwhile (then everything left fails
with ``ProducerFencedError``: this instance must stop).

An idempotent producer's sequences have no holes: the node refuses a batch that skips ahead of what
it has seen from the producer (``OutOfOrderSequenceError``, not retried: resending the same batch
cannot fill the hole).  Batches failed before they were ever written give their sequences back.  After
batches failed with their fate unknown (the node stayed away longer than ``reconnect_timeout``), the
node may not have them: a later batch can then be refused, and the producer should start over under
a new ``producer_id``.

An outage (the node, or the log behind it, away) is bounded by ``reconnect_timeout`` from its first
failure to the next batch answered: an idempotent producer meanwhile also holds back and resends, in
order, the batches the node answered with a transient error; how, and when such a batch fails rather
than land out of order, is ``_sender``'s.

Routing and the local buffer: the producer reaches its pchannel through a ``Route`` (the owner in a
cluster, see ``_routing``); a stream refused with NOT_OWNER, or broken because the node went away,
is opened again at the owner the Router learns or resolves.  Every message accepted and not answered
yet counts against ``buffer_bytes``: while no owner answers, ``send``/``send_nowait`` keep accepting
until that bound, and the batches go out (in order, with their sequences) as soon as a stream opens.
A full buffer makes ``send`` wait (``on_full="block"``, within the send's ``timeout``) or fail with
``ResourceExhaustedError`` (``on_full="fail"``, and ``send_nowait`` in that mode).  With
``spool_dir`` every sealed batch is appended to a file before it is written, and answered batches are
marked so; a producer made later with the same ``producer_id`` and ``spool_dir`` sends what is left
first (see ``_spool``).

Lifecycle: running -> draining (``aclose``: everything queued is still sent and answered) -> closed.

The parts, as aiokafka splits its producer: ``_accumulator`` (the open batch, sealing, sequences and
the buffer account), ``_sender`` (the stream task: writes, answers, reconnects), ``_spool`` (the disk
copy) and ``_routing`` (the owner to write to); this module is the public face that puts them together.
"""

from __future__ import annotations

import asyncio
import builtins
import enum

from streamingnode.client._accumulator import Accumulator, Batch
from streamingnode.client._routing import Route
from streamingnode.client._sender import Sender
from streamingnode.client._spool import Spool
from streamingnode.observability.trace_context import with_current_context
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from streamingnode.wire.defaults import LINGER, MAX_BATCH_BYTES, MAX_BATCH_MESSAGES, RECONNECT_TIMEOUT
from wal.errors import InvalidArgumentError, OnShutdownError
from wal.message import AppendResult, MessageType
from wal.tasks import cancel_and_wait

DEFAULT_BUFFER_BYTES = 64 << 20
"""Bytes of accepted, unanswered messages a producer holds by default (``buffer_bytes``)."""

_DEFAULT_IN_FLIGHT = 8
NODE_DEDUP_WINDOW = 4096
"""Sequences per producer the node remembers by default (``ChainConfig.dedup_window``)."""


class _State(enum.Enum):
    RUNNING = "running"
    DRAINING = "draining"
    CLOSED = "closed"


class Producer:
    """Appends to one pchannel.  Make one with ``AsyncClient.producer``; use it on the client's loop.

    ``send`` returns once the message is durable; ``send_nowait`` returns a future at once (and applies
    no backpressure).  Messages sent concurrently are batched: a batch is written when ``linger``
    seconds have passed since its first message, or when it reaches ``max_batch_bytes`` or
    ``max_batch_messages``.  At ``linger=0`` a ``send`` made while nothing is open, queued or in
    flight goes out at once; messages sent while it is in flight gather for one loop turn and share
    the next batch.

    ``max_in_flight`` (written, unanswered batches) defaults to 8; with a ``producer_id`` to as many as
    keep ``max_in_flight * max_batch_messages`` within the node's default dedup window (4096
    sequences), so that a resend after a reconnect is always recognised: 4 batches of 1,000.
    """

    def __init__(
        self,
        stub: sgrpc.StreamingNodeStub | Route,
        pchannel: str,
        *,
        producer_id: str | None = None,
        first_sequence: int | None = None,
        linger: float = LINGER,
        max_batch_bytes: int = MAX_BATCH_BYTES,
        max_batch_messages: int = MAX_BATCH_MESSAGES,
        max_in_flight: int | None = None,
        reconnect_timeout: float = RECONNECT_TIMEOUT,
        txn: pb.TxnContext | None = None,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        on_full: str = "block",
        spool_dir: str | None = None,
    ) -> None:
        if not pchannel:
            raise InvalidArgumentError("pchannel is required", field="pchannel")
        if producer_id == "":
            raise InvalidArgumentError("producer_id must not be empty when set", field="producer_id")
        if max_in_flight is None:
            max_in_flight = _DEFAULT_IN_FLIGHT
            if producer_id is not None:
                max_in_flight = max(1, min(max_in_flight, NODE_DEDUP_WINDOW // max(max_batch_messages, 1)))
        if linger < 0 or max_batch_bytes <= 0 or max_batch_messages <= 0 or max_in_flight <= 0:
            raise InvalidArgumentError("linger must be >= 0; batch limits and max_in_flight must be > 0")
        if buffer_bytes <= 0:
            raise InvalidArgumentError(f"buffer_bytes must be > 0, got {buffer_bytes}", field="buffer_bytes")
        if on_full not in ("block", "fail"):
            raise InvalidArgumentError(f"on_full must be 'block' or 'fail', got {on_full[:200]!r}", field="on_full")
        if spool_dir is not None and (producer_id is None or txn is not None):
            # Without sequences a resend after a restart could duplicate; a transaction dies with its client.
            raise InvalidArgumentError("spool_dir needs a producer_id (and no transaction)", field="spool_dir")
        self.pchannel = pchannel
        self.producer_id = producer_id
        self._state = _State.RUNNING
        spool = Spool(spool_dir, producer_id, pchannel) if spool_dir is not None and producer_id is not None else None
        self._accumulator = Accumulator(
            pchannel, producer_id, first_sequence=first_sequence, linger=linger, max_batch_bytes=max_batch_bytes,
            max_batch_messages=max_batch_messages, txn=txn, buffer_bytes=buffer_bytes, on_full=on_full,
            spool=spool, on_sealed=self._start_task)
        self._sender = Sender(self._accumulator, stub, pchannel, producer_id, max_in_flight=max_in_flight,
                              reconnect_timeout=reconnect_timeout, fail_all=self._fail_all)
        self.recovered: list[asyncio.Future[AppendResult]] = []
        """One future per message a spool held from an earlier producer (sent before anything new)."""
        if spool is not None:
            self.recovered = self._accumulator.recover()
            if self._accumulator.sealed:
                self._start_task()

    # --- public ----------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._state is _State.CLOSED

    @property
    def draining(self) -> bool:
        """``aclose`` is under way."""
        return self._state is _State.DRAINING

    @property
    def buffer_bytes(self) -> int:
        """Bytes of accepted, unanswered messages this producer holds at most."""
        return self._accumulator.buffer_bytes

    @property
    def buffered_bytes(self) -> int:
        """Bytes of messages accepted and not answered yet (what ``buffer_bytes`` bounds)."""
        return self._accumulator.buffered

    @property
    def connected(self) -> bool:
        """A stream to an owner is open now."""
        return self._sender.connected

    @property
    def max_in_flight(self) -> int:
        """Batches written and not answered yet, at most (after defaults are applied)."""
        return self._sender.max_in_flight

    @property
    def spool_damaged(self) -> list[tuple[str, int]]:
        """``(file, offset)`` of every spool record that failed its checksum when this producer read
        its spool (those batches cannot be resent; the others were); empty without a spool."""
        spool = self._accumulator.spool
        return list(spool.damaged) if spool is not None else []

    @property
    def next_sequence(self) -> int:
        """The sequence the next sealed message gets (provisional until the first open answered, when
        no ``first_sequence`` was given: the node's next sequence is where the producer goes on)."""
        return self._accumulator.next_sequence

    @property
    def epoch(self) -> int | None:
        """The producer's epoch, handed out by the node on the first open (None before it, and
        without a producer_id); presented again on every reconnect."""
        return self._sender.epoch

    @property
    def term(self) -> int | None:
        """The WAL term of the current stream (None before the first open)."""
        return self._sender.term

    @property
    def batches_written(self) -> int:
        """Batches written to a stream, resends included (for tests and metrics)."""
        return self._sender.batches_written

    @property
    def largest_batch(self) -> int:
        """Messages in the largest batch written so far."""
        return self._sender.largest_batch

    @property
    def reconnects(self) -> int:
        """How many times the stream was opened again after a failure (for tests and metrics)."""
        return self._sender.reconnects

    def send_nowait(
        self,
        vchannel: str,
        payload: bytes,
        *,
        properties: dict[str, str] | None = None,
        type: MessageType = MessageType.DATA,
    ) -> asyncio.Future[AppendResult]:
        """Queue a message; the future resolves to its AppendResult once it is durable, or fails with
        the StreamingError the node gave its batch."""
        if self._state is not _State.RUNNING:
            raise OnShutdownError(f"producer on {self.pchannel!r} is closed", channel=self.pchannel)
        # The caller's span context (W3C traceparent), when a recording span is current: the node's
        # produce span becomes its child.  Without one this is a context-variable read, nothing more.
        properties = with_current_context(properties)
        # Checked here, not when the batch is sealed (possibly from a timer, where a TypeError would
        # strand every future of the batch): the columns take exactly these types.
        if not isinstance(payload, bytes) or not isinstance(vchannel, str) or not isinstance(type, int):
            raise InvalidArgumentError(
                f"a message needs a str vchannel, a bytes payload and a MessageType, got "
                f"{builtins.type(vchannel).__name__}, {builtins.type(payload).__name__} and "
                f"{builtins.type(type).__name__}", field="payload")
        return self._accumulator.add(vchannel, payload, properties, type)

    async def send(
        self,
        vchannel: str,
        payload: bytes,
        *,
        properties: dict[str, str] | None = None,
        type: MessageType = MessageType.DATA,
        timeout: float | None = None,  # noqa: ASYNC109  (bounds the wait for room and the answer alike)
    ) -> AppendResult:
        """Append one message and wait until it is durable.  Waits first while too many sealed batches
        are queued for an open stream (backpressure), or while the buffer is full (``on_full="block"``;
        ``"fail"`` raises ``ResourceExhaustedError``).  ``timeout`` (seconds, None: none) bounds the
        whole call; when it passes while the message is still only waiting for room, it was not
        accepted (TimeoutError); once accepted, the message stays queued even if the wait times out."""
        if timeout is None:  # no timeout object to make and enter: the usual call
            return await self._send(vchannel, payload, properties, type)
        async with asyncio.timeout(timeout):
            return await self._send(vchannel, payload, properties, type)

    async def _send(
        self, vchannel: str, payload: bytes, properties: dict[str, str] | None, type: MessageType
    ) -> AppendResult:
        size = len(payload) + len(vchannel)
        if properties:
            size += sum(len(k) + len(v) for k, v in properties.items())
        acc, sender = self._accumulator, self._sender
        while self._state is _State.RUNNING and (
                (sender.connected and len(acc.sealed) >= sender.max_in_flight)
                or (acc.buffered and acc.buffered + size > acc.buffer_bytes)):
            if not (sender.connected and len(acc.sealed) >= sender.max_in_flight) and acc.on_full == "fail":
                raise acc.full(size)
            acc.space.clear()
            await acc.space.wait()
        # A lone message at linger 0 (nothing open, queued or in flight: no company to wait for, and
        # nothing it could overtake) goes out now, not one loop turn later.  Messages sent while it is
        # in flight still gather for that turn and share a batch.
        lone = acc.linger == 0 and not (acc.has_open or acc.sealed or sender.in_flight or sender.held)
        fut = self.send_nowait(vchannel, payload, properties=properties, type=type)
        if lone:
            acc.seal()
        # Awaited directly, not through a shield: the future is this call's alone, and a cancelled
        # wait leaves the message in its batch (``_resolve`` and the failure paths skip done futures).
        return await fut

    async def flush(self) -> None:
        """Write the open batch now and wait until every message sent so far is answered (failures
        stay on their own futures)."""
        self._accumulator.seal()
        futures = [f for b in (*self._sender.held, *self._sender.in_flight, *self._accumulator.sealed)
                   for f in b.futures]
        if futures:
            await asyncio.wait(futures)

    async def aclose(self) -> None:
        """Drain (everything sent so far is still written and answered), then end the stream.
        Idempotent; cancelling it abandons the drain and fails what is left with OnShutdownError."""
        if self._state is _State.CLOSED:
            return
        self._state = _State.DRAINING
        sender = self._sender
        sender.closing = True
        self._accumulator.seal()
        sender.wake.set()
        self._accumulator.space.set()
        try:
            if sender.task is not None:
                await asyncio.shield(sender.task)
        finally:
            self._state = _State.CLOSED
            if sender.task is not None and not sender.task.done():
                await cancel_and_wait(sender.task)
            spool = self._accumulator.spool
            kept = " (its spool keeps them for a producer with the same id)" if spool is not None else ""
            self._fail_all(OnShutdownError(f"producer on {self.pchannel!r} closed before its messages were "
                                           f"answered{kept}", channel=self.pchannel), keep_spool=True)
            if spool is not None:
                spool.close()

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- the parts ------------------------------------------------------------------------------
    def _start_task(self) -> None:
        self._sender.start()

    def _fail_all(self, exc: BaseException, *, keep_spool: bool = False) -> None:
        """Fail everything this producer holds: in flight, sealed and open (their sequences given back)."""
        in_flight, held = self._sender.in_flight, self._sender.held
        batches: tuple[Batch, ...] = (*held, *in_flight, *self._accumulator.sealed)
        held.clear()
        in_flight.clear()
        self._accumulator.fail_all(batches, exc, keep_spool=keep_spool)


__all__ = ["DEFAULT_BUFFER_BYTES", "NODE_DEDUP_WINDOW", "Producer"]
