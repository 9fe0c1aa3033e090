"""The bytes of the node's ``ConsumeResponse``s: a MsgPack as rows (in fragments, joinable into one
response) or as columns, a pack continued over several responses, and the head of a pack.
``streamingnode.wire.codec`` re-exports every name."""

from __future__ import annotations

from collections.abc import Sequence

from streamingnode.v1 import common_pb2 as pb
from streamingnode.wire.messages import fill_message_pb, position_to_pb
from wal.message import (
    MESSAGE_ID_BYTES,
    Message,
)
from wal.scanner import MsgPack


def msgpack_to_pb(pack: MsgPack, vchannel: str) -> pb.MsgPack:
    out = pb.MsgPack(
        begin_ts=pack.begin_ts,
        end_ts=pack.end_ts,
        start_positions=[position_to_pb(pack.start_position, vchannel)],
        end_positions=[position_to_pb(pack.end_position, vchannel)],
    )
    add = out.messages.add
    for m in pack.messages:
        fill_message_pb(add(), m)
    return out


# Messages serialized per MsgPack fragment.  upb encodes a large message tree much more slowly per
# message than a small one (about 2x at 2 MiB, measured), and serialized protobuf messages concatenate
# as a merge: repeated fields append.  So a pack is encoded as its header plus fragments of this many
# messages, and parses to the same MsgPack as one SerializeToString of the whole.
_FRAGMENT = 64
_PACK_FIELD_TAG = b"\x12"  # ConsumeResponse.pack: field 2, length-delimited


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _pack_head(pack: MsgPack, vchannel: str, continued: bool = False) -> pb.MsgPack:
    head = pb.MsgPack(
        begin_ts=pack.begin_ts,
        end_ts=pack.end_ts,
        start_positions=[position_to_pb(pack.start_position, vchannel)],
        end_positions=[position_to_pb(pack.end_position, vchannel)],
    )
    if continued:
        head.continued = True
    return head


def pack_head_bytes(pack: MsgPack, vchannel: str) -> int:
    """Bytes of a ConsumeResponse carrying ``pack`` besides its messages' own (``streamingnode.wire.packs.wire_bound``):
    the header with its positions, the continued flag and the framing of the response."""
    size: int = _pack_head(pack, vchannel, True).ByteSize()
    return size + 16


def continued_part(pack: MsgPack, start: int, stop: int, last: bool) -> MsgPack:
    """Messages ``start:stop`` of ``pack`` as one part of it sent over several responses (see
    ``MsgPack.continued`` in common.proto): the pack's timestamps and start position, and its end
    position only on the last part (the others end where the pack starts: acking or resuming from one
    re-reads the whole pack, never half of it)."""
    end = pack.end_position if last else pack.start_position
    return MsgPack(pack.begin_ts, pack.end_ts, pack.messages[start:stop], pack.start_position, end)


def consume_pack_response(pack: MsgPack, vchannel: str, continued: bool = False) -> bytes:
    """The wire bytes of ``ConsumeResponse(pack=msgpack_to_pb(pack, vchannel))``, built fragment by
    fragment (see ``_FRAGMENT``); field order differs, which every protobuf parser accepts.
    ``continued`` sets ``MsgPack.continued``: the next response continues this pack."""
    parts = [_pack_head(pack, vchannel, continued).SerializeToString()]
    msgs = pack.messages
    for i in range(0, len(msgs), _FRAGMENT):
        fragment = pb.MsgPack()
        add = fragment.messages.add
        for m in msgs[i:i + _FRAGMENT]:
            fill_message_pb(add(), m)
        parts.append(fragment.SerializeToString())
    body = b"".join(parts)
    return b"".join((_PACK_FIELD_TAG, _varint(len(body)), body))


_HEAD_TAGS = frozenset((0x08, 0x10, 0x22, 0x2A))
"""The fields ``_pack_head`` writes without ``continued``: begin_ts, end_ts (varints), start_positions
and end_positions (length-delimited)."""
_MESSAGES_TAG = 0x1A  # MsgPack.messages: field 3, length-delimited


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def pack_messages_offset(response: bytes) -> int | None:
    """Where the messages of a ``consume_pack_response`` start (after its header), or None for any
    other response (columns, a continued part, not a pack): the header is a handful of fields, so
    this reads a few bytes, not the messages."""
    try:
        if response[0] != _PACK_FIELD_TAG[0]:
            return None
        size, pos = _read_varint(response, 1)
        if pos + size != len(response):
            return None
        while pos < len(response):
            tag = response[pos]
            if tag == _MESSAGES_TAG:
                return pos
            if tag not in _HEAD_TAGS:
                return None
            value, pos = _read_varint(response, pos + 1)
            if tag & 7 == 2:
                pos += value
        return pos if pos == len(response) else None
    except IndexError:
        return None


