"""Batched group commits (``streamingnode.node.groups``): changes that arrive while a store of the groups
record is in flight are stored together by the next one; each caller returns only once the store
holding its change is durable, and a failed store fails every change it held.  The record keeps its
format: one written by an older node loads, and a restart keeps every acknowledged position.

The WAL's ``put_meta`` is wrapped so that a test holds each store until it lets it go and sees what
each store wrote."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from streamingnode.node.groups import META_KEY, ConsumerGroups
from tests.factories import ins
from tests.waiting import until
from wal import WAL, Position, WALManager
from wal.errors import ConsumerGroupNotExistError, UnavailableError


class _Gate:
    """Wraps ``wal.put_meta``: store ``k`` of the groups record (from 0) waits for ``let(k)`` and
    raises ``fail[k]`` if set; what each store wrote is recorded."""

    def __init__(self, wal: WAL) -> None:
        self.records: list[dict[str, dict[str, list[int]]]] = []
        self.started = 0
        self._lets: dict[int, asyncio.Event] = {}
        self.fail: dict[int, Exception] = {}
        put = wal.put_meta

        async def gated(name: str, value: bytes) -> None:
            if name != META_KEY:
                await put(name, value)
                return
            k = self.started
            self.started += 1
            await self._event(k).wait()
            if k in self.fail:
                raise self.fail[k]
            await put(name, value)
            self.records.append(json.loads(value))

        wal.put_meta = gated  # type: ignore[method-assign]

    def _event(self, k: int) -> asyncio.Event:
        return self._lets.setdefault(k, asyncio.Event())

    def let(self, *ks: int) -> None:
        for k in ks:
            self._event(k).set()


@pytest.fixture
async def manager(tmp_path: Path) -> AsyncIterator[WALManager]:
    m = await WALManager.start_rocksdb(tmp_path / "db")
    await m.create_channel("p")
    yield m
    await m.aclose()


def _pos(message_id: int) -> Position:
    return Position("p", message_id, message_id * 10)


async def _open(manager: WALManager, messages: int = 200) -> WAL:
    """The pchannel "p" holding ``messages`` messages, message ``i`` at timetick ``10 * i``: a commit
    must name a position inside the log (``ConsumerGroups.commit``), so ``_pos(i)`` needs them."""
    wal = await manager.open("p")
    for start in range(wal.next_id, messages, 1000):
        await wal.append_batch([ins("v", 10 * i) for i in range(start, min(start + 1000, messages))])
    return wal


async def _quiet() -> None:
    """Let every task run as far as it can without a store ending."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_commits_during_a_store_are_stored_together_and_each_returns_only_after_its_store(
    manager: WALManager,
) -> None:
    wal = await _open(manager)
    groups = await ConsumerGroups.load(wal)
    names = [f"g{i}" for i in range(50)]
    for name in names:
        await groups.create(name)
    gate = _Gate(wal)
    first = asyncio.ensure_future(groups.commit("g0", [("v", _pos(1))]))
    await until(lambda: gate.started == 1, "the first commit's store")
    rest = [asyncio.ensure_future(groups.commit(n, [("v", _pos(i + 100))])) for i, n in enumerate(names[1:])]
    await _quiet()
    assert gate.started == 1, "one store in flight: the others wait for it"
    assert not first.done() and not any(t.done() for t in rest), "nothing returns before its store"
    assert groups.committed("g0", "v") is None, "not durable yet: not visible"

    gate.let(0)
    await asyncio.wait_for(first, 10)
    await until(lambda: gate.started == 2, "the store of the commits that waited")
    await _quiet()
    assert not any(t.done() for t in rest), "their store has not ended: none returns"
    gate.let(1)
    await asyncio.wait_for(asyncio.gather(*rest), 10)
    assert gate.started == 2 and len(gate.records) == 2, "49 commits that waited: one store"
    assert gate.records[0]["g0"] == {"v": [1, 10]} and gate.records[0]["g1"] == {}
    assert all(gate.records[1][n] == {"v": [i + 100, (i + 100) * 10]} for i, n in enumerate(names[1:]))
    assert groups.committed("g49", "v") == _pos(148)


async def test_a_commit_returns_only_once_the_store_that_holds_it_has_ended(manager: WALManager) -> None:
    wal = await _open(manager)
    groups = await ConsumerGroups.load(wal)
    await groups.create("a")
    await groups.create("b")
    gate = _Gate(wal)
    first = asyncio.ensure_future(groups.commit("a", [("v", _pos(1))]))
    await until(lambda: gate.started == 1, "the first store")
    second = asyncio.ensure_future(groups.commit("b", [("v", _pos(2))]))
    gate.let(0)
    await asyncio.wait_for(first, 10)
    await until(lambda: gate.started == 2, "the second store")
    await _quiet()
    assert not second.done(), "its own store has not ended: not acknowledged"
    gate.let(1)
    await asyncio.wait_for(second, 10)
    assert groups.committed("b", "v") == _pos(2)


