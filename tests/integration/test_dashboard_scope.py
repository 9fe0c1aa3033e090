"""Every dashboard panel shows the node and nothing else, with the job picker on "All".

Prometheus here scrapes, besides the node (under the shipped job), itself under a job of its own and,
like a Kubernetes pod-annotation job, the node and itself together under a third.  Prometheus exports
the same ``process_*`` series as the node.  The job picker's "All" is expanded as Grafana expands it
(the variable's ``allValue`` when it has one, else every value its query finds, joined in a regex), and
every panel query must then give exactly what it gives restricted to the node's own instance: no CPU,
memory or file descriptors of another process mixed in.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.test_prometheus import DASHBOARD, PROMETHEUS_CONFIG, _tool, dashboard_panels
from tests.node_process import NodeProcess, free_port
from tests.waiting import until_sync

pytestmark = pytest.mark.integration

RATE_WINDOW = "30s"
OTHER_JOB = "prometheus"
MIXED_JOB = "pods"


class ScopedPrometheus:
    """Prometheus scraping the node under the shipped job, itself, and both under one more job."""

    def __init__(self, workdir: Path, node: str) -> None:
        config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
        config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
        (job,) = config["scrape_configs"]
        self.node_job = job["job_name"]
        self.url = f"http://127.0.0.1:{free_port()}"
        itself = self.url.removeprefix("http://")
        job["static_configs"] = [{"targets": [node]}]
        config["scrape_configs"] += [
            {"job_name": OTHER_JOB, "static_configs": [{"targets": [itself]}]},
            {"job_name": MIXED_JOB, "static_configs": [{"targets": [node, itself]}]},
        ]
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log_path = workdir / "prometheus.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [_tool("prometheus"), f"--config.file={workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address={itself}", "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=workdir)

    def get(self, path: str, **params: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}?{urllib.parse.urlencode(params)}", timeout=10) as resp:
            answer = json.loads(resp.read())
        assert answer["status"] == "success", (path, params, answer)
        return answer["data"]

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", query=expr, time=str(at))
        assert data["resultType"] == "vector", expr
        return list(data["result"])

    def ready(self) -> bool:
        assert self.proc.poll() is None, f"prometheus exited:\n{self.log_path.read_text()}"
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(15)
        self._log.close()


@pytest.fixture
def scoped(tmp_path: Path) -> Iterator[tuple[ScopedPrometheus, str]]:
    node = NodeProcess(tmp_path / "data", None, "--channels", "orders").start()
    try:
        assert node.metrics_url is not None
        instance = urllib.parse.urlsplit(node.metrics_url).netloc
        prom = ScopedPrometheus(tmp_path / "prometheus", instance)
        try:
            until_sync(prom.ready, "prometheus ready", timeout=30)
            yield prom, instance
        finally:
            prom.stop()
    finally:
        node.kill()


def grafana_regex(values: list[str]) -> str:
    """A multi-value variable's values as Grafana's Prometheus data source writes them into ``=~``."""
    escaped = [re.sub(r"[$^*{}\[\]'+?.()|\\]", lambda m: "\\\\" + m.group(0), v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def expand_all(variable: dict[str, Any], prom: ScopedPrometheus, known: dict[str, str]) -> str:
    """What Grafana puts for ``$<name>`` with "All" picked."""
    if variable.get("allValue"):
        return str(variable["allValue"])
    query = variable["query"]["query"]
    found = re.fullmatch(r"label_values\((.+), (\w+)\)", query)
    assert found, f"a variable query the test does not know: {query}"
    selector = found.group(1)
    for name, value in known.items():
        selector = selector.replace(f"${name}", value)
    values = sorted(prom.get(f"/api/v1/label/{found.group(2)}/values", **{"match[]": selector}))
    assert values, f"${variable['name']} finds no value: {selector}"
    return grafana_regex(values)


def pinned(expr: str, instance: str) -> str:
    """The query restricted to one instance: every selector gets ``instance="..."``."""
    return re.sub(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{", lambda m: f'{m.group(1)}{{instance="{instance}",', expr)


def answer(result: list[dict[str, Any]]) -> dict[frozenset[tuple[str, str]], str]:
    return {frozenset(r["metric"].items()): r["value"][1] for r in result}


def test_every_panel_shows_only_the_node_with_all_jobs_picked(scoped: tuple[ScopedPrometheus, str]) -> None:
    prom, node = scoped
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}

    def scraped_both() -> bool:
        # Every job has two scrapes of every target, so the rate() of process CPU exists for each.
        return len(prom.query(f"count_over_time(up[{RATE_WINDOW}]) >= 2", time.time())) == 4

    until_sync(scraped_both, "two scrapes of each target", timeout=60, interval=0.2)

    known: dict[str, str] = {}
    for name in ("job", "pchannel"):
        known[name] = expand_all(variables[name], prom, known)
    # "All" jobs are the node's: a job with no node in it (Prometheus' own) is not picked.
    at = time.time()  # every query below is evaluated at this one instant, so answers compare
    picked = {r["metric"]["job"] for r in prom.query(f'count by (job) (up{{job=~"{known["job"]}"}})', at)}
    assert picked == {prom.node_job, MIXED_JOB}, f"All picks {sorted(picked)}"

    checked, with_data, process = 0, 0, 0
    for panel in dashboard_panels(dashboard["panels"]):
        if panel["type"] == "row":
            continue
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", RATE_WINDOW)
            for name, value in known.items():
                expr = expr.replace(f"${name}", value)
            assert "$" not in expr, f"a Grafana variable the test does not know: {expr}"
            got = answer(prom.query(expr, at))
            only_node = answer(prom.query(pinned(expr, node), at))
            assert got == only_node, (
                f"{panel['title']!r} {target['refId']} shows more than the node:\n{expr}\n{got}\n"
                f"node only: {only_node}")
            checked += 1
            with_data += bool(got)
            if "process_" in expr:
                assert got, f"{panel['title']!r} {target['refId']}: no data to compare\n{expr}"
                process += 1
    assert checked >= 40 and process >= 4
    # Most panels had something to compare, not only empty answers on both sides.
    assert with_data >= checked // 2, f"{with_data} of {checked} queries returned data"
