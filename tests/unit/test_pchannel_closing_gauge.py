"""``pchannel_closing``: a pchannel no longer served whose log, flusher or retention still run shows as
1 until its close ends, then its series goes; one closed before it stopped being served never shows."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from streamingnode.observability.metrics import NodeMetrics

GAUGE = "streamingnode_pchannel_closing"


def _channel() -> Any:
    stream = SimpleNamespace(adaptor=SimpleNamespace(observer=None), txns=SimpleNamespace(on_finish=None))
    return SimpleNamespace(stream=stream, groups=SimpleNamespace(), flusher=None, closed=asyncio.Event())


def test_a_close_not_ended_shows_until_it_ends() -> None:
    m = NodeMetrics()
    ch = _channel()
    m.open_channel("p0", ch)
    m.close_channel("p0")  # no longer served; its log still closing
    assert m.registry.get_sample_value(GAUGE, {"pchannel": "p0"}) == 1
    assert m.registry.get_sample_value("streamingnode_pchannels") == 0
    ch.closed.set()
    assert m.registry.get_sample_value(GAUGE, {"pchannel": "p0"}) is None


def test_a_close_that_ended_first_never_shows() -> None:
    m = NodeMetrics()
    ch = _channel()
    m.open_channel("p0", ch)
    ch.closed.set()
    m.close_channel("p0")
    assert m.registry.get_sample_value(GAUGE, {"pchannel": "p0"}) is None
