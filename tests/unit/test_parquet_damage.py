"""Damaged Parquet never stops the node: the flusher moves the file aside, rewrites it from the WAL
when the WAL still holds its messages (or reports the loss), and readers never read it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import structlog

from flusher import _probe, layout
from flusher._buffers import Buffer
from flusher.read.spark import DamagedFileError, read_collection_arrow
from streamingnode.config import NodeConfig
from streamingnode.node.channel import Owner
from streamingnode.node.node import Node
from tests.waiting import until
from wal import bodies
from wal.message import Position

SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("name", pa.string())])
P = "p"


def config(data: Path, **overrides: object) -> NodeConfig:
    base: dict[str, object] = {"data_dir": data, "listen": "127.0.0.1:0", "metrics_listen": "127.0.0.1:0",
                               "tick_interval": 0.02, "drain_seconds": 0.5}
    base.update(overrides)
    return NodeConfig(**base)  # type: ignore[arg-type]


def rows(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(range(start, start + n), pa.int64()),
                            pa.array([f"n{i}" for i in range(start, start + n)])], schema=SCHEMA)


async def write_files(node: Node) -> None:
    """Four data files of one segment and one delete file, each acknowledged and flushed."""
    await node.create_channels([P], 0, Owner())
    channel = node.channel(P)
    assert channel.flusher is not None
    await channel.stream.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
    for i in range(4):
        await channel.stream.append(bodies.insert("v", "c", rows(i * 10, 10)))
        await channel.flusher.flush("v")
    await channel.stream.append(bodies.delete("v", "c", pa.array([3, 13], pa.int64())))
    await channel.flusher.flush("v")


def parquet_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.parquet") if layout.QUARANTINE_DIR not in p.parts)


def quarantined(root: Path) -> list[Path]:
    return sorted((root / layout.QUARANTINE_DIR).glob("*")) if (root / layout.QUARANTINE_DIR).is_dir() else []


def metric(node: Node, name: str) -> float:
    value = node.metrics.registry.get_sample_value(name, {"pchannel": P})
    assert value is not None, name
    return value


def flip(offset: Callable[[bytes], int]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[offset(bytes(data))] ^= 0x01
        path.write_bytes(bytes(data))
    return damage


def set_byte(path: Path, key: bytes, after: int, value: int) -> None:
    """One byte of a key-value metadata entry's value (``after`` bytes past its key) set to ``value``."""
    data = bytearray(path.read_bytes())
    at = data.rindex(key) + len(key) + after
    assert data[at] != value
    data[at] = value
    path.write_bytes(bytes(data))


