"""flusher: turns a pchannel's WAL into Parquet files for Spark, exactly once.

``Flusher`` reads one pchannel from its checkpoint and writes through the one commit protocol of
``flusher.commit``; ``flusher._layout`` says where files go.
"""

from flusher.commit import commit_file, remove_temporaries
from flusher.flusher import CHECKPOINT_META, Flusher, FlusherConfig, FlusherState, FlusherStats

__all__ = [
    "CHECKPOINT_META",
    "Flusher",
    "FlusherConfig",
    "FlusherState",
    "FlusherStats",
    "commit_file",
    "remove_temporaries",
]
