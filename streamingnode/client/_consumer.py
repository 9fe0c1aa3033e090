"""Consumer: an async iterator of MsgPacks over one Consume stream that survives reconnects.

A background task owns the stream: it reads packs into a small buffer (and stops reading while the
buffer is full, so gRPC flow control slows the node's scanner: backpressure, never dropping), and it
answers acks.  It remembers the end position of the last pack it received; when the stream breaks
it opens a new one that resumes exactly there, by the resume rule of ``Position`` in common.proto:
``DeliverPolicy.start_from(pos.message_id)`` plus ``DeliverFilter.timetick_gt(pos.timetick)``.  So the
caller sees every pack once, with no gap and no duplicate, across node restarts.

A pack larger than one response arrives in parts (``MsgPack.continued``); the reader joins them and
hands the caller the whole pack, so a transaction is never seen in part.  ``max_receive_bytes`` (the
client's) tells the node how large a response this consumer can take.

With a consumer group the node replaces the policy by the group's committed position (which is at or
before what this consumer received, unless someone moved the group), but it keeps the filters, so the
``timetick_gt`` filter still cuts everything already received.

The node commits an ack only up to what the stream it arrives on has delivered.  So an ack not yet
answered when a stream breaks goes again on the new stream once that stream has delivered up to it
(its first pack, normally: the new read skips what was received by its timetick); acks after it
wait behind it, as answers come in order.  An ack of a position this consumer never received is
sent at once, and the node's refusal is raised.  An ack answered ON_SHUTDOWN (the pchannel closed
under it, as when its owner goes away) is not failed: the stream is opened again and the ack resent.

In a cluster the consumer reaches its pchannel through a ``Route``: an open refused with NOT_OWNER
goes to the owner it names, and after the owner went away the next open resolves it again through
the seeds; the resume rule above makes the new owner continue exactly after the last pack received.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from streamingnode.client import _parallel
from streamingnode.client._calls import open_stream, reconnectable, translate, unary, with_reconnect, write
from streamingnode.client._routing import Route
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from streamingnode.wire import codec
from streamingnode.wire.codes import from_error_detail
from streamingnode.wire.defaults import RECONNECT_TIMEOUT
from wal.errors import ErrorCode, InvalidArgumentError, OnShutdownError, StreamingError, UnavailableError
from wal.message import Position
from wal.options import DeliverFilter, DeliverPolicy, PolicyKind
from wal.resume import resume_after
from wal.scanner import MsgPack
from wal.tasks import cancel_and_wait

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from streamingnode.client._parallel import Handler, KeyFunction


class _State(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    CLOSED = "closed"


def resume_read(
    position: Position, filters: Sequence[DeliverFilter] = (),
) -> tuple[DeliverPolicy, tuple[DeliverFilter, ...]]:
    """The policy and filters that deliver exactly what comes after ``position``."""
    return resume_after(position.message_id, position.timetick, filters)


class Consumer:
    """Reads one vchannel (or a whole pchannel with ``vchannel=""``) of ``pchannel``.

    Make one with ``AsyncClient.consumer``, which starts it.  Iterate it for ``MsgPack``s (empty packs
    too: they report that time advanced); ``ack`` commits positions to the consumer group.  ``async
    with`` waits until the node opened the read (so a ``latest`` policy is anchored) and closes it at
    the end.
    """

    def __init__(
        self,
        stub: sgrpc.StreamingNodeStub | Route,
        pchannel: str,
        vchannel: str = "",
        *,
        policy: DeliverPolicy | None = None,
        filters: Iterable[DeliverFilter] = (),
        group: str | None = None,
        max_pack_messages: int = 0,
        max_buffered_packs: int = 8,
        reconnect_timeout: float = RECONNECT_TIMEOUT,
        timeout: float | None = None,
        max_receive_bytes: int = 0,
    ) -> None:
        if not pchannel:
            raise InvalidArgumentError("pchannel is required", field="pchannel")
        if max_pack_messages < 0 or max_buffered_packs <= 0 or max_receive_bytes < 0:
            raise InvalidArgumentError(
                "max_pack_messages and max_receive_bytes must be >= 0 and max_buffered_packs > 0")
        self._max_receive_bytes = max_receive_bytes
        self._route = stub if isinstance(stub, Route) else None
        self._stub = stub
        self.pchannel = pchannel
        self.vchannel = vchannel
        self.group = group or None
        self._policy = policy or DeliverPolicy.all()
        self._filters = tuple(filters)
        self._max_pack_messages = max_pack_messages
        self._max_buffered = max_buffered_packs
        self._reconnect_timeout = reconnect_timeout
        self._timeout = timeout
        self._loop = asyncio.get_running_loop()
        self._state = _State.STARTING
        self._packs: collections.deque[MsgPack] = collections.deque()
        self._ready = asyncio.Event()  # a pack arrived, or the read ended
        self._space = asyncio.Event()  # the caller took a pack, an ack waits, or closing
        self._opened = asyncio.Event()
        self._error: StreamingError | None = None
        self._ended = False
        self._received: Position | None = None
        self._delivered: Position | None = None
        self._acks: collections.deque[tuple[spb.ConsumeRequest, asyncio.Future[None], tuple[int, int]]] = \
            collections.deque()
        """Acks not answered yet, in order: (request, its future, the largest id and timetick it names)."""
        self._written = 0
        """How many of ``_acks`` (from the left) went out on the current stream."""
        self._stream_end: tuple[int, int] | None = None
        """(id, timetick) of the end of the last pack received on the current stream."""
        self._high: tuple[int, int] | None = None
        """The same, the largest over every stream so far."""
        self._write_lock = asyncio.Lock()
        self._call: Any = None
        self.reconnects = 0
        """How many times the read was opened again after a failure (for tests and metrics)."""
        self.in_process = 0
        """Messages ``process`` took from this consumer and has not handled yet."""
        self._task: asyncio.Task[None] | None = None

    # --- public ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start reading in the background.  Idempotent; ``AsyncClient.consumer`` calls it, and
        ``async with``, iteration and ``wait_opened`` do when nobody did.  Never after ``aclose``."""
        if self._state is not _State.STARTING:
            return
        self._state = _State.RUNNING
        self._task = self._loop.create_task(self._run(), name=f"consumer:{self.pchannel}/{self.vchannel}")
        self._task.add_done_callback(self._on_task_done)

    @property
    def closed(self) -> bool:
        return self._state is _State.CLOSED

    @property
    def connected(self) -> bool:
        """A stream to the node is open now (False while the consumer reconnects, and before it opened)."""
        return self._call is not None

    @property
    def position(self) -> Position | None:
        """Where the last pack handed to the caller ends (None before the first): resume from here."""
        return self._delivered

    async def wait_opened(self) -> None:
        """Return once the node opened the read; raise its error if opening failed for good."""
        self.start()
        task = self._task
        if task is not None:  # None: closed before it started
            waiter = asyncio.ensure_future(self._opened.wait())
            try:
                await asyncio.wait((waiter, task), return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
        if not self._opened.is_set():
            if self._error is not None:
                raise self._error
            raise OnShutdownError(f"consumer on {self.pchannel!r} closed before it opened", channel=self.pchannel)

    def __aiter__(self) -> AsyncIterator[MsgPack]:
        self.start()
        return self

    async def __anext__(self) -> MsgPack:
        while not self._packs:
            if self._error is not None:
                raise self._error
            if self._ended:
                raise StopAsyncIteration
            self._ready.clear()
            await self._ready.wait()
        pack = self._packs.popleft()
        self._space.set()
        self._delivered = pack.end_position
        return pack

    async def ack(self, what: MsgPack | Position | Iterable[Position]) -> None:
        """Commit to the consumer group: a pack's end positions, or the given positions.  Returns once
        the node stored them; an ack sent before a reconnect is sent again (acks are idempotent)."""
        if self.group is None:
            raise InvalidArgumentError("ack needs a consumer group (consumer(..., group=...))", field="group")
        if self._state is not _State.RUNNING:
            raise OnShutdownError(f"consumer on {self.pchannel!r} is closed", channel=self.pchannel)
        if isinstance(what, MsgPack):
            positions: list[Position] = list(what.end_positions)
        elif isinstance(what, Position):
            positions = [what]
        else:
            positions = list(what)
        request = spb.ConsumeRequest(ack=spb.ConsumeAck(
            positions=[codec.position_to_pb(p, self.vchannel) for p in positions]))
        top = (max((p.message_id for p in positions), default=0), max((p.timetick for p in positions), default=0))
        fut: asyncio.Future[None] = self._loop.create_future()
        async with self._write_lock:
            # Registered and written under the lock that a reconnect holds while it resends pending
            # acks: each ack goes out once per stream, so answers match acks one to one.
            self._acks.append((request, fut, top))
            await self._send_acks()
        self._space.set()  # the reader must read on to see the answer, even with a full buffer
        await fut

    async def process(self, handler: Handler, *, workers: int = 4, key: KeyFunction | None = None,
                      max_in_flight: int = 1000) -> int:
        """Run ``handler`` on every message, on ``workers`` workers, until the read ends (``aclose``)
        or a handler raises (then that error is raised); returns how many messages were handled.

        Messages with the same ``key(message)`` (default: the vchannel) are handled one at a time, in
        order; different keys run in parallel.  A coroutine function runs as tasks, a plain function on
        threads.  With a consumer group the position is committed only up to the first message not yet
        handled (per pack: a crash never skips work, and may redo part of a pack).  At most
        ``max_in_flight`` messages are taken and not yet handled; reading waits meanwhile.  See
        ``streamingnode.client._parallel``."""
        return await _parallel.process(self, handler, workers=workers, key=key, max_in_flight=max_in_flight)

    async def aclose(self) -> None:
        """Stop reading: end the stream and the background task.  Idempotent."""
        if self._state is _State.CLOSED:
            return
        self._state = _State.DRAINING
        task = self._task
        try:
            if self._call is not None and task is not None and not task.done():
                async with self._write_lock:
                    with contextlib.suppress(StreamingError):
                        await write(self._call, spb.ConsumeRequest(close=spb.ConsumeClose()))
                self._space.set()
                with contextlib.suppress(TimeoutError):
                    # The reader discards packs while draining, so 'closed' arrives promptly.
                    async with asyncio.timeout(5.0):
                        await asyncio.shield(task)
        finally:
            self._state = _State.CLOSED
            try:
                with contextlib.suppress(StreamingError):
                    await cancel_and_wait(task)
            finally:
                self._ended = True
                self._ready.set()
                self._fail_acks(OnShutdownError(f"consumer on {self.pchannel!r} closed", channel=self.pchannel))

    async def __aenter__(self) -> Consumer:
        try:
            await self.wait_opened()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- the stream ------------------------------------------------------------------------------
    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        # No caller may wait forever: the iterator and pending acks learn the task is gone.
        if not task.cancelled() and (exc := task.exception()) is not None and self._error is None:
            self._error = exc if isinstance(exc, StreamingError) else UnavailableError(
                f"consumer on {self.pchannel!r} failed: {exc!r}", channel=self.pchannel)
        self._ended = True
        self._ready.set()
        self._fail_acks(self._error or OnShutdownError(f"consumer on {self.pchannel!r} closed",
                                                       channel=self.pchannel))

    async def _send_acks(self) -> None:
        """Write the acks not yet sent on this stream, in order, stopping at one that must wait: one
        naming a position received on an earlier stream that this one has not delivered yet (the
        node would refuse it).  Hold ``_write_lock``."""
        if self._call is None:
            return
        while self._written < len(self._acks):
            request, _, top = self._acks[self._written]
            if _covered(top, self._high) and not _covered(top, self._stream_end):
                return
            with contextlib.suppress(StreamingError):  # a broken stream: the reconnect resends it
                await write(self._call, request)
            self._written += 1

    def _fail_acks(self, exc: StreamingError) -> None:
        self._written = 0
        while self._acks:
            _, fut, _ = self._acks.popleft()
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()

    async def _run(self) -> None:
        if self._policy.kind is PolicyKind.LATEST:
            try:
                await with_reconnect(self._anchor_latest, self._reconnect_timeout)
            except StreamingError as exc:
                self._error = exc
                return
        while self._state is _State.RUNNING:
            try:
                call = await with_reconnect(self._open, self._reconnect_timeout)
            except StreamingError as exc:
                self._error = exc
                return
            broke = await self._pump_until_broken(call)
            if broke is not None and self._route is not None:
                self._route.failed(broke)
            if broke is None or self._state is not _State.RUNNING:
                return
            if not reconnectable(broke):
                self._error = broke
                return

    async def _pump_until_broken(self, call: Any) -> StreamingError | None:
        """Read ``call`` until it ends (None) or breaks (the error)."""
        try:
            await self._pump(call)
        except grpc.RpcError as exc:
            return translate(exc)
        except StreamingError as exc:
            return exc
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise
            # The call was cancelled, not this task: grpc.aio cancels a call whose write is cancelled
            # (a caller cancelled inside ack()), and every read of it then raises CancelledError.  The
            # stream is gone, not the consumer: open it again (pending acks are resent).
            return UnavailableError(f"consume stream on {self.pchannel!r} was cancelled", channel=self.pchannel)
        finally:
            self._call = None
            call.cancel()
        return None

    async def _anchor_latest(self) -> None:
        if await self._group_has_position():
            # The node resumes from the group's committed position instead, and so must a reconnect.
            return
        # Anchor 'latest' to a concrete position now, so a reconnect before the first pack still
        # resumes from here and loses nothing appended in between.
        resp = await self._unary("GetLatestPosition", spb.GetLatestPositionRequest(
            pchannel=self.pchannel, vchannel=self.vchannel))
        if resp.HasField("last"):
            self._received = codec.position_from_pb(resp.last)[0]

    async def _group_has_position(self) -> bool:
        if self.group is None:
            return False
        resp = await self._unary("DescribeConsumerGroups", spb.DescribeConsumerGroupsRequest(
            pchannel=self.pchannel, groups=[self.group]))
        return any(p.vchannel == self.vchannel for g in resp.groups for p in g.vchannels)

    async def _unary(self, method: str, request: Any) -> Any:
        if self._route is not None:
            return await self._route.call(method, request)
        return await unary(getattr(self._stub, method), request, self._timeout)

    async def _open(self) -> Any:
        try:
            stub = await self._route.stub() if self._route is not None else self._stub
            return await self._open_at(stub)
        except StreamingError as exc:
            if self._route is not None:
                self._route.failed(exc)
            raise

    async def _open_at(self, stub: Any) -> Any:
        policy, filters = self._policy, self._filters
        if self._received is not None:
            policy, filters = resume_read(self._received, filters)
        open_ = spb.ConsumeOpen(
            pchannel=self.pchannel, vchannel=self.vchannel, policy=codec.policy_to_pb(policy),
            filters=codec.filters_to_pb(filters), consumer_group=self.group or "",
            # Column packs cost a fraction per message to encode and decode; msgpack_from_pb reads
            # both forms, so a node that ignores the flag still works.
            max_pack_messages=self._max_pack_messages, columns=True, max_response_bytes=self._max_receive_bytes)
        call = stub.Consume()
        await open_stream(call, spb.ConsumeRequest(open=open_), "consume", self.pchannel)
        try:
            async with self._write_lock:
                # Acks not yet answered go again on the new stream, each once it has delivered up to it.
                self._written = 0
                self._stream_end = None
                self._call = call
                await self._send_acks()
        except BaseException:
            call.cancel()
            raise
        if self._opened.is_set():
            self.reconnects += 1
        self._opened.set()
        return call

    async def _pump(self, call: Any) -> None:
        parts: list[MsgPack] = []  # the continued parts of the pack being received (this stream's)
        while True:
            while len(self._packs) >= self._max_buffered and not self._acks and self._state is _State.RUNNING:
                self._space.clear()
                await self._space.wait()
            resp = await call.read()
            if resp is grpc.aio.EOF:
                if self._state is _State.RUNNING:
                    raise UnavailableError(f"consume stream on {self.pchannel!r} ended unasked",
                                           channel=self.pchannel)
                return
            kind = resp.WhichOneof("response")
            if kind == "pack":
                if self._state is not _State.RUNNING:
                    continue  # closing: nobody will read it
                pack = codec.msgpack_from_pb(resp.pack)
                if resp.pack.continued:
                    parts.append(pack)  # nothing of it is delivered, nor resumed from, before the last part
                    continue
                if parts:
                    pack = codec.join_continued(parts, pack)
                    parts = []
                self._received = pack.end_position
                self._packs.append(pack)
                self._ready.set()
                end = (pack.end_position.message_id, pack.end_position.timetick)
                self._stream_end = end
                self._high = end if self._high is None else (max(self._high[0], end[0]), max(self._high[1], end[1]))
                if self._written < len(self._acks):
                    async with self._write_lock:
                        await self._send_acks()
            elif kind in ("acked", "error"):
                if not self._acks:
                    continue
                if kind == "error" and resp.error.code == ErrorCode.ON_SHUTDOWN:
                    # The pchannel closed under the ack (its owner is going away, the stream ends next):
                    # the ack stays pending and goes again, with those after it, on the next stream.
                    raise from_error_detail(resp.error)
                _, fut, _ = self._acks.popleft()
                self._written = max(self._written - 1, 0)
                if fut.done():
                    continue
                if kind == "acked":
                    fut.set_result(None)
                else:
                    fut.set_exception(from_error_detail(resp.error))
            elif kind == "closed":
                return


def _covered(top: tuple[int, int], end: tuple[int, int] | None) -> bool:
    """Whether a position (id, timetick) lies at or before ``end`` in both parts."""
    return end is not None and top[0] <= end[0] and top[1] <= end[1]


__all__ = ["Consumer", "resume_read"]
