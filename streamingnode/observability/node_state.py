"""Node-wide state read at scrape time, beside the per-pchannel families of ``metrics``: cluster
ownership (leases held and known, live nodes, clock skew) and the free-space guard."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from streamingnode.cluster.ownership import Ownership
    from streamingnode.node.disk_guard import StorageMonitor

NAMESPACE = "streamingnode"


def cluster_families(ownership: Ownership | None) -> Iterator[Metric]:
    """Cluster mode's families: the leases this node holds and knows of, the live nodes, the clock skew."""
    if ownership is None:
        return
    ns = NAMESPACE
    now = time.monotonic()
    owned = GaugeMetricFamily(f"{ns}_pchannel_owned", "Cluster mode: 1 while this node holds the pchannel's "
                              "lease, 0 for the other pchannels it knows of.", labels=["pchannel"])
    expiry = GaugeMetricFamily(f"{ns}_lease_expiry_seconds", "Cluster mode: time left on this node's lease of "
                               "the pchannel before it must stop serving it without a renewal.",
                               labels=["pchannel"])
    for name in sorted({*ownership.view.leases, *ownership.held}):
        held = ownership.held.get(name)
        owned.add_metric([name], 1 if held is not None else 0)
        if held is not None:
            expiry.add_metric([name], max(held.valid_until - now, 0.0))
    yield owned
    yield expiry
    yield GaugeMetricFamily(f"{ns}_cluster_nodes", "Cluster mode: live nodes this node sees (itself included).",
                            value=len(ownership.view.live))
    skew = ownership.membership.clock_skew
    if skew is not None:
        yield GaugeMetricFamily(f"{ns}_clock_skew_seconds", "Cluster mode: how far this node's wall clock is "
                                "ahead of the NATS server's (negative: behind), from its last heartbeat.",
                                value=skew)

def storage_families(storage: StorageMonitor | None) -> Iterator[Metric]:
    """The free-space guard's families (docs/operations.md, \"A full disk\")."""
    if storage is None:
        return
    ns = NAMESPACE
    free = GaugeMetricFamily(f"{ns}_storage_free_bytes", "Free bytes on each volume the node writes to "
                             "(data: RocksDB and its journal; parquet: the flusher's files), as last read.",
                             labels=["volume"])
    for volume, value in sorted(storage.free.items()):
        free.add_metric([volume], value)
    yield free
    yield GaugeMetricFamily(f"{ns}_storage_min_free_bytes", "The low-water mark: under it appends are "
                            "refused (STORAGE_FULL) and the node flushes and truncates at once.",
                            value=storage.min_free_bytes)
    yield GaugeMetricFamily(f"{ns}_storage_full", "1 while appends are refused for lack of free space.",
                            value=1 if storage.low is not None else 0)
    yield CounterMetricFamily(f"{ns}_storage_refused_appends", "Append batches refused with STORAGE_FULL "
                              "while free space was under the mark.", value=storage.refused_appends())
    yield CounterMetricFamily(f"{ns}_storage_reliefs", "Forced flush-and-retention runs started because "
                              "free space was under the mark.", value=storage.reliefs)
