"""The streaming job of docs/spark.md, run as it is written there (its block fenced as ``python spark-job``)
against a real node: orders in, one message per closed minute out, each exactly once."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from streamingnode.client import Client
from streamingnode.server import ServerThread
from tests.node_process import REPO
from tests.spark_stream.test_source import wait

pytestmark = pytest.mark.integration


def readme_job() -> str:
    text = (REPO / "docs" / "spark.md").read_text()
    found = re.search(r"^```python spark-job\n(.*?)\n```", text, re.DOTALL | re.MULTILINE)
    assert found is not None, "docs/spark.md has no spark-job block"
    return found.group(1)


ORDERS = [  # (item, amount, at): minutes 10:00 and 10:01 are closed once an order of 10:03 is read
    ("tea", 3.5, "2026-01-01T10:00:05Z"), ("cake", 4.0, "2026-01-01T10:00:40Z"),
    ("tea", 3.5, "2026-01-01T10:01:10Z"), ("jam", 6.0, "2026-01-01T10:03:00Z"),
]


def _per_minute(addr: str) -> list[dict[str, Any]]:
    with Client(addr) as client:
        latest, _ = client.latest_position("shop")
        if latest is None:
            return []
        out: list[dict[str, Any]] = []
        consumer = client.consumer("shop", "orders-per-minute")
        try:
            consumer.wait_opened()
            while True:
                pack = consumer.next(timeout=30)
                assert pack is not None, "no pack from the node"
                out += [json.loads(m.payload) for m in pack.messages if m.vchannel == "orders-per-minute"]
                if pack.end_ts >= latest.timetick:
                    return out
        finally:
            consumer.close()


def test_the_readme_job_counts_orders_per_minute(sspark: Any, node: ServerThread, tmp_path: Path) -> None:
    namespace: dict[str, Any] = {"__name__": "readme"}
    exec(compile(readme_job(), "docs/spark.md:spark-job", "exec"), namespace)
    with Client(node.address) as client:
        client.create_channels(["shop"])
        with client.producer("shop") as producer:
            for item, amount, at in ORDERS:
                producer.send("orders", json.dumps({"item": item, "amount": amount, "at": at}).encode())
    query = namespace["orders_per_minute"](sspark, node.address, str(tmp_path / "checkpoint"))
    try:
        wait(query, lambda: len(_per_minute(node.address)) >= 2, "two closed minutes in orders-per-minute")
    finally:
        query.stop()
    got = sorted(_per_minute(node.address), key=lambda r: r["minute"])
    assert [(r["minute"][:16], r["orders"], r["revenue"]) for r in got] == [
        ("2026-01-01T10:00", 2, 7.5), ("2026-01-01T10:01", 1, 3.5)]
