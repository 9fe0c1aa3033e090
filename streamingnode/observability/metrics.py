"""Prometheus metrics of the node, labelled by pchannel, served on ``/metrics``.

Values come in two kinds, priced differently:

- **Events** the append and consume paths observe as they happen (appends, transaction ends, packs
  delivered, streams opened): each pchannel binds its labelled children once (``ChannelMetrics``),
  so an observation is a dict lookup and a locked add, once per batch or pack, never per message.
- **State** read when Prometheus scrapes (per-interceptor time, time tick, open transactions,
  scanners, consumer-group lag, flusher progress, disk): ``_StateCollector`` walks the open channels
  then, so the hot path pays nothing for them.

When a pchannel closes, its label sets are removed, so a destroyed channel does not linger as a
flat line.  No label carries a message id, a transaction id or user data; the label values are
pchannel and consumer-group names (operator-made, few), the vchannels consumer groups have positions
on (the lag gauges only), message types, error codes, interceptor names, scanner modes and
transaction outcomes.

``/metrics`` is served by a small asyncio HTTP server on the node's own event loop: the scrape-time
reads then happen on the thread that owns the state (no torn reads of dicts being changed, no locks).
Disk sizes are the exception: directory walks run on a worker thread just before each scrape
(``refresh_disk``), so a large Parquet tree never stalls the loop's appends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from streamingnode.observability.node_state import NAMESPACE, cluster_families, storage_families
from streamingnode.wire.host_port import connectable, split_host_port
from wal.clock import physical_ms
from wal.errors import StreamingError, UnavailableError
from wal.message import Message, MessageType, all_of_type, payload_bytes

if TYPE_CHECKING:
    from interceptors.txn import TxnSession
    from streamingnode.cluster.ownership import Ownership
    from streamingnode.node.channel import Channel
    from streamingnode.node.disk_guard import StorageMonitor

log = structlog.get_logger(__name__)

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TXN_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)
_TYPE_NAMES = {t: t.name.lower() for t in MessageType}
_MAX_REQUEST_LINE = 8192


class ChannelMetrics:
    """One pchannel's event metrics, children bound once; ``close`` removes every label set."""

    def __init__(self, node: NodeMetrics, pchannel: str) -> None:
        self._node = node
        self.pchannel = pchannel
        self._messages: dict[tuple[MessageType, str], Counter] = {}
        self._bytes: dict[MessageType, Counter] = {}
        self._latency: dict[str, Histogram] = {}
        self._txn: dict[str, Histogram] = {}
        self.producer_streams = node.producer_streams.labels(pchannel)
        self.consumer_streams = node.consumer_streams.labels(pchannel)
        self.consume_messages = node.consume_messages.labels(pchannel)
        self.consume_bytes = node.consume_bytes.labels(pchannel)
        self.consume_packs = node.consume_packs.labels(pchannel)

    def observe_append(self, batch: list[Message], seconds: float, error: BaseException | None,
                       nbytes: int | None = None) -> None:
        """One batch through the chain (all-or-nothing, so one outcome for all of it).  ``nbytes``: its
        summed payload lengths when the caller already has them (the produce stream does)."""
        status = "ok" if error is None else _status(error)
        latency = self._latency.get(status)
        if latency is None:
            latency = self._latency[status] = self._node.append_latency.labels(self.pchannel, status)
        latency.observe(seconds)
        first = batch[0].message_type
        if all_of_type(batch, first):  # the usual case: one type, no per-type dict
            self._count(first, status, len(batch), payload_bytes(batch) if nbytes is None else nbytes)
            return
        counts: dict[MessageType, list[int]] = {}
        for m in batch:  # a batch of mixed types (DDL beside data): rare, and public reads suffice
            t = m.message_type
            c = counts.get(t)
            if c is None:
                c = counts[t] = [0, 0]
            c[0] += 1
            c[1] += len(m.payload)
        for t, (n, size) in counts.items():
            self._count(t, status, n, size)

    def _count(self, t: MessageType, status: str, n: int, nbytes: int) -> None:
        key = (t, status)
        counter = self._messages.get(key)
        if counter is None:
            counter = self._messages[key] = self._node.append_messages.labels(self.pchannel, _TYPE_NAMES[t], status)
        counter.inc(n)
        if status == "ok":
            b = self._bytes.get(t)
            if b is None:
                b = self._bytes[t] = self._node.append_bytes.labels(self.pchannel, _TYPE_NAMES[t])
            b.inc(nbytes)

    def observe_txn(self, session: TxnSession) -> None:
        """A transaction ended: how long it lived, by outcome (committed, rolled_back, expired)."""
        outcome = session.state.name.lower()
        h = self._txn.get(outcome)
        if h is None:
            h = self._txn[outcome] = self._node.txn_duration.labels(self.pchannel, outcome)
        h.observe(max(time.time() * 1000 - physical_ms(session.begin_ts), 0) / 1000)

    def observe_pack(self, messages: int, nbytes: int) -> None:
        self.consume_packs.inc()
        self.consume_messages.inc(messages)
        self.consume_bytes.inc(nbytes)

    def close(self) -> None:
        node, p = self._node, self.pchannel
        gone: list[tuple[Counter | Gauge | Histogram, tuple[str, ...]]] = [
            *((node.append_messages, (p, _TYPE_NAMES[t], status)) for t, status in self._messages),
            *((node.append_bytes, (p, _TYPE_NAMES[t])) for t in self._bytes),
            *((node.append_latency, (p, status)) for status in self._latency),
            *((node.txn_duration, (p, outcome)) for outcome in self._txn),
            *((family, (p,)) for family in (node.producer_streams, node.consumer_streams, node.consume_messages,
                                             node.consume_bytes, node.consume_packs)),
        ]
        for family, labels in gone:
            with contextlib.suppress(KeyError):  # one already gone must not keep the others
                family.remove(*labels)
        self._messages.clear()
        self._bytes.clear()
        self._latency.clear()
        self._txn.clear()