def joined_pack_response(head: MsgPack, vchannel: str, responses: Sequence[bytes]) -> bytes | None:
    """One response carrying the consecutive packs that ``responses`` (each a ``consume_pack_response``)
    carry, as one pack with ``head``'s timestamps and positions (its messages are not read), without
    decoding or encoding a message: a fresh header, then each response's messages as they are
    (repeated fields concatenate).  None if one of them is not such a response."""
    parts: list[bytes | memoryview] = [_PACK_FIELD_TAG, b"", _pack_head(head, vchannel).SerializeToString()]
    for response in responses:
        offset = pack_messages_offset(response)
        if offset is None:
            return None
        parts.append(memoryview(response)[offset:])
    # The body's length from its parts', so the messages are copied once (into the response), not
    # once into a body and again behind its tag: a join is up to MERGE_BYTES, per follower.
    parts[1] = _varint(sum(len(p) for p in parts[2:]))
    return b"".join(parts)


# Column packs are sent in fragments too (upb serializes one big fresh message several times slower
# per message), but each fragment costs one ``extend`` per column rather than one call per message,
# so fragments can be larger; 128 measured about as fast as 64 and 256.
_COLUMN_FRAGMENT = 128
_COLUMNS_FIELD_TAG = b"\x32"  # MsgPack.columns: field 6, length-delimited


def _extras(index: int, m: Message, dense_lc: bool) -> pb.MessageExtras | None:
    """``m``'s extras entry, or None when it needs none."""
    lc = None if dense_lc else m._last_confirmed
    if not m._properties and m._txn is None and m._id is not None and lc is None:
        return None
    e = pb.MessageExtras(index=index, properties=m._properties, no_id=m._id is None)
    if lc is not None:
        e.last_confirmed.id = lc.to_bytes(MESSAGE_ID_BYTES, "big")
    if m._txn is not None:
        e.txn.txn_id = m._txn.txn_id
        e.txn.keepalive_ms = m._txn.keepalive_ms
    return e


def consume_columns_response(
    pack: MsgPack, vchannel: str, continued: bool = False, *, fragment: int = _COLUMN_FRAGMENT,
) -> bytes:
    """The wire bytes of ``ConsumeResponse(pack=...)`` with the messages as ``MsgPack.columns``
    (ConsumeOpen.columns): the header, then a ``MsgPack(columns=...)`` per ``fragment`` messages.
    Concatenated, the columns append and parse as one; extras indices count over the whole pack.
    ``continued`` as for ``consume_pack_response``."""
    parts = [b"", _pack_head(pack, vchannel, continued).SerializeToString()]
    msgs = pack.messages
    # Every stored message has a last_confirmed, so it normally travels as a column; the whole pack
    # decides, since a column must have an entry for every message or none.
    dense_lc = all(m._last_confirmed is not None for m in msgs)
    for i in range(0, len(msgs), fragment):
        chunk = msgs[i:i + fragment]
        part = pb.MsgPack()
        cols = part.columns
        cols.types.extend([m._type for m in chunk])
        cols.vchannels.extend([m._vchannel for m in chunk])
        cols.timeticks.extend([m._timetick for m in chunk])
        cols.wal_terms.extend([m._term for m in chunk])
        cols.ids.extend([m._id or 0 for m in chunk])  # no id: 0 here, no_id in its extras
        cols.payloads.extend([m._payload for m in chunk])
        if dense_lc:
            cols.last_confirmeds.extend([m._last_confirmed for m in chunk])
        # A function call per message costs more than all the columns; only the rare ones get one.
        if dense_lc:
            rare = [j for j, m in enumerate(chunk, i) if m._properties or m._txn is not None or m._id is None]
        else:
            rare = list(range(i, i + len(chunk)))
        extras = [e for j in rare if (e := _extras(j, msgs[j], dense_lc)) is not None]
        if extras:
            cols.extras.extend(extras)
        parts.append(part.SerializeToString())
    # One join, with the length in front: the pack's bytes are copied once, not twice.
    parts[0] = _PACK_FIELD_TAG + _varint(sum(map(len, parts)))
    return b"".join(parts)
