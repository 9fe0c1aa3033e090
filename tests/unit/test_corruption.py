"""Damaged storage gives clear errors that name what is damaged; undamaged data stays readable."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import pytest
import rocksdict

from interceptors.recovery.streaming_wal import ChainConfig, open_streaming_wal
from tests.factories import data, flat, ins, packs_until, tick
from wal import CorruptedError, DeliverPolicy, ReadOption, WALManager, decode_block
from wal.backends import RocksBackend
from wal.errors import UnavailableError


async def _fill(path: Path, blocks: int) -> None:
    m = await WALManager.start(RocksBackend(path))
    await m.create_channel("p")
    wal = await m.open("p")
    for k in range(blocks):  # one block per append_batch: ids [2k, 2k+1]
        await wal.append_batch([ins("v", 10 * k + 1, f"row{k}".encode()), tick(10 * k + 2)])
    await m.aclose()


def _damage_block(path: Path, first_id: int) -> None:
    """Flip one payload byte of the stored block that starts at ``first_id``, behind the WAL's back."""
    db = rocksdict.Rdict(str(path), options=rocksdict.Options(raw_mode=True))
    try:
        it = db.iter()
        it.seek(b"D")
        target = None
        while it.valid() and it.key().startswith(b"D"):
            if int.from_bytes(it.key()[5:13], "big") == first_id:
                target = (it.key(), bytearray(it.value()))
                break
            it.next()
        del it
        assert target is not None
        key, value = target
        value[-3] ^= 0x5A
        db.put(key, bytes(value))
        db.flush()
    finally:
        db.close()


def _rewrite_block(path: Path, first_id: int, old: bytes, new: bytes) -> bytes:
    """Replace ``old`` by ``new`` (same length) inside the stored block at ``first_id``; return the block."""
    db = rocksdict.Rdict(str(path), options=rocksdict.Options(raw_mode=True))
    try:
        key = b"D" + (1).to_bytes(4, "big") + first_id.to_bytes(8, "big")  # the first channel's key is 1
        block = db.get(key)
        assert block is not None and block.count(old) == 1
        damaged = block.replace(old, new)
        db.put(key, damaged)
        db.flush()
        return damaged
    finally:
        db.close()


async def test_a_flipped_payload_byte_that_still_decodes_is_caught_by_the_checksum(tmp_path: Path) -> None:
    path = tmp_path / "db"
    await _fill(path, 5)
    # One bit of one payload byte: b"row2" becomes b"row3".  Every length and header still checks out,
    # so the block decodes; only its CRC can tell.
    damaged = _rewrite_block(path, 4, b"row2", b"row3")
    assert decode_block(damaged, 4, 4, checksum_verified=True)[0].payload == b"row3"
    m = await WALManager.start(RocksBackend(path))
    try:
        wal = await m.open("p")
        with pytest.raises(CorruptedError, match=r"block at id 4 of pchannel 'p' is damaged"):
            await wal.read_stored(4)
        # What precedes the damage is handed out; the read that reaches it fails.
        assert [x.payload for x in await wal.read_stored(0) if x.payload] == [b"row0", b"row1"]
        scanner = wal.read()
        assert [x.payload for x in flat(await packs_until(scanner, 12))] == [b"row0", b"row1"]
        with pytest.raises(CorruptedError, match=r"block at id 4"):
            await asyncio.wait_for(scanner.__anext__(), 5)
        await scanner.aclose()
    finally:
        await m.aclose()


async def test_damaged_block_is_reported_and_data_before_it_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "db"
    await _fill(path, 5)
    _damage_block(path, 4)  # the third of five blocks
    m = await WALManager.start(RocksBackend(path))
    try:
        wal = await m.open("p")  # the last block is intact, so opening works
        scanner = wal.read()
        good = flat(await packs_until(scanner, 12))
        assert [x.payload for x in good] == [b"row0", b"row1"]
        with pytest.raises(CorruptedError, match=r"block at id 4 of pchannel 'p' is damaged") as info:
            await asyncio.wait_for(scanner.__anext__(), 5)
        assert info.value.fields["path"] == str(path)
        # Reading after the damage is still possible by position.
        later = wal.read(ReadOption(deliver_policy=DeliverPolicy.start_from(6)))
        assert [x.payload for x in flat(await packs_until(later, 42))] == [b"row3", b"row4"]
    finally:
        await m.aclose()


