"""The executor's read of one range, straight from the node's column packs.

An executor reads ``(start, end]`` of one vchannel with a raw ``Consume`` stream opened with
``ConsumeOpen.columns``: each pack arrives as one packed array per field (``MessageColumns``), and
plain mode builds its Arrow columns from those arrays (``plain_batch``) without a Python object per
message.  Reading through the SDK's consumer instead turns every message into a ``Message`` first, and
the executor spent more than twice the SDK consumer's CPU per message doing that and then taking the
objects apart again (bench/RESULTS.md, "Spark reads the log live").  Collection mode, which decodes
each message's Arrow body anyway, gets ``Message`` objects from the same packs
(``codec.messages_from_columns``, the SDK's own decoder).

The stream is opened through an ``AsyncClient``'s route (so the owner is found in a cluster, with the
connection's token and TLS) on an event loop of the reading thread's own: the worker pulls each pack
with ``run_until_complete``, so nothing hops between threads.  A stream that breaks for a reason a new
stream cures (the node restarted, the pchannel moved) is opened again after the last whole pack read,
by the resume rule of ``Position``, as the SDK's consumer does: the range's rows come out exactly once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.compute as pc

from streamingnode.client._calls import open_stream, reconnectable, translate, with_reconnect
from streamingnode.spark._options import Connection, Offset
from streamingnode.spark._range import ReadStalledError, read_policy
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.wire import codec
from wal import clock
from wal.errors import StreamingError, UnavailableError
from wal.message import Message, MessageType, Position
from wal.options import DeliverPolicy
from wal.resume import resume_after

_FRAMING = pa.array([int(t) for t in (MessageType.TIME_TICK, MessageType.BEGIN_TXN, MessageType.COMMIT_TXN,
                                      MessageType.ROLLBACK_TXN)], pa.int32())
_COMMIT = int(MessageType.COMMIT_TXN)
# Scalars made once: pyarrow.compute turns a Python number into a scalar with an import attempt per
# call, which cost the read ~15% of its CPU.
_ZERO = pa.scalar(0, pa.int32())
_LOGICAL_BITS = pa.scalar(clock.LOGICAL_BITS, pa.int64())
_US_PER_MS = pa.scalar(1000, pa.int64())
# The ``type`` column's names by type number: a dense table, so a pack's names are one ``take``.  A
# number this version does not know is "undefined", as the SDK's decoder makes it.
_TOP = max(int(t) for t in MessageType)
_TOP_SCALAR = pa.scalar(_TOP, pa.int32())
_NAMES = pa.array(["undefined"] * (_TOP + 1), pa.string())
_NAMES = pc.replace_with_mask(_NAMES, pa.array([i in {int(t) for t in MessageType} for i in range(_TOP + 1)]),
                              pa.array([t.name.lower() for t in sorted(MessageType, key=int)], pa.string()))


@dataclass(frozen=True, slots=True)
class ColumnPack:
    """One whole pack as it came: its parts' columns (one part unless the pack was larger than one
    response, see ``MsgPack.continued``) and where it ends."""

    parts: tuple[pb.MessageColumns, ...]
    end_ts: int
    end_position: Position


class _PackStream:
    """A raw ``Consume`` stream of column packs after ``start``; async, on the reading thread's loop."""

    def __init__(self, conn: Connection, start: Offset, vchannel: str, types: tuple[int, ...]) -> None:
        from streamingnode.client import AsyncClient  # noqa: PLC0415  (its channels bind to the running loop)

        self._client = AsyncClient(list(conn.addrs), timeout=conn.timeout, reconnect_timeout=conn.timeout,
                                   token=conn.token, tls_ca=conn.tls_ca, tls_cert=conn.tls_cert,
                                   tls_key=conn.tls_key)
        self._route = self._client.route(start.pchannel)
        self._pchannel = start.pchannel
        self._vchannel = vchannel
        self._timeout = conn.timeout
        self._policy, self._filters = read_policy(start, types)
        self._received: Position | None = None  # the end of the last whole pack taken
        self._call: Any = None

    async def _open(self) -> Any:
        policy: DeliverPolicy = self._policy
        filters = self._filters
        if self._received is not None:
            policy, resumed = resume_after(self._received.message_id, self._received.timetick, filters)
            filters = list(resumed)
        request = spb.ConsumeRequest(open=spb.ConsumeOpen(
            pchannel=self._pchannel, vchannel=self._vchannel, policy=codec.policy_to_pb(policy),
            filters=codec.filters_to_pb(filters), columns=True))
        try:
            stub = await self._route.stub()
            call = stub.Consume()
            await open_stream(call, request, "consume", self._pchannel)
        except StreamingError as exc:
            self._route.failed(exc)
            raise
        return call

    async def next(self) -> ColumnPack:
        """The next whole pack; a broken stream is opened again after the last whole pack."""
        while True:
            if self._call is None:
                self._call = await with_reconnect(self._open, self._timeout)
            try:
                return await self._read_pack(self._call)
            except grpc.RpcError as exc:
                broke = translate(exc)
            except StreamingError as exc:
                broke = exc
            self._call.cancel()
            self._call = None
            self._route.failed(broke)
            if not reconnectable(broke):
                raise broke

    async def _read_pack(self, call: Any) -> ColumnPack:
        parts: list[pb.MessageColumns] = []
        while True:
            resp = await call.read()
            if resp is grpc.aio.EOF:
                raise UnavailableError(f"consume stream on {self._pchannel!r} ended unasked", channel=self._pchannel)
            kind = resp.WhichOneof("response")
            if kind == "closed":
                raise UnavailableError(f"consume stream on {self._pchannel!r} closed unasked", channel=self._pchannel)
            if kind != "pack":
                continue
            pack = resp.pack
            if pack.HasField("columns"):
                parts.append(pack.columns)
            elif len(pack.messages):
                # Opened with ConsumeOpen.columns, which every version of the node honours.
                raise UnavailableError(f"the node answered a column read of {self._pchannel!r} with messages",
                                       channel=self._pchannel)
            if pack.continued:
                continue  # nothing of a pack is taken, nor resumed from, before its last part
            if not pack.end_positions:
                raise UnavailableError("a pack without end positions", channel=self._pchannel)
            end, _ = codec.position_from_pb(pack.end_positions[0])
            self._received = end
            return ColumnPack(tuple(parts), pack.end_ts, end)

    async def aclose(self) -> None:
        call, self._call = self._call, None
        if call is not None:
            call.cancel()
            await call.code()  # the cancellation has gone through
        await self._client.aclose()


