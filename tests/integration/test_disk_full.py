"""A real small filesystem filling up under a real node process.

A tmpfs of a few MiB is mounted for the test (the tests run as root here).  With a low-water mark the
node refuses appends (STORAGE_FULL) before the disk is full and takes them again by itself once space
is freed; with no mark a real ENOSPC fails the write cleanly, SIGTERM still exits 0 while the disk is
full, and after space is freed a restart serves every acknowledged message.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamingnode.client import Client, DeliverPolicy, StorageFullError, StreamingError, SyncProducer
from tests.node_process import REPO, NodeProcess
from tests.waiting import until_sync
from wal.errors import ErrorCode
from wal.message import MessageType

pytestmark = pytest.mark.integration

MiB = 1 << 20
PAYLOAD = 8 << 10  # compressible: RocksDB's tables stay small, the journal (raw) fills the disk
CHANNEL = "c"


@contextlib.contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        # CI runs as root, where the mount must work: a refusal there is a failure, never a skip.  Only a
        # developer's unprivileged run skips, saying why.
        detail = mounted.stderr.strip()[:200]
        if os.geteuid() == 0:
            pytest.fail(f"mounting a tmpfs failed as root: {detail}")
        pytest.skip(f"mounting a tmpfs needs root (this run is not): {detail}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _payload(i: int) -> bytes:
    return b"%08d" % i + b"x" * (PAYLOAD - 8)


def produce_until_refused(producer: SyncProducer, acked: list[bytes]) -> StreamingError:
    """Send one message at a time until one fails; returns the failure (every success is in ``acked``)."""
    for _ in range(100_000):
        payload = _payload(len(acked))
        try:
            producer.send("v", payload)
        except StreamingError as exc:
            return exc
        acked.append(payload)
    raise AssertionError("the disk never filled up")


def read_all(address: str, count: int) -> list[bytes]:
    out: list[bytes] = []
    with Client(address, timeout=60) as client, client.consumer(
            CHANNEL, "v", policy=DeliverPolicy.all()) as consumer:
        while len(out) < count:
            pack = consumer.next(timeout=30)
            assert pack is not None, f"no pack within 30 s after {len(out)} of {count} messages"
            out += [m.payload for m in pack.messages if m.message_type is MessageType.DATA]
    return out


def verify_clean(data_dir: Path) -> None:
    """``streamingnode verify`` finds nothing (when this tree has the command)."""
    if importlib.util.find_spec("streamingnode.offline.verify") is None:
        return
    done = subprocess.run([sys.executable, "-m", "streamingnode", "verify", "--data-dir", str(data_dir)],
                          capture_output=True, text=True, check=False, timeout=120, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, f"verify found damage:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"


def test_a_filling_disk_is_refused_early_survived_when_full_and_resumed_when_freed(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "mnt", "24m") as mnt:
        data = mnt / "data"
        acked: list[bytes] = []

        # 1. The low-water mark: refused before the disk is full, taken again once space is freed.
        filler = mnt / "filler"
        filler.write_bytes(b"\0" * (6 * MiB))
        node = NodeProcess(data, None, "--channels", CHANNEL, "--storage-min-free-bytes", str(4 * MiB)).start()
        try:
            with Client(node.address, timeout=60) as client, client.producer(CHANNEL, linger=0.001) as producer:
                refused = produce_until_refused(producer, acked)
                assert isinstance(refused, StorageFullError), repr(refused)
                assert refused.code is ErrorCode.STORAGE_FULL and refused.retriable
                assert "storage_min_free_bytes" in str(refused)
                assert len(acked) > 100
                filler.unlink()

                def resumed() -> bool:
                    try:
                        producer.send("v", _payload(len(acked)))
                    except StorageFullError:
                        return False
                    acked.append(_payload(len(acked)))
                    return True

                until_sync(resumed, "appends taken again after space was freed", timeout=60)
            assert any("storage low: flushed and truncated" in line for line in node.stderr)
        finally:
            code = node.terminate()
        assert code == 0, "".join(node.stderr[-20:])

        # 2. No mark: the disk really fills up (as if another process filled it).
        filler = mnt / "filler2"
        filler.write_bytes(b"\0" * (4 * MiB))
        node = NodeProcess(data, None, "--storage-min-free-bytes", "0").start()
        try:
            with Client(node.address, timeout=60) as client, client.producer(CHANNEL, linger=0.001) as producer:
                failed = produce_until_refused(producer, acked)
                assert isinstance(failed, StorageFullError), repr(failed)
                assert os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize < PAYLOAD * 2
        finally:
            # Still full: closing cannot move the journal into RocksDB's tables, which must not fail
            # the shutdown (it exited 1 with RocksDB's error); the journal is replayed at the next start.
            code = node.terminate()
        assert code == 0, "".join(node.stderr[-20:])
        assert "Traceback" not in "".join(node.stderr)

        # 3. Space freed: every acknowledged message is there, in order, and writes go on.
        filler.unlink()
        node = NodeProcess(data, None, "--storage-min-free-bytes", str(1 * MiB)).start()
        try:
            with Client(node.address, timeout=60) as client, client.producer(CHANNEL, linger=0.001) as producer:
                started = time.monotonic()
                producer.send("v", _payload(len(acked)))
                acked.append(_payload(len(acked)))
                assert time.monotonic() - started < 30
            assert read_all(node.address, len(acked)) == acked
        finally:
            code = node.terminate()
        assert code == 0, "".join(node.stderr[-20:])
        verify_clean(data)
