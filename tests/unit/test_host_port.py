"""host:port (streamingnode.wire.host_port): one parser and formatter, IPv6 brackets right, at each user.

The metrics line printed ``::1:9091`` for ``[::1]:9091``: an address no client can dial."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import pytest

from streamingnode.config import NodeConfig
from streamingnode.observability.metrics import NodeMetrics
from streamingnode.server.serve import is_loopback
from streamingnode.spark._options import OptionError, parse_connection
from streamingnode.wire.host_port import connectable, is_loopback_host, join_host_port, split_host_port
from tests.node_process import NodeProcess
from wal.errors import InvalidArgumentError


@pytest.mark.parametrize(("text", "parsed"), [
    ("127.0.0.1:9091", ("127.0.0.1", 9091)),
    ("localhost:0", ("localhost", 0)),
    ("[::1]:9091", ("::1", 9091)),
    ("[::]:0", ("::", 0)),
    (":9091", ("", 9091)),
    ("node-1.example:65535", ("node-1.example", 65535)),
])
def test_parse_and_format_round_trip(text: str, parsed: tuple[str, int]) -> None:
    assert split_host_port(text) == parsed
    assert join_host_port(*parsed) == text


@pytest.mark.parametrize("bad", ["::1:9091", "[::1]", "127.0.0.1", "h:", "h:x", "h:65536", "[h]:1", "[::1:1",
                                 "h:١٢", "h:-1", ""])
def test_refused(bad: str) -> None:
    with pytest.raises(ValueError, match=r"host:port, \[IPv6\]:port or :port|outside 0\.\.65535"):
        split_host_port(bad)


def test_connectable_and_loopback() -> None:
    assert connectable("::1", 9091) == "[::1]:9091"
    assert [connectable(h, 1) for h in ("", "0.0.0.0", "::")] == ["127.0.0.1:1"] * 3
    assert connectable("10.0.0.1", 1) == "10.0.0.1:1"
    assert [is_loopback_host(h) for h in ("localhost", "127.0.0.2", "::1", "", "0.0.0.0", "::", "example")] == [
        True, True, True, False, False, False, False]
    # The node's protected-mode test reads listen addresses through the parser.
    assert is_loopback("[::1]:19530") and is_loopback("localhost:1")
    assert not is_loopback("::1:19530")  # ambiguous: not taken for loopback
    assert not is_loopback("0.0.0.0:1")


def _status(url: str) -> int:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return int(resp.status)


async def test_metrics_address_of_an_ipv6_listener() -> None:
    metrics = NodeMetrics()
    try:
        address = await metrics.serve("[::1]:0")
        assert address.startswith("[::1]:"), address
        assert await asyncio.to_thread(_status, f"http://{address}/metrics") == 200
    finally:
        await metrics.aclose()


def test_config_refuses_what_is_no_address() -> None:
    assert NodeConfig(listen="[::1]:0", metrics_listen="[::1]:9091", advertise="[::1]:19530").listen == "[::1]:0"
    assert NodeConfig(metrics_listen="", advertise="").metrics_listen == ""
    for name in ("listen", "metrics_listen", "advertise"):
        with pytest.raises(InvalidArgumentError, match=f"{name}: not an address") as caught:
            NodeConfig(**{name: "::1:9091"})  # type: ignore[arg-type]
        assert caught.value.fields["field"] == name


def test_spark_source_addr() -> None:
    assert parse_connection({"addr": "[::1]:9091"}).addrs == ("[::1]:9091",)
    for bad in ("::1:9091", "h:0", ":9091"):
        with pytest.raises(OptionError, match="addr"):
            parse_connection({"addr": bad})


def test_cli_prints_the_metrics_address_in_brackets(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path / "data", None, "--metrics-listen", "[::1]:0").start()
    try:
        assert node.metrics_url is not None and node.metrics_url.startswith("http://[::1]:"), node.metrics_url
        with urllib.request.urlopen(node.metrics_url, timeout=10) as resp:
            assert resp.status == 200
    finally:
        node.kill()
