"""Versioned binary codec for the record blocks that hold messages (each message in the record format
of ``wal._record``, whose names this module also exports).

Block, version 1 — one per appended group, like a Kafka record batch::

    b"SNB" | u8 version | u32 count | u32 body_len | u32 crc32(body) | body
    body = count x (u32 message_len | message)

The id of a message is not stored: it is the block's first id plus the message's index in the block.
Decoding never trusts a length: every slice is bounds-checked, the block checksum is verified before
any message is decoded, and any failure raises ``CodecError`` naming what was wrong.
"""

from __future__ import annotations

import itertools
import struct
import zlib
from collections.abc import Iterable, Sequence

from wal._record import (
    _FLAG_LAST_CONFIRMED,
    _FLAG_TXN,
    _HEADER,
    _HEADER_SIZE,
    _KNOWN_FLAGS,
    _MARKED_TYPES,
    _PROP,
    _TYPES,
    MESSAGE_VERSION,
    _decode_at,
    _unpack_len,
)
from wal.errors import CodecError
from wal.message import Message, MessageID, MessageType, TxnContext, decoded_message

BLOCK_VERSION = 1
BLOCK_MAGIC = b"SNB"
_BLOCK_HEADER = struct.Struct("<3sBIII")
BLOCK_HEADER_SIZE = _BLOCK_HEADER.size

_REC = struct.Struct("<I" + _HEADER.format[1:])
"""A block record: the u32 length prefix and the message header, packed and unpacked in one call."""
_REC_SIZE = _REC.size
_pack_rec = _REC.pack
_unpack_rec = _REC.unpack_from

_VC_CACHE_MAX = 4096
_vc_encoded: dict[str, bytes] = {}
_vc_decoded: dict[bytes, str] = {}


def _encode_vchannel(vchannel: str) -> bytes:
    # vchannels repeat across messages: encode each once (bounded, cleared when full).
    if len(_vc_encoded) >= _VC_CACHE_MAX:
        _vc_encoded.clear()
    raw = _vc_encoded[vchannel] = vchannel.encode()
    return raw


def _decode_vchannel(raw: bytes) -> str:
    try:
        vchannel = raw.decode()
    except UnicodeDecodeError as exc:
        raise CodecError("vchannel is not valid UTF-8") from exc
    if len(_vc_decoded) >= _VC_CACHE_MAX:
        _vc_decoded.clear()
    _vc_decoded[raw] = vchannel
    return vchannel


def _plain_parts(messages: Sequence[Message]) -> Iterable[bytes]:
    """The records of messages without properties or transaction, built field by field.

    Every header is packed by ``map`` over the fields' lists, so the loop over messages runs in C;
    per message only a few list comprehensions run as bytecode.  The bytes are exactly those of the
    general path (tested).
    """
    cache = _vc_encoded
    encoded = {vc: cache.get(vc) or vc.encode() for vc in {m._vchannel for m in messages}}
    vcs = [encoded[m._vchannel] for m in messages]
    payloads = [m._payload for m in messages]
    lcs = [m._last_confirmed for m in messages]
    flags: Iterable[int]
    if None in lcs:
        flags = [0 if lc is None else _FLAG_LAST_CONFIRMED for lc in lcs]
        lcs = [0 if lc is None else lc for lc in lcs]
    else:
        flags = itertools.repeat(_FLAG_LAST_CONFIRMED)
    vc_lens = list(map(len, vcs))
    payload_lens = list(map(len, payloads))
    totals = [_HEADER_SIZE + a + b for a, b in zip(vc_lens, payload_lens, strict=True)]
    zero = itertools.repeat(0)
    headers = map(
        _pack_rec, totals, itertools.repeat(MESSAGE_VERSION), [m._type for m in messages], flags,
        [m._timetick for m in messages], [m._term for m in messages], lcs, zero, zero, vc_lens, zero, payload_lens,
    )
    return itertools.chain.from_iterable(zip(headers, vcs, payloads, strict=True))


