"""The Produce stream: batches in, appended pipelined, results out in the order the batches came.

The node keeps reading a stream while its batches are being appended, up to
``produce_max_in_flight`` pending batches holding less than ``produce_max_in_flight_bytes``; past that
it stops reading, so gRPC flow control pushes back on the client, memory stays bounded, and what one
stream has handed to the log (which commits in order) stays short for the other streams' appends.
A failed batch is answered in-band and the stream goes on, unless the failure means the channel is
gone for this stream (``_STREAM_ENDING``): then the call ends with that status and the client
reconnects (and, if idempotent, resends).  A batch reusing the request_id of a pending batch also ends
the call (INVALID_ARGUMENT), so no two results carry one id.
"""

from __future__ import annotations

import asyncio
import collections
import enum

import grpc
import structlog

from interceptors.dedup import PRODUCER_CLAIM, PROP_PRODUCER, PROP_SEQUENCE, dedup_step, skip_sequences
from streamingnode.node.channel import Channel
from streamingnode.node.node import Node
from streamingnode.server.errors import internal, refused, require
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.wire import codec
from streamingnode.wire.codes import to_error_detail
from wal.error_codes import Behaviour, codes_with
from wal.errors import InvalidArgumentError, OnShutdownError, StreamingError
from wal.message import AppendResult, Message, TxnContext, bind_txn, first_property, payload_bytes, stamp_sequence
from wal.tasks import cancel_and_wait
from wal.wal import COMMIT_OVERHEAD

log = structlog.get_logger(__name__)

_RESERVED_PROPERTIES = (PROP_PRODUCER, PROP_SEQUENCE)
# Errors after which a produce stream cannot go on: the channel changed owner, went away, or the node
# is closing (the stream ends with the status; the client reconnects and, if idempotent, resends), or
# a newer open of the stream's producer_id fenced it (the stream's producer must stop).
_STREAM_ENDING = codes_with(Behaviour.ENDS_PRODUCE_STREAM)


class _EndOfStream(enum.Enum):
    """What the reader leaves after the last batch: the writer stops when it comes to it."""

    END = enum.auto()


# (request id, outcome, answer in column form, outcome is the chain's own future: never cancel it,
# bytes counted against produce_max_in_flight_bytes)
_Pending = tuple[int, asyncio.Future[list[AppendResult]], bool, bool, int]


class _DuplicateRequestId(InvalidArgumentError):
    """A batch reusing the request_id of a batch still pending.  Answered in band, it would give the
    stream two results with one request_id, and a client matching results by id could not tell which
    answers which; so it ends the stream instead, after the batches before it are answered."""


