"""The node's metrics as Prometheus and Grafana see them.

A real ``streamingnode serve`` process runs a short load that touches every part of the dashboard
(produce, a consumer group that commits, a committed and a rolled-back transaction, a refused append,
a collection insert + delete + flush).  Debian's ``prometheus`` scrapes it every second; every query
of ``deploy/grafana/dashboards/streamingnode.json`` is then evaluated through Prometheus's HTTP API
and must return finite data.  The Cluster row's metrics exist only in cluster mode: the main load's
node is a single node, so those panels are checked apart, against a cluster-mode node (leases in a
one-server NATS JetStream) scraped the same way.  ``promtool check metrics`` checks the exposition, and
the label sets are
checked to stay bounded however much is produced.

Prometheus and promtool come from the Debian package that ``make test`` and ``.ci/run`` install; a
machine without them fails these tests rather than skipping them.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from interceptors.txn import TxnState
from streamingnode.client import AsyncClient
from streamingnode.v1 import streaming_pb2 as spb
from tests.node_process import REPO, NodeProcess, free_port
from tests.waiting import until
from wal.errors import ErrorCode, StreamingError
from wal.message import MessageType

pytestmark = pytest.mark.integration

DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "streamingnode.json"
PROMETHEUS_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
CHANNEL = "orders"
GROUP = "billing"
VCHANNEL = "eu"
TABLE_VCHANNEL = "rows"
SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("name", pa.string())])
# With a scrape every second, a 30 s window holds enough samples for rate() once the load has run a
# few seconds, and is short enough that every counter still moves inside it while the load goes on.
RATE_WINDOW = "30s"
# Series a node exports only in cluster mode (docs/cluster.md); their panels are checked by
# test_cluster_panels_return_data against a cluster-mode node.
CLUSTER_ONLY = ("streamingnode_pchannel_owned", "streamingnode_lease_expiry_seconds",
                "streamingnode_ownership_changes_total", "streamingnode_cluster_nodes",
                "streamingnode_clock_skew_seconds", "streamingnode_pchannels_closed_on_lease_loss_total")
LOAD_TIMEOUT = 90.0  # seconds of load before a query without data fails the test (it takes ~10 s)


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: `make test` and .ci/run install Debian's prometheus package")
    return path


# --- the load ------------------------------------------------------------------------------------
@dataclass
class Produced:
    """What the load wrote: none of it may show up as a label value."""

    payloads: set[str] = field(default_factory=set)
    message_ids: set[int] = field(default_factory=set)
    txn_ids: set[int] = field(default_factory=set)
    producer_ids: set[str] = field(default_factory=set)
    files: list[str] = field(default_factory=list)
    next_pk: int = 0


async def setup(client: AsyncClient) -> None:
    await client.create_channels([CHANNEL])
    await client.create_group(CHANNEL, GROUP)
    await client.data(CHANNEL).create_collection(TABLE_VCHANNEL, "items", SCHEMA, primary_key="pk")


async def load_round(client: AsyncClient, messages: int, seen: Produced) -> None:
    """One round of everything the dashboard shows; each round moves every counter it plots."""
    round_payloads: set[bytes] = set()
    producer_id = uuid.uuid4().hex
    seen.producer_ids.add(producer_id)
    async with client.producer(CHANNEL, producer_id=producer_id) as producer:
        futures = []
        for _ in range(messages):
            payload = f"payload-{uuid.uuid4().hex}".encode()
            round_payloads.add(payload)
            futures.append(producer.send_nowait(VCHANNEL, payload))
        for result in await asyncio.gather(*futures):
            seen.message_ids.add(result.message_id)
    seen.payloads.update(p.decode() for p in round_payloads)

    # A consumer group reads this round's messages and commits after every pack.
    async with client.consumer(CHANNEL, VCHANNEL, group=GROUP) as consumer:
        missing = set(round_payloads)
        async for pack in consumer:
            missing.difference_update(m.payload for m in pack.messages if m.message_type is MessageType.DATA)
            await consumer.ack(pack)
            if not missing:
                break

    async with client.txn(CHANNEL, VCHANNEL) as tx:
        seen.txn_ids.add(tx.txn_id)
        for _ in range(2):
            payload = f"txn-{uuid.uuid4().hex}"
            seen.payloads.add(payload)
            await tx.send(payload.encode())
    with pytest.raises(RuntimeError):
        async with client.txn(CHANNEL, VCHANNEL) as tx:
            seen.txn_ids.add(tx.txn_id)
            await tx.send(b"never delivered")
            raise RuntimeError("roll this one back")

    data = client.data(CHANNEL)
    pks = list(range(seen.next_pk, seen.next_pk + 20))
    seen.next_pk += len(pks)
    names = [f"name-{uuid.uuid4().hex}" for _ in pks]
    seen.payloads.update(names)
    await data.insert(TABLE_VCHANNEL, "items", pa.record_batch([pks, names], schema=SCHEMA))
    await data.delete(TABLE_VCHANNEL, "items", pks[:2])
    # Refused by the shard interceptor: the failure panel has something to show.
    with pytest.raises(StreamingError) as refused:
        await data.insert(TABLE_VCHANNEL, "no_such_table", pa.record_batch([pks, names], schema=SCHEMA))
    assert refused.value.code is ErrorCode.COLLECTION_NOT_EXIST
    files, _ = await data.flush(TABLE_VCHANNEL, "items")
    assert files, "the flush wrote no Parquet file"
    seen.files.extend(files)


# --- Prometheus ----------------------------------------------------------------------------------
class Prometheus:
    """Debian's prometheus scraping one target every second, in a temporary directory."""

    def __init__(self, workdir: Path, target: str) -> None:
        config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
        # The shipped config, pointed at the test's node and sped up.
        config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
        (job,) = config["scrape_configs"]
        job["static_configs"] = [{"targets": [target]}]
        self.job = job["job_name"]
        workdir.mkdir(parents=True, exist_ok=True)
        config_path = workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{free_port()}"
        self._log = (workdir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [_tool("prometheus"), f"--config.file={config_path}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address={self.url.removeprefix('http://')}", "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=workdir,
        )
        self.log_path = workdir / "prometheus.log"

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as resp:
            return json.loads(resp.read())

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited {self.proc.returncode}:\n{self.log_path.read_text()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.1)
        raise AssertionError(f"prometheus not ready in {timeout} s:\n{self.log_path.read_text()}")

    def query(self, expr: str) -> list[dict[str, Any]]:
        answer = self.get("/api/v1/query", query=expr)
        assert answer["status"] == "success", (expr, answer)
        assert answer["data"]["resultType"] == "vector", (expr, answer["data"]["resultType"])
        return list(answer["data"]["result"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)
        self._log.close()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProcess]:
    # Compaction every second, of every two small files: each load round flushes one, so the compaction
    # panels plot real passes.
    proc = NodeProcess(tmp_path / "data", None, "--compaction-interval-seconds", "1", "--compaction-min-files", "2",
                       "--compaction-horizon-seconds", "0").start()
    try:
        assert proc.metrics_url is not None, "the node did not report its metrics address"
        yield proc
    finally:
        proc.kill()


@pytest.fixture
def prometheus(tmp_path: Path, node: NodeProcess) -> Iterator[Prometheus]:
    assert node.metrics_url is not None
    prom = Prometheus(tmp_path / "prometheus", urllib.parse.urlsplit(node.metrics_url).netloc)
    try:
        prom.wait_ready()
        yield prom
    finally:
        prom.stop()


# --- the dashboard -------------------------------------------------------------------------------
def dashboard_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, also those folded into a collapsed row."""
    for panel in panels:
        yield panel
        yield from dashboard_panels(panel.get("panels", []))


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, expr) for every target of every panel."""
    dashboard = json.loads(DASHBOARD.read_text())
    queries = []
    for panel in dashboard_panels(dashboard["panels"]):
        if panel["type"] == "row":
            continue
        assert panel.get("targets"), f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            queries.append((panel["title"], target["expr"]))
    return queries


def cluster_only(expr: str) -> bool:
    return any(name in expr for name in CLUSTER_ONLY)


def substitute(expr: str, job: str) -> str:
    """What Grafana sends for one pchannel of one job, with a rate window that suits 1 s scrapes."""
    out = (expr.replace("$__rate_interval", RATE_WINDOW).replace("$__interval", "1s")
           .replace("$job", re.escape(job)).replace("$pchannel", re.escape(CHANNEL)))
    assert "$" not in out, f"a Grafana variable the test does not know: {out}"
    return out


def finite(result: list[dict[str, Any]]) -> bool:
    return bool(result) and all(math.isfinite(float(r["value"][1])) for r in result)


async def test_every_dashboard_query_returns_data(node: NodeProcess, prometheus: Prometheus) -> None:
    queries = [(title, expr, substitute(expr, prometheus.job)) for title, expr in dashboard_queries()
               if not cluster_only(expr)]
    assert len(queries) >= 40, "the dashboard lost most of its panels"
    loop = asyncio.get_running_loop()

    # The node must be scraped before the load starts: rate() needs samples from before and during it.
    async def target_up() -> bool:
        answer = await asyncio.to_thread(prometheus.query, f'up{{job="{prometheus.job}"}}')
        return bool(answer) and answer[0]["value"][1] == "1"

    await until(target_up, f"prometheus to scrape the node (its log: {prometheus.log_path})", timeout=30,
                interval=0.2)

    seen = Produced()
    pending: dict[str, Any] = {}
    async with AsyncClient(node.address) as client:
        await setup(client)
        started = loop.time()
        deadline = started + LOAD_TIMEOUT
        while True:
            await load_round(client, 50, seen)
            # Rounds keep going until every panel has data: a counter needs two scrapes inside the
            # window that saw it move, so the first seconds of load cannot satisfy rate() yet.
            if loop.time() - started < 3:
                continue
            results = await asyncio.gather(*(asyncio.to_thread(prometheus.query, q) for _, _, q in queries))
            pending = {f"{title}: {q}": r for (title, _, q), r in zip(queries, results, strict=True) if not finite(r)}
            if not pending:
                break
            assert loop.time() < deadline, (
                f"dashboard queries without finite data after {LOAD_TIMEOUT} s of load:\n"
                + "\n".join(f"{q} -> {r}" for q, r in pending.items()))
            await asyncio.sleep(0.5)

    # The template variables resolve to the node's job and pchannel, as Grafana's pickers would.
    jobs = await asyncio.to_thread(prometheus.get, "/api/v1/label/job/values", **{"match[]": "streamingnode_pchannels"})
    assert prometheus.job in jobs["data"]
    channels = await asyncio.to_thread(
        prometheus.get, "/api/v1/label/pchannel/values",
        **{"match[]": f'streamingnode_wal_messages{{job=~"{prometheus.job}"}}'})
    assert channels["data"] == [CHANNEL]

    # Values a correct node must show after this load, so a panel cannot pass on an all-zero series.
    def value(expr: str) -> float:
        (sample,) = prometheus.query(substitute(expr, prometheus.job))
        return float(sample["value"][1])

    assert await asyncio.to_thread(value, 'sum(streamingnode_flusher_files_total{pchannel=~"$pchannel"})') >= 1
    assert await asyncio.to_thread(value, 'sum(streamingnode_compactions_total{pchannel=~"$pchannel"})') >= 1
    assert await asyncio.to_thread(
        value, 'sum(streamingnode_txn_duration_seconds_count{pchannel=~"$pchannel",outcome="rolled_back"})') >= 1
    ok_appends = 'streamingnode_append_messages_total{pchannel=~"$pchannel",status="ok"}'
    assert await asyncio.to_thread(value, f"sum(rate({ok_appends}[$__rate_interval]))") > 0
    assert await asyncio.to_thread(
        value, 'sum(rate(streamingnode_consume_messages_total{pchannel=~"$pchannel"}[$__rate_interval]))') > 0


# --- exposition and cardinality ------------------------------------------------------------------
def scrape(node: NodeProcess) -> str:
    assert node.metrics_url is not None
    with urllib.request.urlopen(node.metrics_url, timeout=10) as resp:
        return str(resp.read().decode())


def series(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], str]:
    """Every sample's identity (name and labels), mapped to its family name."""
    return {(s.name, frozenset(s.labels.items())): family.name
            for family in text_string_to_metric_families(text) for s in family.samples}