def _status(error: BaseException) -> str:
    if isinstance(error, StreamingError):
        return error.code.name.lower()
    if isinstance(error, TimeoutError):
        return "deadline_exceeded"
    if isinstance(error, asyncio.CancelledError):
        return "cancelled"
    return "unknown"


class NodeMetrics:
    """Every metric of one node, in a registry of its own (tests run several nodes per process)."""

    def __init__(self, data_dir: str | os.PathLike[str] | None = None) -> None:
        # A ``*_created`` series beside every counter and histogram doubles their series for a value no
        # panel uses (process_start_time_seconds says when counting began).  The switch is process-wide.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        self.data_dir = data_dir
        self.channels: dict[str, tuple[Channel, ChannelMetrics]] = {}
        self.closing: dict[str, Channel] = {}
        """pchannels no longer served whose close has not ended (``pchannel_closing``)."""
        self._dir_sizes: dict[str, tuple[float, int]] = {}  # Parquet root -> (when measured, bytes)
        self.wal_bytes = 0
        """Bytes of the WAL database on disk, as last measured by ``refresh_disk``."""
        self.storage: StorageMonitor | None = None
        """Set by the node: its free-space watch (the ``storage_*`` series)."""
        self.failed_states: Callable[[], dict[str, bool]] = dict
        """Set by the node: each pchannel it serves or has FAILED, and whether it is FAILED."""
        r = self.registry
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        ns = NAMESPACE
        self.append_messages = Counter(
            "append_messages", "Messages appended through the interceptor chain, by type and outcome "
            "(ok or the lower-case error code).", ["pchannel", "message_type", "status"], namespace=ns, registry=r)
        self.append_bytes = Counter(
            "append_bytes", "Payload bytes of messages appended durably.", ["pchannel", "message_type"],
            namespace=ns, registry=r)
        self.append_latency = Histogram(
            "append_latency_seconds", "Time from a batch entering the chain to its durable acknowledgement "
            "(or failure), per batch.", ["pchannel", "status"], namespace=ns, registry=r, buckets=LATENCY_BUCKETS)
        self.txn_duration = Histogram(
            "txn_duration_seconds", "Life of a transaction from BeginTxn to its end, by outcome.",
            ["pchannel", "outcome"], namespace=ns, registry=r, buckets=TXN_BUCKETS)
        self.producer_streams = Gauge(
            "producer_streams", "Open Produce streams.", ["pchannel"], namespace=ns, registry=r)
        self.consumer_streams = Gauge(
            "consumer_streams", "Open Consume streams.", ["pchannel"], namespace=ns, registry=r)
        self.consume_messages = Counter(
            "consume_messages", "Messages delivered to Consume streams.", ["pchannel"], namespace=ns, registry=r)
        self.consume_bytes = Counter(
            "consume_bytes", "Payload bytes delivered to Consume streams.", ["pchannel"], namespace=ns, registry=r)
        self.consume_packs = Counter(
            "consume_packs", "MsgPacks delivered to Consume streams.", ["pchannel"], namespace=ns, registry=r)
        # The fan-out of Consume streams (server.fanout), node-wide: one cache and one budget serve all.
        self.consume_cache_hits = Counter(
            "consume_cache_hits", "Consume packs sent from the shared cache of encoded responses.",
            namespace=ns, registry=r)
        self.consume_cache_misses = Counter(
            "consume_cache_misses", "Consume packs encoded because the shared cache did not have them.",
            namespace=ns, registry=r)
        self.consume_cache_bytes = Gauge(
            "consume_cache_bytes", "Bytes in the shared cache of encoded Consume responses (at most "
            "consume_cache_bytes).", namespace=ns, registry=r)
        self.consume_held_bytes = Gauge(
            "consume_held_bytes", "Bytes the node holds for Consume streams, not yet taken by their clients "
            "(at most consume_buffer_bytes per stream).", namespace=ns, registry=r)
        # Node-wide, not per pchannel: the caps they watch (max_streams, max_streams_per_connection)
        # count a stream before it names its channel.
        self.open_streams = Gauge(
            "open_streams", "Produce and Consume streams open on the node (what max_streams caps).",
            namespace=ns, registry=r)
        self.streams_refused = Counter(
            "streams_refused", "Streams refused with RESOURCE_EXHAUSTED because a cap was full, by cap "
            "(node: max_streams, connection: max_streams_per_connection).", ["limit"], namespace=ns, registry=r)
        for cap in ("node", "connection"):  # at 0 from the start: a rate, not an absent series
            self.streams_refused.labels(cap)
        self.refusals = Counter(
            "refusals", "Requests refused or failed, by RPC and error code: a call that ended with an error "
            "status, and each produce batch or consume ack answered with an error in-band.", ["rpc", "code"],
            namespace=ns, registry=r)
        self.ownership_changes = Counter(
            "ownership_changes", "Cluster mode: this node's ownership of a pchannel changed, by reason (taken: "
            "it took the lease; released: it handed the pchannel off; expired: its lease ran out before a "
            "renewal; lost: a renewal found another owner).", ["pchannel", "reason"], namespace=ns, registry=r)
        self.closed_on_loss = Counter(
            "pchannels_closed_on_lease_loss", "Cluster mode: pchannels this node closed (appends, flusher and "
            "retention stopped) because its lease went, by reason (released: handed off; expired: it ran out on "
            "this node's clock; lost: another node took it).", ["pchannel", "reason"], namespace=ns, registry=r)
        self.cluster: Ownership | None = None
        """Set by the node in cluster mode: its lease loop (the owned, lease and nodes series)."""
        r.register(_StateCollector(self))
        self._http: asyncio.Server | None = None

    def refused(self, rpc: str, code: str) -> None:
        """One refusal answered to a caller of ``rpc`` (``server.refusals``); labels are bounded: the
        service's method names and the error codes."""
        self.refusals.labels(rpc, code.lower()).inc()

    def ownership_changed(self, pchannel: str, reason: str) -> None:
        self.ownership_changes.labels(pchannel, reason).inc()

    def closed_on_lease_loss(self, pchannel: str, reason: str) -> None:
        self.closed_on_loss.labels(pchannel, reason).inc()

    # --- channels --------------------------------------------------------------------------------
    def open_channel(self, name: str, channel: Channel) -> ChannelMetrics:
        """Bind a pchannel: its appends and transaction ends are observed from now on."""
        old = self.channels.pop(name, None)
        if old is not None:
            old[1].close()
        cm = ChannelMetrics(self, name)
        self.channels[name] = (channel, cm)
        stream = channel.stream
        groups = channel.groups

        def observe(batch: list[Message], seconds: float, error: BaseException | None, nbytes: int | None) -> None:
            groups.observe_append(batch, seconds, error)  # each vchannel's newest message: group lag
            cm.observe_append(batch, seconds, error, nbytes)

        stream.adaptor.observer = observe

        def finished(session: TxnSession) -> None:
            cm.observe_txn(session)
            if session.state.name == "EXPIRED":  # the client went quiet past its keepalive: worth a line
                log.info("transaction expired", pchannel=name, txn_id=session.txn_id, vchannel=session.vchannel,
                         keepalive_ms=session.keepalive_ms)

        stream.txns.on_finish = finished
        return cm

    def close_channel(self, name: str) -> None:
        entry = self.channels.pop(name, None)
        if entry is not None:
            channel, cm = entry
            if not channel.closed.is_set():  # failed or cut short: shown until it gets there
                self.closing[name] = channel
            channel.stream.adaptor.observer = None
            channel.stream.txns.on_finish = None
            if channel.flusher is not None:
                self._dir_sizes.pop(str(channel.flusher.root), None)
            cm.close()

    async def refresh_disk(self) -> None:
        """Measure what is on disk, on a worker thread (directory walks must not stall the loop's
        appends): the WAL's files every scrape, each Parquet tree at most once a minute."""
        now = time.monotonic()
        stale = [root for root in (str(c.flusher.root) for c, _ in self.channels.values() if c.flusher is not None)
                 if root not in self._dir_sizes or now - self._dir_sizes[root][0] >= _DIR_SIZE_TTL]
        data_dir = self.data_dir

        def measure() -> tuple[int, list[int]]:
            return (_wal_disk_bytes(data_dir) if data_dir is not None else 0), [_tree_bytes(r) for r in stale]

        wal_bytes, sizes = await asyncio.to_thread(measure)
        self.wal_bytes = wal_bytes
        for root, size in zip(stale, sizes, strict=True):
            self._dir_sizes[root] = (now, size)

    async def refresh_lag(self) -> None:
        """Before a scrape: each pchannel's vchannel high-water covers its groups' positions (a
        read of the log once after a restart, nothing after; see ``ConsumerGroups.refresh``)."""
        for channel, _ in list(self.channels.values()):
            try:
                await channel.groups.refresh()
            except StreamingError as exc:  # a channel closing or damaged: its lag waits for the next scrape
                log.warning("consumer group lag not refreshed", pchannel=channel.stream.pchannel, error=repr(exc))

    def tree_bytes(self, root: str) -> int:
        """Bytes under ``root`` as last measured by ``refresh_disk`` (0 before the first scrape)."""
        cached = self._dir_sizes.get(root)
        return cached[1] if cached is not None else 0

    def channel(self, name: str) -> ChannelMetrics | None:
        entry = self.channels.get(name)
        return entry[1] if entry is not None else None

    # --- the /metrics endpoint -------------------------------------------------------------------
    async def serve(self, listen: str) -> str:
        """Serve ``/metrics`` on ``listen`` (host:port; port 0 = any); return a connectable address."""
        try:
            host, port = split_host_port(listen)
            # An empty host means every interface.
            self._http = await asyncio.start_server(self._handle, host or "0.0.0.0", port)  # noqa: S104
        except (ValueError, OSError) as exc:
            raise UnavailableError(f"cannot serve metrics on {listen!r}: {exc}", address=listen) from None
        return connectable(host, self._http.sockets[0].getsockname()[1])

    async def aclose(self) -> None:
        if self._http is not None:
            self._http.close()
            with contextlib.suppress(Exception):
                await self._http.wait_closed()
            self._http = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(10):
                request = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            writer.close()
            return
        try:
            head = request.decode("latin-1").split("\r\n")
            method, target, _ = head[0].split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:] if h)}
            path = target.split("?", 1)[0]
            if method not in ("GET", "HEAD"):
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"only GET is served\n"
            elif path == "/metrics":
                encoder, ctype = choose_encoder(headers.get("accept", ""))
                await self.refresh_disk()
                await self.refresh_lag()
                status, body = "200 OK", encoder(self.registry)
            elif path == "/":
                status, ctype, body = "200 OK", "text/plain", b"streamingnode: metrics at /metrics\n"
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"not found; metrics are at /metrics\n"
        except ValueError:
            status, ctype, body = "400 Bad Request", "text/plain", b"malformed request\n"
            method = "GET"
        except Exception:  # a bug in a collector must not take the endpoint (or the node) down
            log.exception("metrics scrape failed")
            status, ctype, body = "500 Internal Server Error", "text/plain", b"scrape failed; see the node log\n"
            method = "GET"
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode("latin-1")
        )
        if method != "HEAD":
            writer.write(body)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()


