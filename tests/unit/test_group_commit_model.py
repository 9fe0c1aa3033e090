"""Group commits against a plain model (seeded random walks): the log grows, streams of a group open
and deliver, acks and seeks name valid and invalid positions, and the node restarts.  After every step
the groups hold exactly what the model holds: a valid ack or seek lands whole, an invalid one is
refused with the class the rule gives and commits nothing (``ConsumerGroups.commit``)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from streamingnode.node.groups import ConsumerGroups
from tests.factories import ins
from wal import WAL, Position, WALManager
from wal.errors import InvalidArgumentError, OutOfRangeError, StreamingError

TOP = 2**64 - 1
VCHANNELS = ("a", "b", "")
GROUPS = ("g", "h")


@pytest.fixture
async def manager(tmp_path: Path) -> AsyncIterator[WALManager]:
    m = await WALManager.start_rocksdb(tmp_path / "db")
    await m.create_channel("p")
    yield m
    await m.aclose()


@dataclass
class _Stream:
    group: str
    reads: str
    ceiling: tuple[int, int]


class _Walk:
    """The system (a WAL and its groups) and the model (committed positions, the log's extent)."""

    def __init__(self, rng: random.Random, wal: WAL, groups: ConsumerGroups) -> None:
        self.rng = rng
        self.wal = wal
        self.groups = groups
        self.model: dict[str, dict[str, tuple[int, int]]] = {g: {} for g in GROUPS}
        self.streams: list[_Stream] = []
        self.ts = 100

    # --- the log -----------------------------------------------------------------------------------
    async def append(self) -> None:
        batch = []
        for _ in range(self.rng.randint(1, 5)):
            self.ts += self.rng.randint(1, 20)
            batch.append(ins(self.rng.choice(("a", "b")), self.ts))
        await self.wal.append_batch(batch)

    def real(self) -> tuple[int, int]:
        """A position inside the log: an id up to the next one, a timetick up to the newest."""
        return self.rng.randint(self.wal.first_id, self.wal.next_id), self.rng.randint(0, self.wal.last_timetick)

    # --- streams -----------------------------------------------------------------------------------
    def open(self) -> None:
        group = self.rng.choice(GROUPS)
        reads = self.rng.choice(VCHANNELS)
        start = self.model[group].get(reads, (self.wal.first_id, 0))
        self.streams.append(_Stream(group, reads, start))

    def deliver(self) -> None:
        if self.streams:
            s = self.rng.choice(self.streams)
            mid, ts = self.real()
            s.ceiling = (max(s.ceiling[0], mid), max(s.ceiling[1], ts))

    def _position(self, s: _Stream) -> tuple[str, Position, str]:
        """(vchannel, position, what kind) for an ack of stream ``s``."""
        vchannel = s.reads or self.rng.choice(("a", "b", ""))
        low = self.model[s.group].get(vchannel, (self.wal.first_id, 0))
        kind = self.rng.choice(("valid", "valid", "valid", "beyond", "future", "past end", "behind", "vchannel",
                                "pchannel"))
        mid = self.rng.randint(min(low[0], s.ceiling[0]), s.ceiling[0])
        ts = self.rng.randint(min(low[1], s.ceiling[1]), s.ceiling[1])
        if kind == "beyond":
            mid, ts = (s.ceiling[0] + self.rng.randint(1, 3), ts) if self.rng.random() < 0.5 else (
                mid, s.ceiling[1] + self.rng.randint(1, 3))
        elif kind == "future":
            ts = TOP
        elif kind == "past end":
            mid = self.rng.choice((self.wal.next_id + 1, TOP))
        elif kind == "behind":
            mid, ts = (low[0] - 1, ts) if self.rng.random() < 0.5 else (mid, low[1] - 1)
        elif kind == "vchannel" and s.reads:
            vchannel = "a" if s.reads == "b" else "b"
        return vchannel, Position("q" if kind == "pchannel" else "p", mid, ts), kind

    def expect_ack(self, s: _Stream, positions: list[tuple[str, Position]]) -> type[StreamingError] | None:
        """The rule, written plainly: the class of the refusal, or None when the ack lands."""
        if s.reads and any(v != s.reads for v, _ in positions):
            return InvalidArgumentError
        wal = self.wal
        for _, p in positions:
            if p.pchannel != "p":
                return InvalidArgumentError
            if not wal.first_id <= p.message_id <= wal.next_id or p.timetick > wal.last_timetick:
                return OutOfRangeError
            if p.message_id > s.ceiling[0] or p.timetick > s.ceiling[1]:
                return OutOfRangeError
        for v, p in positions:
            was = self.model[s.group].get(v)
            if was is not None and (p.message_id < was[0] or p.timetick < was[1]):
                return InvalidArgumentError
        return None

    async def ack(self) -> None:
        if not self.streams:
            return
        s = self.rng.choice(self.streams)
        drawn = [self._position(s) for _ in range(self.rng.randint(1, 2))]
        positions = [(v, p) for v, p, _ in drawn]
        expected = self.expect_ack(s, positions)
        await self._attempt(self.groups.commit(s.group, positions, ceiling=s.ceiling, reads=s.reads),
                            expected, s.group, positions, drawn)

    async def seek(self) -> None:
        group = self.rng.choice(GROUPS)
        vchannel = self.rng.choice(VCHANNELS)
        mid, ts = self.real()
        kind = self.rng.choice(("valid", "valid", "future", "past end"))
        if kind == "future":
            ts = self.rng.choice((self.wal.last_timetick + 1, TOP))
        elif kind == "past end":
            mid = self.rng.choice((self.wal.next_id + 1, TOP))
        positions = [(vchannel, Position("p", mid, ts))]
        expected = None if kind == "valid" else OutOfRangeError
        await self._attempt(self.groups.commit(group, positions), expected, group, positions, kind)

    async def _attempt(self, commit: object, expected: type[StreamingError] | None, group: str,
                       positions: list[tuple[str, Position]], why: object) -> None:
        try:
            await commit  # type: ignore[misc]
        except StreamingError as exc:
            assert expected is not None and type(exc) is expected, (why, expected, exc)
            assert "nothing was committed" in str(exc), exc
        else:
            assert expected is None, (why, positions, "landed")
            for v, p in positions:
                self.model[group][v] = (p.message_id, p.timetick)

    async def restart(self) -> None:
        """What a restart keeps: the stored record, loaded again."""
        self.groups = await ConsumerGroups.load(self.wal)

    def check(self) -> None:
        for group in GROUPS:
            stored = self.groups.require(group)
            assert stored == self.model[group], (group, stored, self.model[group])
            for mid, ts in stored.values():
                assert self.groups.problem(mid, ts) is None, "every stored position stays in range"


@pytest.mark.parametrize("seed", range(6))
async def test_group_commits_follow_the_model(manager: WALManager, seed: int) -> None:
    rng = random.Random(seed)
    wal = await manager.open("p")
    groups = await ConsumerGroups.load(wal)
    for group in GROUPS:
        await groups.create(group)
    walk = _Walk(rng, wal, groups)
    await walk.append()
    landed = refused = 0
    for _ in range(400):
        step = rng.choices(("append", "open", "deliver", "ack", "seek", "restart"), (3, 1, 4, 8, 2, 0.3))[0]
        before = {g: dict(v) for g, v in walk.model.items()}
        if step == "append":
            await walk.append()
        elif step == "open":
            walk.open()
        elif step == "deliver":
            walk.deliver()
        elif step == "ack":
            await walk.ack()
        elif step == "seek":
            await walk.seek()
        else:
            await walk.restart()
        if step in ("ack", "seek"):
            if walk.model != before:
                landed += 1
            else:
                refused += 1
        walk.check()
    assert landed > 20 and refused > 20, (landed, refused)
