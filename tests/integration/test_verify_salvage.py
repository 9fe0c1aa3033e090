"""``streamingnode verify`` and ``salvage`` against real data directories (the embedded WAL and a
flusher's Parquet files), clean and damaged copies of them, run as the commands they are
(``python -m streamingnode ...``)."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from flusher import Flusher, FlusherConfig
from interceptors.recovery.streaming_wal import ChainConfig, open_streaming_wal
from wal import Message, MessageType, WALManager, bodies, new_time_tick
from wal.backends import RocksBackend, _journal

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("name", pa.string())])
BLOCKS = 40
"""Blocks appended to pchannel 'p', each an insert and a TimeTick: ids 2k and 2k + 1."""
C_TAIL = 3
"""Messages appended to pchannel 'c' last, in one block."""
DAMAGED_BLOCK = 20
"""The block of 'p' the journal tests damage: ids 40 and 41."""


def payload(k: int) -> bytes:
    # Incompressible, so that p's blocks fill most of the table file the SST test damages.
    return f"p-{k:05d}-".encode() + random.Random(k).randbytes(200)


async def build(data_dir: str, *, crash: bool = False) -> None:
    """A data directory with pchannel 'c' (a collection flushed to three Parquet files) and 'p' (plain
    messages, one block per append).  ``crash``: end with ``os._exit``, so that the journal keeps its
    records (a clean close empties it into RocksDB's tables)."""
    manager = await WALManager.start(RocksBackend(data_dir))
    await manager.create_channel("c")
    swal = await open_streaming_wal(manager, "c", ChainConfig(tick_interval=0.01, segment_max_rows=1000))
    await swal.ready()
    flusher = Flusher(swal, Path(data_dir) / "parquet" / "c", FlusherConfig())
    await flusher.start()
    await swal.append(bodies.create_collection("v", "coll", SCHEMA, "pk"))
    for i in range(3):
        batch = pa.record_batch([pa.array(range(i * 5, i * 5 + 5), pa.int64()),
                                 pa.array([f"r{j}" for j in range(i * 5, i * 5 + 5)])], schema=SCHEMA)
        await swal.append(bodies.insert("v", "coll", batch))
        await flusher.flush("v")
    await flusher.aclose()
    await swal.aclose()
    await manager.create_channel("p")
    wal = await manager.open("p")
    for k in range(BLOCKS):
        await wal.append_batch([Message(MessageType.INSERT, "pv", payload(k), timetick=10 * k + 1),
                                new_time_tick(10 * k + 2)])
    # Then pchannel c again: in the journal, these records follow p's.
    wal = await manager.open("c")
    await wal.append_batch([Message(MessageType.DATA, "cv", f"c-tail-{k}".encode()) for k in range(C_TAIL)])
    if crash:
        os._exit(0)
    await manager.aclose()


def node_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streamingnode", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)


def _built(tmp: Path, crash: bool) -> Path:
    path = tmp / ("crashed" if crash else "clean")
    code = f"import asyncio\nfrom tests.integration.test_verify_salvage import build\n" \
           f"asyncio.run(build({str(path)!r}, crash={crash}))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return path


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("verify-originals")
    return {"clean": _built(tmp, crash=False), "crashed": _built(tmp, crash=True)}


@pytest.fixture
def clean(originals: dict[str, Path], tmp_path: Path) -> Path:
    """A copy of a cleanly closed data directory: everything in RocksDB's tables, three Parquet files."""
    return Path(shutil.copytree(originals["clean"], tmp_path / "clean"))


@pytest.fixture
def crashed(originals: dict[str, Path], tmp_path: Path) -> Path:
    """A copy of a data directory whose node was killed: p's blocks (and c's last) only in the journal."""
    return Path(shutil.copytree(originals["crashed"], tmp_path / "crashed"))


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def journal_record_of(data_dir: Path, first_id: int) -> tuple[Path, int, int]:
    """(journal file, offset, length) of the record that holds p's block at ``first_id``."""
    for name in _journal.files(str(data_dir / "journal")):
        offset = 0
        for groups in _journal.read(name):
            assert isinstance(groups, list)
            size = sum(map(len, _journal.encode(groups)))
            if any(g.first_id == first_id and g.channel_key == 2 for g in groups):
                return Path(name), offset, size
            offset += size
    raise AssertionError(f"no journal record holds id {first_id}")


def findings(out: str) -> list[str]:
    """The finding lines of verify's output (notes and the summary left out)."""
    return [line for line in out.splitlines() if line and not line.startswith(("note:", "verify "))]


def parquet_files(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "parquet").rglob("*.parquet"))