async def test_damaged_last_block_fails_open_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "db"
    await _fill(path, 3)
    _damage_block(path, 4)
    m = await WALManager.start(RocksBackend(path))
    try:
        with pytest.raises(CorruptedError, match=rf"last block of pchannel 'p' at id 4 in {path}"):
            await m.open("p")
    finally:
        await m.aclose()


@pytest.mark.parametrize("victim", ["CURRENT", "MANIFEST"])
async def test_damaged_database_directory_names_the_path(tmp_path: Path, victim: str) -> None:
    path = tmp_path / "db"
    await _fill(path, 2)
    names = [n for n in os.listdir(path) if n.startswith(victim)]
    assert names
    for name in names:
        (path / name).write_bytes(b"\x00garbage\xff" * 10)
    with pytest.raises(CorruptedError, match=f"cannot open WAL database at {path}"):
        RocksBackend(path)


async def test_data_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "not-a-dir"
    path.write_text("hello")
    with pytest.raises(CorruptedError, match=f"cannot open WAL database at {path}"):
        RocksBackend(path)
    assert path.read_text() == "hello"  # nothing of the user's was touched


async def test_second_open_of_a_locked_directory_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "db"
    first = RocksBackend(path)
    try:
        # In use, not damaged (see test_data_dir_in_use.py).
        with pytest.raises(UnavailableError, match=f"{path} is in use"):
            RocksBackend(path)
    finally:
        first.close()


async def test_transient_engine_errors_are_retriable_and_redone(tmp_path: Path) -> None:
    backend = RocksBackend(tmp_path / "db")
    m = await WALManager.start(backend)
    try:
        await m.create_channel("p")
        swal = await open_streaming_wal(m, "p", ChainConfig(tick_interval=0.05))
        await swal.ready()
        real_db = backend._db
        failures = [2]

        class Flaky:
            """Answers 'busy' to the next writes, then behaves."""

            def write(self, *args: object) -> object:
                if failures[0] > 0:
                    failures[0] -= 1
                    raise Exception("Resource busy: compaction pending")  # what rocksdict raises
                return real_db.write(*args)

            def __getattr__(self, name: str) -> object:
                return getattr(real_db, name)

        backend._db = Flaky()
        result = await swal.append(data("v", b"after busy"))
        backend._db = real_db
        assert failures[0] == 0 and result.message_id is not None
        stored = await swal.wal.read_stored(result.message_id)
        assert stored[0].payload == b"after busy"
        await swal.aclose()
    finally:
        await m.aclose()


async def _fill_payloads(path: Path, payloads: list[bytes]) -> None:
    m = await WALManager.start(RocksBackend(path))
    await m.create_channel("p")
    wal = await m.open("p")
    for p in payloads:
        await wal.append_batch([ins("v", 1, p)])
    await m.aclose()  # a clean close flushes everything into a table file


async def test_a_flipped_byte_in_a_table_file_is_reported_naming_pchannel_file_and_keys(tmp_path: Path) -> None:
    path = tmp_path / "db"
    rng = random.Random(7)
    payloads = [rng.randbytes(300) for _ in range(300)]
    await _fill_payloads(path, payloads)
    tables = [path / n for n in os.listdir(path) if n.endswith(".sst")]
    victim = next(t for t in tables if payloads[150] in t.read_bytes())
    raw = bytearray(victim.read_bytes())
    raw[raw.index(payloads[150]) + 100] ^= 0x10
    victim.write_bytes(bytes(raw))
    m = await WALManager.start(RocksBackend(path))
    try:
        wal = await m.open("p")  # the damage is in the middle: the first and last blocks read
        got: list[bytes] = []
        with pytest.raises(CorruptedError) as info:
            while True:  # never more than the 300 messages
                batch = await wal.read_stored(len(got), 4096)
                got.extend(x.payload for x in batch)
                assert len(got) <= 300
        assert got == payloads[:len(got)] and len(got) < 150, "what precedes the damaged block, exactly"
        fields = info.value.fields
        assert fields["pchannel"] == "p" and fields["file"] == str(victim) and fields["offset"] >= 0
        assert fields["key_range"].startswith(f"D/1/{len(got)}")
        assert str(victim) in str(info.value) and "pchannel 'p'" in str(info.value)
    finally:
        await m.aclose()
