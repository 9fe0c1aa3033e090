"""The offline checks in-process: a missing block is a gap verify names and salvage cuts at; damage in
a pchannel salvage was not asked to cut is refused with nothing changed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import rocksdict

from streamingnode.offline.salvage import SalvageRefusedError, salvage
from streamingnode.offline.verify import verify
from tests.factories import ins, tick
from wal import WALManager
from wal.backends import RocksBackend

_KEYS = {"p": 1, "q": 2}


async def _fill(path: Path) -> None:
    m = await WALManager.start(RocksBackend(path))
    for name in _KEYS:
        await m.create_channel(name)
        wal = await m.open(name)
        for k in range(5):  # one block per append: ids [2k, 2k + 1]
            await wal.append_batch([ins("v", 10 * k + 1, f"{name}{k}".encode()), tick(10 * k + 2)])
    await m.aclose()


def _block_key(channel: str, first_id: int) -> bytes:
    return b"D" + _KEYS[channel].to_bytes(4, "big") + first_id.to_bytes(8, "big")


def _edit(path: Path, channel: str, first_id: int, *, delete: bool = False) -> None:
    """Behind the WAL's back: drop the block at ``first_id`` or flip one byte of its body."""
    db = rocksdict.Rdict(str(path), options=rocksdict.Options(raw_mode=True))
    try:
        key = _block_key(channel, first_id)
        block = db.get(key)
        assert block is not None
        if delete:
            db.delete(key)
        else:
            db.put(key, block[:-3] + bytes([block[-3] ^ 0x40]) + block[-2:])
        db.flush()
    finally:
        db.close()


def _digest(path: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.rglob("*"))
            if p.is_file() and not p.name.startswith("LOG")}


async def test_a_missing_block_is_a_gap_that_verify_names_and_salvage_cuts_at(tmp_path: Path) -> None:
    path = tmp_path / "db"
    await _fill(path)
    _edit(path, "p", 4, delete=True)
    report = verify(str(path))
    assert [f.problem for f in report.findings] == ["pchannel 'p': ids [4, 6) are missing (no block holds them)"]
    outcome = salvage(str(path), ["p"], apply=True)
    [cut] = outcome.plan.cuts
    assert (cut.first, cut.end, cut.count) == (4, 10, 6)
    assert verify(str(path)).findings == []
    m = await WALManager.start(RocksBackend(path))
    try:
        wal = await m.open("p")
        assert (wal.first_id, wal.next_id) == (0, 4)
        assert [x.payload for x in await wal.read_stored(0) if x.payload] == [b"p0", b"p1"]
    finally:
        await m.aclose()


async def test_damage_in_a_pchannel_not_named_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    path = tmp_path / "db"
    await _fill(path)
    _edit(path, "p", 2)
    _edit(path, "q", 6)
    assert {f.channel for f in verify(str(path)).findings} == {"p", "q"}
    before = _digest(path)
    with pytest.raises(SalvageRefusedError, match=r"pchannel 'q' is damaged too .*--pchannel q"):
        salvage(str(path), ["p"], apply=True)
    assert _digest(path) == before
    outcome = salvage(str(path), ["p", "q"], apply=True)
    assert sorted((c.pchannel, c.first, c.count) for c in outcome.plan.cuts) == [("p", 2, 8), ("q", 6, 4)]
    assert verify(str(path)).findings == []
