"""The dashboard's panels say what their numbers are: one unit per axis.

Each query's quantity is read off the query itself (the metric's name says bytes, seconds or a count;
``rate`` makes it per second, a leading ``60 *`` or ``3600 *`` per minute or per hour), so a panel that
plots two quantities on one axis — batches per second next to a latency in seconds, bytes per second
next to files per minute — is caught without a list of panels to look at.  A panel may show two
quantities only with the second on a right-hand axis of its own unit (a field override by query).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "dashboards" / "streamingnode.json"

# Grafana units that show each quantity; None where no built-in unit fits (counts per hour), so any goes.
UNITS: dict[str, set[str] | None] = {
    "count": {"short", "none"},
    "count/s": {"ops"},
    "count/min": {"opm"},
    "count/h": None,
    "bytes": {"bytes", "decbytes"},
    "bytes/s": {"Bps", "binBps"},
    "bytes/h": None,
    "s": {"s"},
    "ratio": {"percentunit"},
}
_METRIC = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{")
_PERIOD = {None: "/s", "60": "/min", "3600": "/h"}


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in items:
        if panel["type"] != "row":
            yield panel
        yield from panels(panel.get("panels", []))


def _kind(metric: str) -> str:
    """What one sample of a metric counts."""
    if metric.endswith(("_bytes", "_bytes_total")):
        return "bytes"
    if metric.endswith(("_seconds", "_seconds_total", "_seconds_sum")):
        return "s"
    return "count"


def quantity(expr: str) -> str:
    """The quantity a panel query plots, from its metrics and the arithmetic around them."""
    if expr.startswith("histogram_quantile("):
        return "s"
    metrics = _METRIC.findall(expr)
    assert metrics, f"no metric selector in {expr!r}"
    if " / " in expr:
        # A ratio of two sums: seconds per batch, or a share of the same quantity.
        top, bottom = (_kind(m) for m in (metrics[0], metrics[-1]))
        return "ratio" if top == bottom else top
    kind = _kind(metrics[0])
    if "rate(" not in expr and "deriv(" not in expr:
        return kind  # a gauge, a difference of gauges, or a counter's total
    if kind == "s":
        return "ratio"  # seconds busy per second
    scale = re.match(r"^(\d+) \* ", expr) or re.search(r" \* (\d+)$", expr)
    return kind + _PERIOD[scale.group(1) if scale else None]


def overrides(panel: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{refId: {property id: value}} of the panel's per-query overrides."""
    found: dict[str, dict[str, Any]] = {}
    for override in panel["fieldConfig"].get("overrides", []):
        matcher = override["matcher"]
        assert matcher["id"] == "byFrameRefID", f"{panel['title']!r}: override by {matcher['id']}, not by query"
        found[matcher["options"]] = {p["id"]: p["value"] for p in override["properties"]}
    return found


def check_units(panel: dict[str, Any]) -> None:
    """At most two quantities, one per axis, each shown in a unit that fits it."""
    title = panel["title"]
    default = panel["fieldConfig"]["defaults"].get("unit")
    by_ref = overrides(panel)
    left: dict[str, str] = {}
    right: dict[str, str] = {}
    for target in panel["targets"]:
        what = quantity(target["expr"])
        override = by_ref.get(target["refId"])
        if override is None:
            left[target["refId"]] = what
            continue
        assert override.get("custom.axisPlacement") == "right", (
            f"{title!r} {target['refId']}: an override of unit needs its own (right) axis")
        unit = override.get("unit")
        allowed = UNITS[what]
        assert unit is not None and unit != default, f"{title!r} {target['refId']}: no unit of its own"
        assert allowed is None or unit in allowed, f"{title!r} {target['refId']}: {what} shown as {unit!r}"
        right[target["refId"]] = what
    assert len(set(left.values())) <= 1, f"{title!r} puts {sorted(set(left.values()))} on one axis"
    assert len(set(right.values())) <= 1, f"{title!r} puts {sorted(set(right.values()))} on the right axis"
    assert not set(left.values()) & set(right.values()), f"{title!r}: the same quantity on both axes"
    for ref, what in left.items():
        allowed = UNITS[what]
        assert allowed is None or default in allowed, f"{title!r} {ref}: {what} shown as {default!r}"


def test_every_panel_shows_one_unit_per_axis() -> None:
    dash = json.loads(DASHBOARD.read_text())
    checked = 0
    for panel in panels(dash["panels"]):
        check_units(panel)
        checked += 1
    assert checked >= 40


@pytest.mark.parametrize(("expr", "expected"), [
    ('sum(rate(a_total{job=~"$job"}[5m]))', "count/s"),
    ('3600 * sum(rate(a_total{job=~"$job"}[5m]))', "count/h"),
    ('sum(rate(a_total{job=~"$job"}[5m])) * 60', "count/min"),
    ('sum(rate(a_bytes_total{job=~"$job"}[5m]))', "bytes/s"),
    ('sum(rate(a_seconds_total{job=~"$job"}[5m]))', "ratio"),
    ('sum(rate(a_seconds_sum{x="1"}[5m])) / sum(rate(a_seconds_count{x="1"}[5m]))', "s"),
    ('histogram_quantile(0.99, sum by (le) (rate(a_seconds_bucket{x="1"}[5m])))', "s"),
    ('time() - max(a_timestamp_seconds{x="1"})', "s"),
    ('sum(a_bytes{x="1"})', "bytes"),
    ('sum(a_total{x="1"})', "count"),
    ('sum(deriv(a_bytes{x="1"}[5m]))', "bytes/s"),
])
def test_quantity_reads_the_query(expr: str, expected: str) -> None:
    assert quantity(expr) == expected


def _panel(unit: str, *targets: tuple[str, str], over: dict[str, dict[str, str]] | None = None) -> dict[str, Any]:
    return {"title": "t", "type": "timeseries", "targets": [{"refId": r, "expr": e} for r, e in targets],
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": [
                {"matcher": {"id": "byFrameRefID", "options": ref},
                 "properties": [{"id": k, "value": v} for k, v in props.items()]}
                for ref, props in (over or {}).items()]}}


def test_the_check_catches_two_units_on_one_axis() -> None:
    rate = 'sum(rate(a_total{x="1"}[5m]))'
    latency = 'sum(rate(a_seconds_sum{x="1"}[5m])) / sum(rate(a_seconds_count{x="1"}[5m]))'
    with pytest.raises(AssertionError, match="on one axis"):
        check_units(_panel("ops", ("A", rate), ("B", latency)))
    with pytest.raises(AssertionError, match="right"):
        check_units(_panel("ops", ("A", rate), ("B", latency), over={"B": {"unit": "s"}}))
    with pytest.raises(AssertionError, match="shown as"):
        check_units(_panel("short", ("A", rate)))
    check_units(_panel("ops", ("A", rate), ("B", latency),
                       over={"B": {"unit": "s", "custom.axisPlacement": "right"}}))