class ProduceStream:
    """One Produce call: reads batches, appends them pipelined, writes results in order.

    Made per call and driven by ``run``, which starts its reader and writer tasks and returns once
    both have ended.
    """

    def __init__(self, node: Node, context: grpc.aio.ServicerContext, servicer: object = None) -> None:
        self.node = node
        self.context = context
        self.servicer = servicer
        """Whose ``refusals`` count and log the batches refused in-band (``errors.refused``)."""
        self.slots = asyncio.Semaphore(self.node.config.produce_max_in_flight)
        self.pending_bytes = 0
        """Bytes of the batches read and not yet answered (payloads and COMMIT_OVERHEAD a message)."""
        self.max_bytes = self.node.config.produce_max_in_flight_bytes
        self.room = asyncio.Event()
        """Set while ``pending_bytes`` is under ``max_bytes``: the reader may read on.
        Appends commit in the order they reach the chain, so a stream that kept reading would put all
        it had sent ahead of every other stream's next append."""
        self.room.set()
        # Batches in the order they came (see _Pending), then _EndOfStream.END once the reader stopped.
        self.pending: collections.deque[_Pending | _EndOfStream] = collections.deque()
        self.wake = asyncio.Event()
        self.failed: StreamingError | None = None
        self.reader: asyncio.Task[None] | None = None
        self.unanswered: set[int] = set()
        """Request ids read and not yet answered: reusing one is refused.  An id stays here until its
        answer is written, not only until its batch is done: a batch may be done at once (a lone
        append written inside the chain's call) while the answers before it are still pending."""
        self.pchannel = ""
        """The pchannel the stream writes to, once open."""

    async def run(self) -> None:
        ctx = self.context
        first = await ctx.read()
        if first is grpc.aio.EOF:
            return
        if first.WhichOneof("request") != "open":
            raise InvalidArgumentError("the first request of a Produce stream must be 'open'", field="open")
        opened = first.open
        channel = self.node.channel(require(opened.pchannel, "open.pchannel"), "open.pchannel")
        self.pchannel = channel.stream.pchannel
        producer_id = opened.producer_id if opened.HasField("producer_id") else None
        if producer_id == "":
            raise InvalidArgumentError("open.producer_id must not be empty when set", field="producer_id")
        presented = opened.producer_epoch if opened.HasField("producer_epoch") else None
        if presented is not None and producer_id is None:
            raise InvalidArgumentError("open.producer_epoch needs open.producer_id", field="producer_epoch")
        epoch = next_sequence = 0
        if producer_id is not None:
            # The node owns the producer's identity: a new instance gets a new epoch (fencing every
            # older stream of the id), a reconnecting one keeps its own or is refused as fenced.
            step = dedup_step(channel.stream.chain.interceptors)
            if step is not None:
                await channel.stream.ready()  # the table is whole only once recovery replayed the log
                epoch, next_sequence = await step.open_producer(producer_id, presented)
        structlog.contextvars.bind_contextvars(pchannel=channel.stream.pchannel, term=channel.stream.term,
                                               producer_id=producer_id, producer_epoch=epoch)
        await ctx.write(spb.ProduceResponse(opened=spb.ProduceOpened(
            pchannel=channel.stream.pchannel, term=channel.stream.term, producer_id=producer_id or "",
            producer_epoch=epoch, next_sequence=next_sequence)))
        loop = asyncio.get_running_loop()
        writer = loop.create_task(self._write_results())
        # The reader runs as its own task so that a stream-ending failure seen by the writer can stop
        # it: otherwise the call would hang in ctx.read() until the client happened to send again.
        self.reader = loop.create_task(self._read_batches(channel, producer_id, epoch))
        streams = self.node.metrics.channel(channel.stream.pchannel)
        if streams is not None:
            streams.producer_streams.inc()
        log.debug("produce stream opened")
        # An idle stream waits in ctx.read() forever: when the node drains, stop reading at once, answer
        # the batches already taken and end with ON_SHUTDOWN (the client reconnects elsewhere or later),
        # as Consume does, rather than be cut without a status when the grace period runs out.
        draining = loop.create_task(self.node.draining.wait())
        try:
            await asyncio.wait((self.reader, draining), return_when=asyncio.FIRST_COMPLETED)
            if draining.done() and not self.reader.done() and self.failed is None:
                self.failed = OnShutdownError("the node is shutting down; reconnect to go on producing",
                                              channel=self.pchannel)
                self.reader.cancel()
            await self.reader
        except asyncio.CancelledError:
            # Swallowed only when it is the reader's own end, stopped by a failure; a cancel of the
            # call itself (this task is being cancelled) always goes on, failure recorded or not.
            task = asyncio.current_task()
            if self.failed is None or (task is not None and task.cancelling()):
                raise
        finally:
            await cancel_and_wait(draining)
            log.debug("produce stream closed", failed=None if self.failed is None else self.failed.code.name)
            if streams is not None:
                streams.producer_streams.dec()
            self.reader.cancel()
            self.pending.append(_EndOfStream.END)
            self.wake.set()
            await writer
        if self.failed is not None:
            raise self.failed
        await ctx.write(spb.ProduceResponse(closed=spb.ProduceClosed()))

    async def _read_batches(self, channel: Channel, producer_id: str | None, epoch: int = 0) -> None:
        if producer_id is not None:
            # Set once in this task's own context, copied by every append it starts: the dedup step
            # fences a batch of this stream once a newer open of the id bumped the epoch.
            PRODUCER_CLAIM.set((producer_id, epoch))
        ctx = self.context
        loop = asyncio.get_running_loop()
        seen = self.unanswered
        tracing = self.node.tracing  # decided once per node: off means not one extra call per batch
        # Cluster mode: the lease is checked per batch, not only at the open, so that a stream opened
        # while the node held it is refused from the moment the lease may have run out on this node's
        # clock, not only once the pchannel's close (which runs beside the ownership loop) gets to it.
        ownership = self.node.ownership
        pchannel = channel.stream.pchannel
        while self.failed is None:
            await self.slots.acquire()  # backpressure: stop reading while too many batches are pending
            await self.room.wait()  # ... or while they hold produce_max_in_flight_bytes
            request = await ctx.read()
            if request is grpc.aio.EOF or request.WhichOneof("request") == "close":
                self.slots.release()
                return
            if request.WhichOneof("request") != "batch":
                self.slots.release()
                raise InvalidArgumentError("'open' may only be the first request of a Produce stream", field="open")
            batch = request.batch
            rid = batch.request_id
            fut: asyncio.Future[list[AppendResult]]
            if rid in seen:
                fut = loop.create_future()
                fut.set_exception(_DuplicateRequestId(
                    f"request_id {rid} is already pending on this stream: the batch is refused and the stream "
                    f"ends once the batches before it are answered (give each pending batch its own request_id)",
                    field="request_id", request_id=rid))
                self.pending.append((rid, fut, batch.HasField("columns"), False, 0))
                self.wake.set()
                return  # nothing after it is read: the stream ends with this error
            chained = False
            nbytes = 0
            try:
                if ownership is not None and not ownership.serves(pchannel):
                    self.node.channel(pchannel)  # raises why it is no longer served here (NOT_OWNER)
                messages = self._messages(channel, batch, producer_id)
            except StreamingError as exc:
                fut = loop.create_future()
                fut.set_exception(exc)
                if producer_id is not None:  # answered as refused: its sequences are no gap
                    skip_sequences(channel.stream.chain.interceptors, producer_id, batch.first_sequence,
                                   len(batch.messages) or len(batch.columns.payloads))
            else:
                # Weighed as the commit weighs them, so that the bound is in commits' bytes.
                payload = payload_bytes(messages)  # summed once: the metrics observer is handed it
                nbytes = payload + COMMIT_OVERHEAD * len(messages)
                lean = None
                if tracing is None:
                    # The lean path: the chain's own future, no task of ours around it (one task and
                    # two loop turns fewer per batch).  None for transactions and while recovering.
                    try:
                        lean = channel.stream.start_append(messages, nbytes=payload)
                    except Exception as exc:  # noqa: BLE001  (refused before the chain: answered in band)
                        lean = loop.create_future()
                        lean.set_exception(exc)
                if lean is not None:
                    fut, chained = lean, True
                elif tracing is None:
                    fut = loop.create_task(channel.stream.append_batch(messages))
                else:
                    fut = loop.create_task(tracing.produce(
                        channel.stream.pchannel, rid, messages, channel.stream.append_batch))
            seen.add(rid)  # pending until its answer is written (a refused batch's too)
            self.pending.append((rid, fut, batch.HasField("columns"), chained, nbytes))
            self.pending_bytes += nbytes
            if self.pending_bytes >= self.max_bytes:
                self.room.clear()
            self.wake.set()

    def _messages(self, channel: Channel, batch: spb.ProduceBatch, producer_id: str | None) -> list[Message]:
        limit = self.node.config.max_message_bytes
        own: dict[int, pb.TxnContext]
        if batch.HasField("columns"):
            if len(batch.messages):
                raise InvalidArgumentError("a produce batch carries messages or columns, not both", field="columns")
            out, own = codec.produced_columns(batch.columns, limit)
        else:
            if not batch.messages:
                raise InvalidArgumentError("a produce batch needs at least one message", field="messages")
            out = codec.produced_messages(batch.messages, limit)
            own = {i: p.txn for i, p in enumerate(batch.messages) if p.HasField("txn")}
        reserved = first_property(out, _RESERVED_PROPERTIES)
        if reserved is not None:
            i, key = reserved
            raise InvalidArgumentError(
                f"messages[{i}]: property {key!r} is reserved (set producer_id on open instead)", field=key)
        txns = channel.stream.txns
        if batch.HasField("txn"):
            session = txns.get(batch.txn.txn_id)
            txn = session.context if session is not None else TxnContext(batch.txn.txn_id, batch.txn.keepalive_ms)
            for i, t in own.items():
                if t.txn_id != txn.txn_id:
                    raise InvalidArgumentError(
                        f"messages[{i}] names transaction {t.txn_id} in a batch of transaction {txn.txn_id}",
                        txn_id=txn.txn_id)
            bind_txn(out, txn)
        else:
            for i, t in own.items():
                session = txns.get(t.txn_id)
                out[i].with_txn(session.context if session is not None else TxnContext(t.txn_id, t.keepalive_ms))
        if producer_id is not None:
            stamp_sequence(out, (PROP_PRODUCER, producer_id), PROP_SEQUENCE, batch.first_sequence)
        return out

    async def _write_results(self) -> None:
        ctx = self.context
        while True:
            while not self.pending:
                self.wake.clear()
                await self.wake.wait()
            item = self.pending.popleft()
            if item is _EndOfStream.END:
                return
            rid, fut, columns, chained, nbytes = item
            # Filled in place inside its envelope: no copy of the result into the response.
            envelope = spb.ProduceResponse()
            response = envelope.result
            response.request_id = rid
            try:
                # The chain's own future is shielded: a cancelled stream must not cut its batch in half.
                results = await (asyncio.shield(fut) if chained and not fut.done() else fut)
            except StreamingError as exc:
                self.node.fail_on(self.pchannel, exc)  # damaged storage: the pchannel fails
                response.error.CopyFrom(to_error_detail(exc))
                if (exc.code in _STREAM_ENDING or isinstance(exc, _DuplicateRequestId)) and self.failed is None:
                    self.failed = exc  # counted as the call's status when the stream ends with it
                    if self.reader is not None:
                        self.reader.cancel()
                elif self.failed is None:
                    refused(self.servicer, "Produce", exc, ctx, in_band=True)
            except Exception as exc:  # noqa: BLE001  (a bug fails its batch, not the node)
                err = internal(exc)
                response.error.CopyFrom(to_error_detail(err))
                refused(self.servicer, "Produce", err, ctx, in_band=True)
            else:
                appended = response.appended
                if columns:
                    # Three packed arrays filled from lists in C: no per-result submessage.
                    appended.ids.extend([r[0] for r in results])
                    appended.timeticks.extend([r[1] for r in results])
                    txn_ids = [r[2] or 0 for r in results]
                    if any(txn_ids):
                        appended.txn_ids.extend(txn_ids)
                else:
                    add = appended.results.add
                    # Filled in place, field by field: about a third of the cost of building each
                    # result (and its MessageID) as a separate message first.
                    for mid, ts, txn_id in results:
                        out = add(timetick=ts)
                        out.id.id = mid.to_bytes(8, "big")
                        if txn_id:
                            out.txn_id = txn_id
            finally:
                self.slots.release()
                self.pending_bytes -= nbytes
                if self.pending_bytes < self.max_bytes:
                    self.room.set()
            if self.failed is None or response.WhichOneof("outcome") == "appended":
                await ctx.write(envelope)
            # Answered (or never to be, once the stream fails): the id may be used again.
            self.unanswered.discard(rid)

__all__ = ["ProduceStream"]
