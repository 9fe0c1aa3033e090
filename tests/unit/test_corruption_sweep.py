"""Corruption sweep: one flipped byte at many offsets of the data journal and of a RocksDB table file.

After each flip the database is opened again and every acknowledged message is read back.  Each one
must be served exactly (same id, same bytes), or the open or the read must fail with CORRUPTED naming
the damage (the journal file and offset; the table file, pchannel and keys; or the damaged block's id).
Never a message silently missing, never different bytes.  Journal damage is contained: the database
always opens, and a flip inside one pchannel's block refuses that pchannel only.

The images are made once per module: the journal image is a copy of the directory taken while the WAL
is still open (the data is then only in the journal, as after a crash), the table image a copy after a
clean close (everything flushed into a table file, the journal empty).  Offsets are drawn with a fixed
seed, forty per file kind, in the parts of the file that matter (for the journal: record headers,
checksums, the metadata, the blocks).
"""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from wal import CorruptedError, Message, MessageType, WALManager
from wal._codec import BLOCK_HEADER_SIZE
from wal.backends import RocksBackend, _journal
from wal.errors import ErrorCode

SEED = 20
PER_KIND = 40
PCHANNELS = ("p", "q")
Expected = dict[str, list[tuple[int, bytes]]]


@dataclass(frozen=True)
class Images:
    journal: Path  # the data only in the journal
    table: Path  # the data only in table files
    expected: Expected  # per pchannel, every acknowledged (id, payload)


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Images:
    import asyncio  # noqa: PLC0415  (a module-scoped fixture runs outside the test's loop)

    root = tmp_path_factory.mktemp("sweep")
    return asyncio.run(_build(root))


async def _build(root: Path) -> Images:
    live = root / "live"
    rng = random.Random(SEED)
    expected: Expected = {name: [] for name in PCHANNELS}
    m = await WALManager.start_rocksdb(live)
    try:
        for name in PCHANNELS:
            await m.create_channel(name)
        wals = {name: await m.open(name) for name in PCHANNELS}
        for _ in range(40):
            for name in PCHANNELS:
                batch = [Message(MessageType.DATA, "v", rng.randbytes(rng.randrange(1, 300)))
                         for _ in range(rng.randrange(1, 4))]
                results = await wals[name].append_batch(batch)
                expected[name].extend((r.message_id, x.payload) for r, x in zip(results, batch, strict=True))
        # Taken while open: RocksDB's tables do not hold the appends yet, the journal does.
        shutil.copytree(live, root / "journal-image")
    finally:
        await m.aclose()
    shutil.copytree(live, root / "table-image")
    return Images(root / "journal-image", root / "table-image", expected)


def _names_the_damage(err: CorruptedError) -> bool:
    f = err.fields
    return err.code is ErrorCode.CORRUPTED and (
        ("file" in f and "offset" in f)  # a journal record, or a table block RocksDB located
        or ("file" in f and "key_range" in f)  # a table file, with the keys read
        or "message_id" in f  # a stored block whose own checksum fails
    )


async def _check(copy: Path, expected: Expected, what: str) -> str:
    """'served' or 'refused'; fails the test on anything else."""
    refused = await _refusals(copy, expected, what)
    return "refused" if refused else "served"


async def _refusals(copy: Path, expected: Expected, what: str) -> set[str]:
    """The pchannels refused (``{"*"}``: the database itself); fails the test on anything else."""
    try:
        backend = RocksBackend(copy)
    except CorruptedError as err:
        assert _names_the_damage(err), f"{what}: opening refused without naming the damage: {err!r}"
        return {"*"}
    refused: set[str] = set()
    m = await WALManager.start(backend)
    try:
        for name in PCHANNELS:
            try:
                wal = await m.open(name)
                got: list[tuple[int, bytes]] = []
                while wal.next_id > (got[-1][0] + 1 if got else wal.first_id):
                    batch = await wal.read_stored(got[-1][0] + 1 if got else wal.first_id, 1 << 20)
                    got.extend((x.message_id, x.payload) for x in batch if x.message_type is MessageType.DATA)
                    assert len(got) <= len(expected[name]), f"{what}: more messages than were acknowledged"
            except CorruptedError as err:
                assert _names_the_damage(err), f"{what}: pchannel {name} refused without naming the damage: {err!r}"
                refused.add(name)
                continue
            assert got == expected[name], f"{what}: pchannel {name} does not serve exactly what was acknowledged"
    finally:
        await m.aclose()
    return refused


