"""The producer's accumulator: where accepted messages wait until a stream takes them.

Messages go into the *open* batch, column by column, until ``linger`` passes or the batch is full;
the batch is then *sealed* (it gets its sequence numbers, if idempotent, and is written to the spool)
and queued on ``sealed`` for the sender.  The accumulator also keeps the buffer account: every
message accepted and not answered yet counts against ``buffer_bytes`` until ``release`` (see
``Producer`` for what a full buffer does), and the producer's next sequence, provisional until the
node says where the producer's sequences go on (``number``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable, Iterable
from typing import Any, cast

from streamingnode.client._spool import Spool
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from wal.errors import ResourceExhaustedError
from wal.message import AppendResult, MessageType


class Batch:
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
        fail_futures(self.futures, exc)


def fail_futures(futures: list[asyncio.Future[AppendResult]], exc: BaseException) -> None:
    """Fail every future not done yet with ``exc``."""
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


class Accumulator:
    """The open batch, the queue of sealed batches, the producer's sequences and its buffer account.

    ``on_sealed`` is called after a batch joins ``sealed`` (the sender starts or wakes).  Used on the
    client's loop only.
    """

    def __init__(
        self,
        pchannel: str,
        producer_id: str | None,
        *,
        first_sequence: int | None,
        linger: float,
        max_batch_bytes: int,
        max_batch_messages: int,
        txn: pb.TxnContext | None,
        buffer_bytes: int,
        on_full: str,
        spool: Spool | None,
        on_sealed: Callable[[], None],
    ) -> None:
        self.pchannel = pchannel
        self.producer_id = producer_id
        self.linger = linger
        self._max_bytes = max_batch_bytes
        self._max_messages = max_batch_messages
        self._txn = txn
        self.buffer_bytes = buffer_bytes
        self.on_full = on_full
        self.spool = spool
        self._on_sealed = on_sealed
        self.next_sequence = first_sequence or 0
        """The sequence the next sealed message gets."""
        self.numbered = producer_id is None or first_sequence is not None
        """Sequences are final: given by the caller, or learnt from the node's first answer."""
        self.spool_floor = 0
        """Where new sequences may start at the earliest: past the batches the spool resends."""
        self.buffered = 0
        """Bytes of accepted messages not answered yet (open, sealed, in flight)."""
        self._loop = asyncio.get_running_loop()
        # The open batch, column by column (MessageColumns): one list append per field and message,
        # and the columns go into the request with one C-level extend each when it is sealed.
        self._open_types: list[int] = []
        self._open_vchannels: list[str] = []
        self._open_payloads: list[bytes] = []
        self._open_extras: list[pb.MessageExtras] = []
        self._open_futures: list[asyncio.Future[AppendResult]] = []
        self._open_bytes = 0
        self._linger_timer: asyncio.Handle | None = None
        self.sealed: collections.deque[Batch] = collections.deque()
        """Sealed batches not written yet, in sequence order (the sender takes them from the left)."""
        self.space = asyncio.Event()
        """Set when the sealed queue shrinks or buffered bytes are released: waiting senders look again."""

    @property
    def has_open(self) -> bool:
        """Messages wait in the open batch."""
        return bool(self._open_futures)

    @property
    def lingering(self) -> bool:
        """A timer (or a call-soon) will seal the open batch."""
        return self._linger_timer is not None

    def recover(self) -> list[asyncio.Future[AppendResult]]:
        """Queue the batches the spool holds from an earlier producer (before anything new), with
        their sequences; one future per message, which nobody need wait on."""
        assert self.spool is not None
        recovered: list[asyncio.Future[AppendResult]] = []
        for request in self.spool.pending():
            batch = request.batch
            n = len(batch.columns.payloads)
            futures = [self._loop.create_future() for _ in range(n)]
            for fut in futures:  # nobody may be waiting on them: no "never retrieved" warnings
                fut.add_done_callback(_retrieve)
            size = _request_bytes(request)
            self.sealed.append(Batch(request, futures, size))
            self.buffered += size
            recovered.extend(futures)
            self.next_sequence = max(self.next_sequence, batch.first_sequence + n)
        self.spool_floor = self.next_sequence  # past the batches it resends
        return recovered

    def add(
        self, vchannel: str, payload: bytes, properties: dict[str, str] | None, type: MessageType,
    ) -> asyncio.Future[AppendResult]:
        """Put one message (types already checked) into the open batch; its future resolves once it
        is durable.  Seals the batch when it is full, or arms the linger timer."""
        # The per-message path of every producer: no message object, no generator, no callback.
        size = len(payload) + len(vchannel)
        if properties:
            for k, v in properties.items():
                size += len(k) + len(v)
        if self.on_full == "fail" and self.buffered + size > self.buffer_bytes and self.buffered:
            raise self.full(size)
        self.buffered += size
        futures = self._open_futures
        if futures and self._open_bytes + size > self._max_bytes:
            self.seal()
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
            self.seal()
        elif self._linger_timer is None:
            # linger 0 still waits for the current loop iteration, so a burst of send_nowait calls
            # made without awaiting goes out as one batch.
            if self.linger > 0:
                self._linger_timer = self._loop.call_later(self.linger, self.seal)
            else:
                self._linger_timer = self._loop.call_soon(self.seal)
        return fut

    def full(self, size: int) -> ResourceExhaustedError:
        """The error of a message of ``size`` bytes that does not fit the buffer."""
        return ResourceExhaustedError(
            f"producer buffer on {self.pchannel!r} is full: {self.buffered} of buffer_bytes={self.buffer_bytes} "
            f"bytes unanswered, and a message of {size} bytes does not fit", channel=self.pchannel,
            limit="buffer_bytes")

    def seal(self) -> None:
        """Close the open batch (if any) and queue it for the sender."""
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        futures = self._open_futures
        if not futures:
            return
        request = spb.ProduceRequest()
        body = request.batch
        body.first_sequence = self.next_sequence
        if self._txn is not None:
            body.txn.CopyFrom(self._txn)
        columns = body.columns
        columns.types.extend(cast(Any, self._open_types))
        columns.vchannels.extend(self._open_vchannels)
        columns.payloads.extend(self._open_payloads)
        if self._open_extras:
            columns.extras.extend(self._open_extras)
        if self.producer_id is not None:
            self.next_sequence += len(futures)
        batch = Batch(request, futures, self._open_bytes)
        batch.numbered = self.numbered
        if self.spool is not None and batch.numbered:
            try:
                self.spool.append(request)
            except OSError as exc:
                # Refused loudly, never sent unspooled: the caller asked for the disk copy.
                self._reset_open()
                self.release(batch)
                batch.fail(ResourceExhaustedError(f"cannot write the producer spool: {exc}",
                                                  channel=self.pchannel, limit="spool_dir"))
                self.next_sequence = request.batch.first_sequence
                return
        self.sealed.append(batch)
        self._reset_open()
        self._on_sealed()

    def number(self, node_next: int) -> None:
        """The node told where the producer's sequences go on: number the batches sealed before it
        (after any the spool resends) from there, and spool them now."""
        self.numbered = True
        start = max(node_next, self.spool_floor)
        if node_next == 0 and self.spool is not None:
            # The node does not know the id (new to it, or dropped from its table): the spool's
            # high-water mark keeps the id's sequences from ever going back.
            start = max(start, self.spool.high_water + 1)
        seq = start
        fresh = [b for b in self.sealed if not b.numbered]
        for batch in fresh:
            batch.numbered = True
            batch.request.batch.first_sequence = seq
            seq += len(batch.futures)
        self.next_sequence = max(seq, start)
        if self.spool is None:
            return
        for i, batch in enumerate(fresh):
            try:
                self.spool.append(batch.request)
            except OSError as exc:
                # Refused loudly, never sent unspooled: the caller asked for the disk copy.  The
                # batches after it cannot go either (they would skip its sequences).
                failed = ResourceExhaustedError(f"cannot write the producer spool: {exc}", channel=self.pchannel,
                                                limit="spool_dir")
                for gone in fresh[i:]:
                    self.sealed.remove(gone)
                    self.release(gone)
                    gone.fail(failed)
                self.next_sequence = batch.request.batch.first_sequence
                return

    def release(self, batch: Batch) -> None:
        """The batch is answered (or failed for good): its bytes leave the buffer."""
        self.buffered = max(0, self.buffered - batch.nbytes)
        self.space.set()
        if self.spool is not None and batch.sent:
            n = len(batch.futures)
            with contextlib.suppress(OSError):  # a spool left behind only resends what dedup drops
                self.spool.answered(batch.request.batch.first_sequence + n - 1, empty=not self.buffered)

    def fail_all(self, batches: Iterable[Batch], exc: BaseException, *, keep_spool: bool = False) -> None:
        """Fail ``batches`` (every batch in flight, then every sealed one, in sequence order), the open
        batch and the sealed queue with ``exc``; the buffer is empty afterwards."""
        batches = tuple(batches)
        if self.producer_id is not None:
            # Batches never written leave their sequences unused: hand them out again, or the next
            # batch would skip them and the node refuse it (OUT_OF_ORDER_SEQUENCE).  Batches are
            # written in sequence order, so the unwritten ones are the tail.
            unsent = [b for b in batches if not b.sent]
            if unsent:
                self.next_sequence = unsent[0].request.batch.first_sequence
            if self.spool is not None and batches and not keep_spool:
                # Their callers got this failure: the spool must not resend them after a restart
                # (their sequences may be handed out again to other messages).
                last = batches[-1].request.batch
                with contextlib.suppress(OSError):
                    self.spool.answered(last.first_sequence + len(last.columns.payloads) - 1, empty=True)
        for batch in batches:
            batch.fail(exc)
        self.sealed.clear()
        fail_futures(self._open_futures, exc)
        self._reset_open()
        self.buffered = 0
        self.space.set()

    def _reset_open(self) -> None:
        self._open_types, self._open_vchannels, self._open_payloads = [], [], []
        self._open_extras, self._open_futures, self._open_bytes = [], [], 0


__all__ = ["Accumulator", "Batch", "fail_futures"]