def store_digest(data_dir: Path) -> dict[str, str]:
    """What the stores hold, file by file (RocksDB's text LOG left out)."""
    return {str(p.relative_to(data_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(data_dir.rglob("*")) if p.is_file() and not p.name.startswith("LOG")}


# --- verify ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["clean", "crashed"])
def test_verify_passes_a_clean_data_dir_with_exit_0(originals: dict[str, Path], kind: str, tmp_path: Path) -> None:
    data_dir = Path(shutil.copytree(originals[kind], tmp_path / kind))
    before = store_digest(data_dir)
    done = node_cli("verify", "--data-dir", str(data_dir))
    assert done.returncode == 0, done.stdout + done.stderr
    assert findings(done.stdout) == []
    summary = done.stdout.splitlines()[-1]
    assert summary.startswith(f"verify {data_dir}: clean") and "3 parquet files" in summary, summary
    if kind == "crashed":
        # p's blocks are checked where they are: one record each (and c's, before them).
        assert int(summary.split("(")[1].split(" journal records")[0]) > BLOCKS, summary
    assert store_digest(data_dir) == before  # verify changes no stored byte


def test_a_flipped_byte_in_a_journal_record_followed_by_valid_ones_is_one_finding(crashed: Path) -> None:
    path, offset, size = journal_record_of(crashed, 2 * DAMAGED_BLOCK)
    flip(path, offset + size // 2)
    done = node_cli("verify", "--data-dir", str(crashed))
    assert done.returncode == 1, done.stdout + done.stderr
    [line] = findings(done.stdout)
    assert line.startswith(f"{path} at byte {offset}: damaged journal record"), line
    assert "valid records follow it" in line
    assert done.stdout.splitlines()[-1].startswith(f"verify {crashed}: 1 finding(s)")


def test_a_flipped_byte_in_a_table_file_is_one_finding_naming_it(clean: Path) -> None:
    [sst] = clean.glob("*.sst")
    flip(sst, sst.stat().st_size // 3)  # inside p's blocks, which fill most of the file
    done = node_cli("verify", "--data-dir", str(clean))
    assert done.returncode == 1, done.stdout + done.stderr
    [line] = findings(done.stdout)
    assert line.startswith(f"{sst}: RocksDB cannot read keys after"), line
    assert "Corruption" in line and "pchannel(s) 'p'" in line


@pytest.mark.parametrize("damage", ["footer byte", "truncated"])
def test_a_damaged_parquet_file_is_one_finding_naming_it(clean: Path, damage: str) -> None:
    target = parquet_files(clean)[1]
    if damage == "truncated":
        os.truncate(target, target.stat().st_size // 2)
    else:
        flip(target, target.stat().st_size - 12)  # in the footer's metadata, before its length and magic
    done = node_cli("verify", "--data-dir", str(clean))
    assert done.returncode == 1, done.stdout + done.stderr
    [line] = findings(done.stdout)
    assert line.startswith(f"{target}: "), line


def test_verify_refuses_a_data_dir_a_running_node_holds(clean: Path) -> None:
    holder_code = ("import sys\nfrom wal.backends import RocksBackend\nb = RocksBackend(sys.argv[1])\n"
                   "print('open', flush=True)\nsys.stdin.readline()\nb.close()\n")
    with subprocess.Popen([sys.executable, "-c", holder_code, str(clean)], cwd=ROOT, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as holder:
        try:
            assert holder.stdout is not None
            assert "open\n" in iter(holder.stdout.readline, ""), "the holder exited without opening the database"
            for command in (["verify"], ["salvage", "--pchannel", "p", "--truncate-at-corruption"]):
                done = node_cli(*command, "--data-dir", str(clean))
                assert done.returncode == 2, done.stdout + done.stderr
                assert f"data directory {clean} is in use by a running node" in done.stderr, done.stderr
        finally:
            holder.communicate("\n", timeout=60)
    assert holder.returncode == 0


# --- salvage -----------------------------------------------------------------------------------------
async def _read_back(data_dir: Path) -> tuple[int, list[Message], int]:
    """(term, stored messages, next id) of p, opened as the node opens it; checks on the way that
    p's largest acknowledged timestamp survived the cut and that c lost nothing."""
    manager = await WALManager.start(RocksBackend(data_dir))
    try:
        wal = await manager.open("p")
        messages = await wal.read_stored(wal.first_id, 1 << 30) if wal.next_id > wal.first_id else []
        assert wal.last_timetick == 10 * (BLOCKS - 1) + 2  # time never goes back, whatever was cut
        c = await manager.open("c")
        tail = (await c.read_stored(c.first_id, 1 << 30))[-C_TAIL:]
        assert [m.payload for m in tail] == [f"c-tail-{k}".encode() for k in range(C_TAIL)]
        return wal.term, messages, wal.next_id
    finally:
        await manager.aclose()


def _expected(upto_block: int) -> list[tuple[MessageType, bytes, int]]:
    out = []
    for k in range(upto_block):
        out += [(MessageType.INSERT, payload(k), 10 * k + 1), (MessageType.TIME_TICK, b"", 10 * k + 2)]
    return out


async def test_salvage_without_the_flag_reports_the_cut_and_changes_nothing(crashed: Path) -> None:
    path, offset, size = journal_record_of(crashed, 2 * DAMAGED_BLOCK)
    flip(path, offset + size // 2)
    before = store_digest(crashed)
    done = node_cli("salvage", "--data-dir", str(crashed), "--pchannel", "p")
    assert done.returncode == 1, done.stdout + done.stderr
    first, last = 2 * DAMAGED_BLOCK, 2 * BLOCKS - 1
    assert f"pchannel 'p': would cut ids {first}..{last} ({last - first + 1} messages)" in done.stdout
    assert "nothing changed; run again with --truncate-at-corruption" in done.stdout
    assert store_digest(crashed) == before


async def test_salvage_cuts_a_damaged_journal_record_and_the_pchannel_reopens_with_what_preceded_it(
    crashed: Path,
) -> None:
    path, offset, size = journal_record_of(crashed, 2 * DAMAGED_BLOCK)
    flip(path, offset + size // 2)
    done = node_cli("salvage", "--data-dir", str(crashed), "--pchannel", "p", "--truncate-at-corruption")
    assert done.returncode == 0, done.stdout + done.stderr
    first, last = 2 * DAMAGED_BLOCK, 2 * BLOCKS - 1
    assert f"pchannel 'p': cut ids {first}..{last} ({last - first + 1} messages)" in done.stdout
    [aside] = crashed.glob("salvaged-*")
    assert (aside / "journal" / path.name).is_file() and not path.exists()  # kept as evidence, not replayed
    term, messages, next_id = await _read_back(crashed)
    assert term == 3  # 1 before the damage; salvage takes 2; this open 3
    assert next_id == first
    assert [(m.message_type, m.payload, m.timetick) for m in messages] == _expected(DAMAGED_BLOCK)
    assert [m.message_id for m in messages] == list(range(first))
    done = node_cli("verify", "--data-dir", str(crashed))
    assert done.returncode == 0, done.stdout + done.stderr


async def test_salvage_cuts_at_a_damaged_table_block_and_leaves_a_database_verify_passes(clean: Path) -> None:
    [sst] = clean.glob("*.sst")
    flip(sst, sst.stat().st_size // 3)
    done = node_cli("salvage", "--data-dir", str(clean), "--pchannel", "p", "--truncate-at-corruption")
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("pchannel 'p': cut ids"))
    first = int(line.split("cut ids ")[1].split("..")[0])
    assert 0 < first < 2 * BLOCKS and first % 2 == 0, line
    assert f"..{2 * BLOCKS - 1} ({2 * BLOCKS - first} messages)" in line
    term, messages, next_id = await _read_back(clean)
    assert term == 3 and next_id == first
    assert [(m.message_type, m.payload, m.timetick) for m in messages] == _expected(first // 2)
    done = node_cli("verify", "--data-dir", str(clean))
    assert done.returncode == 0, done.stdout + done.stderr
    # The Parquet files of pchannel c were never touched.
    assert len(parquet_files(clean)) == 3
