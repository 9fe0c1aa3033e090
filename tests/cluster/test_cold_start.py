"""Cold start: three nodes started at the same moment as a fresh three-server NATS cluster all come up.

While the cluster forms, NATS answers with every transient error it has (connection refused, no
responders — which nats-py reports to JetStream callers as ``NoStreamResponseError`` — no meta leader
yet, peers not yet joined for an R3 bucket); a node must ride them out, not exit.

``COLD_STARTS`` (environment) sets how many fresh clusters are tried, 2 by default:

    COLD_STARTS=10 .venv/bin/python -m pytest tests/cluster/test_cold_start.py -q -p no:cacheprovider
"""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from streamingnode.client import Client
from tests.natscluster import NatsCluster
from tests.node_process import NodeProcess

pytestmark = pytest.mark.integration

TRIES = int(os.environ.get("COLD_STARTS", "2"))
CHANNELS = ("p0", "p1", "p2")
_prefixes = itertools.count()


@pytest.mark.parametrize("attempt", range(TRIES))
def test_three_nodes_started_with_a_fresh_three_server_nats_cluster_all_start_and_serve(
    tmp_path: Path, attempt: int,
) -> None:
    cluster = NatsCluster(tmp_path / "nats", 3)
    prefix = f"cold{next(_prefixes)}"
    nodes = [NodeProcess(tmp_path / n, None, "--wal", "jetstream", "--nats", cluster.url, "--nats-replicas", "3",
                         "--node-id", n, "--cluster-prefix", prefix, "--lease-seconds", "3",
                         "--channels", ",".join(CHANNELS), "--parquet-root", str(tmp_path / "parquet"))
             for n in ("a", "b", "c")]
    try:
        cluster.start()  # not waited for: the nodes start while it forms
        with ThreadPoolExecutor(len(nodes)) as pool:
            for started in [pool.submit(node.start, 120.0) for node in nodes]:
                started.result()  # AssertionError with the node's log when it did not come up
        with Client([n.address for n in nodes], reconnect_timeout=60) as client:
            for p in CHANNELS:
                with client.producer(p) as producer:
                    producer.send("v", f"{p} after a cold start".encode())
    finally:
        for node in nodes:
            node.kill()
        cluster.stop()