def encode_block(messages: Sequence[Message]) -> bytes:
    """Encode messages into one checksummed block, in order.

    This is the append hot path.  The usual block (no message with properties or a transaction)
    goes through ``_plain_parts``, the others through ``_general_parts``; both give the same bytes.
    """
    try:
        parts = _general_parts(messages) if _any_extras(messages) else _plain_parts(messages)
        body = b"".join(parts)
    except struct.error as exc:
        raise CodecError(f"message field out of range: {exc}") from exc
    return _BLOCK_HEADER.pack(BLOCK_MAGIC, BLOCK_VERSION, len(messages), len(body), zlib.crc32(body)) + body


def _any_extras(messages: Sequence[Message]) -> bool:
    """Whether a message has properties or a transaction: a plain loop over slots, about half the
    instructions per message of ``any()`` over a generator on CPython 3.11."""
    for m in messages:  # noqa: SIM110  (see the docstring)
        if m._properties or m._txn is not None:
            return True
    return False


def _general_parts(messages: Sequence[Message]) -> list[bytes]:
    """The records of any messages.  The per-message work is inlined: one struct call packs the
    record length with the header, and cached vchannel bytes and the payload are joined without
    copies."""
    parts: list[bytes] = []
    append = parts.append
    pack_rec = _pack_rec
    vcs = _vc_encoded
    for msg in messages:
        vc = vcs.get(msg._vchannel)
        if vc is None:
            vc = _encode_vchannel(msg._vchannel)
        payload = msg._payload
        lc = msg._last_confirmed
        txn = msg._txn
        flags = 0
        if lc is None:
            lc = 0
        else:
            flags = _FLAG_LAST_CONFIRMED
        if txn is None:
            txn_id = keepalive = 0
        else:
            flags |= _FLAG_TXN
            txn_id = txn.txn_id
            keepalive = txn.keepalive_ms
        props = msg._properties
        if props:
            prop_parts: list[bytes] = []
            for k, v in props.items():
                kb = k.encode()
                vb = v.encode()
                prop_parts.append(_PROP.pack(len(kb), len(vb)))
                prop_parts.append(kb)
                prop_parts.append(vb)
            prop_bytes = b"".join(prop_parts)
        else:
            prop_bytes = b""
        append(
            pack_rec(
                _HEADER_SIZE + len(vc) + len(prop_bytes) + len(payload), MESSAGE_VERSION, msg._type, flags,
                msg._timetick, msg._term, lc, txn_id, keepalive, len(vc), len(props), len(payload),
            )
        )
        append(vc)
        if prop_bytes:
            append(prop_bytes)
        append(payload)
    return parts


def block_count(block: bytes) -> int:
    """Number of messages in a block, from its header alone (no checksum verification)."""
    if len(block) < BLOCK_HEADER_SIZE:
        raise CodecError(f"truncated block: {len(block)} bytes")
    magic, version, count, _, _ = _BLOCK_HEADER.unpack_from(block, 0)
    if magic != BLOCK_MAGIC or version != BLOCK_VERSION:
        raise CodecError(f"not a v{BLOCK_VERSION} block (magic {magic!r}, version {version})")
    return int(count)


def _decode_record(
    block: bytes, pos: int, end: int, *, index: int, count: int, msg_id: MessageID | None, out: list[Message]
) -> int:
    """Decode the length-prefixed record at ``pos`` (into ``out`` unless ``msg_id`` is None)."""
    if pos + 4 > end:
        raise CodecError(f"truncated block: message {index} of {count} missing")
    (size,) = _unpack_len(block, pos)
    pos += 4
    if pos + size > end:
        raise CodecError(f"truncated block: message {index} runs past the end")
    if msg_id is not None:
        out.append(_decode_at(block, pos, pos + size, msg_id))
    return int(pos + size)