# Label names of the whole exposition: the node's own, and prometheus_client's process/GC/platform ones.
NODE_LABELS = {"pchannel", "message_type", "status", "interceptor", "mode", "group", "vchannel", "outcome", "le",
               "limit", "volume", "when", "reason", "rpc", "code"}
CLIENT_LABELS = {"generation", "implementation", "major", "minor", "patchlevel", "version"}
STATUSES = ({"ok", "deadline_exceeded", "cancelled", "unknown"}
            | {c.name.lower() for c in ErrorCode})


def check_label_values(name: str, value: str) -> None:
    """A node label value comes from a short, known list — never from what users sent."""
    allowed: dict[str, set[str]] = {
        "pchannel": {CHANNEL},
        "group": {GROUP},
        "vchannel": {VCHANNEL},  # only where a group has a position: the lag gauges
        "message_type": {t.name.lower() for t in MessageType},
        "status": STATUSES,
        "outcome": {s.name.lower() for s in TxnState},
        "mode": {"catchup", "tailing"},
        "limit": {"node", "connection"},
        "volume": {"data", "parquet"},
        "when": {"before", "after"},
        "reason": {"taken", "released", "expired", "lost"},
        "rpc": {m.name for m in spb.DESCRIPTOR.services_by_name["StreamingNode"].methods},  # the refusals
        "code": {c.name.lower() for c in ErrorCode},
    }
    if name in allowed:
        assert value in allowed[name], f"label {name}={value!r} is not one of {sorted(allowed[name])}"
    elif name == "interceptor":
        assert re.fullmatch(r"[a-z_]{1,32}", value), f"interceptor={value!r} does not look like a step name"
    elif name == "le":
        float(value)  # a bucket bound


