"""The chaos workload's history lines, without a cluster: a consumer group that waits in vain for its
next pack after a commit must leave a history the checker reads (no completion without an invoke)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from streamingnode.client import MessageType
from tests.chaos import workload
from tests.chaos.checker import parse_run
from tests.chaos.history import Writer, merge, read_lines


@dataclass
class _Msg:
    message_id: int
    properties: dict[str, str]
    message_type: MessageType = MessageType.DATA


@dataclass
class _Pack:
    messages: list[_Msg]


@dataclass
class _Consumer:
    """Delivers its packs, then nothing ever again (a quiet vchannel)."""

    packs: list[_Pack]
    acked: list[_Pack] = field(default_factory=list)

    def __aiter__(self) -> _Consumer:
        return self

    async def __anext__(self) -> _Pack:
        if self.packs:
            return self.packs.pop(0)
        await asyncio.Event().wait()  # never set: only the workload's own timeout ends this
        raise AssertionError("unreachable")

    async def ack(self, pack: _Pack) -> None:
        self.acked.append(pack)


async def test_a_group_left_waiting_after_its_commit_writes_no_outcome_without_an_invoke(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workload, "OP_TIMEOUT", 0.01)  # the wait for a pack that never comes
    hist = Writer(tmp_path / "ops.jsonl")
    work = workload.Workload(client=None, hist=hist, pchannels=["c0"], seed=1)  # type: ignore[arg-type]
    pack = _Pack([_Msg(i, {"chaos_id": f"m{i}"}) for i in range(100)])  # 100: the resume is recorded at once
    consumer = _Consumer([pack])
    base: dict[str, Any] = {"pchannel": "c0", "vchannel": "v0", "group": "g-c0"}
    proc = hist.fresh()
    hist.write(proc, "invoke", "group_resume", base)
    async with asyncio.timeout(60):
        await work._consume(proc, consumer, base, None)
    hist.close()
    assert consumer.acked == [pack]
    merge(tmp_path, ("ops.jsonl",))
    history = read_lines(tmp_path / "history.jsonl")
    assert [(x["type"], x["f"]) for x in history] == [
        ("invoke", "group_resume"), ("ok", "group_resume"), ("invoke", "group_commit"), ("ok", "group_commit")]
    meta = {"seed": 1, "started": 0, "duration_s": 0, "nodes": ["a"], "pchannels": ["c0"], "faults": {}}
    run = parse_run(meta, history, {"a": {"c0": []}})  # raises MalformedRunError on a stray outcome
    assert len(run.commits) == 1