def footer_start(data: bytes) -> int:
    return len(data) - 8 - int.from_bytes(data[-8:-4], "little")


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGE: dict[str, Callable[[Path], None]] = {
    "head magic": flip(lambda d: 1),
    "first page": flip(lambda d: 40),
    "middle of the pages": flip(lambda d: footer_start(d) // 2),
    "footer start": flip(footer_start),
    "last key's id in the footer": flip(lambda d: d.index(b":", d.rindex(layout.LAST_KEY)) + 1),
    "first key's time in the footer": lambda path: set_byte(path, layout.FIRST_KEY, 2, ord("9")),
    "footer length": flip(lambda d: len(d) - 7),
    "tail magic": flip(lambda d: len(d) - 1),
    "truncated": truncate,
}


@pytest.mark.parametrize("kind", ["data", "deletes"])
@pytest.mark.parametrize("how", list(DAMAGE))
async def test_a_damaged_file_is_moved_aside_and_rewritten_from_the_wal(tmp_path: Path, how: str, kind: str) -> None:
    cfg = config(tmp_path / "data")
    node = await Node.start(cfg)
    try:
        await node.open_all()
        await write_files(node)
        root = node.config.parquet_root / P
        expected = read_collection_arrow(root, "c")
        files = parquet_files(root)
        assert len(files) == 5
    finally:
        await node.aclose()
    victim = files[1] if kind == "data" else next(f for f in files if "_deletes" in f.parts)
    original = pq.read_table(victim)
    DAMAGE[how](victim)

    with structlog.testing.capture_logs() as logs:
        node = await Node.start(cfg)
        try:
            await node.open_all()  # the node starts and serves the pchannel
            flusher = node.channel(P).flusher
            assert flusher is not None
            rel = victim.relative_to(root).as_posix()
            await until(lambda: not flusher.checking, f"the files checked after {how}")
            assert victim.exists() and len(quarantined(root)) == 1
            assert quarantined(root)[0].name == rel.replace("/", "+")
            assert pq.read_table(victim).equals(original, check_metadata=True)  # same rows, same name
            assert read_collection_arrow(root, "c").equals(expected)
            assert metric(node, "streamingnode_parquet_quarantined_total") == 1
            assert metric(node, "streamingnode_parquet_lost_total") == 0
            assert flusher.problems == []
            # The node goes on flushing into the same directory, without writing those rows twice.
            await node.channel(P).stream.append(bodies.insert("v", "c", rows(100, 5)))
            await flusher.flush("v")
            assert read_collection_arrow(root, "c").num_rows == expected.num_rows + 5
        finally:
            await node.aclose()
    moved = [e for e in logs if e["event"] == "damaged parquet file moved aside"]
    assert [e["file"] for e in moved] == [rel]
    assert any(e["event"] == "damaged parquet file rewritten from the WAL" and e["file"] == rel for e in logs)


async def test_a_damaged_file_whose_messages_were_truncated_is_reported_lost(tmp_path: Path) -> None:
    cfg = config(tmp_path / "data", retention_seconds=0.0, retention_check_seconds=3600.0)
    node = await Node.start(cfg)
    try:
        await node.open_all()
        await write_files(node)
        root = node.config.parquet_root / P
        files = [f for f in parquet_files(root) if "_deletes" not in f.parts]
        channel = node.channel(P)
        victim = files[0]
        first_id = layout.parse_name(victim.name)
        assert first_id is not None and channel.retention is not None

        async def truncated() -> bool:
            await channel.retention.check()  # type: ignore[union-attr]
            return channel.stream.wal.first_id > max(first_id)

        await until(truncated, "the WAL truncated past the first file")
        expected = pa.concat_tables([pq.read_table(f) for f in files[1:]])
    finally:
        await node.aclose()
    flip(lambda d: len(d) - 1)(victim)

    node = await Node.start(cfg)
    try:
        await node.open_all()
        flusher = node.channel(P).flusher
        assert flusher is not None
        await until(lambda: not flusher.checking, "the files checked")
        rel = victim.relative_to(root).as_posix()
        (problem,) = flusher.problems
        assert rel in problem and "no longer in the WAL" in problem
        assert not victim.exists() and [p.name for p in quarantined(root)] == [rel.replace("/", "+")]
        assert metric(node, "streamingnode_parquet_quarantined_total") == 1
        assert metric(node, "streamingnode_parquet_lost_total") == 1
        assert node.problems(P) == flusher.problems
        # Readers read the other files fine: every row but the lost file's, minus the deletes.
        got = read_collection_arrow(root, "c")
        assert sorted(got.column("pk").to_pylist()) == sorted(
            k for k in expected.column("pk").to_pylist() if k not in (3, 13))
    finally:
        await node.aclose()


async def test_retention_keeps_a_damaged_files_messages_until_it_is_rewritten(tmp_path: Path) -> None:
    """The check of the files runs after start; retention must not cut the log under it."""
    cfg = config(tmp_path / "data", retention_seconds=0.0, retention_check_seconds=3600.0)
    node = await Node.start(cfg)
    try:
        await node.open_all()
        await write_files(node)
        root = node.config.parquet_root / P
        victim = parquet_files(root)[0]
        original = pq.read_table(victim)
    finally:
        await node.aclose()
    flip(lambda d: 40)(victim)  # a page: found by the check of the data, not at start

    gate = asyncio.Event()
    real = _probe.probe

    async def slow_probe(mode: str, root: Path, pchannel: str, rels: list[str]) -> AsyncIterator[_probe.Answer]:
        if mode == _probe.DATA:
            await gate.wait()
        async for answer in real(mode, root, pchannel, rels):
            yield answer

    mp = pytest.MonkeyPatch()
    mp.setattr(_probe, "probe", slow_probe)
    try:
        node = await Node.start(cfg)
        try:
            await node.open_all()
            channel = node.channel(P)
            assert channel.retention is not None and channel.flusher is not None
            first = channel.stream.wal.first_id
            assert channel.flusher.retained_from == first
            assert await channel.retention.check() is None  # held while the files are unchecked
            gate.set()
            await until(lambda: not channel.flusher.checking, "the files checked")  # type: ignore[union-attr]
            assert len(quarantined(root)) == 1
            assert pq.read_table(victim).equals(original, check_metadata=True)
            assert channel.flusher.retained_from > first
        finally:
            await node.aclose()
    finally:
        mp.undo()


def test_the_arrow_reader_names_a_damaged_file_and_never_lists_the_quarantine(tmp_path: Path) -> None:
    coll = tmp_path / "c" / "partition=_default" / "segment=1"
    coll.mkdir(parents=True)
    table = pa.table({"pk": pa.array([1, 2], pa.int64()), "_ts": pa.array([1, 2], pa.int64()),
                      "_segment": pa.array([1, 1], pa.int64())})
    pq.write_table(table, coll / layout.file_name(1, 1))
    pq.write_table(table, coll / layout.file_name(2, 2), write_page_checksum=True)
    bad = coll / layout.file_name(2, 2)
    flip(lambda d: 40)(bad)
    with pytest.raises(DamagedFileError) as caught:
        read_collection_arrow(tmp_path, "c")
    assert caught.value.path == str(bad)
    assert str(bad) in str(caught.value)

    # Moved aside as the flusher does: readers no longer see it, nor anything else in _quarantine/.
    moved = layout.quarantine(tmp_path, bad.relative_to(tmp_path).as_posix())
    pq.write_table(table, bad)
    again = layout.quarantine(tmp_path, bad.relative_to(tmp_path).as_posix())
    assert moved != again and moved.exists() and again.name == moved.name + ".1"  # never overwritten
    assert read_collection_arrow(tmp_path, "c").num_rows == 2


def _table() -> pa.Table:
    schema = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("name", pa.string()),
                        pa.field("vec", pa.list_(pa.float32(), 4))])
    b = Buffer("c/partition=_default/segment=1", "c", schema, 1, Position(P, 0, 0), primary_key="pk")
    for i in range(3):
        b.add(pa.record_batch([pa.array(range(i * 5, i * 5 + 5), pa.int64()), pa.array([f"r{j}" for j in range(5)]),
                               pa.array([[1.0 * j] * 4 for j in range(5)], pa.list_(pa.float32(), 4))],
                              schema=schema), (1000 + i) << 18, ((1000 + i) << 18, 10 + i), "v", 10)
    return b.to_table(P)