async def test_metrics_pass_promtool_and_stay_bounded(node: NodeProcess) -> None:
    seen = Produced()
    async with AsyncClient(node.address) as client:
        await setup(client)
        await load_round(client, 100, seen)
        small = scrape(node)
        await load_round(client, 1000, seen)
        large = scrape(node)

    checked = subprocess.run([_tool("promtool"), "check", "metrics"], input=large, capture_output=True, text=True,
                             check=False, timeout=60)
    assert checked.returncode == 0, f"promtool check metrics:\n{checked.stdout}{checked.stderr}"

    # Eleven times the messages, transactions and rows: not one series more.
    small_series, large_series = series(small), series(large)
    assert set(large_series) == set(small_series), (
        f"new series: {sorted(set(large_series) - set(small_series), key=str)[:10]}")
    own = {key: fam for key, fam in large_series.items() if fam.startswith("streamingnode_")}
    assert len(own) < 400, f"{len(own)} node series for one pchannel and one group"

    # Operators see only what a panel shows: every family the node exports is on the dashboard.
    exprs = " ".join(expr for _, expr in dashboard_queries())
    # (The text parser reports prometheus_client's ``*_created`` timestamps as families of their own.)
    families = {f for f in large_series.values() if f.startswith("streamingnode_") and not f.endswith("_created")}
    assert families, "no node metrics in the scrape"
    assert not {f for f in families if f not in exprs}, "node metrics on no dashboard panel"

    assert len(seen.message_ids) > 1000 and len(seen.payloads) > 1000  # the load really made what is checked
    check_labels(series(large), seen)