# A run of records of one shape (same length, vchannel length and payload length, no properties) is
# decoded by one ``Struct.iter_unpack`` that also cuts out the vchannel and the payload: one C call per
# record instead of an unpack and two slices.  Producers mostly send batches of like-sized records, so
# whole blocks are usually such runs, broken only by TimeTicks and transaction framing.
_MIN_RUN = 8
"""Fewer records than this go through the per-record path: the run check costs a few record decodes."""
_MAX_BACKOFF = 64
"""After a failed run check, at most this many records are decoded one by one before the next check."""
# Byte offsets, inside a record, of the fields that make up its shape: u32 length, u8 version,
# u16 vchannel_len, u16 n_props, u32 payload_len (see ``_REC``).  The length's low bytes come first so
# that a block of varied records fails the check on its first slice.
_SHAPE_OFFSETS = (0, 48, 1, 2, 3, 4, 44, 45, 46, 47, 49, 50, 51)
_FLAGS_OFFSET = 7
_ALLOWED_FLAGS = bytes(range(_KNOWN_FLAGS + 1))
assert struct.calcsize("<IBH") == _FLAGS_OFFSET and struct.calcsize("<IBHBQqQqI") == 44 and _REC_SIZE == 52
_SHAPES_MAX = 256
_shapes: dict[tuple[int, int], struct.Struct] = {}


def _shape_struct(vc_len: int, payload_len: int) -> struct.Struct:
    """A record of this shape minus what the run check verified: type, flags, the u64/i64/u32 fields,
    vchannel and payload (pad bytes skip the length, version and the counts)."""
    if len(_shapes) >= _SHAPES_MAX:
        _shapes.clear()
    st = _shapes[(vc_len, payload_len)] = struct.Struct(f"<5xHBQqQqI8x{vc_len}s{payload_len}s")
    return st


def _run_length(block: bytes, pos: int, stride: int, limit: int) -> int:
    """How many records from ``pos`` (at most ``limit``, all inside the block) share the first's shape.

    Each byte of the shape fields is compared across the records with one strided slice (C work, no
    per-record Python).  This is sound although record boundaries are only assumed: record k is checked
    at ``pos + k * stride``, which is where it starts exactly when records 0..k-1 have the first one's
    length, which the leading run of equal length bytes establishes.
    """
    stop = pos + stride * limit
    n = limit
    for off in _SHAPE_OFFSETS:
        col = block[pos + off : stop : stride]
        n = min(n, len(col) - len(col.lstrip(col[:1])))
        if n < _MIN_RUN:
            return n
    col = block[pos + _FLAGS_OFFSET : stop : stride]
    return min(n, len(col) - len(col.lstrip(_ALLOWED_FLAGS)))


_TYPE_OFFSETS = (5, 6)
_VC_OFFSET = _REC_SIZE
_PLAIN_VC_MAX = 32
"""Longest vchannel whose bytes are compared across a run (one strided slice per byte)."""
_plain_structs: dict[tuple[int, int], struct.Struct] = {}


def _plain_length(block: bytes, pos: int, stride: int, n: int, vc_len: int) -> int:
    """Of ``n`` same-shaped records from ``pos``, how many leading ones also share the first one's
    type, flags and vchannel bytes (the caller checks that those make a plain record)."""
    stop = pos + stride * n
    for off in (*_TYPE_OFFSETS, _FLAGS_OFFSET, *range(_VC_OFFSET, _VC_OFFSET + vc_len)):
        col = block[pos + off : stop : stride]
        n = min(n, len(col) - len(col.lstrip(col[:1])))
        if n < _MIN_RUN:
            break
    return n


def _decode_plain_run(
    block: bytes, pos: int, stop: int, *, vc_len: int, payload_len: int, mtype: MessageType, vchannel: str,
    has_lc: bool, msg_id: MessageID, out: list[Message], marks: list[int], mark_base: int, prev_ts: int,
) -> int:
    """Records from ``pos`` to ``stop`` of one shape, type, vchannel and flags (0 or last-confirmed
    only): only timetick, term, last-confirmed and payload differ, so only they are unpacked.
    Appends to ``out`` and ``marks`` (out-of-order timestamps); returns the last timestamp."""
    st = _plain_structs.get((vc_len, payload_len))
    if st is None:
        if len(_plain_structs) >= _SHAPES_MAX:
            _plain_structs.clear()
        st = _plain_structs[(vc_len, payload_len)] = struct.Struct(f"<8xQqQ20x{vc_len}x{payload_len}s")
    append = out.append
    new = decoded_message
    base = mark_base - msg_id + len(out)  # index in ``out`` (plus mark_base) of message msg_id
    for ts, term, lc, payload in st.iter_unpack(memoryview(block)[pos:stop]):
        append(new(mtype, vchannel, payload, {}, ts, term, lc if has_lc else None, None, msg_id, False))
        if ts < prev_ts:
            marks.append(base + msg_id)
        prev_ts = ts
        msg_id += 1
    return prev_ts


