"""The data journal of the RocksDB backend: durable group commits without RocksDB's own log.

RocksDB's write-ahead log copies every record and checksums it (CRC32C) while rocksdict holds the GIL;
in the rocksdict build this runs on, the CRC32C has no hardware support, and together they cost about
2 µs per KiB of data, a third of the writer thread's time.  Blocks already carry a CRC32 of their own
(wal/_codec.py), so the backend writes data with RocksDB's log off and appends each group commit here
instead: one ``writev`` of small headers plus the blocks as they are, and ``fdatasync``, both without
the GIL.  Channel records and small metadata still go through RocksDB's log (synced writes).

Files ``journal/<sequence>.jnl``; a record (version 2) is

    u32 magic "SNJ2" | u32 meta length | u32 CRC32(meta) | meta | block 0 | block 1 | ... | trailer
    trailer = u64 record length (from the magic to the trailer's end) | u32 end magic "SNJE"

and meta lists, per group, ``u32 channel key | u64 first id | u64 max timetick | u32 ticks |
u32 block length | u32 CRC32(block header)`` followed by the ticks (``u64 timetick | u64 id | u64 resume
id``).  The CRCs chain: the meta's covers the block headers' CRCs, a block header covers its count and
length and holds its body's CRC, so every byte but the trailer is checked, without a CRC of the data
on the writer's thread beyond the one the block already has.  Version 1 records ("SNJ1", no trailer,
the body's CRC in the meta) are still read, so a journal left behind by an older build replays.

What the journal holds is in RocksDB's memtable, not yet in a table file.  After ``rotate_bytes`` the
journal moves to a new file, a RocksDB flush runs in the background, and once it has returned the
older files are deleted (their writes are in table files now).  On open every file left is replayed
in order (puts are idempotent), RocksDB is flushed and the files are deleted.

The writer preallocates each file (zeros written ahead of the records, so that a sync commits no
change of the file's size): at a record boundary, a rest of the file that is all zeros is where the
records end, in any file, and is neither a torn tail nor damage.

A torn tail or damage?  A write cut short by a crash leaves a prefix of its record at the end of the
newest file, perhaps followed by bytes never written (zeros); it was never acknowledged (the sync
comes after it), so replay drops it, as RocksDB's point-in-time recovery does, and keeps the dropped
bytes beside the file (``<file>.torn``).  A record that does not check out is taken for such a tail
only when both hold:

- nothing valid follows it in the file: every later occurrence of a record magic is tried as the start
  of a record (header, meta CRC, block CRCs); when the damaged record's own meta checks out the search
  starts after its end, as its bytes are known to be its own;
- it is not complete: a trailer whose length reaches back exactly to the record's start proves the
  whole record reached the disk, so what fails inside it is damage, not a cut.

Anything else is damage (``Torn.damaged``); what replay makes of it, failing only the pchannels the
record held and keeping the file, is wal/backends/_replay.py's.  A bad record in an older file is
always damage.  The search may take a payload that happens to hold a valid record (or trailer) for
one, and then refuses a true torn tail: the mistake goes towards refusing, never towards dropping
what was acknowledged.  Version 1 records
have no trailer: there, damage in the last record cannot be told from a cut.

A destroyed channel first empties the journal the same way, so replay can never bring back what was
deleted; a truncation leaves a mark below which replay skips blocks instead (``_keys.TRUNCATED_META``).
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from wal._codec import BLOCK_HEADER_SIZE, block_checksum_ok
from wal.backend import TickEntry, WriteGroup

MAGIC_V1 = 0x534E4A31  # "SNJ1": no trailer, the block body's CRC in the meta
MAGIC = 0x534E4A32  # "SNJ2"
END_MAGIC = 0x534E4A45  # "SNJE"
_RECORD = struct.Struct("<III")
_GROUP = struct.Struct("<IQQIII")
_TICK = struct.Struct("<QQQ")
_TRAILER = struct.Struct("<QI")
_BLOCK_CRC = struct.Struct("<I")
_BLOCK_CRC_OFFSET = BLOCK_HEADER_SIZE - 4  # the header's last field is the body's CRC32
_MAGICS = (MAGIC, MAGIC_V1)
SUFFIX = ".jnl"
TORN_SUFFIX = ".torn"
KEPT_SUFFIX = ".kept"
"""Appended to a journal file that was not fully replayed (damage in it or before it): kept as
evidence, never replayed again and never deleted by the node."""


def encode(groups: list[WriteGroup]) -> list[bytes]:
    """The parts of one record, for ``os.writev``: the blocks are not copied."""
    meta: list[bytes] = []
    size = 0
    for g in groups:
        meta.append(_GROUP.pack(g.channel_key, g.first_id, g.max_timetick, len(g.ticks), len(g.block),
                                zlib.crc32(g.block[:BLOCK_HEADER_SIZE])))
        meta.extend(_TICK.pack(t.timetick, t.message_id, t.resume_id) for t in g.ticks)
        size += len(g.block)
    head = b"".join(meta)
    size += _RECORD.size + len(head) + _TRAILER.size
    return [_RECORD.pack(MAGIC, len(head), zlib.crc32(head)), head, *(g.block for g in groups),
            _TRAILER.pack(size, END_MAGIC)]


@dataclass(frozen=True, slots=True)
class Torn:
    """Where the readable records of a file end, why, and whether that is damage (``damaged``: the
    record is complete or valid records follow it) rather than a write cut short."""

    offset: int
    reason: str
    damaged: bool = False
    channel_keys: tuple[int, ...] = ()  # the pchannels of the bad record, when its meta checks out
    good: tuple[WriteGroup, ...] = ()
    """The groups of the bad record whose blocks check out (only when its meta does)."""
    bad: tuple[tuple[int, int], ...] = ()
    """(channel key, first id) of each group of the bad record whose block does not check out."""


@dataclass(frozen=True, slots=True)
class _Bad:
    reason: str
    end: int | None  # where the record ends, when its meta checks out (its lengths can be trusted)
    channel_keys: tuple[int, ...] = ()
    good: tuple[WriteGroup, ...] = ()
    bad: tuple[tuple[int, int], ...] = ()


def _parse(data: bytes, pos: int) -> tuple[list[WriteGroup], int] | _Bad:
    """The record at ``pos`` and where the next one starts, or why it does not check out."""
    end = len(data)
    if end - pos < _RECORD.size:
        return _Bad("a record header is cut off", None)
    magic, meta_len, meta_crc = _RECORD.unpack_from(data, pos)
    start = pos + _RECORD.size
    if magic not in _MAGICS:
        return _Bad("bad record magic", None)
    if start + meta_len > end:
        return _Bad("the record's metadata is cut off", None)
    head = data[start:start + meta_len]
    if zlib.crc32(head) != meta_crc:
        return _Bad("the record's metadata fails its CRC", None)
    entries: list[tuple[int, int, int, list[TickEntry], int, int]] = []
    at = 0
    try:
        while at < meta_len:
            key, first_id, max_ts, nticks, block_len, crc = _GROUP.unpack_from(head, at)
            at += _GROUP.size
            ticks = [TickEntry(*_TICK.unpack_from(head, at + i * _TICK.size)) for i in range(nticks)]
            at += nticks * _TICK.size
            entries.append((key, first_id, max_ts, ticks, block_len, crc))
    except struct.error:
        return _Bad("the record's metadata does not parse", None)
    body = start + meta_len
    record_end = body + sum(e[4] for e in entries) + (_TRAILER.size if magic == MAGIC else 0)
    keys = tuple(sorted({e[0] for e in entries}))
    groups: list[WriteGroup] = []
    bad: list[tuple[int, int]] = []
    reason = ""
    # Every block is checked, past a bad one too: the meta's lengths place each block, so the groups
    # of other pchannels in a damaged record can still be told whole (see ``Torn.good``).
    for key, first_id, max_ts, ticks, block_len, crc in entries:
        block = data[body:body + block_len]
        if body + block_len > end:
            reason = reason or f"the block of channel key {key} at id {first_id} is cut off"
            bad.append((key, first_id))
        else:
            if magic == MAGIC:
                header_ok = zlib.crc32(block[:BLOCK_HEADER_SIZE]) == crc
            else:
                header_ok = (len(block) >= BLOCK_HEADER_SIZE
                             and _BLOCK_CRC.unpack_from(block, _BLOCK_CRC_OFFSET)[0] == crc)
            if header_ok and block_checksum_ok(block):
                groups.append(WriteGroup(key, first_id, block, ticks, max_ts))
            else:
                reason = reason or f"the block of channel key {key} at id {first_id} is damaged"
                bad.append((key, first_id))
        body += block_len
    if bad:
        return _Bad(reason, record_end, keys, tuple(groups), tuple(bad))
    # The trailer is not checked here: everything it could vouch for already checked out.  (A record
    # complete but for its trailer was cut in its last bytes; applying it brings back nothing wrong.)
    return groups, record_end


def _valid_record_from(data: bytes, start: int) -> int | None:
    """The offset of the first record at or after ``start`` that checks out, if any."""
    patterns = [struct.pack("<I", m) for m in _MAGICS]
    hits = {p: data.find(p, start) for p in patterns}
    while True:
        live = [(at, p) for p, at in hits.items() if at >= 0]
        if not live:
            return None
        at, p = min(live)
        if isinstance(_parse(data, at), tuple):
            return at
        hits[p] = data.find(p, at + 1)


def _complete(data: bytes, pos: int, bad: _Bad) -> bool:
    """Whether a trailer proves the record at ``pos`` reached the disk whole."""
    if bad.end is not None:
        ends = [bad.end] if bad.end <= len(data) else []
    else:
        end_pattern = struct.pack("<I", END_MAGIC)
        ends = []
        at = data.find(end_pattern, pos + _RECORD.size + _TRAILER.size - 4)
        while at >= 0:
            ends.append(at + 4)
            at = data.find(end_pattern, at + 1)
    for end in ends:
        length, magic = _TRAILER.unpack_from(data, end - _TRAILER.size)
        if magic == END_MAGIC and length == end - pos:
            return True
    return False


def zero_rest(data: bytes, pos: int) -> bool:
    """Whether everything from ``pos`` on is zeros: at a record boundary, the unwritten rest of a
    preallocated file, where its records end."""
    return data.count(0, pos) == len(data) - pos


@dataclass(frozen=True, slots=True)
class Record:
    """One record of a journal file, as ``records`` finds it: its groups, or why it does not check out."""

    offset: int
    groups: list[WriteGroup] | None
    """The record's groups; None when it does not check out."""
    reason: str = ""
    """Why it does not check out."""
    channel_keys: tuple[int, ...] = ()
    """The pchannels of a bad record, when its meta checks out."""
    good: tuple[WriteGroup, ...] = ()
    bad: tuple[tuple[int, int], ...] = ()
    """As ``Torn.good`` and ``Torn.bad``."""
    resumes_at: int | None = None
    """Where the first record that checks out after a bad one starts; None when none does."""
    written_whole: bool = False
    """Whether a trailer proves a bad record with nothing valid after it reached the disk whole."""


