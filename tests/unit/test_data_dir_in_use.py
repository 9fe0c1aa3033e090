"""A data directory that another process (or another open) holds is reported as in use, naming the
directory: UNAVAILABLE (retriable: the holder may be a node still shutting down), never CORRUPTED,
which would send an operator restoring a backup of healthy data."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from wal.backends import RocksBackend
from wal.errors import CorruptedError, ErrorCode, UnavailableError

_HOLDER = """
import sys
from wal.backends import RocksBackend
backend = RocksBackend(sys.argv[1])
print("open", flush=True)
sys.stdin.readline()
backend.close()
"""


def test_a_data_dir_held_by_another_process_is_in_use_not_corrupted(tmp_path: Path) -> None:
    path = tmp_path / "db"
    RocksBackend(path).close()
    with subprocess.Popen([sys.executable, "-c", _HOLDER, str(path)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as holder:
        try:
            assert holder.stdout is not None
            # Log lines may come first; the holder says "open" once it has the database.
            lines = iter(holder.stdout.readline, "")
            assert "open\n" in lines, "the holder exited without opening the database"
            with pytest.raises(UnavailableError) as caught:
                RocksBackend(path)
            err = caught.value
            assert not isinstance(err, CorruptedError) and err.code is ErrorCode.UNAVAILABLE
            assert f"WAL database at {path} is in use by another process" in str(err), err
            assert err.fields["path"] == str(path)
        finally:
            holder.communicate("\n", timeout=30)
    assert holder.returncode == 0
    RocksBackend(path).close()  # free again once the holder is gone


def test_a_second_open_in_the_same_process_is_in_use(tmp_path: Path) -> None:
    path = tmp_path / "db"
    first = RocksBackend(path)
    try:
        with pytest.raises(UnavailableError, match=f"WAL database at {path} is in use"):
            RocksBackend(path)
    finally:
        first.close()
