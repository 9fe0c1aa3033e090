"""Loaded by the node that bench/node_threads.py starts (this directory is on its PYTHONPATH): every
Python thread sets its OS name to its Python name (the first 15 bytes), so /proc tells the event loop,
the WAL's writer, sync and reader threads, worker threads and RocksDB's own apart; by default every
Python thread of a process is called "python" there."""

import ctypes
import threading

_PR_SET_NAME = 15
_libc = ctypes.CDLL(None)
_bootstrap_inner = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]


def _named(self: threading.Thread) -> None:
    _libc.prctl(_PR_SET_NAME, self.name[:15].encode(), 0, 0, 0)
    _bootstrap_inner(self)


threading.Thread._bootstrap_inner = _named  # type: ignore[attr-defined]
