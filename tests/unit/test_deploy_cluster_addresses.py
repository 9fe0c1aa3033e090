"""The cluster deployments advertise addresses that the other containers (and pods) can reach: NOT_OWNER
and DescribeChannels hand a node's advertised address to clients and to the other nodes, so a
``localhost`` there sends everyone else to themselves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
LOOPBACK = ("localhost", "127.", "::1", "[::1]", "0.0.0.0")


def flag(argv: list[str], name: str) -> str:
    """The value of ``--name value`` or ``--name=value`` in ``argv``."""
    for i, arg in enumerate(argv):
        if arg == name:
            return argv[i + 1]
        if arg.startswith(f"{name}="):
            return arg.partition("=")[2]
    raise AssertionError(f"{name} not in {argv}")


def compose_nodes() -> dict[str, dict[str, Any]]:
    services = yaml.safe_load((DEPLOY / "compose.cluster.yaml").read_text())["services"]
    nodes = {n: s for n, s in services.items() if s.get("command", [""])[0] == "streamingnode"}
    assert len(nodes) >= 2, sorted(services)
    return nodes


def test_compose_nodes_advertise_their_service_name_on_the_port_they_listen_and_publish() -> None:
    for name, service in compose_nodes().items():
        advertise = flag(service["command"], "--advertise")
        host, _, port = advertise.rpartition(":")
        assert not host.startswith(LOOPBACK), f"{name} advertises {advertise}: no other container reaches it"
        # The other containers reach a service by its name on the compose network.
        assert host == name or host in service.get("networks", {}).get("default", {}).get("aliases", []), (
            f"{name} advertises {advertise}, which is not its own service name")
        assert flag(service["command"], "--listen").rpartition(":")[2] == port, name
        # Published on the same port, so a host that maps the service names to itself reaches the
        # advertised address as it is (see the file's header).
        assert f"{port}:{port}" in service["ports"], name


def test_compose_nodes_advertise_distinct_addresses() -> None:
    advertised = [flag(s["command"], "--advertise") for s in compose_nodes().values()]
    assert len(set(advertised)) == len(advertised), advertised


def test_kubernetes_nodes_advertise_their_pod_ip_from_the_downward_api() -> None:
    docs = [d for d in yaml.safe_load_all((DEPLOY / "kubernetes/cluster/nodes.yaml").read_text()) if d]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    argv = container["command"] + container["args"]
    host, _, port = flag(argv, "--advertise").rpartition(":")
    assert not host.startswith(LOOPBACK)
    assert host == "$(POD_IP)", "each pod must advertise its own address, not a Service's (one of several pods)"
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert {p["containerPort"] for p in container["ports"]} >= {int(port)}
    assert flag(argv, "--listen").rpartition(":")[2] == port
    # One id per pod: the pod name (a Deployment's pods are named uniquely).
    assert flag(argv, "--node-id") == "$(POD_NAME)"
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
