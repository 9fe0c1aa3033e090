"""``streamingnode serve`` as a real process: health while serving and draining, SIGTERM exits 0 with
every acknowledged message durable, restart keeps the data, configuration from a TOML file."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from streamingnode.client import AsyncClient
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from streamingnode.wire.codes import from_rpc_error
from tests.node_process import REPO, NodeProcess, free_port
from wal.errors import ErrorCode, MessageTooLargeError
from wal.message import MessageType

pytestmark = pytest.mark.integration


async def test_sigterm_drains_reports_not_serving_and_exits_zero(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path / "data", None, "--channels", "ch", "--drain-seconds", "3").start()
    try:
        async with grpc.aio.insecure_channel(node.address) as channel, AsyncClient(
                node.address, reconnect_timeout=1.0) as client:
            health = health_pb2_grpc.HealthStub(channel)
            watch = health.Watch(health_pb2.HealthCheckRequest(service="streamingnode.v1.StreamingNode"))
            first = await watch.read()
            assert first.status == health_pb2.HealthCheckResponse.SERVING
            # A tailing read: draining must end it at once with ON_SHUTDOWN, not hold the shutdown.
            tail = sgrpc.StreamingNodeStub(channel).Consume()
            await tail.write(spb.ConsumeRequest(open=spb.ConsumeOpen(pchannel="ch")))
            assert (await tail.read()).WhichOneof("response") == "opened"

            producer = client.producer("ch", linger=0.001)
            futures = [producer.send_nowait("v", f"m{i:05}".encode()) for i in range(3000)]
            await futures[0]
            assert node.proc is not None
            node.proc.send_signal(15)  # SIGTERM while most of the batches are still in flight
            update = await watch.read()
            assert update.status == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                while await tail.read() is not grpc.aio.EOF:
                    pass
            assert from_rpc_error(ended.value).code is ErrorCode.ON_SHUTDOWN
            results = await asyncio.gather(*futures, return_exceptions=True)
            acked = {f"m{i:05}".encode() for i, r in enumerate(results) if not isinstance(r, BaseException)}
            with contextlib.suppress(Exception):  # the node is gone: closing may or may not complain
                await producer.aclose()
        assert node.proc.wait(30) == 0, "".join(node.stderr[-30:])
        assert any("node stopped" in line for line in node.stderr)
        assert len(acked) >= 1

        node.start()  # the same data directory: every acknowledged message is there once
        async with AsyncClient(node.address) as client, client.consumer("ch") as consumer:
            got: list[bytes] = []
            async with asyncio.timeout(30):
                async for pack in consumer:
                    got += [m.payload for m in pack.messages if m.message_type is MessageType.DATA]
                    if len(got) >= len(acked):
                        break
            assert acked <= set(got) and len(got) == len(set(got))
    finally:
        node.kill()


async def test_config_file_env_and_flags(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text('durability = "relaxed"\nchannels = ["from-file"]\nmax_message_bytes = 1024\n')

    env = dict(os.environ, STREAMINGNODE_MAX_MESSAGE_BYTES="2048")
    node = NodeProcess(tmp_path / "data", None, "--config", str(config), env=env).start()
    try:
        async with AsyncClient(node.address) as client:
            (desc,) = await client.describe_channels()
            assert desc.name == "from-file"
            producer = client.producer("from-file")
            await producer.send("v", b"x" * 1500)  # env (2048) overrides the file (1024)
            with pytest.raises(MessageTooLargeError, match="over the limit of 2048"):
                await producer.send("v", b"x" * 3000)
            await producer.aclose()
    finally:
        node.kill()
    bad = tmp_path / "bad.toml"
    bad.write_text("durabilty = 'sync'\n")
    broken = NodeProcess(tmp_path / "data2", None, "--config", str(bad))
    with pytest.raises(AssertionError, match="unknown key 'durabilty'"):
        broken.start(timeout=30)


async def test_metrics_on_by_default_and_a_taken_port_is_a_clear_error(tmp_path: Path) -> None:
    import urllib.request  # noqa: PLC0415

    node = NodeProcess(tmp_path / "data", None, "--channels", "ch").start()
    try:
        assert node.metrics_url is not None
        with urllib.request.urlopen(node.metrics_url, timeout=10) as resp:
            text = resp.read().decode()
        assert 'streamingnode_wal_messages{pchannel="ch"}' in text
        assert "process_resident_memory_bytes" in text
        taken = node.metrics_url.removeprefix("http://").removesuffix("/metrics")
        # A second node whose metrics port is taken refuses to start, naming the address, and leaves
        # no half-started node behind (its gRPC port is free again afterwards).
        second = NodeProcess(tmp_path / "data2", None, "--metrics-listen", taken)
        with pytest.raises(AssertionError, match=f"cannot serve metrics on '{taken}'"):
            second.start(timeout=30)
        assert second.proc is not None and second.proc.returncode not in (None, 0)
    finally:
        node.kill()
    off = NodeProcess(tmp_path / "data3", None, "--metrics-listen", "").start()
    try:
        assert off.metrics_url is None
    finally:
        off.kill()


async def test_protected_mode_in_a_real_process(tmp_path: Path) -> None:
    """Every interface without authentication: refused, naming the flag; the environment variable
    that accepts the risk lets it start (and it says so in its log)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMINGNODE_")}
    port = free_port()
    refused = subprocess.run(
        [sys.executable, "-m", "streamingnode", "serve", "--data-dir", str(tmp_path / "data"), "--listen",
         f"0.0.0.0:{port}", "--metrics-listen", ""], capture_output=True, text=True, timeout=60, check=False,
        cwd=REPO, env=env)
    assert refused.returncode == 1, refused.stderr
    assert "INVALID_ARGUMENT" in refused.stderr and "--allow-unauthenticated" in refused.stderr
    assert not (tmp_path / "data").exists()

    node = NodeProcess(tmp_path / "data", port, "--listen", f"0.0.0.0:{port}",
                       env={**env, "STREAMINGNODE_ALLOW_UNAUTHENTICATED": "1"}).start()
    try:
        async with AsyncClient(node.address) as client:
            assert await client.describe_channels() == []
    finally:
        assert node.terminate() == 0
    assert any("without authentication" in line for line in node.stderr)
