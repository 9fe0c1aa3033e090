"""The on-disk layout of the RocksDB backend, public: what the offline ``verify`` and ``salvage`` tools
read and write besides the backend itself (one definition, so they cannot drift apart).

- The database's keys (wal/README.md, "RocksDB key layout"): one kind byte (``M`` ``C`` ``D`` ``T``
  ``H`` ``X``), then big-endian fields: ``U32``, ``KEY_ID``, ``TICK_VALUE``, ``U64``, the builders
  ``data_key`` and ``tick_key``, ``NEXT_KEY``, and the marks ``DAMAGED`` and ``TRUNCATED_META``.
- The data journal's files (``JOURNAL_DIR``, ``journal_files``, ``KEPT_SUFFIX``) and their records
  (``scan_journal_records``, ``JournalTorn``); the record format is ``wal.backends._journal``'s.

Also ``tail_state``, shared by the backends that recover a channel's state from its stored blocks.
"""

from __future__ import annotations

import os
import struct

from wal._codec import decode_block
from wal.backend import ChannelInfo
from wal.backends._journal import KEPT_SUFFIX
from wal.backends._journal import Torn as JournalTorn
from wal.backends._journal import files as _live_files
from wal.backends._journal import kept_files as _kept_files
from wal.backends._journal import scan_records as scan_journal_records
from wal.backends._journal import sequence_of as _sequence_of
from wal.errors import CodecError, CorruptedError
from wal.message import MessageID

U32 = struct.Struct(">I")
"""A channel key (after the one-byte kind of a key)."""
KEY_ID = struct.Struct(">IQ")
"""A channel key and a message id or timetick: D and T keys."""
TICK_VALUE = struct.Struct(">QQ")
"""A T key's value: the tick's message id and its resume id."""
U64 = struct.Struct(">Q")
"""An H key's value: the largest timetick acknowledged."""
MAX_ID = 0xFFFFFFFFFFFFFFFF
"""The largest u64: the open end of a channel's D or T key range."""
NEXT_KEY = b"Mnext_key"
"""The key holding the next channel key to hand out (u32; keys are never reused)."""


def data_key(channel_key: int, first_id: MessageID) -> bytes:
    """The D key of the block whose first message is ``first_id``."""
    return b"D" + KEY_ID.pack(channel_key, first_id)


def tick_key(channel_key: int, timetick: int) -> bytes:
    """The T key (time index) of the persisted TimeTick at ``timetick``."""
    return b"T" + KEY_ID.pack(channel_key, timetick)


DAMAGED = "damaged"
"""The field of a channel record (a C key's JSON) that marks a pchannel whose journal records were
damaged when the database opened: ``{"file", "offset", "reason", "first_id"}``, where ``first_id`` is
the first id of the pchannel the database does not hold (what came from it on is lost, or only in
kept journal files).  Opening such a pchannel fails with CORRUPTED; ``salvage`` removes the mark."""

TRUNCATED_META = "wal.truncated_before"
"""The per-channel value (an X key, u64) below which a truncation deleted every block: journal
replay skips older blocks, so truncating needs no journal checkpoint."""


JOURNAL_DIR = "journal"
"""The data journal's directory inside the data directory."""


def journal_files(data_dir: str) -> list[tuple[str, bool]]:
    """Every journal file of ``data_dir``, live (``<seq>.jnl``) and kept after damage
    (``<seq>.jnl.kept``), in sequence order: (path, whether it is kept)."""
    directory = os.path.join(data_dir, JOURNAL_DIR)
    both = [(p, True) for p in _kept_files(directory)] + [(p, False) for p in _live_files(directory)]
    return sorted(both, key=lambda pk: _sequence_of(pk[0]))


def tail_state(
    info: ChannelInfo, last_block: tuple[MessageID, bytes] | None, where: str, max_timetick: int
) -> ChannelInfo:
    """Fill ``next_id`` and ``last_timetick`` of ``info`` from the last stored block and the stored
    high-water timestamp (``max_timetick``, written with every block)."""
    info.last_timetick = max_timetick
    if last_block is None:
        return info
    first_id, block = last_block
    try:
        messages = decode_block(block, first_id)
    except CodecError as exc:
        raise CorruptedError(
            f"last block of pchannel {info.name!r} at id {first_id} in {where} is damaged: {exc}",
            channel=info.name, message_id=first_id, path=where,
        ) from exc
    info.next_id = first_id + len(messages)
    info.last_timetick = max([max_timetick, *(m.timetick for m in messages)])
    return info


__all__ = [
    "DAMAGED",
    "JOURNAL_DIR",
    "KEPT_SUFFIX",
    "KEY_ID",
    "MAX_ID",
    "NEXT_KEY",
    "TICK_VALUE",
    "TRUNCATED_META",
    "U32",
    "U64",
    "JournalTorn",
    "data_key",
    "journal_files",
    "scan_journal_records",
    "tail_state",
    "tick_key",
]