def check_labels(scraped: dict[tuple[str, frozenset[tuple[str, str]]], str], seen: Produced) -> None:
    """No label name outside the known few; no node label value outside its list; nothing user-made."""
    ids = {str(i) for i in seen.message_ids | seen.txn_ids}
    for (name, labels), family in scraped.items():
        label_names = {k for k, _ in labels}
        assert label_names <= NODE_LABELS | CLIENT_LABELS, f"{name} has unexpected labels {label_names}"
        for key, value in labels:
            assert value not in seen.payloads and value not in seen.producer_ids, f"{name}: user data in {key}"
            if family.startswith("streamingnode_"):
                assert key in NODE_LABELS, f"{name}: label {key}"
                assert value not in ids, f"{name}: {key}={value!r} is a message or transaction id"
                check_label_values(key, value)


@pytest.mark.parametrize("line", [
    'streamingnode_append_messages_total{pchannel="orders",message_type="data",status="ok",txn="7"} 1',
    'streamingnode_append_messages_total{pchannel="orders",message_type="data",status="7"} 1',
    'streamingnode_consume_messages_total{pchannel="payload-x"} 1',
    'streamingnode_consumer_group_lag_messages{pchannel="orders",group="other"} 1',
    'python_gc_collections_total{generation="payload-x"} 1',
])
def test_label_check_rejects_unbounded_values(line: str) -> None:
    # The check above passes on a correct node; these show what it would catch.
    seen = Produced(payloads={"payload-x"}, message_ids={7}, txn_ids={8})
    with pytest.raises(AssertionError):
        check_labels(series(line + "\n"), seen)


