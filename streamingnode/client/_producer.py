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
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import contextlib
import enum
import itertools
from typing import Any, cast

import grpc

from streamingnode.client._calls import done_writing, open_stream, reconnectable, translate, with_reconnect, write
from streamingnode.client._routing import Route
from streamingnode.client._spool import Spool
from streamingnode.observability.tracing import with_current_context
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from streamingnode.wire.codes import from_error_detail
from streamingnode.wire.defaults import LINGER, MAX_BATCH_BYTES, MAX_BATCH_MESSAGES, RECONNECT_TIMEOUT
from wal.error_codes import Behaviour, codes_with
from wal.errors import (
    InvalidArgumentError,
    OnShutdownError,
    ResourceExhaustedError,
    StreamingError,
    UnavailableError,
)
from wal.message import AppendResult, MessageType
from wal.tasks import cancel_and_wait

# In-band batch errors that the node sends just before it ends the stream (the channel was reopened,
# or the node is stopping): nothing of the batch was written, and a new stream can take it.
_ENDS_STREAM = codes_with(Behaviour.RESEND_ON_NEW_STREAM)

DEFAULT_BUFFER_BYTES = 64 << 20
"""Bytes of accepted, unanswered messages a producer holds by default (``buffer_bytes``)."""

_DEFAULT_IN_FLIGHT = 8
NODE_DEDUP_WINDOW = 4096
"""Sequences per producer the node remembers by default (``ChainConfig.dedup_window``)."""


class _State(enum.Enum):
    RUNNING = "running"
    DRAINING = "draining"
    CLOSED = "closed"


class _Batch:
    """A sealed batch: its request, built once in column form (a resend after a reconnect reuses it
    with a new request id), and one future per message."""

    __slots__ = ("futures", "nbytes", "numbered", "request", "sent")

    def __init__(self, request: spb.ProduceRequest, futures: list[asyncio.Future[AppendResult]],
                 nbytes: int = 0) -> None:
        self.request = request
        self.futures = futures
        self.nbytes = nbytes
        """What the batch counts against ``buffer_bytes``."""
        self.sent = False
        """Written to a stream at least once (the node may have its sequences)."""
        self.numbered = True
        """Its sequences are final (False: sealed before the node said where the producer's go on)."""

    @property
    def request_id(self) -> int:
        return self.request.batch.request_id

    def fail(self, exc: BaseException) -> None:
        _fail_futures(self.futures, exc)


def _fail_futures(futures: list[asyncio.Future[AppendResult]], exc: BaseException) -> None:
    for fut in futures:
        if not fut.done():
            fut.set_exception(exc)
            # A send_nowait caller may drop its future: its error must not be logged as "never
            # retrieved".  Marked here, once per failure, instead of a callback on every future.
            fut.exception()


def _retrieve(fut: asyncio.Future[AppendResult]) -> None:
    if not fut.cancelled():
        fut.exception()


def _request_bytes(request: spb.ProduceRequest) -> int:
    columns = request.batch.columns
    size = sum(map(len, columns.payloads)) + sum(map(len, columns.vchannels))
    for extra in columns.extras:
        size += sum(len(k) + len(v) for k, v in extra.properties.items())
    return size


