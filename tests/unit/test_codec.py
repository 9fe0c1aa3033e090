"""The message and block codec: round trips for any message, clear errors for any garbage."""

from __future__ import annotations

import contextlib
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wal import (
    CodecError,
    Message,
    MessageType,
    TxnContext,
    _codec,
    decode_block,
    decode_message,
    encode_block,
    encode_message,
)
from wal._codec import BLOCK_HEADER_SIZE


def _build(t: MessageType, vc: str, payload: bytes, props: dict[str, str], ts: int, term: int,
           lc: int | None, txn: TxnContext | None) -> Message:
    m = Message(t, vc, payload, props, timetick=ts, txn=txn).with_wal_term(term)
    if lc is not None:
        m.with_last_confirmed(lc)
    return m


text = st.text(max_size=40)
messages = st.builds(
    _build,
    st.sampled_from(list(MessageType)),
    text,
    st.binary(max_size=2048),
    st.dictionaries(text, text, max_size=5),
    st.integers(0, 2**64 - 1),
    st.integers(-(2**63), 2**63 - 1),
    st.one_of(st.none(), st.integers(0, 2**64 - 1)),
    st.one_of(st.none(), st.builds(TxnContext, st.integers(-(2**63), 2**63 - 1), st.integers(0, 2**32 - 1))),
)


@given(messages)
def test_message_round_trip(msg: Message) -> None:
    assert decode_message(encode_message(msg)) == msg


@given(st.lists(messages, max_size=20), st.integers(0, 2**40))
def test_block_round_trip_assigns_dense_ids(msgs: list[Message], first_id: int) -> None:
    decoded = decode_block(encode_block(msgs), first_id)
    assert [m.message_id for m in decoded] == list(range(first_id, first_id + len(msgs)))
    for original, got in zip(msgs, decoded, strict=True):
        assert got.is_immutable
        original_copy = decode_message(encode_message(original))
        original_copy._id = got.message_id
        assert got == original_copy


@given(st.lists(messages, min_size=1, max_size=10), st.data())
def test_block_decode_from_inside(msgs: list[Message], data: st.DataObject) -> None:
    start = data.draw(st.integers(100, 100 + len(msgs)))
    decoded = decode_block(encode_block(msgs), 100, start)
    assert [m.message_id for m in decoded] == list(range(start, 100 + len(msgs)))


@settings(max_examples=500)
@given(st.binary(max_size=300))
def test_garbage_message_raises_codec_error(data: bytes) -> None:
    # Decoding may succeed by chance; any failure must be a CodecError (anything else fails the test).
    with contextlib.suppress(CodecError):
        decode_message(data)


@settings(max_examples=500)
@given(st.binary(max_size=300))
def test_garbage_block_raises_codec_error(data: bytes) -> None:
    with pytest.raises(CodecError):
        decode_block(b"SNB\x01" + data, 0)


@given(st.lists(messages, min_size=1, max_size=5), st.data())
def test_any_flipped_byte_in_a_block_is_detected(msgs: list[Message], data: st.DataObject) -> None:
    block = bytearray(encode_block(msgs))
    i = data.draw(st.integers(0, len(block) - 1))
    block[i] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CodecError):
        decode_block(bytes(block), 0)


@given(st.lists(messages, min_size=1, max_size=5), st.data())
def test_truncated_block_is_detected(msgs: list[Message], data: st.DataObject) -> None:
    block = encode_block(msgs)
    cut = data.draw(st.integers(0, len(block) - 1))
    with pytest.raises(CodecError):
        decode_block(block[:cut], 0)


def test_garbage_with_valid_checksum_still_fails_cleanly() -> None:
    # A body whose checksum is right but whose message lengths lie: caught by bounds checks.
    body = struct.pack("<I", 10_000) + b"x" * 20
    block = struct.pack("<3sBIII", b"SNB", 1, 1, len(body), zlib.crc32(body)) + body
    assert len(block) == BLOCK_HEADER_SIZE + len(body)
    with pytest.raises(CodecError, match="runs past the end"):
        decode_block(block, 0)


def test_unknown_version_and_type_are_named() -> None:
    raw = bytearray(encode_message(Message(MessageType.INSERT, "v", b"p")))
    raw[0] = 9
    with pytest.raises(CodecError, match="unsupported message version 9"):
        decode_message(bytes(raw))
    raw = bytearray(encode_message(Message(MessageType.INSERT, "v", b"p")))
    raw[1:3] = struct.pack("<H", 777)
    with pytest.raises(CodecError, match="unknown message type code 777"):
        decode_message(bytes(raw))


def test_not_bytes_is_refused() -> None:
    with pytest.raises(CodecError, match="expected bytes"):
        decode_message(bytearray(b"abc"))  # type: ignore[arg-type]


def _plain(t: MessageType, vc: str, payload: bytes, ts: int, term: int, lc: int | None) -> Message:
    m = Message(t, vc, payload, timetick=ts)
    m._term = term
    m._last_confirmed = lc
    return m


_plain_message = st.builds(
    _plain,
    st.sampled_from(list(MessageType)), st.sampled_from(["", "v1", "vchannel-ü", "x" * 300]), st.binary(max_size=40),
    st.integers(0, 2**64 - 1), st.integers(-(2**63), 2**63 - 1), st.none() | st.integers(0, 2**64 - 1),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_plain_message, min_size=1, max_size=12))
def test_the_plain_block_path_writes_the_bytes_of_the_general_one(messages: list[Message]) -> None:
    # Blocks without properties or transactions take the column-wise path; any other block, and every
    # block written before it existed, the per-message one.  A reader must not tell them apart.
    assert b"".join(_codec._plain_parts(messages)) == b"".join(_codec._general_parts(messages))
    decoded = decode_block(encode_block(messages), 0)
    assert [(m.message_type, m.vchannel, m.payload, m.timetick, m.wal_term, m.last_confirmed) for m in decoded] == [
        (m.message_type, m.vchannel, m.payload, m.timetick, m.wal_term, m.last_confirmed) for m in messages]


def test_an_out_of_range_field_fails_on_either_path() -> None:
    plain = [_plain(MessageType.DATA, "v", b"x", 2**64, 0, None)]
    with pytest.raises(CodecError, match="out of range"):
        encode_block(plain)
    with pytest.raises(CodecError, match="out of range"):
        encode_block([*plain, Message(MessageType.DATA, "v", b"y", {"k": "v"})])
