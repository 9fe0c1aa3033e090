"""The data journal of the RocksDB backend: durable group commits without RocksDB's own log.

RocksDB's write-ahead log copies every record and checksums it (CRC32C) while rocksdict holds the GIL;
in the rocksdict build this runs on, the CRC32C has no hardware support, and together they cost about
2 µs per KiB of data, a third of the writer thread's time.  Blocks already carry a CRC32 of their own
(wal/_codec.py), so the backend writes data with RocksDB's log off and appends each group commit here
instead: one ``writev`` of small headers plus the blocks as they are, and ``fdatasync``, both without
the GIL.  Channel records and small metadata still go through RocksDB's log (synced writes).

Files ``journal/<sequence>.jnl``; a record is

    u32 magic | u32 meta length | u32 CRC32(meta) | meta | block 0 | block 1 | ...

and meta lists, per group, ``u32 channel key | u64 first id | u64 max timetick | u32 ticks |
u32 block length | u32 block CRC`` followed by the ticks (``u64 timetick | u64 id | u64 resume id``).
A block's own header carries its CRC too: replay checks both, so a damaged block is never applied.

What the journal holds is in RocksDB's memtable, not yet in a table file.  After ``rotate_bytes`` the
journal moves to a new file, a RocksDB flush runs in the background, and once it has returned the
older files are deleted (their writes are in table files now).  On open every file left is replayed
in order (puts are idempotent), RocksDB is flushed and the files are deleted.  Replay of the newest
file stops at its first record that does not check out, as RocksDB's point-in-time recovery does: a
write torn by a crash was never acknowledged (the sync comes after it).  A bad record in an older
file is reported (CORRUPTED), never skipped.  Deletions (truncation, a destroyed channel) first empty the journal
the same way, so replay can never bring back what was deleted.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from wal._codec import BLOCK_HEADER_SIZE, block_checksum_ok
from wal.backend import TickEntry, WriteGroup
from wal.errors import CorruptedError

MAGIC = 0x534E4A31  # "SNJ1"
_RECORD = struct.Struct("<III")
_GROUP = struct.Struct("<IQQIII")
_TICK = struct.Struct("<QQQ")
_BLOCK_CRC = struct.Struct("<I")
_BLOCK_CRC_OFFSET = BLOCK_HEADER_SIZE - 4  # the header's last field is the body's CRC32
SUFFIX = ".jnl"


def encode(groups: list[WriteGroup]) -> list[bytes]:
    """The parts of one record, for ``os.writev``: the blocks are not copied."""
    meta: list[bytes] = []
    for g in groups:
        crc = _BLOCK_CRC.unpack_from(g.block, _BLOCK_CRC_OFFSET)[0] if len(g.block) >= BLOCK_HEADER_SIZE else 0
        meta.append(_GROUP.pack(g.channel_key, g.first_id, g.max_timetick, len(g.ticks), len(g.block), crc))
        meta.extend(_TICK.pack(t.timetick, t.message_id, t.resume_id) for t in g.ticks)
    head = b"".join(meta)
    return [_RECORD.pack(MAGIC, len(head), zlib.crc32(head)), head, *(g.block for g in groups)]


@dataclass(frozen=True, slots=True)
class Torn:
    """Where the readable records of a file end, and whether what follows is a torn tail."""

    offset: int
    reason: str


def read(path: str) -> Iterator[list[WriteGroup] | Torn]:
    """The records of one file in order; a ``Torn`` last if the file does not end on a record.

    A record whose header or CRCs do not check out is where reading stops: the caller decides whether
    that may be a torn write (the end of the last file) or must be reported.
    """
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    end = len(data)
    while pos < end:
        if end - pos < _RECORD.size:
            yield Torn(pos, "a record header is cut off")
            return
        magic, meta_len, meta_crc = _RECORD.unpack_from(data, pos)
        start = pos + _RECORD.size
        if magic != MAGIC or start + meta_len > end:
            yield Torn(pos, "bad record magic" if magic != MAGIC else "the record's metadata is cut off")
            return
        head = data[start:start + meta_len]
        if zlib.crc32(head) != meta_crc:
            yield Torn(pos, "the record's metadata fails its CRC")
            return
        groups: list[WriteGroup] = []
        at = 0
        body = start + meta_len
        while at < meta_len:
            key, first_id, max_ts, nticks, block_len, block_crc = _GROUP.unpack_from(head, at)
            at += _GROUP.size
            ticks = [TickEntry(*_TICK.unpack_from(head, at + i * _TICK.size)) for i in range(nticks)]
            at += nticks * _TICK.size
            block = data[body:body + block_len]
            if (body + block_len > end or len(block) < BLOCK_HEADER_SIZE
                    or _BLOCK_CRC.unpack_from(block, _BLOCK_CRC_OFFSET)[0] != block_crc
                    or not block_checksum_ok(block)):
                yield Torn(pos, f"the block of channel key {key} at id {first_id} is cut off or damaged")
                return
            groups.append(WriteGroup(key, first_id, block, ticks, max_ts))
            body += block_len
        yield groups
        pos = body


def files(directory: str) -> list[str]:
    """The journal files in ``directory``, oldest first."""
    if not os.path.isdir(directory):
        return []
    names = sorted(n for n in os.listdir(directory) if n.endswith(SUFFIX))
    return [os.path.join(directory, n) for n in names]


def file_name(directory: str, sequence: int) -> str:
    return os.path.join(directory, f"{sequence:020d}{SUFFIX}")


def sequence_of(path: str) -> int:
    return int(os.path.basename(path)[: -len(SUFFIX)])


def corrupted(path: str, torn: Torn) -> CorruptedError:
    return CorruptedError(
        f"journal {path} is damaged at byte {torn.offset} ({torn.reason}) and newer journal files follow "
        "it; refusing to open rather than lose acknowledged writes", path=path,
    )


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["MAGIC", "SUFFIX", "Torn", "corrupted", "encode", "file_name", "files", "fsync_dir", "read",
           "sequence_of"]