def _journal_offsets(path: str, rng: random.Random) -> list[tuple[str, int]]:
    """Forty offsets: ten in record headers, ten in checksums, ten in metadata, ten in block bytes."""
    regions: dict[str, list[int]] = {"header": [], "checksum": [], "meta": [], "body": []}
    pos = 0
    records = [r for r in _journal.read(path)]
    assert records and all(isinstance(r, list) for r in records), "the image's journal reads whole"
    for groups in records:
        assert isinstance(groups, list)
        head, meta, *blocks, trailer = _journal.encode(groups)
        regions["header"].extend(range(pos, pos + 8))
        regions["checksum"].extend(range(pos + 8, pos + 12))
        regions["meta"].extend(range(pos + 12, pos + 12 + len(meta)))
        at = pos + len(head) + len(meta)
        for block in blocks:
            crc_field = at + BLOCK_HEADER_SIZE - 4
            regions["header"].extend(range(at, crc_field))  # the block's header: magic, count, length
            regions["checksum"].extend(range(crc_field, crc_field + 4))
            regions["body"].extend(range(at + BLOCK_HEADER_SIZE, at + len(block)))
            at += len(block)
        regions["checksum"].extend(range(at, at + len(trailer)))
        pos = at + len(trailer)
    with open(path, "rb") as f:  # the records end where the file's preallocated zeros begin
        assert pos == len(f.read().rstrip(b"\0"))
    return [(kind, off) for kind, offs in regions.items() for off in rng.sample(offs, PER_KIND // 4)]


def _flip(path: Path, offset: int, rng: random.Random) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ rng.randrange(1, 256)]))


async def test_flipped_bytes_in_the_journal_are_served_exactly_or_refused_by_name(
    images: Images, tmp_path: Path,
) -> None:
    rng = random.Random(SEED + 1)
    files = _journal.files(str(images.journal / "journal"))
    assert len(files) == 1
    name = os.path.relpath(files[0], images.journal)
    outcomes: dict[str, int] = {}
    for i, (kind, offset) in enumerate(_journal_offsets(files[0], rng)):
        copy = tmp_path / f"j{i}"
        shutil.copytree(images.journal, copy)
        _flip(copy / name, offset, rng)
        with open(copy / name, "rb") as f:
            flipped = f.read()
        refused = await _refusals(copy, images.expected, f"journal {kind} byte {offset}")
        assert "*" not in refused, f"journal {kind} byte {offset}: the whole database refused to open"
        if kind == "body":
            # The meta names the block's pchannel: the other one has lost nothing and serves.
            assert len(refused) == 1, f"journal body byte {offset}: refused {sorted(refused)}"
        outcome = f"{len(refused)} refused"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if refused:
            with open(copy / (name + _journal.KEPT_SUFFIX), "rb") as f:
                assert f.read() == flipped, "the damaged journal file is kept as it was"
            assert not (copy / name).exists(), "and never replayed again"
        shutil.rmtree(copy)
    # Every byte but a record's trailer is under a checksum, and a damaged trailer leaves the record's
    # content (checked) intact: most flips are refused, the rest served exactly.  The records
    # interleave the two pchannels, so even a flip in a record's own header or meta (which no longer
    # names its pchannels) mostly costs one: the other's next block continues its ids.
    assert PER_KIND - outcomes.get("0 refused", 0) >= PER_KIND * 3 // 4, outcomes
    assert outcomes.get("1 refused", 0) >= PER_KIND * 3 // 4, outcomes


async def test_flipped_bytes_in_a_table_file_are_served_exactly_or_refused_by_name(
    images: Images, tmp_path: Path,
) -> None:
    rng = random.Random(SEED + 2)
    tables = sorted(n for n in os.listdir(images.table) if n.endswith(".sst"))
    assert tables, "the clean close flushed the data into a table file"
    sizes = {n: os.path.getsize(images.table / n) for n in tables}
    biggest = max(tables, key=lambda n: sizes[n])
    outcomes: dict[str, int] = {}
    for i, offset in enumerate(sorted(rng.sample(range(sizes[biggest]), PER_KIND))):
        copy = tmp_path / f"t{i}"
        shutil.copytree(images.table, copy)
        _flip(copy / biggest, offset, rng)
        outcome = await _check(copy, images.expected, f"table {biggest} byte {offset}")
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        shutil.rmtree(copy)
    assert outcomes.get("refused", 0) > 0, outcomes


def test_the_sweep_images_hold_what_the_sweep_assumes(images: Images) -> None:
    # The journal image is a crash image: its data is in the journal; the table image has none left.
    assert os.path.getsize(_journal.files(str(images.journal / "journal"))[0]) > 0
    assert all(os.path.getsize(f) == 0 for f in _journal.files(str(images.table / "journal")))
    assert sum(len(v) for v in images.expected.values()) > 100
