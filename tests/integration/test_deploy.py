"""The container's health check script against a real node: healthy while serving, not otherwise; the
container's command with the tokens secret the deploy files give it (and refused without)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from streamingnode.client import AsyncClient
from streamingnode.server.auth import TokenTable, hash_token
from tests.node_process import REPO, NodeProcess, free_port
from wal.errors import UnauthenticatedError

pytestmark = pytest.mark.integration

SCRIPT = REPO / "deploy" / "docker" / "grpc_health_check.py"


def check(address: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), address], capture_output=True, text=True, timeout=60,
                          check=False)


def test_health_check_script(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path / "data").start()
    try:
        serving = check(node.address)
        assert serving.returncode == 0, serving.stderr
    finally:
        assert node.terminate() == 0
    # Nobody listens there any more: the same check reports the node unhealthy.
    gone = check(node.address)
    assert gone.returncode == 1 and "unhealthy" in gone.stderr, gone.stderr
    nothing = check(f"127.0.0.1:{free_port()}")
    assert nothing.returncode == 1


# --- the tokens secret: the containers listen on every interface, so they must authenticate ----------

DOCKER_CMD = json.loads(re.search(r"^CMD (\[.*\])$", (REPO / "deploy" / "Dockerfile").read_text(), re.M).group(1))  # type: ignore[union-attr]


def _yaml(relative: str) -> list[Any]:
    return [d for d in yaml.safe_load_all((REPO / "deploy" / relative).read_text()) if d is not None]


def test_containers_listen_everywhere_and_read_tokens_from_a_secret() -> None:
    assert DOCKER_CMD[DOCKER_CMD.index("--listen") + 1].startswith("0.0.0.0:")
    # compose: the environment names the file compose mounts for the secret, and the secret has a source.
    compose = _yaml("compose.yaml")[0]
    node = compose["services"]["node"]
    path = node["environment"]["STREAMINGNODE_AUTH_TOKENS"]
    (secret,) = [s for s in node["secrets"] if path == f"/run/secrets/{s}"]
    assert "file" in compose["secrets"][secret]
    # Kubernetes: the variable names a file of a read-only mount of the Secret the kustomization generates.
    (sts,) = [d for d in _yaml("kubernetes/statefulset.yaml") if d["kind"] == "StatefulSet"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    assert container["args"][container["args"].index("--listen") + 1].startswith("0.0.0.0:")
    env = {e["name"]: e.get("value") for e in container["env"]}
    directory, _, name = env["STREAMINGNODE_AUTH_TOKENS"].rpartition("/")
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == directory]
    assert mount["readOnly"] is True
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    secret_name = volumes[mount["name"]]["secret"]["secretName"]
    generators = {g["name"]: g for g in _yaml("kubernetes/kustomization.yaml")[0]["secretGenerator"]}
    assert name in [f.rpartition("=")[2].rpartition("/")[2] for f in generators[secret_name]["files"]]
    # The example the operator starts from is a valid tokens file.
    assert repr(TokenTable.load(REPO / "deploy" / "tokens.example.toml")) == "TokenTable(2 tokens)"


def _container_args(port: int) -> list[str]:
    """The image's serve arguments after the ones NodeProcess sets, on a free port."""
    listen = DOCKER_CMD[DOCKER_CMD.index("--listen") + 1]
    return ["--listen", listen.replace(":19530", f":{port}")]


async def test_the_container_command_needs_the_tokens_and_serves_with_them(tmp_path: Path) -> None:
    port = free_port()
    refused = subprocess.run(
        [sys.executable, "-m", "streamingnode", "serve", "--data-dir", str(tmp_path / "refused"),
         *_container_args(port)], capture_output=True, text=True, timeout=60, check=False, cwd=REPO,
        env={k: v for k, v in os.environ.items() if not k.startswith("STREAMINGNODE_")})
    assert refused.returncode == 1 and "--allow-unauthenticated" in refused.stderr, refused.stderr

    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'[[token]]\nprincipal = "ops"\nsha256 = "{hash_token("s3cret-ops")}"\npermissions = ["admin"]\n')
    env = dict(os.environ, STREAMINGNODE_AUTH_TOKENS=str(tokens))
    env.pop("STREAMINGNODE_TOKEN", None)
    node = NodeProcess(tmp_path / "data", port, *_container_args(port), env=env).start()
    try:
        assert check(node.address).returncode == 0  # health stays open for the HEALTHCHECK and probes
        async with AsyncClient(node.address, token="") as anonymous:
            with pytest.raises(UnauthenticatedError):
                await anonymous.create_channels(["c"])
        async with AsyncClient(node.address, token="s3cret-ops") as ops:
            assert await ops.create_channels(["c"]) == ["c"]
    finally:
        assert node.terminate() == 0
    assert not any("s3cret-ops" in line for line in node.stderr)
