"""The block decoder's run path (records of one shape cut by one ``Struct.iter_unpack``) against a
record-by-record reference built on ``decode_message``: same messages, same marks, same errors."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wal import CodecError, Message, MessageType, TxnContext, decode_block, decode_message, encode_block
from wal._codec import _MIN_RUN, BLOCK_HEADER_SIZE

_MARKED = {MessageType.TIME_TICK, MessageType.BEGIN_TXN, MessageType.COMMIT_TXN, MessageType.ROLLBACK_TXN}


def _reference(block: bytes, first_id: int, start: int | None = None) -> tuple[list[Message], list[int]]:
    """Decode record by record with the general decoder; marks as ``decode_block`` documents them."""
    _, _, count, _, _ = struct.unpack_from("<3sBIII", block, 0)
    pos = BLOCK_HEADER_SIZE
    out: list[Message] = []
    marks: list[int] = []
    prev_ts = None
    for i in range(count):
        (size,) = struct.unpack_from("<I", block, pos)
        pos += 4
        if pos + size > len(block):
            raise CodecError("runs past the end")
        if start is None or first_id + i >= start:
            m = decode_message(block[pos : pos + size])
            m._id = first_id + i
            if prev_ts is None or m.message_type in _MARKED or m.txn is not None or m.timetick < prev_ts:
                marks.append(len(out))
            prev_ts = m.timetick
            out.append(m)
        pos += size
    if pos != len(block):
        raise CodecError("trailing bytes")
    return out, marks


def _msg(kind: str, ts: int, vc: str, size: int, flags: int) -> Message:
    if kind == "tick":
        return Message(MessageType.TIME_TICK, "", timetick=ts)
    if kind == "props":
        return Message(MessageType.INSERT, vc, bytes(size), {"k": "v"}, timetick=ts)
    txn = TxnContext(ts % 7, 100) if flags & 2 else None
    mtype = MessageType.BEGIN_TXN if kind == "begin" else MessageType.INSERT
    m = Message(mtype, vc, bytes([ts % 251]) * size, timetick=ts, txn=txn).with_wal_term(ts % 3)
    if flags & 1:
        m.with_last_confirmed(ts * 2)
    return m


# Segments of like records (so that runs form, plain or not), sometimes another size, a tick, properties
# or txn framing; vchannels of one length but different names; timestamps that increase, except that a
# segment may start lower and every 13th record goes back.
records = st.lists(
    st.tuples(
        st.sampled_from(["plain"] * 8 + ["tick", "props", "begin"]),
        st.sampled_from([0] * 4 + [15, 30]),
        st.sampled_from(["va", "vb", "vc"]),
        st.sampled_from([16] * 8 + [15, 0]),
        st.sampled_from([0] * 4 + [1] * 2 + [2, 3]),
        st.integers(1, 12),
    ),
    max_size=12,
).map(lambda segments: [rec[:5] for rec in segments for _ in range(rec[5])])


def _block(recs: list[tuple[str, int, str, int, int]]) -> bytes:
    return encode_block([
        _msg(k, 10 * i + 30 - back - (15 if i % 13 == 12 else 0), vc, size, fl)
        for i, (k, back, vc, size, fl) in enumerate(recs)
    ])


@settings(max_examples=300)
@given(records, st.integers(0, 90))
def test_runs_decode_like_the_general_decoder(recs: list[tuple[str, int, str, int, int]], skip: int) -> None:
    block = _block(recs)
    for start in (None, 1000 + skip):
        marks: list[int] = []
        got = decode_block(block, 1000, start, marks=marks, mark_base=0)
        want, want_marks = _reference(block, 1000, start)
        assert got == want
        assert marks == want_marks
        assert all(m.is_immutable for m in got)


@settings(max_examples=500)
@given(records, st.data())
def test_a_lying_field_with_a_valid_checksum_fails_as_in_the_general_decoder(
    recs: list[tuple[str, int, str, int, int]], data: st.DataObject
) -> None:
    # Damage that the CRC cannot see (it is recomputed): the run path must not trust a length either.
    body = bytearray(_block(recs)[BLOCK_HEADER_SIZE:])
    if not body:
        return
    i = data.draw(st.integers(0, len(body) - 1))
    body[i] ^= data.draw(st.integers(1, 255))
    block = struct.pack("<3sBIII", b"SNB", 1, len(recs), len(body), zlib.crc32(body)) + bytes(body)
    try:
        want: list[Message] | None = _reference(block, 0)[0]
    except (CodecError, struct.error, IndexError):
        want = None
    if want is None:
        with pytest.raises(CodecError):
            decode_block(block, 0)
    else:
        assert decode_block(block, 0) == want


def test_a_long_run_with_a_tick_inside_and_varied_vchannels() -> None:
    msgs = [Message(MessageType.INSERT, f"v{i % 3}", bytes([i]) * 100, timetick=i + 1) for i in range(3 * _MIN_RUN)]
    msgs.insert(_MIN_RUN + 3, Message(MessageType.TIME_TICK, "", timetick=_MIN_RUN + 3))
    block = encode_block(msgs)
    marks: list[int] = []
    got = decode_block(block, 7, marks=marks)
    assert got == _reference(block, 7)[0]
    assert [m.vchannel for m in got[:3]] == ["v0", "v1", "v2"]
    assert marks == [0, _MIN_RUN + 3]


def test_unknown_type_inside_a_run_is_named() -> None:
    msgs = [Message(MessageType.INSERT, "v", b"p" * 10, timetick=i) for i in range(2 * _MIN_RUN)]
    body = bytearray(encode_block(msgs)[BLOCK_HEADER_SIZE:])
    record = 4 + 48 + 1 + 10
    struct.pack_into("<H", body, 5 * record + 5, 777)
    block = struct.pack("<3sBIII", b"SNB", 1, len(msgs), len(body), zlib.crc32(body)) + bytes(body)
    with pytest.raises(CodecError, match="unknown message type code 777"):
        decode_block(block, 0)