# --- cluster mode ----------------------------------------------------------------------------------
@pytest.fixture
def cluster_node(tmp_path: Path) -> Iterator[NodeProcess]:
    """A cluster-mode node (leases in a one-server NATS JetStream) that owns CHANNEL."""
    from tests.natscluster import NatsCluster  # noqa: PLC0415

    nats = NatsCluster(tmp_path / "nats", 1)
    nats.start()
    try:
        asyncio.run(nats.ready())
        proc = NodeProcess(tmp_path / "data", None, "--cluster-nats", nats.url, "--node-id", "a",
                           "--channels", CHANNEL, "--lease-seconds", "3").start()
        try:
            yield proc
        finally:
            proc.kill()
    finally:
        nats.stop()


async def test_cluster_panels_return_data(cluster_node: NodeProcess, tmp_path: Path) -> None:
    queries = [(title, expr) for title, expr in dashboard_queries() if cluster_only(expr)]
    # Owner, lease, nodes and ownership-change panels: every cluster metric is on one.
    assert {name for name in CLUSTER_ONLY if any(name in expr for _, expr in queries)} == set(CLUSTER_ONLY)
    assert cluster_node.metrics_url is not None
    prometheus = Prometheus(tmp_path / "prometheus", urllib.parse.urlsplit(cluster_node.metrics_url).netloc)
    try:
        await asyncio.to_thread(prometheus.wait_ready)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LOAD_TIMEOUT
        # A node serves no load here: the lease loop alone moves these series (taken at start, renewed).
        while True:
            substituted = [(f"{title}: {expr}", substitute(expr, prometheus.job)) for title, expr in queries]
            results = await asyncio.gather(*(asyncio.to_thread(prometheus.query, q) for _, q in substituted))
            pending = {name: r for (name, _), r in zip(substituted, results, strict=True) if not finite(r)}
            if not pending:
                break
            assert loop.time() < deadline, "cluster panels without finite data:\n" + "\n".join(
                f"{q} -> {r}" for q, r in pending.items())
            await asyncio.sleep(0.5)

        def value(expr: str) -> float:
            (sample,) = prometheus.query(substitute(expr, prometheus.job))
            return float(sample["value"][1])

        # The node owns the pchannel, holds time on its lease, sees itself, and took the lease once.
        assert await asyncio.to_thread(value, 'sum(streamingnode_pchannel_owned{pchannel=~"$pchannel"})') == 1
        assert 0 < await asyncio.to_thread(value, 'min(streamingnode_lease_expiry_seconds{pchannel=~"$pchannel"})') <= 3
        assert await asyncio.to_thread(value, "max(streamingnode_cluster_nodes)") == 1
        assert await asyncio.to_thread(
            value, 'sum(streamingnode_ownership_changes_total{pchannel=~"$pchannel",reason="taken"})') == 1
    finally:
        prometheus.stop()
    check_labels(series(scrape(cluster_node)), Produced())