async def test_a_failed_store_fails_every_commit_it_held_and_changes_nothing(manager: WALManager) -> None:
    wal = await _open(manager)
    groups = await ConsumerGroups.load(wal)
    for name in ("a", "b", "c"):
        await groups.create(name)
        await groups.commit(name, [("v", _pos(1))])
    gate = _Gate(wal)
    first = asyncio.ensure_future(groups.commit("a", [("v", _pos(5))]))
    await until(lambda: gate.started == 1, "the first store")
    batch = [asyncio.ensure_future(groups.commit(n, [("v", _pos(9))])) for n in ("a", "b", "c")]
    await _quiet()
    gate.fail[1] = UnavailableError("disk said no")
    gate.let(0, 1, 2)
    await asyncio.wait_for(first, 10)
    outcomes = await asyncio.wait_for(asyncio.gather(*batch, return_exceptions=True), 10)
    assert all(isinstance(o, UnavailableError) for o in outcomes), outcomes
    assert [groups.committed(n, "v") for n in ("a", "b", "c")] == [_pos(5), _pos(1), _pos(1)], \
        "the durable state is as before the failed store"
    await groups.commit("b", [("v", _pos(7))])  # the next store starts from the durable state
    assert gate.records[-1] == {"a": {"v": [5, 50]}, "b": {"v": [7, 70]}, "c": {"v": [1, 10]}}


async def test_a_change_refused_in_a_batch_fails_alone(manager: WALManager) -> None:
    wal = await _open(manager)
    groups = await ConsumerGroups.load(wal)
    await groups.create("a")
    gate = _Gate(wal)
    first = asyncio.ensure_future(groups.commit("a", [("v", _pos(1))]))
    await until(lambda: gate.started == 1, "the first store")
    missing = asyncio.ensure_future(groups.commit("nope", [("v", _pos(2))]))
    created = asyncio.ensure_future(groups.create("b"))
    then = asyncio.ensure_future(groups.commit("b", [("v", _pos(3))]))  # after its create, same batch
    gone = asyncio.ensure_future(groups.destroy("a"))
    gate.let(0, 1)
    await asyncio.wait_for(asyncio.gather(first, created, then, gone), 10)
    with pytest.raises(ConsumerGroupNotExistError, match="'nope'"):
        await missing
    assert gate.started == 2
    assert groups.names() == ["b"] and groups.committed("b", "v") == _pos(3)


async def test_a_record_written_in_the_older_format_loads_and_stays_readable(manager: WALManager) -> None:
    wal = await _open(manager)
    old = {"a": {"": [4, 40], "v": [3, 30]}, "b": {}, "c/d": {"v\\w": [9, 90]}}
    await wal.put_meta(META_KEY, json.dumps(old, separators=(",", ":"), sort_keys=True).encode())
    groups = await ConsumerGroups.load(wal)
    assert groups.names() == ["a", "b", "c/d"]
    assert groups.committed("a", "") == _pos(4) and groups.committed("c/d", "v\\w") == _pos(9)
    await groups.commit("b", [("v", _pos(5))])
    stored = await wal.get_meta(META_KEY)
    assert stored is not None and json.loads(stored) == {**old, "b": {"v": [5, 50]}}


async def test_a_restart_keeps_every_acknowledged_position(tmp_path: Path) -> None:
    manager = await WALManager.start_rocksdb(tmp_path / "db")
    try:
        await manager.create_channel("p")
        groups = await ConsumerGroups.load(await _open(manager, 20_100))
        for i in range(200):
            await groups.create(f"g{i}")

        async def consumer(i: int) -> dict[str, Position]:
            acked: dict[str, Position] = {}
            for k in range(5):
                vchannel = f"v{k % 2}"
                pos = _pos(i * 100 + k + 1)
                await groups.commit(f"g{i}", [(vchannel, pos)])
                acked[vchannel] = pos
            return acked

        before = groups.stores
        acked = await asyncio.wait_for(asyncio.gather(*(consumer(i) for i in range(200))), 60)
        assert groups.stores - before < 100, "1,000 commits, most of them waiting for a store: batched"
    finally:
        await manager.aclose()
    manager = await WALManager.start_rocksdb(tmp_path / "db")
    try:
        loaded = await ConsumerGroups.load(await manager.open("p"))
        assert len(loaded.names()) == 200
        for i, positions in enumerate(acked):
            for vchannel, pos in positions.items():
                assert loaded.committed(f"g{i}", vchannel) == pos
    finally:
        await manager.aclose()