def read_packs(conn: Connection, start: Offset, end: Offset, vchannel: str,
               types: tuple[int, ...]) -> Iterator[ColumnPack]:
    """The whole packs of ``vchannel`` ("" = the whole pchannel) after ``start`` up to the first that
    ends at or after ``end``'s timetick: every message visible by ``end`` is in them (see
    ``_range.read_range``; the caller drops what is visible later)."""
    if end.timetick <= start.timetick:
        return
    loop = asyncio.new_event_loop()
    stream: _PackStream | None = None
    try:
        async def make() -> _PackStream:
            return _PackStream(conn, start, vchannel, types)

        stream = loop.run_until_complete(make())
        while True:
            try:
                pack = loop.run_until_complete(asyncio.wait_for(stream.next(), conn.timeout))
            except TimeoutError as exc:
                raise ReadStalledError(
                    f"no pack from {start.pchannel!r}/{vchannel!r} within {conn.timeout} s while reading up "
                    f"to timetick {end.timetick}") from exc
            yield pack
            if pack.end_ts >= end.timetick:
                return
    finally:
        try:
            if stream is not None:
                loop.run_until_complete(stream.aclose())
        finally:
            _close_loop(loop)


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Close ``loop`` as ``asyncio.run`` does: what gRPC left running (a cancelled call's status task)
    is cancelled and awaited first, so nothing is destroyed pending."""
    try:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()


def _extras(parts: tuple[pb.MessageColumns, ...]) -> Iterator[tuple[int, pb.MessageExtras]]:
    """Each part's extras, their index made absolute over the pack."""
    base = 0
    for part in parts:
        for e in part.extras:
            yield base + e.index, e
        base += len(part.types)


def _joined(parts: tuple[pb.MessageColumns, ...], name: str, t: pa.DataType) -> pa.Array:
    if len(parts) == 1:
        return pa.array(getattr(parts[0], name), t)
    return pa.concat_arrays([pa.array(getattr(p, name), t) for p in parts])


def plain_batch(pack: ColumnPack, end_timetick: int, schema: pa.Schema) -> pa.RecordBatch | None:
    """The plain-mode rows of ``pack``'s data messages visible by ``end_timetick`` (None: none),
    columns as ``_rows.plain_batches`` gives them for the same messages."""
    parts = pack.parts
    n = sum(len(p.types) for p in parts)
    if n == 0:
        return None
    types = _joined(parts, "types", pa.int32())
    timeticks = _joined(parts, "timeticks", pa.uint64()).cast(pa.int64())
    # The rare fields: a transaction's body is visible at its commit's timetick; properties and a
    # missing id are carried only by the messages that have them.
    commits: dict[int, int] = {}
    in_txn: list[tuple[int, int]] = []
    no_id: list[int] = []
    props: dict[int, list[tuple[str, str]]] = {}
    for i, e in _extras(parts):
        if e.HasField("txn"):
            in_txn.append((i, e.txn.txn_id))
        if len(e.properties):
            props[i] = list(dict(e.properties).items())
        if e.no_id:
            no_id.append(i)
    if in_txn:
        ts_list = timeticks.to_pylist()
        for i, txn_id in in_txn:
            if types[i].as_py() == _COMMIT:
                commits[txn_id] = ts_list[i]
        for i, txn_id in in_txn:
            ts_list[i] = commits.get(txn_id, ts_list[i])
        visible = pa.array(ts_list, pa.int64())
    else:
        visible = timeticks
    ids = _joined(parts, "ids", pa.uint64()).cast(pa.int64())
    if no_id:
        mask = [False] * n
        for i in no_id:
            mask[i] = True
        ids = pc.if_else(pa.array(mask, pa.bool_()), pa.nulls(n, pa.int64()), ids)
    map_type = schema.field("properties").type
    if props:
        properties = pa.array([props.get(i, []) for i in range(n)], map_type)
    else:
        properties = pa.MapArray.from_arrays(pa.array([0] * (n + 1), pa.int32()), pa.array([], map_type.key_type),
                                             pa.array([], map_type.item_type), type=map_type)
    # A number outside the table (an enum value this version does not know, negative ones too) is 0.
    known = pc.if_else(pc.and_(pc.greater_equal(types, _ZERO), pc.less_equal(types, _TOP_SCALAR)), types, _ZERO)
    batch = pa.RecordBatch.from_arrays([
        ids,
        _joined(parts, "vchannels", pa.string()),
        _NAMES.take(known),
        visible,
        pc.multiply(pc.shift_right(visible, _LOGICAL_BITS), _US_PER_MS).cast(schema.field("time").type),
        properties,
        _joined(parts, "payloads", pa.binary()),
    ], schema=schema)
    keep = pc.and_(pc.invert(pc.is_in(types, _FRAMING)), pc.less_equal(visible, pa.scalar(end_timetick, pa.int64())))
    kept = pc.sum(keep.cast(pa.int32())).as_py() or 0
    if kept == 0:
        return None
    return batch if kept == n else batch.filter(keep)


def pack_messages(pack: ColumnPack) -> list[Message]:
    """``pack``'s messages as the SDK's consumer gives them (collection mode decodes their bodies)."""
    return [m for part in pack.parts for m in codec.messages_from_columns(part)]


__all__ = ["ColumnPack", "pack_messages", "plain_batch", "read_packs"]