async def test_a_file_that_aborts_the_parquet_reader_is_found_damaged_without_stopping_the_node(
    tmp_path: Path,
) -> None:
    """pyarrow 26 aborts the process (std::terminate) on some footers: here a column chunk's
    histogram.  The checks run in a child, which names the file it died on."""
    good = tmp_path / layout.file_name(10, 12)
    pq.write_table(_table(), good, compression="zstd", coerce_timestamps="us", allow_truncated_timestamps=True,
                   write_page_checksum=True)
    bad = tmp_path / "c" / layout.file_name(10, 12)
    bad.parent.mkdir()
    data = bytearray(good.read_bytes())
    data[898] ^= 0x01  # a column chunk's definition level histogram (the offset moves when the columns change)
    bad.write_bytes(bytes(data))
    rels = ["c/" + bad.name, good.name]
    for mode in (_probe.KEYS, _probe.DATA):
        answers = [a async for a in _probe.probe(mode, tmp_path, P, rels)]
        assert [a[0] for a in answers] == rels
        assert answers[0][1] is None and answers[0][2], answers[0]
        assert answers[1][2] is None
    keys = [a async for a in _probe.probe(_probe.KEYS, tmp_path, P, [good.name])]
    assert keys == [(good.name, (1002 << 18, 12), None)]


