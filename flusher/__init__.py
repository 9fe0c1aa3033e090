"""flusher: turns a pchannel's WAL into Parquet files for Spark, exactly once.

``Flusher`` reads one pchannel from its checkpoint and writes through the one commit protocol of
``flusher.commit``; ``flusher.layout`` says where files go.  See README.md.

Names are imported lazily: ``flusher.read.spark`` runs under spark-submit, where importing the package
must not pull in the WAL, its interceptors and RocksDB.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flusher.checkpoint import CHECKPOINT_META
    from flusher.commit import commit_file, remove_temporaries
    from flusher.config import FlusherConfig
    from flusher.flusher import Flusher, FlusherState, FlusherStats

_WHERE = {
    "CHECKPOINT_META": "flusher.checkpoint",
    "Flusher": "flusher.flusher",
    "FlusherConfig": "flusher.config",
    "FlusherState": "flusher.flusher",
    "FlusherStats": "flusher.flusher",
    "commit_file": "flusher.commit",
    "remove_temporaries": "flusher.commit",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'flusher' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "CHECKPOINT_META",
    "Flusher",
    "FlusherConfig",
    "FlusherState",
    "FlusherStats",
    "commit_file",
    "remove_temporaries",
]