def _resolve(futures: list[asyncio.Future[AppendResult]], appended: spb.AppendResults) -> None:
    """Give each message's future its result; the node answers a column batch in column form."""
    ids, txn_ids = appended.ids, appended.txn_ids
    n = len(futures)
    if len(ids) != n or len(appended.timeticks) != n or len(txn_ids) not in (0, n):
        raise UnavailableError(f"the node answered a batch of {n} messages with {len(ids)} results")
    if len(txn_ids):
        for fut, mid, ts, txn_id in zip(futures, ids, appended.timeticks, txn_ids, strict=True):
            if not fut.done():
                fut.set_result(AppendResult(mid, ts, txn_id or None))
        return
    for fut, mid, ts in zip(futures, ids, appended.timeticks, strict=True):
        if not fut.done():
            fut.set_result(AppendResult(mid, ts, None))


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
        self._route = stub if isinstance(stub, Route) else None
        self._stub = stub
        self.pchannel = pchannel
        self.producer_id = producer_id
        self._linger = linger
        self._max_bytes = max_batch_bytes
        self._max_messages = max_batch_messages
        self._max_in_flight = max_in_flight
        self._reconnect_timeout = reconnect_timeout
        self._txn = txn
        self._next_sequence = first_sequence or 0
        self._numbered = producer_id is None or first_sequence is not None
        """Sequences are final: given by the caller, or learnt from the node's first answer."""
        self.epoch: int | None = None
        """The producer's epoch, handed out by the node on the first open (None before it, and
        without a producer_id); presented again on every reconnect."""
        self.buffer_bytes = buffer_bytes
        self._on_full = on_full
        self._buffered = 0  # bytes of accepted messages not answered yet (open, sealed, in flight)
        self._connected = False
        self._request_ids = itertools.count(1)
        self._loop = asyncio.get_running_loop()
        self._state = _State.RUNNING
        # The open batch, column by column (MessageColumns): one list append per field and message,
        # and the columns go into the request with one C-level extend each when it is sealed.
        self._open_types: list[int] = []
        self._open_vchannels: list[str] = []
        self._open_payloads: list[bytes] = []
        self._open_extras: list[pb.MessageExtras] = []
        self._open_futures: list[asyncio.Future[AppendResult]] = []
        self._open_bytes = 0
        self._linger_timer: asyncio.Handle | None = None
        self._sealed: collections.deque[_Batch] = collections.deque()
        self._in_flight: collections.deque[_Batch] = collections.deque()
        self._wake = asyncio.Event()  # the stream task: something to write, or a slot freed
        self._space = asyncio.Event()  # senders waiting for the sealed queue to shrink
        self._task: asyncio.Task[None] | None = None
        self.term: int | None = None
        """The WAL term of the current stream (None before the first open)."""
        self.batches_written = 0
        """Batches written to a stream, resends included (for tests and metrics)."""
        self.largest_batch = 0
        """Messages in the largest batch written so far."""
        self.reconnects = 0
        """How many times the stream was opened again after a failure (for tests and metrics)."""
        self._spool: Spool | None = None
        self._spool_floor = 0
        """Where new sequences may start at the earliest: past the batches the spool resends."""
        self.recovered: list[asyncio.Future[AppendResult]] = []
        """One future per message a spool held from an earlier producer (sent before anything new)."""
        if spool_dir is not None:
            assert producer_id is not None
            self._spool = Spool(spool_dir, producer_id, pchannel)
            for request in self._spool.pending():
                batch = request.batch
                n = len(batch.columns.payloads)
                futures = [self._loop.create_future() for _ in range(n)]
                for fut in futures:  # nobody may be waiting on them: no "never retrieved" warnings
                    fut.add_done_callback(_retrieve)
                size = _request_bytes(request)
                self._sealed.append(_Batch(request, futures, size))
                self._buffered += size
                self.recovered.extend(futures)
                self._next_sequence = max(self._next_sequence, batch.first_sequence + n)
            self._spool_floor = self._next_sequence  # past the batches it resends
            if self._sealed:
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
    def buffered_bytes(self) -> int:
        """Bytes of messages accepted and not answered yet (what ``buffer_bytes`` bounds)."""
        return self._buffered

    @property
    def connected(self) -> bool:
        """A stream to an owner is open now."""
        return self._connected

    @property
    def max_in_flight(self) -> int:
        """Batches written and not answered yet, at most (after defaults are applied)."""
        return self._max_in_flight

    @property
    def spool_damaged(self) -> list[tuple[str, int]]:
        """``(file, offset)`` of every spool record that failed its checksum when this producer read
        its spool (those batches cannot be resent; the others were); empty without a spool."""
        return list(self._spool.damaged) if self._spool is not None else []

    @property
    def next_sequence(self) -> int:
        """The sequence the next sealed message gets (provisional until the first open answered, when
        no ``first_sequence`` was given: the node's next sequence is where the producer goes on)."""
        return self._next_sequence

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
        # The per-message path of every producer: no message object, no generator, no callback.
        size = len(payload) + len(vchannel)
        if properties:
            for k, v in properties.items():
                size += len(k) + len(v)
        if self._on_full == "fail" and self._buffered + size > self.buffer_bytes and self._buffered:
            raise self._full(size)
        self._buffered += size
        futures = self._open_futures
        if futures and self._open_bytes + size > self._max_bytes:
            self._seal()
            futures = self._open_futures
        if properties:
            self._open_extras.append(pb.MessageExtras(index=len(futures), properties=properties))
        fut: asyncio.Future[AppendResult] = self._loop.create_future()
        self._open_types.append(type)
        self._open_vchannels.append(vchannel)
        self._open_payloads.append(payload)
        futures.append(fut)
        self._open_bytes += size
        if len(futures) >= self._max_messages or self._open_bytes >= self._max_bytes:
            self._seal()
        elif self._linger_timer is None:
            # linger 0 still waits for the current loop iteration, so a burst of send_nowait calls
            # made without awaiting goes out as one batch.
            if self._linger > 0:
                self._linger_timer = self._loop.call_later(self._linger, self._seal)
            else:
                self._linger_timer = self._loop.call_soon(self._seal)
        return fut

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
        while self._state is _State.RUNNING and (
                (self._connected and len(self._sealed) >= self._max_in_flight)
                or (self._buffered and self._buffered + size > self.buffer_bytes)):
            if not (self._connected and len(self._sealed) >= self._max_in_flight) and self._on_full == "fail":
                raise self._full(size)
            self._space.clear()
            await self._space.wait()
        # A lone message at linger 0 (nothing open, queued or in flight: no company to wait for, and
        # nothing it could overtake) goes out now, not one loop turn later.  Messages sent while it is
        # in flight still gather for that turn and share a batch.
        lone = self._linger == 0 and not (self._open_futures or self._sealed or self._in_flight)
        fut = self.send_nowait(vchannel, payload, properties=properties, type=type)
        if lone:
            self._seal()
        # Awaited directly, not through a shield: the future is this call's alone, and a cancelled
        # wait leaves the message in its batch (``_resolve`` and the failure paths skip done futures).
        return await fut

    def _full(self, size: int) -> ResourceExhaustedError:
        return ResourceExhaustedError(
            f"producer buffer on {self.pchannel!r} is full: {self._buffered} of buffer_bytes={self.buffer_bytes} "
            f"bytes unanswered, and a message of {size} bytes does not fit", channel=self.pchannel,
            limit="buffer_bytes")

    async def flush(self) -> None:
        """Write the open batch now and wait until every message sent so far is answered (failures
        stay on their own futures)."""
        self._seal()
        futures = [f for b in (*self._in_flight, *self._sealed) for f in b.futures]
        if futures:
            await asyncio.wait(futures)

    async def aclose(self) -> None:
        """Drain (everything sent so far is still written and answered), then end the stream.
        Idempotent; cancelling it abandons the drain and fails what is left with OnShutdownError."""
        if self._state is _State.CLOSED:
            return
        self._state = _State.DRAINING
        self._seal()
        self._wake.set()
        self._space.set()
        try:
            if self._task is not None:
                await asyncio.shield(self._task)
        finally:
            self._state = _State.CLOSED
            if self._task is not None and not self._task.done():
                await cancel_and_wait(self._task)
            kept = " (its spool keeps them for a producer with the same id)" if self._spool is not None else ""
            self._fail_all(OnShutdownError(f"producer on {self.pchannel!r} closed before its messages were "
                                           f"answered{kept}", channel=self.pchannel), keep_spool=True)
            if self._spool is not None:
                self._spool.close()

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- batching --------------------------------------------------------------------------------
    def _seal(self) -> None:
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        futures = self._open_futures
        if not futures:
            return
        request = spb.ProduceRequest()
        body = request.batch
        body.first_sequence = self._next_sequence
        if self._txn is not None:
            body.txn.CopyFrom(self._txn)
        columns = body.columns
        columns.types.extend(cast(Any, self._open_types))
        columns.vchannels.extend(self._open_vchannels)
        columns.payloads.extend(self._open_payloads)
        if self._open_extras:
            columns.extras.extend(self._open_extras)
        if self.producer_id is not None:
            self._next_sequence += len(futures)
        batch = _Batch(request, futures, self._open_bytes)
        batch.numbered = self._numbered
        if self._spool is not None and batch.numbered:
            try:
                self._spool.append(request)
            except OSError as exc:
                # Refused loudly, never sent unspooled: the caller asked for the disk copy.
                self._reset_open()
                self._release(batch)
                batch.fail(ResourceExhaustedError(f"cannot write the producer spool: {exc}",
                                                  channel=self.pchannel, limit="spool_dir"))
                self._next_sequence = request.batch.first_sequence
                return
        self._sealed.append(batch)
        self._reset_open()
        self._start_task()

    def _start_task(self) -> None:
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = self._loop.create_task(self._run(), name=f"producer:{self.pchannel}")
            self._task.add_done_callback(self._on_task_done)

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        # The stream task ends only when there is nothing left, or by a bug: then no caller may wait
        # forever on a future it will never answer.
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self._fail_all(exc if isinstance(exc, StreamingError) else UnavailableError(
                f"producer on {self.pchannel!r} failed: {exc!r}", channel=self.pchannel))

    def _fail_all(self, exc: BaseException, *, keep_spool: bool = False) -> None:
        batches = (*self._in_flight, *self._sealed)
        if self.producer_id is not None:
            # Batches never written leave their sequences unused: hand them out again, or the next
            # batch would skip them and the node refuse it (OUT_OF_ORDER_SEQUENCE).  Batches are
            # written in sequence order, so the unwritten ones are the tail.
            unsent = [b for b in batches if not b.sent]
            if unsent:
                self._next_sequence = unsent[0].request.batch.first_sequence
            if self._spool is not None and batches and not keep_spool:
                # Their callers got this failure: the spool must not resend them after a restart
                # (their sequences may be handed out again to other messages).
                last = batches[-1].request.batch
                with contextlib.suppress(OSError):
                    self._spool.answered(last.first_sequence + len(last.columns.payloads) - 1, empty=True)
        for batch in batches:
            batch.fail(exc)
        self._in_flight.clear()
        self._sealed.clear()
        _fail_futures(self._open_futures, exc)
        self._reset_open()
        self._buffered = 0
        self._space.set()

    def _release(self, batch: _Batch) -> None:
        """The batch is answered (or failed for good): its bytes leave the buffer."""
        self._buffered = max(0, self._buffered - batch.nbytes)
        self._space.set()
        if self._spool is not None and batch.sent:
            n = len(batch.futures)
            with contextlib.suppress(OSError):  # a spool left behind only resends what dedup drops
                self._spool.answered(batch.request.batch.first_sequence + n - 1, empty=not self._buffered)

    def _reset_open(self) -> None:
        self._open_types, self._open_vchannels, self._open_payloads = [], [], []
        self._open_extras, self._open_futures, self._open_bytes = [], [], 0

    # --- the stream ------------------------------------------------------------------------------
    async def _run(self) -> None:
        """Open a stream whenever there is work; keep it while the producer lives."""
        while self._sealed or self._in_flight:
            try:
                call = await with_reconnect(self._open, self._reconnect_timeout)
            except StreamingError as exc:
                self._fail_all(exc)  # the channel is gone, or the node stayed away too long
                continue
            self._connected = True
            try:
                await self._serve(call)
            except StreamingError as exc:
                self._stream_broke(exc)
            finally:
                self._connected = False
                self._space.set()  # senders held by the in-flight bound may now buffer
                call.cancel()
            if self._state is not _State.RUNNING and not (self._sealed or self._in_flight):
                return

    async def _open(self) -> Any:
        try:
            return await self._open_at(await self._route.stub() if self._route is not None else self._stub)
        except StreamingError as exc:
            if self._route is not None:
                self._route.failed(exc)  # NOT_OWNER names the owner; a gone node is forgotten
            raise

    async def _open_at(self, stub: Any) -> Any:
        call = stub.Produce()
        first = await open_stream(call, spb.ProduceRequest(open=spb.ProduceOpen(
            pchannel=self.pchannel, producer_id=self.producer_id, producer_epoch=self.epoch)),
            "produce", self.pchannel)
        opened = first.opened
        if self.term is not None:
            self.reconnects += 1
        self.term = opened.term
        if self.producer_id is not None:
            if opened.producer_epoch:  # (0 from a node that predates epochs)
                self.epoch = opened.producer_epoch
            if not self._numbered:
                self._number(opened.next_sequence)
        return call

    def _number(self, node_next: int) -> None:
        """The node told where the producer's sequences go on: number the batches sealed before it
        (after any the spool resends) from there, and spool them now."""
        self._numbered = True
        start = max(node_next, self._spool_floor)
        if node_next == 0 and self._spool is not None:
            # The node does not know the id (new to it, or dropped from its table): the spool's
            # high-water mark keeps the id's sequences from ever going back.
            start = max(start, self._spool.high_water + 1)
        seq = start
        fresh = [b for b in self._sealed if not b.numbered]
        for batch in fresh:
            batch.numbered = True
            batch.request.batch.first_sequence = seq
            seq += len(batch.futures)
        self._next_sequence = max(seq, start)
        if self._spool is None:
            return
        for i, batch in enumerate(fresh):
            try:
                self._spool.append(batch.request)
            except OSError as exc:
                # Refused loudly, never sent unspooled: the caller asked for the disk copy.  The
                # batches after it cannot go either (they would skip its sequences).
                failed = ResourceExhaustedError(f"cannot write the producer spool: {exc}", channel=self.pchannel,
                                                limit="spool_dir")
                for gone in fresh[i:]:
                    self._sealed.remove(gone)
                    self._release(gone)
                    gone.fail(failed)
                self._next_sequence = batch.request.batch.first_sequence
                return

    async def _serve(self, call: Any) -> None:
        """Write and read one stream until it ends (drained) or fails (raises StreamingError)."""
        reader = self._loop.create_task(self._read(call))
        # The writer sleeps on _wake alone: the reader ending wakes it too (no task and no
        # asyncio.wait per wait, which a producer sending one message at a time pays every time).
        reader.add_done_callback(lambda _: self._wake.set())
        try:
            try:
                await self._write(call, reader)
            except StreamingError:
                # A refused write only says the stream ended; the status on the reading side says
                # why (fenced, shutdown, ...), and it is finished, so the reader returns at once.
                await reader
                raise
            await reader
        except grpc.RpcError as exc:
            raise translate(exc) from exc
        finally:
            # Retrieve its outcome too when the writer failed first: the writer's error is raised.
            with contextlib.suppress(grpc.RpcError, StreamingError):
                await cancel_and_wait(reader)

    async def _write(self, call: Any, reader: asyncio.Task[None]) -> None:
        while True:
            while not (self._sealed and len(self._in_flight) < self._max_in_flight):
                if reader.done():
                    return  # the stream ended; the reader holds why
                if self._state is not _State.RUNNING and not self._sealed and not self._in_flight:
                    await write(call, spb.ProduceRequest(close=spb.ProduceClose()))
                    await done_writing(call)
                    return
                self._wake.clear()
                await self._wake.wait()
            batch = self._sealed.popleft()
            self._space.set()
            batch.request.batch.request_id = next(self._request_ids)
            # In flight before the write: a write that fails half way leaves the batch's fate unknown.
            self._in_flight.append(batch)
            batch.sent = True
            self.batches_written += 1
            self.largest_batch = max(self.largest_batch, len(batch.futures))
            await write(call, batch.request)

    async def _read(self, call: Any) -> None:
        while True:
            resp = await call.read()
            if resp is grpc.aio.EOF:
                if self._in_flight or self._sealed:
                    raise UnavailableError(f"produce stream on {self.pchannel!r} ended with batches unanswered",
                                           channel=self.pchannel)
                return
            kind = resp.WhichOneof("response")
            if kind == "closed":
                return
            if kind != "result":
                continue
            result = resp.result
            if not self._in_flight or self._in_flight[0].request_id != result.request_id:
                raise UnavailableError(f"produce stream on {self.pchannel!r} answered request {result.request_id} "
                                       "out of order", channel=self.pchannel)
            batch = self._in_flight[0]
            if result.WhichOneof("outcome") == "error":
                exc = from_error_detail(result.error)
                if self.producer_id is not None and exc.code in _ENDS_STREAM:
                    # Nothing of the batch was written and the stream is ending: resend it on the next.
                    raise exc
                batch.fail(exc)
            else:
                # Checked before the batch leaves the in-flight list: an answer that does not fit it
                # breaks the stream with the batch still there, so it is resent (idempotent) or failed
                # as of unknown fate, never left with futures that no one completes.
                _resolve(batch.futures, result.appended)
            self._in_flight.popleft()
            self._wake.set()
            self._release(batch)

    def _stream_broke(self, exc: StreamingError) -> None:
        if self._route is not None:
            self._route.failed(exc)
        if not reconnectable(exc):
            self._fail_all(exc)
            return
        if self.producer_id is not None:
            # Same batches, same sequences, new stream: the node's dedup makes the resend safe.
            self._sealed.extendleft(reversed(self._in_flight))
        else:
            lost = UnavailableError(
                f"produce stream on {self.pchannel!r} broke before the batch was answered; it may or may not "
                "have been appended (set producer_id to make resending safe)", channel=self.pchannel)
            lost.__cause__ = exc
            for batch in self._in_flight:
                batch.fail(lost)
                self._release(batch)
        self._in_flight.clear()


__all__ = ["Producer"]