def records(data: bytes) -> Iterator[Record]:
    """Every record of one journal file's bytes (``data``), in order, reading on past damage: after a bad
    record at the next one that checks out (``resumes_at``); the end of ``data``, a bad record with
    nothing valid after it, or the zero-written rest of a preallocated file ends them.

    The record format and the facts that tell a torn tail from damage are the journal's; what a bad
    record means where it is (the end of the newest file, or not) is the caller's to judge, as replay
    (``read``) and the offline ``verify`` and ``salvage`` do.
    """
    pos = 0
    while pos < len(data):
        parsed = _parse(data, pos)
        if isinstance(parsed, tuple):
            groups, end = parsed
            yield Record(pos, groups)
            pos = end
            continue
        if zero_rest(data, pos):
            return  # the zero-written rest of a preallocated file: the records end here
        follows = _valid_record_from(data, parsed.end if parsed.end is not None else pos + 1)
        whole = follows is None and _complete(data, pos, parsed)
        yield Record(pos, None, parsed.reason, parsed.channel_keys, parsed.good, parsed.bad, follows, whole)
        if follows is None:
            return
        pos = follows


def read(path: str, *, past_damage: bool = False) -> Iterator[list[WriteGroup] | Torn]:
    """The records of one file in order; a ``Torn`` where a record does not check out.

    The ``Torn`` says whether the bad record is damage (``damaged``) or may be a write cut short; the
    caller decides what a cut means where it is (the end of the newest file, or not).  Reading stops
    at the first ``Torn`` unless ``past_damage``: then it goes on at the valid record that follows
    damage (a cut, with nothing valid after it, always ends the file).
    """
    with open(path, "rb") as f:
        data = f.read()
    for r in records(data):
        if r.groups is not None:
            yield r.groups
            continue
        if r.resumes_at is not None:
            yield Torn(r.offset, f"{r.reason}; a valid record follows at byte {r.resumes_at}", True,
                       r.channel_keys, r.good, r.bad)
        elif r.written_whole:
            yield Torn(r.offset, f"{r.reason}; its trailer shows the record was written whole", True,
                       r.channel_keys, r.good, r.bad)
        else:
            yield Torn(r.offset, r.reason, False, r.channel_keys, r.good, r.bad)
        if not past_damage:
            return


