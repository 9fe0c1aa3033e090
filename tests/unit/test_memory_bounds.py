"""The memory settings (docs/operations.md, "Memory") bound what they claim, and reach what they bound.

- RocksDB: the write buffer, the number of memtables and the block cache (which also holds the
  tables' index and filter blocks) are what the backend was given, read back from RocksDB itself
  (its properties and the OPTIONS file it writes); the memtables stay within two write buffers
  however much is written.
- The WAL's tail buffer stays within its bytes however much is appended.
- The node's threads share ``malloc_arena_max`` C allocator arenas (counted by glibc itself).
- NodeConfig's settings reach the backend and the manager the node starts, and bad values are refused
  naming the setting.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import streamingnode.node.node
from streamingnode.config import NodeConfig, load_config
from streamingnode.node.node import Node
from tests.factories import ins, tick
from wal import WALManager
from wal.backends import MemoryBackend
from wal.backends.rocks import (
    DEFAULT_BLOCK_CACHE_BYTES,
    DEFAULT_WRITE_BUFFER_BYTES,
    MAX_WRITE_BUFFERS,
    RocksBackend,
    l0_compaction_trigger,
)
from wal.errors import InvalidArgumentError
from wal.manager import DEFAULT_TAIL_BUFFER_BYTES

MiB = 1 << 20


def _options_file(path: Path) -> dict[str, str]:
    """The newest OPTIONS file RocksDB wrote in ``path``: what it actually runs with."""
    newest = max(path.glob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
    return dict(re.findall(r"^\s*([a-z0-9_]+)=(.*)$", newest.read_text(), flags=re.MULTILINE))


def test_rocksdb_runs_with_the_write_buffer_and_block_cache_it_was_given(tmp_path: Path) -> None:
    backend = RocksBackend(tmp_path / "db", write_buffer_bytes=3 * MiB, block_cache_bytes=5 * MiB)
    try:
        assert backend._db.property_int_value("rocksdb.block-cache-capacity") == 5 * MiB
        options = _options_file(tmp_path / "db")
        assert int(options["write_buffer_size"]) == 3 * MiB
        assert int(options["max_write_buffer_number"]) == MAX_WRITE_BUFFERS == 2
        # Index and filter blocks are counted in the cache, not held beside it by every table reader.
        assert options["cache_index_and_filter_blocks"] == "true"
    finally:
        backend.close()


@pytest.mark.parametrize(("write_buffer", "trigger"), [(16 * MiB, 16), (64 * MiB, 4), (3 * MiB, 32), (1 << 30, 4)])
def test_level_zero_gathers_about_256_mib_before_a_compaction(tmp_path: Path, write_buffer: int, trigger: int) -> None:
    """Small memtables with RocksDB's default trigger (4 files) rewrote level 1 every 64 MiB
    written, a microsecond of compaction per bulk message; the trigger now scales with the memtable
    so that level 0 gathers about 256 MiB (between 4 and 32 files), and RocksDB runs with it."""
    assert l0_compaction_trigger(write_buffer) == trigger
    if write_buffer > 64 * MiB:
        return  # not opened: a memtable that large is no test of the trigger
    backend = RocksBackend(tmp_path / "db", write_buffer_bytes=write_buffer)
    try:
        options = _options_file(tmp_path / "db")
        assert int(options["level0_file_num_compaction_trigger"]) == trigger
        assert int(options["level0_slowdown_writes_trigger"]) == trigger + 16
        assert int(options["level0_stop_writes_trigger"]) == trigger + 32
    finally:
        backend.close()


def test_rocksdb_defaults_are_small(tmp_path: Path) -> None:
    """RocksDB's own defaults here were two 64 MiB memtables and a 32 MiB cache: 160 MiB for a log
    that keeps tens of MB; the defaults are now 2 x 16 MiB and 8 MiB."""
    backend = RocksBackend(tmp_path / "db")
    try:
        assert backend._db.property_int_value("rocksdb.block-cache-capacity") == DEFAULT_BLOCK_CACHE_BYTES == 8 * MiB
        assert int(_options_file(tmp_path / "db")["write_buffer_size"]) == DEFAULT_WRITE_BUFFER_BYTES == 16 * MiB
    finally:
        backend.close()


def test_a_block_cache_of_zero_turns_the_cache_off(tmp_path: Path) -> None:
    backend = RocksBackend(tmp_path / "db", block_cache_bytes=0)
    try:
        assert _options_file(tmp_path / "db")["no_block_cache"] == "true"
    finally:
        backend.close()


async def test_memtables_stay_within_two_write_buffers_however_much_is_written(tmp_path: Path) -> None:
    backend = RocksBackend(tmp_path / "db", write_buffer_bytes=1 * MiB)
    manager = await WALManager.start(backend, tail_buffer_bytes=0)
    try:
        await manager.create_channel("p")
        wal = await manager.open("p")
        peak = 0
        payload = b"x" * 4000
        for k in range(40):  # 40 x 100 x 4 KB = 16 MB through a 1 MiB write buffer
            await wal.append_batch([ins("v", 1000 * k + i + 1, payload) for i in range(100)] + [tick(1000 * k + 999)])
            peak = max(peak, backend._db.property_int_value("rocksdb.size-all-mem-tables"))
        # RocksDB counts a memtable's arena blocks, so a full one may be a little over its size.
        assert 0 < peak <= MAX_WRITE_BUFFERS * MiB * 1.25, f"memtables held {peak} bytes"
    finally:
        await manager.aclose()


def test_bad_rocksdb_memory_settings_are_refused_naming_them(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="write buffer") as caught:
        RocksBackend(tmp_path / "a", write_buffer_bytes=1024)
    assert caught.value.fields["field"] == "rocksdb_write_buffer_bytes"
    with pytest.raises(InvalidArgumentError, match="block cache") as caught:
        RocksBackend(tmp_path / "b", block_cache_bytes=-1)
    assert caught.value.fields["field"] == "rocksdb_block_cache_bytes"
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


async def test_the_tail_buffer_stays_within_its_bytes() -> None:
    manager = await WALManager.start(MemoryBackend(), tail_buffer_bytes=64 * 1024)
    try:
        await manager.create_channel("p")
        wal = await manager.open("p")
        for k in range(200):  # 200 x 10 x 1 KiB: 30 times the budget
            await wal.append_batch([ins("v", 100 * k + i + 1, b"y" * 1024) for i in range(10)] + [tick(100 * k + 99)])
            assert wal._tail._bytes <= 64 * 1024
        assert 0 < len(wal._tail._messages) < 64 and wal._tail.base > 1000
    finally:
        await manager.aclose()


async def test_the_tail_buffer_default_is_the_nodes_default() -> None:
    manager = await WALManager.start(MemoryBackend())
    try:
        assert manager.tail_buffer_bytes == DEFAULT_TAIL_BUFFER_BYTES == NodeConfig().tail_buffer_bytes == 16 * MiB
    finally:
        await manager.aclose()
    assert NodeConfig().rocksdb_write_buffer_bytes == DEFAULT_WRITE_BUFFER_BYTES
    assert NodeConfig().rocksdb_block_cache_bytes == DEFAULT_BLOCK_CACHE_BYTES


async def test_the_nodes_memory_settings_reach_the_backend_and_the_wals(tmp_path: Path) -> None:
    config = load_config(env={"STREAMINGNODE_TAIL_BUFFER_BYTES": str(3 * MiB)}, overrides={
        "data_dir": str(tmp_path / "data"), "rocksdb_write_buffer_bytes": 2 * MiB,
        "rocksdb_block_cache_bytes": 6 * MiB, "flusher": False, "channels": "p"})
    node = await Node.start(config)
    try:
        backend = node.manager.backend
        assert isinstance(backend, RocksBackend)
        assert backend._db.property_int_value("rocksdb.block-cache-capacity") == 6 * MiB
        assert int(_options_file(tmp_path / "data")["write_buffer_size"]) == 2 * MiB
        await node.open_all()
        wal = node.channel("p").stream.wal
        assert wal._tail._max_bytes == node.manager.tail_buffer_bytes == 3 * MiB
    finally:
        await node.aclose()


# Eight threads allocate at once (payloads over pymalloc's 512 bytes go to malloc), then glibc prints
# one "Arena N:" block per arena it made.
_ARENAS = textwrap.dedent("""
    import ctypes, sys, threading
    from streamingnode.node.memory_trim import limit_arenas
    if int(sys.argv[1]):
        assert limit_arenas(int(sys.argv[1]))
    held, barrier = [], threading.Barrier(8)
    def work():
        barrier.wait()
        held.append([bytes(4000) for _ in range(100)])
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    ctypes.CDLL("libc.so.6").malloc_stats()
""")


def _arenas(limit: int) -> int:
    done = subprocess.run([sys.executable, "-c", _ARENAS, str(limit)], capture_output=True, text=True, timeout=60,
                          check=True, cwd=Path(__file__).resolve().parents[2])
    return sum(line.startswith("Arena ") for line in done.stderr.splitlines())


def test_the_threads_share_at_most_malloc_arena_max_arenas() -> None:
    assert _arenas(0) > 4  # glibc's default: a new arena per thread, up to 8 per core
    assert _arenas(2) == 2


async def test_the_node_limits_the_arenas_before_its_threads_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    limits: list[int] = []
    monkeypatch.setattr(streamingnode.node.node, "limit_arenas", limits.append)
    assert NodeConfig().malloc_arena_max == 2
    node = await Node.start(NodeConfig(data_dir=tmp_path / "data", flusher=False, malloc_arena_max=3))
    await node.aclose()
    assert limits == [3]


@pytest.mark.parametrize(("setting", "value", "words"), [
    ("malloc_arena_max", -1, "malloc_arena_max must be >= 0"),
    ("tail_buffer_bytes", -1, "tail_buffer_bytes must be >= 0"),
    ("rocksdb_block_cache_bytes", -1, "rocksdb_block_cache_bytes must be >= 0"),
    ("rocksdb_write_buffer_bytes", 65536, "rocksdb_write_buffer_bytes must be >= 1 MiB"),
])
def test_bad_memory_settings_are_refused_naming_the_setting(setting: str, value: int, words: str) -> None:
    with pytest.raises(InvalidArgumentError, match=words) as caught:
        NodeConfig(**{setting: value})
    assert caught.value.fields["field"] == setting