async def test_a_rebuilt_file_is_not_written_again_by_the_replay_behind_it(tmp_path: Path) -> None:
    """A buffer of another vchannel holds the checkpoint below the damaged file: the replay after the
    restart reads its messages again (cut at other bounds: the row limit changed), and must skip them
    as the rebuilt file holds them."""
    node = await Node.start(config(tmp_path / "data"))
    try:
        await node.open_all()
        await node.create_channels([P], 0, Owner())
        channel = node.channel(P)
        flusher = channel.flusher
        assert flusher is not None
        await channel.stream.append(bodies.create_collection("w", "d", SCHEMA, "pk"))
        await channel.stream.append(bodies.create_collection("v", "c", SCHEMA, "pk"))
        await channel.stream.append(bodies.insert("w", "d", rows(1000, 3)))  # stays buffered
        for i in range(3):
            await channel.stream.append(bodies.insert("v", "c", rows(i * 3, 3)))
        await flusher.flush("v")
        root = node.config.parquet_root / P
        (victim,) = parquet_files(root)
        original = pq.read_table(victim)
        ids = layout.parse_name(victim.name)
        assert ids is not None and flusher.checkpoint.message_id <= min(ids)  # the replay reads the file's rows
    finally:
        await node.aclose()
    flip(lambda d: len(d) - 1)(victim)  # the footer: its rows are not among those the replay skips

    node = await Node.start(config(tmp_path / "data", flush_max_rows=4))
    try:
        await node.open_all()
        flusher = node.channel(P).flusher
        assert flusher is not None
        await until(lambda: not flusher.checking, "the files checked")
        assert pq.read_table(victim).equals(original, check_metadata=True)
        await flusher.flush("v")
        await flusher.flush("w")
        assert sorted(read_collection_arrow(root, "c").column("pk").to_pylist()) == list(range(9))
        assert sorted(read_collection_arrow(root, "d").column("pk").to_pylist()) == [1000, 1001, 1002]
    finally:
        await node.aclose()


async def test_flipped_bytes_across_every_file_are_rewritten_or_harmless(tmp_path: Path) -> None:
    """The corruption sweep for Parquet: in each round one byte of every file is flipped, at offsets
    drawn with a fixed seed across the whole file (pages, footer, lengths, magics).  After a restart
    every file reads back exactly what it held, either because the flip is harmless (a byte no reader
    interprets, such as the writer's name) or because the file was moved aside and rewritten from the
    WAL, and the node served throughout."""
    import random  # noqa: PLC0415
    import shutil  # noqa: PLC0415

    cfg = config(tmp_path / "data")
    node = await Node.start(cfg)
    try:
        await node.open_all()
        await write_files(node)
        root = node.config.parquet_root / P
        expected = read_collection_arrow(root, "c")
        files = parquet_files(root)
        originals = {f: f.read_bytes() for f in files}
        tables = {f: pq.read_table(f) for f in files}
    finally:
        await node.aclose()
    rng = random.Random(20)
    rounds, rewritten = 8, 0
    for _ in range(rounds):
        for f, data in originals.items():
            damaged = bytearray(data)
            damaged[rng.randrange(len(data))] ^= rng.randrange(1, 256)
            f.write_bytes(bytes(damaged))
        node = await Node.start(cfg)
        try:
            await node.open_all()
            flusher = node.channel(P).flusher
            assert flusher is not None
            await until(lambda: not flusher.checking, "the files checked")  # noqa: B023  (awaited here)
            assert flusher.problems == [], flusher.problems
            for f in files:
                assert pq.read_table(f).equals(tables[f]), f"{f.name} does not hold exactly what it held"
            assert read_collection_arrow(root, "c").equals(expected)
            rewritten += len(quarantined(root))
        finally:
            await node.aclose()
        shutil.rmtree(root / layout.QUARANTINE_DIR, ignore_errors=True)
        for f, data in originals.items():
            f.write_bytes(data)
    # Most bytes of a file are pages and footer under a checksum or a check: most flips are found.
    assert rewritten >= rounds * len(files) // 2, rewritten
