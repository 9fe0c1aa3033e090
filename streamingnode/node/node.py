"""The node: one RocksDB WAL manager, every pchannel opened for streaming, their consumer groups.

The gRPC service is a thin layer over this class; tests and embedders can drive it directly.  At start
the node opens every existing pchannel with a new term (fencing any previous owner) and waits for each
recovery, so a node that reports ready serves every channel at once.  Channel administration is
serialised by one lock: creating, destroying and opening channels are rare and must not interleave.

Damage is contained to its pchannel: one that cannot open, or whose storage turns out damaged while it
serves (a CORRUPTED error from a read or a write, met by a call or by its flusher's or retention's
background reads), goes to FAILED.  The node keeps serving the others;
every call on the failed one is refused with the cause's code (CORRUPTED for damage, which gRPC carries
as DATA_LOSS) and a message naming the pchannel and the cause, until it is repaired and the node
restarted, or destroyed.  A failed group commit (a sync error: ``UnrecoverableError``) stops every
write of the node's WAL until it is reopened, so it shows the same way on every pchannel.

Cluster mode (``cluster_nats`` set; ``streamingnode.cluster.ownership``): the node opens only the pchannels
whose lease it holds, when it takes the lease, and closes one when it loses or hands off the lease.
A call on any other pchannel fails fast with NOT_OWNER naming the owner's address and term, as last
read from the leases (no KV round trip on the call path).  With ``wal = "rocksdb"`` each node keeps
its own WAL: the pchannels are those configured (``channels``, the same list on every node) and those
in the node's WAL.  With ``wal = "jetstream"`` the log is the cluster's: every node lists the same
pchannels from it, CreateChannels creates them there (the preferred node's ownership loop takes and
opens each), DestroyChannels removes them (its owner stops serving it at its next pass), and a node
that takes a pchannel over opens it with the normal recovery (fence, the old term's transactions
rolled back, dedup, shard state, consumer groups and the flusher's checkpoint, all read from the
shared log and its KV meta).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
from typing import TYPE_CHECKING

import structlog

from flusher import incarnation
from flusher.commit import inside
from flusher.config import FlusherConfig
from flusher.flusher import Flusher
from interceptors.recovery.streaming_wal import ChainConfig, open_streaming_wal
from streamingnode.cluster.startup import while_nats_forms
from streamingnode.config import NodeConfig, compaction_config
from streamingnode.node.channel import Channel, Failure, Owner
from streamingnode.node.disk_guard import StorageMonitor, start_monitor
from streamingnode.node.groups import ConsumerGroups
from streamingnode.node.memory_trim import limit_arenas
from streamingnode.node.retention import ChannelRetention, RetentionConfig
from streamingnode.observability.metrics import NodeMetrics
from streamingnode.observability.tracing import Tracing
from wal.backend import ChannelInfo
from wal.errors import (
    ChannelExistError,
    ChannelNotExistError,
    ErrorCode,
    InvalidArgumentError,
    NotOwnerError,
    OnShutdownError,
    StreamingError,
    UnavailableError,
)
from wal.manager import WALManager
from wal.names import PCHANNEL, shorten

if TYPE_CHECKING:
    from streamingnode.cluster.connection import ClusterClient
    from streamingnode.cluster.leases import Lease
    from streamingnode.cluster.ownership import Ownership

log = structlog.get_logger(__name__)

# Each channel costs a clock task and buffers; a request for millions of them is a mistake, not a plan.
MAX_CREATE = 1024
class Node:
    """Start with ``await Node.start(config)``; close with ``aclose``."""

    def __init__(self, manager: WALManager, config: NodeConfig, tracing: Tracing | None = None) -> None:
        self.manager = manager
        self.config = config
        self.tracing = tracing
        """Spans for produce, the chain's steps and consume; None (the default) traces nothing."""
        self.chain_config = ChainConfig(tick_interval=config.tick_interval, txn_max_messages=config.txn_max_messages,
                                        txn_max_bytes=config.txn_max_bytes)
        self._channels: dict[str, Channel] = {}
        self._failed: dict[str, Failure] = {}
        # Closing a channel that failed while serving runs in the background (the call that met the
        # damage must not wait for it); destroy and shutdown wait for it.
        self._closers: dict[str, asyncio.Task[None]] = {}
        self.metrics = NodeMetrics(config.data_dir)
        self.metrics.failed_states = self.failed_states
        self._admin = asyncio.Lock()
        self._closing = False
        self.storage: StorageMonitor | None = None
        """Free-space watch (streamingnode.node.disk_guard), started once the channels are open."""
        self.ready = asyncio.Event()
        self.draining = asyncio.Event()
        """Set when the node starts to drain: open reads end so that the shutdown is not held up."""
        self.advertise = config.advertise
        """host:port clients reach this node at (cluster mode); the server sets the bound address if empty."""
        self.cluster: ClusterClient | None = None
        self.ownership: Ownership | None = None
        """Cluster mode: the lease loop (None on a single node, which serves every pchannel)."""

    @classmethod
    async def start(cls, config: NodeConfig, tracing: Tracing | None = None) -> Node:
        """Open the database; recovery of the channels runs in ``open_all`` (see the server)."""
        config.data_dir.mkdir(parents=True, exist_ok=True)
        # Before the WAL's and RocksDB's threads exist, so that they share the few arenas.
        limit_arenas(config.malloc_arena_max)
        if config.shared_log:
            from wal.backends.jetstream import JetStreamBackend  # noqa: PLC0415  (nats-py: cluster extra)

            backend = await while_nats_forms("opening the shared log", lambda: asyncio.to_thread(
                JetStreamBackend, config.cluster_nats, prefix=config.cluster_prefix, replicas=config.nats_replicas))
            manager = await WALManager.start(backend, durability=config.wal_durability,
                                             tail_buffer_bytes=config.tail_buffer_bytes)
        else:
            manager = await WALManager.start_rocksdb(
                config.data_dir, durability=config.wal_durability, tail_buffer_bytes=config.tail_buffer_bytes,
                write_buffer_bytes=config.rocksdb_write_buffer_bytes,
                block_cache_bytes=config.rocksdb_block_cache_bytes)
        return cls(manager, config, tracing)

    async def open_all(self) -> None:
        """Open every pchannel (creating the configured ones that are missing), then report ready.

        In cluster mode: join the cluster and take the leases placement gives this node (one pass of
        the ownership loop), then report ready; the loop goes on in the background."""
        if self.config.cluster_nats:
            if self.config.shared_log:
                await while_nats_forms("creating the configured pchannels", self._create_configured)
            await self._join_cluster()
            self.ready.set()
            self.storage = self.metrics.storage = start_monitor(self)
            log.info("node ready in cluster mode", node_id=self.config.node_id, advertise=self.advertise,
                     channels=sorted(self._channels))
            return
        async with self._admin:
            existing = set(await self.manager.list_channels())
            for name in self.config.channels:
                if name not in existing:
                    await self.manager.create_channel(name, Owner(role="node").properties())
                    existing.add(name)
            for name in sorted(existing):
                if not PCHANNEL.is_valid(name):
                    # Created before the name rules: its name could be a path, so it is not served
                    # (its data stays in the database untouched).
                    log.error("pchannel not opened: its name breaks the pchannel name rule",
                              pchannel=shorten(name))
                    continue
                try:
                    await self._open(name)
                except Exception as exc:  # noqa: BLE001  (contained: the other pchannels open and serve)
                    self._record_failure(name, exc, "pchannel failed to open")
        self.ready.set()
        self.storage = self.metrics.storage = start_monitor(self)
        log.info("node ready", channels=len(self._channels), failed=sorted(self._failed),
                 data_dir=str(self.config.data_dir))

    # --- cluster mode ----------------------------------------------------------------------------
    async def _join_cluster(self) -> None:
        from streamingnode.cluster.connection import ClusterClient  # noqa: PLC0415  (nats-py)
        from streamingnode.cluster.leases import Leases  # noqa: PLC0415  (nats-py)
        from streamingnode.cluster.membership import Membership  # noqa: PLC0415  (nats-py)
        from streamingnode.cluster.ownership import Ownership  # noqa: PLC0415  (nats-py)

        cfg = self.config
        from streamingnode.cluster.connection import transient  # noqa: PLC0415  (nats-py)

        # Its own bound (CONNECT_SECONDS) for servers that never answer; the buckets' errors of a
        # cluster still forming are tried again.
        replicas = cfg.nats_replicas if cfg.shared_log else 1
        self.cluster = await while_nats_forms("opening the cluster buckets", lambda: ClusterClient.connect(
            cfg.cluster_nats, cfg.cluster_prefix, cfg.lease_seconds, replicas=replicas), transient)
        membership = Membership(self.cluster.nodes, cfg.node_id, self.advertise, cfg.lease_seconds)
        leases = Leases(self.cluster.leases, cfg.node_id, self.advertise, cfg.lease_seconds)
        self.ownership = Ownership(membership, leases, self._cluster_names, self._take, self._lose,
                                   on_change=self.metrics.ownership_changed)
        self.metrics.cluster = self.ownership
        await self._first_pass()
        self.ownership.start()

    async def _first_pass(self) -> None:
        """The first ownership pass, tried again while NATS does not answer in time (an election, a busy
        host, a cluster still forming): the background passes ride out such a hiccup, and a node must
        not exit for one at start.  Past ``startup.FIRST_PASS_SECONDS`` (or on any other error) the start fails
        with the cause."""
        assert self.ownership is not None
        await while_nats_forms("first ownership pass", self.ownership.step)

    async def _create_configured(self) -> None:
        """Shared log: create the configured pchannels it lacks (every node may try; one wins)."""
        existing = set(await self.manager.list_channels())
        for name in self.config.channels:
            if name not in existing:
                with contextlib.suppress(ChannelExistError):  # another node created it first
                    await self.manager.create_channel(name, Owner(role="node").properties())

    async def _cluster_names(self) -> list[str]:
        local = await self.manager.list_channels()
        valid = {n for n in local if PCHANNEL.is_valid(n)}
        if self.config.shared_log:
            # The log's list is every node's list: a pchannel destroyed there is gone everywhere.
            return sorted(valid)
        return sorted({*self.config.channels, *valid})

    async def _take(self, name: str, term: int) -> int:
        """The lease of ``name`` was taken (term ``term``): open it; return the WAL's term."""
        async with self._admin:
            if self._closing:
                raise OnShutdownError("the node is shutting down", channel=name)
            self._failed.pop(name, None)
            if name not in await self.manager.list_channels():
                if self.config.shared_log:
                    # Destroyed since the loop listed it: the loop gives the lease back.
                    raise ChannelNotExistError(f"pchannel {name!r} does not exist", channel=name)
                # The local WAL does not hold it yet (the log is not shared before the jetstream WAL).
                await self.manager.create_channel(name, Owner("streamingnode", self.advertise).properties())
            channel = self._channels.get(name) or await self._open(name)
            return channel.stream.term

    async def _lose(self, name: str, reason: str) -> None:
        """The lease of ``name`` is gone (``reason``): stop serving it, appends in flight first, then
        its flusher and retention, so that nothing of this node writes for it any more (on the shared
        log the new owner's fencing would refuse it; on a local log nothing else would)."""
        channel = self._channels.pop(name, None)  # new calls are refused from here on
        await self._closed(name)
        if channel is None:
            return
        try:
            await channel.aclose(lost=reason in ("expired", "lost"))
        except Exception as exc:  # noqa: BLE001  (it is no longer ours either way)
            log.warning("closing a pchannel whose lease went failed", pchannel=name, reason=reason, error=repr(exc))
        finally:
            # Counted once it is closed: the open-pchannels gauge and this counter say what is true.
            self.metrics.close_channel(name)
        self.metrics.closed_on_lease_loss(name, reason)

    def lease(self, name: str) -> Lease | None:
        """Cluster mode: the last lease read of pchannel ``name`` (None on a single node or unknown)."""
        return None if self.ownership is None else self.ownership.view.leases.get(name)

    def _not_owner(self, name: str) -> StreamingError:
        lease = self.lease(name)
        if lease is None and name not in self.config.channels:
            # No node knows of it (every known pchannel's lease is read on each pass).
            return ChannelNotExistError(f"pchannel {name!r} does not exist", channel=name)
        if lease is not None and lease.node == self.config.node_id and lease.held():
            if self.ownership is not None and self.ownership.is_opening(name):
                return UnavailableError(f"pchannel {name!r} is being opened on this node", channel=name)
            # The record still names this node, but its lease ran out on this node's clock before a
            # renewal reached NATS (or it is being handed off): whoever takes it next serves it.
            return NotOwnerError(f"pchannel {name!r} is not served here: this node's lease on it ran out or is "
                                 f"being handed off (term {lease.term}); ask again for its owner", channel=name,
                                 owner="", term=lease.term)
        owner = lease.address if lease is not None and lease.held() else ""
        term = lease.term if lease is not None else 0
        where = f"node {owner!r} owns it" if owner else "no node owns it at the moment"
        return NotOwnerError(f"pchannel {name!r} is not served here: {where} (term {term})", channel=name,
                             owner=owner, term=term)

    def _record_failure(self, name: str, exc: BaseException, what: str) -> Failure:
        failure = self._failed[name] = Failure.of(exc)
        # The one error line per failure; a traceback only for what the node has no name for (a bug).
        log.error(what, pchannel=name, code=failure.code.name, error=failure.message,
                  exc_info=None if isinstance(exc, StreamingError) else exc)
        return failure

    def fail_on(self, name: str, exc: BaseException) -> None:
        """Note an error a call on pchannel ``name`` met: damaged storage (CORRUPTED) moves it to FAILED.

        The channel leaves the registry at once (every later call is refused) and closes in the
        background, ending the reads and writes still open on it.  Other errors are the caller's.
        """
        if not isinstance(exc, StreamingError) or exc.code is not ErrorCode.CORRUPTED:
            return
        channel = self._channels.pop(name, None)
        if channel is None or name in self._failed:
            return  # already failed (another call met the same damage), destroyed or closing
        self._record_failure(name, exc, "pchannel failed while serving: its storage is damaged")
        self.metrics.close_channel(name)
        self._closers[name] = asyncio.get_running_loop().create_task(self._close_failed(name, channel))

    async def _close_failed(self, name: str, channel: Channel) -> None:
        try:
            await channel.aclose()
        except Exception as exc:  # noqa: BLE001  (its storage is damaged: a failed close is expected)
            log.warning("closing the failed pchannel failed", pchannel=name, error=repr(exc))

    async def _closed(self, name: str) -> None:
        task = self._closers.pop(name, None)
        if task is not None:
            await asyncio.wait([task])

    def failure(self, name: str) -> Failure | None:
        """Why pchannel ``name`` is FAILED, or None while it serves (or is not served at all)."""
        failure = self._failed.get(name)
        if failure is None and name in self._channels:
            fatal = self.manager.write_failure()
            if fatal is not None:
                return Failure.of(fatal)
        return failure

    def failed_states(self) -> dict[str, bool]:
        """Every pchannel the node serves or has FAILED, and whether it is FAILED (for the metric)."""
        return {name: self.failure(name) is not None for name in (*self._channels, *self._failed)}

    def problems(self, name: str) -> list[str]:
        """Damage found on pchannel ``name`` that does not stop it (the flusher's findings), and in
        cluster mode this node's failed opens of it (backing off before the next try)."""
        channel = self._channels.get(name)
        flusher = None if channel is None else channel.flusher
        found = list(getattr(flusher, "problems", None) or ())
        if self.ownership is not None:
            found.extend(self.ownership.problems(name))
        return found

    async def _open(self, name: str, *, new: bool = False) -> Channel:
        # Opened in a context of its own holding only the pchannel and term: the tasks started here
        # (recovery, time ticks, flusher, retention) copy it and outlive the call that opened the
        # channel, so they must not log with its rpc and request_id.  The caller's context gets neither.
        return await asyncio.get_running_loop().create_task(self._open_bound(name, new), context=contextvars.Context())

    async def _open_bound(self, name: str, new: bool) -> Channel:
        structlog.contextvars.bind_contextvars(pchannel=name)
        return await self._open_channel(name, new)

    async def _open_channel(self, name: str, new: bool) -> Channel:
        tracer = None if self.tracing is None else self.tracing.tracer

        def on_damage(exc: BaseException) -> None:
            # The flusher's and retention's tasks meeting damaged storage: FAILED as for a call.
            # fail_on only schedules the close, so the task reporting it is never awaited by itself.
            self.fail_on(name, exc)

        stream = await open_streaming_wal(self.manager, name, self.chain_config, tracer=tracer)
        structlog.contextvars.bind_contextvars(term=stream.term)
        flusher: Flusher | None = None
        try:
            await stream.ready()
            groups = await ConsumerGroups.load(stream.wal)
            groups.read_point = stream.mvcc_timetick  # ticks delivered unstored are newer than the WAL's last
            if self.config.flusher:
                cfg = self.config
                # This incarnation's own directory: one left by a destroyed channel of the same name
                # is moved aside first, never read or overwritten as this one's.
                key = (await self.manager.describe_channel(name)).key
                root = await asyncio.to_thread(incarnation.claim, cfg.parquet_root, name, key, new=new)
                flusher = Flusher(stream, root, FlusherConfig(
                    max_rows=cfg.flush_max_rows, max_bytes=cfg.flush_max_bytes,
                    max_age_seconds=cfg.flush_max_age_seconds, memory_cap_bytes=cfg.flush_memory_cap_bytes,
                    compaction=compaction_config(cfg), compaction_interval_seconds=cfg.compaction_interval_seconds,
                ), on_damage=on_damage)
                await flusher.start()
        except BaseException:
            if flusher is not None:
                await flusher.aclose()
            await stream.aclose()
            raise
        retention = ChannelRetention(stream, groups, flusher, RetentionConfig(
            retention_seconds=self.config.retention_seconds, check_seconds=self.config.retention_check_seconds,
            snapshot_every_messages=self.config.snapshot_every_messages,
            snapshot_every_seconds=self.config.snapshot_every_seconds), on_damage=on_damage)
        retention.start()
        channel = self._channels[name] = Channel(stream, groups, flusher, retention)
        self.metrics.open_channel(name, channel)
        return channel

    # --- lookup ----------------------------------------------------------------------------------
    def channel(self, name: str, field: str = "pchannel") -> Channel:
        """The open channel ``name``; InvalidArgumentError (naming ``field``) for a name the pchannel
        rule refuses, ChannelNotExistError for a valid name the node does not serve."""
        PCHANNEL.check(name, field)
        if self._closing:
            raise OnShutdownError("the node is shutting down", channel=name)
        failure = self.failure(name)
        if failure is not None:
            raise failure.refusal(name)
        found = self._channels.get(name)
        if self.ownership is not None and (found is None or not self.ownership.serves(name)):
            raise self._not_owner(name)
        if found is None:
            if not self.ready.is_set():
                raise UnavailableError(f"the node is still opening its channels; {name!r} is not open yet",
                                       channel=name)
            raise ChannelNotExistError(f"pchannel {name!r} does not exist", channel=name)
        return found

    def channel_names(self) -> list[str]:
        """The pchannels served (FAILED ones are not)."""
        return sorted(self._channels)

    # --- administration --------------------------------------------------------------------------
    async def create_channels(self, names: list[str], num: int, owner: Owner) -> list[str]:
        """Create ``names`` (or ``num`` channels with node-chosen names) and open them; all or none."""
        if names and num not in (0, len(names)):
            raise InvalidArgumentError(
                f"num_channels is {num} but {len(names)} channel names were given", field="num_channels"
            )
        if not names and num <= 0:
            raise InvalidArgumentError("give channel_names or a positive num_channels", field="num_channels")
        if max(num, len(names)) > MAX_CREATE:
            raise InvalidArgumentError(
                f"at most {MAX_CREATE} channels per call, asked for {max(num, len(names))}", field="num_channels")
        for i, name in enumerate(names):
            PCHANNEL.check(name, f"channel_names[{i}]")
        self._refuse_in_cluster("CreateChannels")
        if len(set(names)) != len(names):
            raise InvalidArgumentError("channel_names has duplicates", field="channel_names")
        if self.config.shared_log:
            return await self._create_shared(names, num, owner)
        async with self._admin:
            names = await self._names_to_create(names, num)
            await self._create_all(names, owner, open_here=True)
        log.info("channels created", channels=names, role=owner.role)
        return names

    async def _create_all(self, names: list[str], owner: Owner, *, open_here: bool) -> None:
        """Create ``names`` (and open each here when ``open_here``), all or nothing: a channel created
        before a failure is removed again.  Called holding ``_admin``."""
        created: list[str] = []
        try:
            for name in names:
                await self.manager.create_channel(name, owner.properties())
                created.append(name)
                if open_here:
                    await self._open(name, new=True)
        except BaseException:
            for name in created:
                await (self._destroy(name) if open_here else self.manager.destroy_channel(name))
            raise

    async def _names_to_create(self, names: list[str], num: int) -> list[str]:
        """``names``, or ``num`` fresh ``pchannel_<i>`` names when none are given; ChannelExistError
        when one exists already.  Called holding ``_admin``."""
        existing = set(await self.manager.list_channels())
        if not names:
            fresh = (f"pchannel_{i}" for i in itertools.count() if f"pchannel_{i}" not in existing)
            names = list(itertools.islice(fresh, num))
        for name in names:
            if name in existing:
                raise ChannelExistError(f"pchannel {name!r} already exists", channel=name)
        return names

    async def destroy_channels(self, names: list[str]) -> None:
        if not names:
            raise InvalidArgumentError("channel_names is empty", field="channel_names")
        for i, name in enumerate(names):
            PCHANNEL.check(name, f"channel_names[{i}]")
        self._refuse_in_cluster("DestroyChannels")
        async with self._admin:
            existing = set(await self.manager.list_channels())
            for name in names:
                if name not in existing:
                    raise ChannelNotExistError(f"pchannel {name!r} does not exist", channel=name)
            for name in dict.fromkeys(names):
                if self.ownership is not None:
                    # This node's own first: stop serving and give the lease up, then remove it from
                    # the log; another owner stops at its next pass, finding it gone.
                    await self.ownership.forget(name)
                await self._destroy(name)
        log.info("channels destroyed", channels=names)

    async def _create_shared(self, names: list[str], num: int, owner: Owner) -> list[str]:
        """Shared log: create the pchannels in it (all or none), then wait until each has an owner:
        the ownership loop of the node placement prefers takes it (maybe this one)."""
        async with self._admin:
            names = await self._names_to_create(names, num)
            await self._create_all(names, owner, open_here=False)
        # Outside the lock: when this node is the one preferred, its loop's open takes the lock.
        await self._await_owners(names)
        log.info("channels created in the shared log", channels=names, role=owner.role)
        return names

    async def _await_owners(self, names: list[str]) -> None:
        """Wait (at most two lease periods) until every pchannel of ``names`` is served by some node;
        past that they are created all the same and taken at a later pass."""
        assert self.ownership is not None
        deadline = asyncio.get_running_loop().time() + 2 * self.config.lease_seconds
        while True:
            await self.ownership.refresh(names)
            # Open at the owner, not only leased: a call sent there right after this returns is served.
            waiting = [n for n in names if (lease := self.lease(n)) is None or not lease.held() or not lease.serving]
            if not waiting or asyncio.get_running_loop().time() >= deadline:
                if waiting:
                    log.warning("pchannels created but not owned yet", channels=waiting)
                return
            await asyncio.sleep(min(0.05, self.config.lease_seconds / 20))

    def _refuse_in_cluster(self, what: str) -> None:
        if self.config.cluster_nats and not self.config.shared_log:
            # Each node keeps its own WAL until the shared one: a channel made here exists nowhere else.
            raise InvalidArgumentError(
                f"{what} is not available in cluster mode yet: give every node the same --channels",
                field="channel_names")

    async def _destroy(self, name: str) -> None:
        # A FAILED pchannel is destroyed like any other (the way to drop one whose damage nobody repairs).
        await self._closed(name)
        failed = self._failed.pop(name, None) is not None
        channel = self._channels.pop(name, None)
        if channel is not None:
            self.metrics.close_channel(name)
            await channel.aclose()
        key: int | None = None
        try:
            key = (await self.manager.describe_channel(name)).key
        except StreamingError:
            if not failed:
                raise
            # Its storage is damaged and cannot be described: the Parquet directory's own marker
            # names the incarnation it belongs to.
        await self.manager.destroy_channel(name)
        # Its Parquet files are user data: kept, but moved aside under a name no later incarnation
        # takes (see flusher.incarnation).  A crash before the move is caught when the name is reused.
        await asyncio.to_thread(self._retire_parquet, name, key)

    def _retire_parquet(self, name: str, key: int | None) -> None:
        root = self.config.parquet_root
        if key is None:
            key = incarnation.read_marker(inside(root, name))
        incarnation.retire(root, name, key)

    async def describe_channels(self, names: list[str]) -> list[ChannelInfo]:
        for i, name in enumerate(names):
            PCHANNEL.check(name, f"channel_names[{i}]")
        if not names:
            names = await (self._cluster_names() if self.ownership is not None else self.manager.list_channels())
        if self.ownership is not None:
            # Fresh from KV, not the loop's last pass: a description names the owner as it is now (and
            # later NOT_OWNER refusals use what this read).
            await self.ownership.refresh(names)
        return [await self._describe(name) for name in names]

    async def _describe(self, name: str) -> ChannelInfo:
        if (self.ownership is not None and not self.config.shared_log and name not in self._channels
                and name not in self._failed and name not in await self.manager.list_channels()):
            # Not served here and never was: the lease (filled in by the caller) says who serves it.
            if name not in self.config.channels and self.lease(name) is None:
                raise ChannelNotExistError(f"pchannel {name!r} does not exist", channel=name)
            return ChannelInfo(name, 0, 0, 0, 0, 0)
        try:
            return await self.manager.describe_channel(name)
        except StreamingError:
            if name not in self._failed:
                raise
            # What made it fail (a damaged last block, say) can keep it from being described too:
            # it is still listed, by name, with its failure.
            return ChannelInfo(name, 0, 0, 0, 0, 0)

    # --- lifecycle -------------------------------------------------------------------------------
    async def aclose(self) -> None:
        """Close every channel (appends in flight finish first), then the database."""
        if self.ownership is not None:
            # Hand every pchannel off first (the channels close, the leases are released).
            await self.ownership.stop()
        if self.cluster is not None:
            await self.cluster.aclose()
        self._closing = True
        if self.storage is not None:
            await self.storage.aclose()
        for name in list(self._closers):
            await self._closed(name)
        async with self._admin:
            for name, channel in list(self._channels.items()):
                self.metrics.close_channel(name)
                try:
                    await channel.aclose()
                except Exception as exc:  # noqa: BLE001  (close the rest and the database regardless)
                    log.warning("closing pchannel failed", pchannel=name, error=repr(exc))
            self._channels.clear()
            await self.metrics.aclose()
            await self.manager.aclose()


__all__ = ["Channel", "Failure", "Node", "Owner"]
