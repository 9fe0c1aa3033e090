"""``pchannel_closing``: a pchannel no longer served whose log, flusher or retention still run shows as
1 until its close ends, then its series goes; one closed before it stopped being served never shows."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from streamingnode.node.channel import Channel
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


class _Stream:
    """A log whose close fails (damaged storage) or waits until released (appends in flight)."""

    def __init__(self, fails: bool) -> None:
        self.fails = fails
        self.release = asyncio.Event()
        self.pchannel = "p0"

    async def aclose(self) -> None:
        if self.fails:
            raise RuntimeError("damaged")
        await self.release.wait()


async def test_a_close_that_failed_has_ended() -> None:
    """A FAILED pchannel's close can raise (its storage is damaged): it has ended all the same, and the
    gauge must not say forever that it is under way."""
    ch = Channel(_Stream(fails=True), SimpleNamespace())  # type: ignore[arg-type]
    with pytest.raises(RuntimeError):
        await ch.aclose()
    assert ch.closed.is_set()


async def test_a_lost_close_ends_when_its_log_closes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("streamingnode.node.channel.LOST_CLOSE_SECONDS", 0.01)
    stream = _Stream(fails=False)
    ch = Channel(stream, SimpleNamespace())  # type: ignore[arg-type]
    await ch.aclose(lost=True)  # returns before the log's close: appends still in flight
    assert not ch.closed.is_set()
    stream.release.set()
    await asyncio.wait_for(ch.closed.wait(), 30)
