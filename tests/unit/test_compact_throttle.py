"""Compaction's I/O limit: a pass reads and writes at most ``io_bytes_per_second`` (the node's default
is 64 MiB/s), sleeping on the flusher's thread when ahead.  The clock is the test's, so the test
checks what the throttle asks for, never how long anything took."""

from __future__ import annotations

import pytest

from flusher import compact
from streamingnode.config import NodeConfig, compaction_config


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_the_throttle_sleeps_until_the_bytes_done_fit_the_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(compact.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(compact.time, "sleep", clock.sleep)
    throttle = compact._Throttle(1000, start=clock.now)
    throttle(500)  # half a second's worth at once: 0.5 s ahead
    assert clock.slept == [pytest.approx(0.5)]
    clock.now += 2.0  # time passed doing other work: the budget it gives is used first
    throttle(1500)
    assert len(clock.slept) == 1
    throttle(1000)
    assert clock.slept[-1] == pytest.approx(0.5) and len(clock.slept) == 2
    unlimited = compact._Throttle(0, start=clock.now)
    unlimited(10**12)
    assert len(clock.slept) == 2


def test_the_nodes_background_compaction_is_limited_by_default() -> None:
    assert compaction_config(NodeConfig()).io_bytes_per_second == 64 << 20
    assert compaction_config(NodeConfig(compaction_io_bytes_per_second=0)).io_bytes_per_second == 0