_DIR_SIZE_TTL = 60.0


def _tree_bytes(root: str) -> int:
    total = 0
    stack = [root]
    while stack:
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as entries:
            for e in entries:
                with contextlib.suppress(OSError):
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    elif e.is_file(follow_symlinks=False):
                        total += e.stat(follow_symlinks=False).st_size
    return total


def _wal_disk_bytes(data_dir: str | os.PathLike[str]) -> int:
    """The RocksDB files sit at the top of the data directory; sub-directories (Parquet) are not the WAL."""
    total = 0
    with contextlib.suppress(OSError), os.scandir(data_dir) as entries:
        for e in entries:
            with contextlib.suppress(OSError):
                if e.is_file(follow_symlinks=False):
                    total += e.stat(follow_symlinks=False).st_size
    return total


class _StateCollector(Collector):
    """State read at scrape time, from every open pchannel."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self._m = metrics

    def describe(self) -> Iterable[Metric]:
        return []  # the families depend on what is open; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        ns = NAMESPACE
        now_ms = time.time() * 1000
        by_p = ["pchannel"]
        channels = list(self._m.channels.items())
        yield GaugeMetricFamily(f"{ns}_pchannels", "pchannels open on this node.", value=len(channels))
        failed = GaugeMetricFamily(f"{ns}_pchannel_failed", "1 while the pchannel is FAILED (it could not open, "
                                   "or its storage is damaged: every call on it is refused; DescribeChannels "
                                   "says why), 0 while it serves.", labels=["pchannel"])
        for name, is_failed in sorted(self._m.failed_states().items()):
            failed.add_metric([name], 1 if is_failed else 0)
        yield failed
        closing = GaugeMetricFamily(f"{ns}_pchannel_closing", "1 while the close of a pchannel this node no longer "
                                    "serves is under way (its log, flusher or retention still running: appends in "
                                    "flight when its lease went, a log out of reach); its series goes once the close "
                                    "ended, done or failed.  One that stays says a close never ended.",
                                    labels=["pchannel"])
        for name, channel in sorted(self._m.closing.items()):
            if channel.closed.is_set():
                del self._m.closing[name]
            else:
                closing.add_metric([name], 1)
        yield closing

        step_s = CounterMetricFamily(f"{ns}_interceptor_seconds", "Own time of each interceptor (time in it "
                                     "minus time in the steps it called; one batch in 16 is timed, and "
                                     "counts for the batches before it).", labels=["pchannel", "interceptor"])
        step_b = CounterMetricFamily(f"{ns}_interceptor_batches", "Batches through each interceptor.",
                                     labels=["pchannel", "interceptor"])
        step_m = CounterMetricFamily(f"{ns}_interceptor_messages", "Messages through each interceptor.",
                                     labels=["pchannel", "interceptor"])
        allocated = GaugeMetricFamily(f"{ns}_timetick_last_allocated_timestamp_seconds",
                                      "Physical time of the last timestamp handed out.", labels=by_p)
        confirmed = GaugeMetricFamily(f"{ns}_timetick_last_confirmed_timestamp_seconds",
                                      "Physical time below which every append is acknowledged (MVCC time).",
                                      labels=by_p)
        tick_lag = GaugeMetricFamily(f"{ns}_timetick_lag_seconds",
                                     "Wall clock minus the confirmed time: how stale a reader's view is.", labels=by_p)
        txns = GaugeMetricFamily(f"{ns}_txn_in_flight", "Open transactions.", labels=by_p)
        scanners = GaugeMetricFamily(f"{ns}_scanners", "Open scanners by mode (catch-up reads storage, tailing "
                                     "reads the in-memory tail).", labels=["pchannel", "mode"])
        backlog = GaugeMetricFamily(f"{ns}_scanner_backlog_messages",
                                    "Messages written but not yet read, summed over open scanners.", labels=by_p)
        wal_msgs = GaugeMetricFamily(f"{ns}_wal_messages", "Messages kept in the WAL (ids not truncated).", labels=by_p)
        g_lag = GaugeMetricFamily(
            f"{ns}_consumer_group_lag_messages", "WAL ids from a consumer group's committed position on a vchannel "
            "through that vchannel's newest message (ids are per pchannel: other vchannels' messages in the range "
            "count too); 0 exactly when nothing is left to read on the vchannel.",
            labels=["pchannel", "group", "vchannel"])
        g_lag_s = GaugeMetricFamily(
            f"{ns}_consumer_group_lag_seconds", "Time of a vchannel's newest message minus the time of a consumer "
            "group's committed position on it; 0 when nothing is left to read on the vchannel.",
            labels=["pchannel", "group", "vchannel"])
        f_rows = CounterMetricFamily(f"{ns}_flusher_rows", "Rows written to Parquet (inserts).", labels=by_p)
        f_del = CounterMetricFamily(f"{ns}_flusher_delete_rows", "Delete keys written to Parquet.", labels=by_p)
        f_bytes = CounterMetricFamily(f"{ns}_flusher_bytes", "Bytes of Parquet files written.", labels=by_p)
        f_files = CounterMetricFamily(f"{ns}_flusher_files", "Parquet files written.", labels=by_p)
        f_buf = GaugeMetricFamily(f"{ns}_flusher_buffered_bytes", "Bytes buffered, not yet in Parquet.", labels=by_p)
        f_lag = GaugeMetricFamily(f"{ns}_flusher_lag_seconds",
                                  "WAL's last timestamp minus the last one the flusher processed.", labels=by_p)
        f_disk = GaugeMetricFamily(f"{ns}_parquet_disk_bytes", "Bytes of the pchannel's Parquet files on disk "
                                   "(measured at most once a minute).", labels=by_p)
        f_quar = CounterMetricFamily(f"{ns}_parquet_quarantined", "Damaged Parquet files the flusher moved to "
                                     "_quarantine/ (each is rewritten from the WAL, or counted as lost).", labels=by_p)
        f_lost = CounterMetricFamily(f"{ns}_parquet_lost", "Damaged Parquet files whose messages the WAL no longer "
                                     "held: their rows are missing from Parquet (DescribeChannels says which).",
                                     labels=by_p)
        r_msgs = CounterMetricFamily(f"{ns}_wal_truncated_messages", "Messages removed by retention.", labels=by_p)
        r_bytes = CounterMetricFamily(f"{ns}_wal_truncated_bytes", "Payload bytes removed by retention.",
                                      labels=by_p)
        s_count = CounterMetricFamily(f"{ns}_recovery_snapshots", "Periodic recovery snapshots stored (a restart "
                                      "replays the log from the newest one).", labels=by_p)
        s_secs = CounterMetricFamily(f"{ns}_recovery_snapshot_seconds", "Time spent storing periodic recovery "
                                     "snapshots.", labels=by_p)
        f_ckpt = GaugeMetricFamily(f"{ns}_flusher_checkpoint_timestamp_seconds",
                                   "Physical time of the flusher's checkpoint (all before it is in Parquet).",
                                   labels=by_p)
        c_runs = CounterMetricFamily(f"{ns}_compactions", "Compaction records committed (flusher/compact.py).",
                                     labels=by_p)
        c_files = CounterMetricFamily(f"{ns}_compaction_files", "Files compacted (when=before: inputs; when=after: "
                                      "outputs).", labels=["pchannel", "when"])
        c_bytes = CounterMetricFamily(f"{ns}_compaction_bytes", "Bytes of compacted files (inputs, outputs).",
                                      labels=["pchannel", "when"])
        c_rows = CounterMetricFamily(f"{ns}_compaction_rows_dropped", "Rows removed for good: deleted at or before "
                                     "the compaction horizon.", labels=by_p)
        c_dels = CounterMetricFamily(f"{ns}_compaction_delete_entries_dropped", "Delete entries removed: no row "
                                     "left for them to remove.", labels=by_p)
        c_secs = CounterMetricFamily(f"{ns}_compaction_seconds", "Time spent compacting (passes that found nothing "
                                     "included).", labels=by_p)
        for name, (channel, _) in channels:
            stream = channel.stream
            for t in stream.chain.timings:
                step_s.add_metric([name, t.name], t.seconds)
                step_b.add_metric([name, t.name], t.batches)
                step_m.add_metric([name, t.name], t.messages)
            clock_last = stream.timetick.clock.last if stream.timetick.started else 0
            mvcc = stream.mvcc_timetick()
            allocated.add_metric([name], physical_ms(clock_last) / 1000)
            confirmed.add_metric([name], physical_ms(mvcc) / 1000)
            tick_lag.add_metric([name], max(now_ms - physical_ms(mvcc), 0) / 1000 if mvcc else 0.0)
            txns.add_metric([name], len(stream.txns.open_sessions()))
            wal = stream.wal
            modes = {"catchup": 0, "tailing": 0}
            behind = 0
            for sc in list(wal.scanners):
                modes["tailing" if sc.tailing else "catchup"] += 1
                behind += sc.backlog
            for mode, n in modes.items():
                scanners.add_metric([name, mode], n)
            backlog.add_metric([name], behind)
            wal_msgs.add_metric([name], max(wal.next_id - wal.first_id, 0))
            for group in channel.groups.names():
                # One series per vchannel the group has a position on (none before its first commit).
                for p in channel.groups.progress(group):
                    g_lag.add_metric([name, group, p.vchannel], p.lag_messages)
                    g_lag_s.add_metric([name, group, p.vchannel], p.lag_ms / 1000)
            if channel.flusher is not None:
                st = channel.flusher.stats()
                f_rows.add_metric([name], st.rows_written)
                f_del.add_metric([name], st.delete_rows_written)
                f_bytes.add_metric([name], st.bytes_written)
                f_files.add_metric([name], st.files_written)
                f_buf.add_metric([name], st.buffered_bytes)
                f_lag.add_metric([name], st.lag_ms / 1000)
                f_ckpt.add_metric([name], physical_ms(st.checkpoint.timetick) / 1000)
                f_disk.add_metric([name], self._m.tree_bytes(str(channel.flusher.root)))
                f_quar.add_metric([name], st.files_quarantined)
                f_lost.add_metric([name], st.files_lost)
            if channel.flusher is not None:
                cs = channel.flusher.compaction_stats()
                c_runs.add_metric([name], cs.runs)
                c_files.add_metric([name, "before"], cs.files_before)
                c_files.add_metric([name, "after"], cs.files_after)
                c_bytes.add_metric([name, "before"], cs.bytes_before)
                c_bytes.add_metric([name, "after"], cs.bytes_after)
                c_rows.add_metric([name], cs.rows_dropped)
                c_dels.add_metric([name], cs.delete_entries_dropped)
                c_secs.add_metric([name], cs.seconds)
            if channel.retention is not None:
                rs = channel.retention.stats()
                r_msgs.add_metric([name], rs.messages_truncated)
                r_bytes.add_metric([name], rs.bytes_truncated)
                s_count.add_metric([name], rs.snapshots_stored)
                s_secs.add_metric([name], rs.snapshot_seconds)
        yield from (step_s, step_b, step_m, allocated, confirmed, tick_lag, txns, scanners, backlog, wal_msgs,
                    g_lag, g_lag_s, f_rows, f_del, f_bytes, f_files, f_buf, f_lag, f_ckpt, f_disk, f_quar, f_lost,
                    r_msgs, r_bytes, c_runs, c_files, c_bytes, c_rows, c_dels, c_secs)
        yield from (s_count, s_secs)
        if self._m.data_dir is not None:
            yield GaugeMetricFamily(f"{ns}_wal_disk_bytes", "Bytes of the WAL database on disk (all pchannels).",
                                    value=self._m.wal_bytes)
        yield from storage_families(self._m.storage)
        yield from cluster_families(self._m.cluster)


__all__ = ["LATENCY_BUCKETS", "ChannelMetrics", "NodeMetrics"]
