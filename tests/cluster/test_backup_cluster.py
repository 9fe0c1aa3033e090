"""Backup and restore in cluster mode: ``streamingnode backup --nats`` reads a running cluster's streams,
key-value buckets and Parquet root while a producer and a transaction loop run; ``streamingnode restore
--nats`` puts them back under a new cluster prefix; a node started on that prefix serves exactly the
acknowledged history below the printed cut, transactions whole, and the Parquet rows flushed before."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from streamingnode.client import AsyncClient
from tests.integration.test_backup import PCH, SCHEMA, History, Load, expected, iso, parquet_pks, read_through
from tests.natscluster import NatsCluster
from tests.node_process import REPO, NodeProcess
from wal.clock import physical_ms

pytestmark = pytest.mark.integration
_prefixes = itertools.count()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streamingnode", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=240, check=False)


def node(nats: NatsCluster, tmp: Path, name: str, prefix: str, parquet: Path) -> NodeProcess:
    return NodeProcess(tmp / name, None, "--wal", "jetstream", "--nats", nats.url, "--nats-replicas", "1",
                       "--cluster-prefix", prefix, "--drain-seconds", "1", "--parquet-root", str(parquet),
                       "--node-id", name)


async def test_a_cluster_backup_restores_under_a_new_prefix_to_the_acknowledged_history(
    nats_r1: NatsCluster, tmp_path: Path,
) -> None:
    n = next(_prefixes)
    old, new = f"bk{n}", f"rs{n}"
    source = node(nats_r1, tmp_path, "a", old, tmp_path / "parquet")
    await asyncio.to_thread(source.start)
    h = History()
    try:
        async with AsyncClient(source.address) as client:
            await client.create_channels([PCH])
            await client.data(PCH).create_collection("d", "coll", SCHEMA, "pk")
            load = Load(client, h)
            load.start()
            await load.run_for(400)
            flushed = set(h.flushed)
            done = await asyncio.to_thread(cli, "backup", "--nats", nats_r1.url, "--cluster-prefix", old,
                                           "--parquet-root", str(tmp_path / "parquet"), "--to",
                                           str(tmp_path / "backups"), "--json")
            await load.run_for(200)
            await load.aclose()
            # A node in cluster mode has no data directory to back up: it refuses, naming the way.
            refused = await asyncio.to_thread(cli, "backup", "--addr", source.address, "--to", str(tmp_path / "x"))
            assert refused.returncode == 1 and "INVALID_ARGUMENT" in refused.stderr, refused.stderr
            assert "--wal jetstream" in refused.stderr and not (tmp_path / "x").exists()
    finally:
        source.kill()
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    (pos,) = result["positions"]
    assert pos["next_id"] > 0

    # Damage refuses with the file named, and nothing is restored.
    manifest_path = Path(result["path"]) / "manifest.json"
    files = json.loads(manifest_path.read_text())["files"]
    victim = Path(result["path"]) / next(f["path"] for f in files if f["path"].startswith("streams/"))
    original = victim.read_bytes()
    victim.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
    bad = cli("restore", "--from", str(tmp_path / "backups"), "--nats", nats_r1.url, "--cluster-prefix", new,
              "--nats-replicas", "1", "--parquet-dir", str(tmp_path / "parquet2"))
    assert bad.returncode == 1 and str(victim) in bad.stderr, bad.stderr
    assert not (tmp_path / "parquet2").exists()
    victim.write_bytes(original)

    done = cli("restore", "--from", str(tmp_path / "backups"), "--nats", nats_r1.url, "--cluster-prefix", new,
               "--nats-replicas", "1", "--parquet-dir", str(tmp_path / "parquet2"))
    assert done.returncode == 0, done.stderr
    pks = parquet_pks(tmp_path / "parquet2")
    assert flushed <= set(pks) and len(pks) == len(set(pks))
    assert all(h.rows[pk] < pos["next_id"] for pk in pks)
    restored = node(nats_r1, tmp_path, "b", new, tmp_path / "parquet2")
    await asyncio.to_thread(restored.start)
    try:
        plain, txns = await read_through(restored.address)
    finally:
        restored.kill()
    assert (plain, txns) == expected(h, pos["next_id"])
    assert 0 < len(plain) < len(h.sent) and txns, "the cut is mid-way through the history"

    # As of a time: exactly the acknowledged messages stamped at or before it, transactions whole.
    in_backup = [(i, ts, p) for i, ts, p in h.sent if i < pos["next_id"]]
    times = sorted({physical_ms(ts) for _, ts, _ in in_backup})
    cut_ms = times[len(times) // 2]
    done = cli("restore", "--from", str(tmp_path / "backups"), "--nats", nats_r1.url, "--cluster-prefix", f"ut{n}",
               "--nats-replicas", "1", "--parquet-dir", str(tmp_path / "parquet3"), "--until", iso(cut_ms),
               "--pchannel", PCH)
    assert done.returncode == 0, done.stderr
    assert "cut at id" in done.stdout, done.stdout
    at = node(nats_r1, tmp_path, "c", f"ut{n}", tmp_path / "parquet3")
    await asyncio.to_thread(at.start)
    try:
        plain, txns = await read_through(at.address)
    finally:
        at.kill()
    assert plain == sorted((i, p) for i, ts, p in h.sent if physical_ms(ts) <= cut_ms)
    assert txns == [ps for _, ts, ps in sorted(h.txns) if physical_ms(ts) <= cut_ms]
    assert 0 < len(plain) < len(in_backup)