def block_checksum_ok(block: bytes) -> bool:
    """Whether ``block``'s header length and CRC match its body (False for anything malformed:
    ``decode_block`` then says what is wrong).  Meant for the reader thread: zlib releases the GIL
    on large buffers, so the check runs beside the event loop instead of on it."""
    if not isinstance(block, bytes) or len(block) < BLOCK_HEADER_SIZE:
        return False
    _, _, _, body_len, crc = _BLOCK_HEADER.unpack_from(block, 0)
    if BLOCK_HEADER_SIZE + int(body_len) != len(block):
        return False
    return zlib.crc32(memoryview(block)[BLOCK_HEADER_SIZE:]) == int(crc)


def decode_block(
    block: bytes, first_id: MessageID, start: MessageID | None = None, *,
    marks: list[int] | None = None, mark_base: int = 0, checksum_verified: bool = False,
) -> list[Message]:
    """Decode a block whose first message has id ``first_id``; skip messages with id < ``start``.

    Returned messages carry their ids and are immutable.  This is the scan hot path: runs of records
    of one shape are cut by ``Struct.iter_unpack`` (see ``_run_length``), other common records (no
    properties) are decoded inline, and anything else goes through the general decoder.

    With ``marks``, the index (plus ``mark_base``) of every message a reader must look at on its own
    is appended: the first one, TimeTicks, transaction messages, and any whose timestamp is lower than
    its predecessor's.  Between two marks the messages are plain and in timestamp order, so a scanner
    can take them in one slice.

    ``checksum_verified``: ``block_checksum_ok`` already returned True for this very block, so the
    CRC is not computed again.
    """
    if not isinstance(block, bytes):
        raise CodecError(f"expected bytes, got {type(block).__name__}")
    if len(block) < BLOCK_HEADER_SIZE:
        raise CodecError(f"truncated block: {len(block)} bytes")
    magic, version, count, body_len, crc = _BLOCK_HEADER.unpack_from(block, 0)
    if magic != BLOCK_MAGIC:
        raise CodecError(f"bad block magic {magic!r}")
    if version != BLOCK_VERSION:
        raise CodecError(f"unsupported block version {version} (this build reads {BLOCK_VERSION})")
    end = BLOCK_HEADER_SIZE + body_len
    if end != len(block):
        found = len(block) - BLOCK_HEADER_SIZE
        raise CodecError(f"block length mismatch: header says {body_len} body bytes, found {found}")
    if not checksum_verified and zlib.crc32(memoryview(block)[BLOCK_HEADER_SIZE:]) != crc:
        raise CodecError("block checksum mismatch")
    skip = 0 if start is None or start <= first_id else min(start - first_id, count)
    pos = BLOCK_HEADER_SIZE
    out: list[Message] = []
    # Skipped messages are walked (bounds-checked), not decoded.
    for i in range(skip):
        pos = _decode_record(block, pos, end, index=i, count=count, msg_id=None, out=out)
    append = out.append
    new = decoded_message
    types = _TYPES
    vcs = _vc_decoded
    unpack_rec = _unpack_rec
    hdr = _HEADER_SIZE
    rec_end = end - _REC_SIZE
    special = _MARKED_TYPES
    prev_ts = -1 if marks is None else 1 << 64  # the first message is always marked
    i = skip
    msg_id = first_id + skip
    next_try = i  # index at which to look for a run of same-shaped records next
    backoff = 0
    while i < count:
        if pos <= rec_end:
            (size, mversion, type_code, flags, ts, term, lc, txn_id, keepalive, vc_len, n_props, payload_len) = (
                unpack_rec(block, pos)
            )
            mtype = types.get(type_code)
        else:
            mtype = None
        if mtype is None or n_props or flags > 3 or mversion != 1 or size != hdr + vc_len + payload_len:
            # Anything unusual takes the general decoder, which names what is wrong.
            before = len(out)
            pos = _decode_record(block, pos, end, index=i, count=count, msg_id=msg_id, out=out)
            i += 1
            msg_id += 1
            if marks is not None:
                m = out[-1]
                if m._type in special or m._txn is not None or m._timetick < prev_ts:
                    marks.append(mark_base + before)
                prev_ts = m._timetick
            continue
        if i >= next_try:
            stride = size + 4
            limit = min(count - i, (end - pos) // stride)
            n = _run_length(block, pos, stride, limit) if limit >= _MIN_RUN else 0
            if n >= _MIN_RUN and flags < 2 and mtype not in special and vc_len <= _PLAIN_VC_MAX:
                plain = _plain_length(block, pos, stride, n, vc_len)
                if plain >= _MIN_RUN:
                    # The commonest run: one producer's batch to one vchannel.
                    stop = pos + plain * stride
                    raw_vc = block[pos + _REC_SIZE : pos + _REC_SIZE + vc_len]
                    vchannel = vcs.get(raw_vc)
                    if vchannel is None:
                        vchannel = _decode_vchannel(raw_vc)
                    prev_ts = _decode_plain_run(
                        block, pos, stop, vc_len=vc_len, payload_len=payload_len, mtype=mtype, vchannel=vchannel,
                        has_lc=flags == 1, msg_id=msg_id, out=out, marks=[] if marks is None else marks,
                        mark_base=mark_base, prev_ts=prev_ts,
                    )
                    msg_id += plain
                    pos = stop
                    i += plain
                    backoff = 0
                    continue
            if n >= _MIN_RUN:
                stop = pos + n * stride
                st = _shapes.get((vc_len, payload_len))
                if st is None:
                    st = _shape_struct(vc_len, payload_len)
                try:
                    for type_code, flags, ts, term, lc, txn_id, keepalive, raw_vc, payload in st.iter_unpack(
                        memoryview(block)[pos:stop]
                    ):
                        vchannel = vcs.get(raw_vc)
                        if vchannel is None:
                            vchannel = _decode_vchannel(raw_vc)
                        mtype = types[type_code]
                        if marks is not None:
                            if mtype in special or flags & 2 or ts < prev_ts:
                                marks.append(mark_base + len(out))
                            prev_ts = ts
                        append(new(mtype, vchannel, payload, {}, ts, term, lc if flags & 1 else None,
                                   TxnContext(txn_id, keepalive) if flags & 2 else None, msg_id, False))
                        msg_id += 1
                except KeyError as exc:
                    raise CodecError(f"unknown message type code {exc.args[0]}") from None
                pos = stop
                i += n
                backoff = 0
                continue
            # Not a run here: decode a few records one by one before looking again, so that a block
            # of varied records pays for the check only now and then.
            backoff = min(backoff * 2 + 1, _MAX_BACKOFF)
            next_try = i + backoff
        # No per-message bounds check here: a short slice can only come from a block whose lengths
        # disagree, which the final ``pos != end`` check (after the CRC) turns into an error.
        vstart = pos + _REC_SIZE
        pstart = vstart + vc_len
        raw_vc = block[vstart:pstart]
        vchannel = vcs.get(raw_vc)
        if vchannel is None:
            vchannel = _decode_vchannel(raw_vc)
        pos = pstart + payload_len
        if marks is not None:
            if mtype in special or flags & 2 or ts < prev_ts:
                marks.append(mark_base + len(out))
            prev_ts = ts
        append(new(mtype, vchannel, block[pstart:pos], {}, ts, term, lc if flags & 1 else None,
                   TxnContext(txn_id, keepalive) if flags & 2 else None, msg_id, False))
        msg_id += 1
        i += 1
    if pos != end:
        raise CodecError(f"block has {end - pos} trailing bytes after {count} messages")
    return out


__all__ = [
    "BLOCK_HEADER_SIZE",
    "BLOCK_VERSION",
    "block_checksum_ok",
    "block_count",
    "decode_block",
    "encode_block",
]