def files(directory: str) -> list[str]:
    """The journal files in ``directory``, oldest first."""
    if not os.path.isdir(directory):
        return []
    names = sorted(n for n in os.listdir(directory) if n.endswith(SUFFIX))
    return [os.path.join(directory, n) for n in names]


def kept_files(directory: str) -> list[str]:
    """The journal files kept after damage (``<seq>.jnl.kept``), oldest first."""
    if not os.path.isdir(directory):
        return []
    names = sorted(n for n in os.listdir(directory) if n.endswith(SUFFIX + KEPT_SUFFIX))
    return [os.path.join(directory, n) for n in names]


def file_name(directory: str, sequence: int) -> str:
    return os.path.join(directory, f"{sequence:020d}{SUFFIX}")


def sequence_of(path: str) -> int:
    name = os.path.basename(path).removesuffix(KEPT_SUFFIX)
    return int(name[: -len(SUFFIX)])


def keep_torn_tail(path: str, offset: int) -> str | None:
    """Copy what follows ``offset`` in ``path`` to ``<path>.torn`` (kept for inspection: it is never
    replayed); returns that file's name, or None when nothing follows."""
    with open(path, "rb") as f:
        f.seek(offset)
        # The zeros a preallocated file ends with were never written: what follows is not kept.
        tail = f.read().rstrip(b"\0")
    if not tail:
        return None
    aside = path + TORN_SUFFIX
    with open(aside, "wb") as f:
        f.write(tail)
        f.flush()
        os.fsync(f.fileno())
    return aside


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["END_MAGIC", "KEPT_SUFFIX", "MAGIC", "MAGIC_V1", "SUFFIX", "TORN_SUFFIX", "Record", "Torn", "encode",
           "file_name", "files", "fsync_dir", "keep_torn_tail", "kept_files", "read", "records", "sequence_of",
           "zero_rest"]
