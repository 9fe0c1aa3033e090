"""AsyncClient: admin calls, producers, consumers, transactions and the MsgStream facade over grpc.aio."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any, TypeVar

import grpc

from streamingnode.client._calls import unary
from streamingnode.client._consumer import Consumer
from streamingnode.client._data import DataClient
from streamingnode.client._msgstream import MsgStream
from streamingnode.client._producer import DEFAULT_BUFFER_BYTES, Producer
from streamingnode.client._routing import Route, Router, parse_addresses
from streamingnode.client._txn import Transaction
from streamingnode.client._types import ChannelDescription, GroupDescription, Owner, TxnInfo
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.wire import codec
from streamingnode.wire.defaults import (
    CALL_TIMEOUT,
    KEEPALIVE_TIME,
    KEEPALIVE_TIMEOUT,
    LINGER,
    MAX_BATCH_BYTES,
    MAX_BATCH_MESSAGES,
    MAX_MESSAGE_BYTES,
    MIN_PING_INTERVAL,
    NODE_ADDR,
    RECONNECT_TIMEOUT,
    RESPONSE_BYTES,
)
from wal.errors import InvalidArgumentError
from wal.message import AppendResult, Position
from wal.options import DeliverFilter, DeliverPolicy

DEFAULT_ADDR = NODE_ADDR
TOKEN_ENV = "STREAMINGNODE_TOKEN"  # noqa: S105  (the variable's name, not a secret)
T = TypeVar("T", Producer, Consumer, MsgStream, DataClient)


class _WithMetadata:
    """A channel whose calls all carry ``metadata`` (the bearer token): the stub asks it for its
    multicallables, and each call adds the metadata once, when it starts.  Nothing per message."""

    __slots__ = ("_channel", "_metadata")

    def __init__(self, channel: grpc.aio.Channel, metadata: tuple[tuple[str, str], ...]) -> None:
        self._channel = channel
        self._metadata = metadata

    def __repr__(self) -> str:
        return "<channel with credentials>"  # never the token

    def _wrap(self, kind: str, *args: Any, **kwargs: Any) -> Any:
        call = getattr(self._channel, kind)(*args, **kwargs)
        ours = self._metadata

        def with_metadata(*call_args: Any, metadata: Any = None, **call_kwargs: Any) -> Any:
            return call(*call_args, metadata=ours if metadata is None else (*metadata, *ours), **call_kwargs)

        return with_metadata

    def unary_unary(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrap("unary_unary", *args, **kwargs)

    def unary_stream(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrap("unary_stream", *args, **kwargs)

    def stream_unary(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrap("stream_unary", *args, **kwargs)

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrap("stream_stream", *args, **kwargs)


def _read_pem(path: str | os.PathLike[str], what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read {what} {os.fspath(path)!r}: {exc.strerror}", field=what) from None


def channel_credentials(
    tls_ca: str | os.PathLike[str] | None, tls_cert: str | os.PathLike[str] | None,
    tls_key: str | os.PathLike[str] | None,
) -> grpc.ChannelCredentials | None:
    """TLS credentials for a client (None: plaintext): trust ``tls_ca`` (else the system's roots) and,
    for mutual TLS, present ``tls_cert`` with ``tls_key``."""
    if (tls_cert is None) != (tls_key is None):
        raise InvalidArgumentError("tls_cert and tls_key go together: give both or neither", field="tls_cert")
    if tls_ca is None and tls_cert is None:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_read_pem(tls_ca, "tls_ca") if tls_ca is not None else None,
        private_key=_read_pem(tls_key, "tls_key") if tls_key is not None else None,
        certificate_chain=_read_pem(tls_cert, "tls_cert") if tls_cert is not None else None,
    )


def keepalive_options(keepalive_time: float | None, keepalive_timeout: float) -> list[tuple[str, int]]:
    """The channel options of the client's keepalive (none when ``keepalive_time`` is None)."""
    if keepalive_time is None:
        return []
    if not keepalive_time >= MIN_PING_INTERVAL:  # (also refuses NaN)
        raise InvalidArgumentError(
            f"keepalive_time must be at least {MIN_PING_INTERVAL:g} s (a node refuses pings more often with "
            f"GOAWAY too_many_pings), got {keepalive_time!r}; None turns keepalive off", field="keepalive_time")
    if not keepalive_timeout > 0:
        raise InvalidArgumentError(f"keepalive_timeout must be > 0 seconds, got {keepalive_timeout!r}",
                                   field="keepalive_timeout")
    return [
        ("grpc.keepalive_time_ms", round(keepalive_time * 1000)),
        ("grpc.keepalive_timeout_ms", round(keepalive_timeout * 1000)),
        # Any ping, not only keepalive's: a keepalive ping is not sent while another is unanswered
        # (gRPC's flow-control probe, say), and that one would wait a minute by default.
        ("grpc.http2.ping_timeout_ms", round(keepalive_timeout * 1000)),
        # Pinged while no call is open too: a producer whose stream is stalled, or a connection about
        # to be used, is on a dead node as surely as a busy one.
        ("grpc.keepalive_permit_without_calls", 1),
        # gRPC stops pinging after two pings without a data frame sent unless told otherwise (0: no
        # limit): a stalled stream sends no data, and that is when the pings matter.
        ("grpc.http2.max_pings_without_data", 0),
    ]


class AsyncClient:
    """A connection to a streaming node, or to a cluster of them.  Use it on one event loop; ``async
    with`` or ``aclose``.

    ``addr`` is one address, or several seeds (a list, or a comma-separated string).  The client keeps
    one gRPC channel per node and sends each pchannel's calls to its owner: with one seed that is the
    seed (unless it answers NOT_OWNER naming another node); with several, the owner comes from
    ``DescribeChannels`` on first use and from NOT_OWNER answers, and after a node becomes unreachable
    it is resolved again through any seed (see ``_routing``).

    ``timeout`` is the deadline of each unary call in seconds (None: none).  ``reconnect_timeout`` is
    how long producers and consumers keep trying to reopen a broken stream before they give up.
    ``token`` is sent as ``authorization: Bearer <token>`` on every call (default
    ``$STREAMINGNODE_TOKEN``; ``""``: none).  ``tls_ca`` (a PEM CA file) turns TLS on; ``tls_cert`` and
    ``tls_key`` present a client certificate (mutual TLS; with them alone, the system's roots are
    trusted).  Every failure raises the ``wal.errors.StreamingError`` subclass the node raised.

    ``keepalive_time`` (seconds, at least 1; None: no keepalive) is how often the client pings each
    node's connection, with calls in flight or without; ``keepalive_timeout`` how long it waits for the
    answer.  A node that does not answer (hung, paused, partitioned away) has its connection closed:
    its streams fail with UNAVAILABLE, and producers and consumers reopen at the pchannel's owner,
    resolved again, instead of waiting on a stream that never errors.  Nodes accept pings every
    second, with or without calls.
    """

    def __init__(
        self,
        addr: str | Sequence[str] = DEFAULT_ADDR,
        *,
        timeout: float | None = CALL_TIMEOUT,
        reconnect_timeout: float = RECONNECT_TIMEOUT,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        max_receive_bytes: int = RESPONSE_BYTES,
        options: Sequence[tuple[str, Any]] = (),
        token: str | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        keepalive_time: float | None = KEEPALIVE_TIME,
        keepalive_timeout: float = KEEPALIVE_TIMEOUT,
    ) -> None:
        self.seeds = parse_addresses(addr)
        self.addr = ",".join(self.seeds)
        self.timeout = timeout
        self.reconnect_timeout = reconnect_timeout
        # What consumers tell the node they can receive (ConsumeOpen.max_response_bytes): gRPC's default
        # of every language unless raised here, so that the node cuts packs alike for every client and
        # a message larger than that is an explicit choice of the consumer (also the channel's limit).
        self.max_receive_bytes = max_receive_bytes
        credentials = channel_credentials(tls_ca, tls_cert, tls_key)
        token = os.environ.get(TOKEN_ENV, "") if token is None else token
        channel_options = [
            # The caller's first: of two entries for one key gRPC takes the first, and an explicit
            # option must win over these defaults.
            *options,
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max(max_message_bytes, max_receive_bytes)),
            # Reconnect quickly after a node restart instead of backing off for up to two minutes.
            ("grpc.max_reconnect_backoff_ms", 1000),
            *keepalive_options(keepalive_time, keepalive_timeout),
        ]

        def open_channel(node: str) -> tuple[grpc.aio.Channel, Any]:
            channel = (grpc.aio.insecure_channel(node, options=channel_options) if credentials is None
                       else grpc.aio.secure_channel(node, credentials, options=channel_options))
            # Plain metadata, not call credentials: gRPC sends those only over TLS, and a node behind a
            # trusted network (or loopback) may take tokens without it.
            calls: Any = channel if not token else _WithMetadata(channel, (("authorization", f"Bearer {token}"),))
            return channel, calls

        self.router = Router(self.seeds, open_channel)
        # The first seed's stub: what calls that name no pchannel use when there is one seed.
        self._stub = self.router.stub_at(self.seeds[0])
        self._owned: list[Producer | Consumer | MsgStream | DataClient] = []
        self._closed = False

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every producer (draining it), consumer and msgstream made by this client, then the
        connection.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        owned, self._owned = self._owned, []
        for item in reversed(owned):
            with contextlib.suppress(Exception):
                await item.aclose()
        await self.router.close()

    async def _call(self, method: str, request: Any, pchannel: str = "", *, read: bool = False) -> Any:
        """A unary call: at ``pchannel``'s owner, or (no pchannel) at the first seed that answers.
        ``read``: safe to repeat at another node after the first became unreachable."""
        if pchannel:
            return await self.router.call(pchannel, method, request, self.timeout, retry_gone=read)
        if not self.router.cluster:
            return await unary(getattr(self._stub, method), request, self.timeout)
        return await self.router.call_any(method, request, self.timeout)

    def route(self, pchannel: str) -> Route:
        """The way to ``pchannel``'s owner that its producers and consumers use."""
        return Route(self.router, pchannel, self.timeout)

    def _own(self, item: T) -> T:
        self._owned = [x for x in self._owned if not getattr(x, "closed", False)]
        self._owned.append(item)
        return item

    # --- channels --------------------------------------------------------------------------------
    async def create_channels(
        self, names: Sequence[str] | None = None, num: int = 0, *, owner: Owner | None = None,
    ) -> list[str]:
        """Create pchannels: the given ``names``, or ``num`` with names the node picks.  All or none."""
        request = spb.CreateChannelsRequest(
            owner=(owner or Owner()).to_pb(), num_channels=num, channel_names=list(names or ()))
        return list((await self._call("CreateChannels", request)).channel_names)

    async def destroy_channels(self, names: Sequence[str]) -> None:
        """Remove pchannels with their data and consumer groups."""
        names = list(names)
        await self._call("DestroyChannels", spb.DestroyChannelsRequest(channel_names=names),
                         names[0] if len(names) == 1 else "")

    async def describe_channels(self, names: Sequence[str] = ()) -> list[ChannelDescription]:
        """Describe the given pchannels (every channel of the node when empty)."""
        names = list(names)
        resp = await self._call("DescribeChannels", spb.DescribeChannelsRequest(channel_names=names),
                                names[0] if len(names) == 1 else "", read=True)
        return [ChannelDescription.from_pb(d) for d in resp.descriptions]

    # --- consumer groups -------------------------------------------------------------------------
    async def create_group(self, pchannel: str, group: str) -> None:
        await self._call("CreateConsumerGroup", spb.CreateConsumerGroupRequest(pchannel=pchannel, group=group),
                         pchannel)

    async def destroy_group(self, pchannel: str, group: str) -> None:
        await self._call("DestroyConsumerGroup", spb.DestroyConsumerGroupRequest(pchannel=pchannel, group=group),
                         pchannel)

    async def describe_groups(self, pchannel: str = "", groups: Sequence[str] = ()) -> list[GroupDescription]:
        """Committed positions and lag of groups (every pchannel / every group when empty)."""
        resp = await self._call("DescribeConsumerGroups", spb.DescribeConsumerGroupsRequest(
            pchannel=pchannel, groups=list(groups)), pchannel, read=True)
        return [GroupDescription.from_pb(d) for d in resp.groups]

    async def seek_group(
        self, pchannel: str, group: str, vchannel: str = "", *,
        policy: DeliverPolicy | None = None, position: Position | None = None,
    ) -> Position:
        """Move the group's committed position on ``vchannel`` to ``position``, or to where ``policy``
        starts; returns the position stored.  Consumers opened later resume from it."""
        if (policy is None) == (position is None):
            raise InvalidArgumentError("seek_group needs exactly one of policy and position", field="target")
        request = spb.SeekConsumerGroupRequest(group=group, pchannel=pchannel, vchannel=vchannel)
        if policy is not None:
            request.policy.CopyFrom(codec.policy_to_pb(policy))
        else:
            assert position is not None
            request.position.CopyFrom(codec.position_to_pb(position, vchannel))
        resp = await self._call("SeekConsumerGroup", request, pchannel)
        return codec.position_from_pb(resp.position)[0]

    # --- positions and flush ---------------------------------------------------------------------
    async def latest_position(self, pchannel: str, vchannel: str = "") -> tuple[Position | None, int]:
        """(the newest confirmed position or None when empty, the vchannel's MVCC timetick)."""
        resp = await self._call("GetLatestPosition", spb.GetLatestPositionRequest(pchannel=pchannel, vchannel=vchannel),
                                pchannel, read=True)
        last = codec.position_from_pb(resp.last)[0] if resp.HasField("last") else None
        return last, resp.mvcc_timetick

    async def flush(self, pchannel: str, vchannel: str, collection: str | None = None) -> tuple[list[str], int]:
        """Write what is buffered for the vchannel (collection) to Parquet: (files, flush timetick)."""
        resp = await self._call("Flush", spb.FlushRequest(pchannel=pchannel, vchannel=vchannel, collection=collection),
                                pchannel)
        return list(resp.files), resp.flush_timetick

    # --- transactions ----------------------------------------------------------------------------
    async def begin_txn(self, pchannel: str, vchannel: str, keepalive_ms: int = 0) -> TxnInfo:
        """Start a transaction (``keepalive_ms`` 0: the node's default)."""
        resp = await self._call("BeginTxn", spb.BeginTxnRequest(
            pchannel=pchannel, vchannel=vchannel, keepalive_ms=keepalive_ms), pchannel)
        mid = codec.message_id_from_pb(resp.message_id, "message_id") if resp.HasField("message_id") else None
        return TxnInfo(pchannel, vchannel, resp.txn_id, resp.begin_timetick, mid, resp.keepalive_ms)

    async def commit_txn(self, pchannel: str, vchannel: str, txn_id: int) -> AppendResult:
        """Commit: AppendResult of the CommitTxn message (its timetick is when readers see the body)."""
        resp = await self._call("CommitTxn", spb.CommitTxnRequest(pchannel=pchannel, vchannel=vchannel, txn_id=txn_id),
                                pchannel)
        return AppendResult(codec.message_id_from_pb(resp.message_id, "message_id"), resp.commit_timetick, txn_id)

    async def rollback_txn(self, pchannel: str, vchannel: str, txn_id: int) -> AppendResult:
        """Roll back: AppendResult of the RollbackTxn message."""
        resp = await self._call("RollbackTxn", spb.RollbackTxnRequest(
            pchannel=pchannel, vchannel=vchannel, txn_id=txn_id), pchannel)
        return AppendResult(codec.message_id_from_pb(resp.message_id, "message_id"), resp.rollback_timetick, txn_id)

    @contextlib.asynccontextmanager
    async def txn(self, pchannel: str, vchannel: str, keepalive_ms: int = 0) -> AsyncIterator[Transaction]:
        """``async with client.txn(p, v) as tx: await tx.send(b"...")`` — commits when the block ends
        normally (after every body message is durable), rolls back when it raises."""
        info = await self.begin_txn(pchannel, vchannel, keepalive_ms)
        producer = Producer(self.route(pchannel), pchannel, reconnect_timeout=self.reconnect_timeout,
                            txn=pb.TxnContext(txn_id=info.txn_id, keepalive_ms=info.keepalive_ms))
        tx = Transaction(self, info, producer)
        try:
            yield tx
        except BaseException as exc:
            if not tx.finished:
                try:
                    await tx.rollback()
                except Exception as rollback_exc:  # noqa: BLE001  (the block's own error is the one to raise)
                    exc.add_note(f"and the rollback of transaction {info.txn_id} failed: {rollback_exc!r}")
            raise
        else:
            if not tx.finished:
                await tx.commit()
        finally:
            await producer.aclose()

    # --- streams ---------------------------------------------------------------------------------
    def producer(
        self,
        pchannel: str,
        *,
        producer_id: str | None = None,
        first_sequence: int | None = None,
        linger: float = LINGER,
        max_batch_bytes: int = MAX_BATCH_BYTES,
        max_batch_messages: int = MAX_BATCH_MESSAGES,
        max_in_flight: int | None = None,
        buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        on_full: str = "block",
        spool_dir: str | os.PathLike[str] | None = None,
    ) -> Producer:
        """A producer on ``pchannel`` (see ``Producer``).  With ``producer_id`` it is idempotent: after a
        reconnect it resends unanswered batches with the same sequences and the node drops what it
        already has.  The node owns the id's identity: the first open gets a new epoch (fencing any
        older producer of the id: its next batch fails with ``ProducerFencedError``) and the next
        sequence, where the producer numbers from unless ``first_sequence`` is given, so reusing an id
        after a restart just continues it.  A ``first_sequence`` below what the node holds is only for
        resending the same messages: other content under a held sequence fails with
        ``DuplicateSequenceMismatchError``.  ``max_in_flight`` defaults to 8, and for an idempotent
        producer to what keeps ``max_in_flight * max_batch_messages`` within the node's dedup window
        (4096): keep that true when you set either.

        While no owner answers (a failover, a network fault) sends are buffered, up to ``buffer_bytes``
        of unanswered messages, and written in batches, in order, once an owner answers (for up to the
        client's ``reconnect_timeout``, after which they fail).  A full buffer makes ``send`` wait
        (``on_full="block"``) or raise ``ResourceExhaustedError`` (``"fail"``).  ``spool_dir`` (needs
        ``producer_id``) also appends each batch to a file there: a producer made later with the same
        id and directory sends what was never answered first (``Producer.recovered``).  Per vchannel
        the order is kept; the node's dedup window removes duplicates as long as the resend comes
        within it."""
        return self._own(Producer(
            self.route(pchannel), pchannel, producer_id=producer_id, first_sequence=first_sequence, linger=linger,
            max_batch_bytes=max_batch_bytes, max_batch_messages=max_batch_messages, max_in_flight=max_in_flight,
            reconnect_timeout=self.reconnect_timeout, buffer_bytes=buffer_bytes, on_full=on_full,
            spool_dir=None if spool_dir is None else os.fspath(spool_dir)))

    def consumer(
        self,
        pchannel: str,
        vchannel: str = "",
        *,
        policy: DeliverPolicy | None = None,
        filters: Iterable[DeliverFilter] = (),
        group: str | None = None,
        max_pack_messages: int = 0,
        max_buffered_packs: int = 8,
    ) -> Consumer:
        """A consumer of ``vchannel`` (the whole pchannel when empty), starting at ``policy`` (default
        all) — or, with ``group``, at the group's committed position when it has one.  It is
        started: reading begins in the background at once."""
        consumer = Consumer(
            self.route(pchannel), pchannel, vchannel, policy=policy, filters=filters, group=group,
            max_pack_messages=max_pack_messages, max_buffered_packs=max_buffered_packs,
            reconnect_timeout=self.reconnect_timeout, timeout=self.timeout, max_receive_bytes=self.max_receive_bytes)
        consumer.start()
        return self._own(consumer)

    def data(self, pchannel: str) -> DataClient:
        """Collections, inserts, deletes and flush on ``pchannel`` (see ``DataClient``)."""
        return self._own(DataClient(self, pchannel))

    def msgstream(self) -> MsgStream:
        """The Milvus MsgStream shape over this client (as_producer / as_consumer, produce, consume)."""
        return self._own(MsgStream(self))


__all__ = ["DEFAULT_ADDR", "TOKEN_ENV", "AsyncClient", "channel_credentials", "keepalive_options"]
