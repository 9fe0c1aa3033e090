"""The binary record of one message (version 1), its field widths and the checks that keep a message
encodable.

Message, version 1 (little-endian)::

    u8 version | u16 type | u8 flags | u64 timetick | i64 term | u64 last_confirmed
    | i64 txn_id | u32 keepalive_ms | u16 vchannel_len | u16 n_props | u32 payload_len
    | vchannel utf-8 | n_props x (u16 key_len | u32 value_len | key | value) | payload

``flags`` bit 0: last_confirmed present; bit 1: txn context present.  The id is not stored in the
message: it is the block's first id plus the message's index in the block (``wal._codec``).

Decoding never trusts a length: every slice is bounds-checked, and any failure raises ``CodecError``
naming what was wrong.
"""

from __future__ import annotations

import struct

from wal import txn_keepalive
from wal.errors import CodecError, InvalidArgumentError
from wal.message import Message, MessageID, MessageType, TxnContext, decoded_message
from wal.txn_keepalive import check_keepalive

MESSAGE_VERSION = 1

_HEADER = struct.Struct("<BHBQqQqIHHI")
_HEADER_SIZE = _HEADER.size
_PROP = struct.Struct("<HI")
_LEN = struct.Struct("<I")

_FLAG_LAST_CONFIRMED = 1
_FLAG_TXN = 2
_KNOWN_FLAGS = _FLAG_LAST_CONFIRMED | _FLAG_TXN


# --- widths ----------------------------------------------------------------------------------------
# What fits the fixed-width fields above, derived from the struct formats themselves so that a change
# of format changes the checks with it.  A message that does not fit must be refused before it joins a
# group commit: there, one unencodable message would fail the block of every pchannel it shares.
_HEADER_FIELDS = ("version", "type", "flags", "timetick", "term", "last_confirmed", "txn_id", "keepalive_ms",
                  "vchannel_len", "n_props", "payload_len")
_PROP_FIELDS = ("key_len", "value_len")
assert len(_HEADER_FIELDS) == len(_HEADER.format) - 1 and len(_PROP_FIELDS) == len(_PROP.format) - 1


def _field_range(code: str) -> tuple[int, int]:
    """The values a struct format character holds (little-endian, standard sizes)."""
    bits = 8 * struct.calcsize("<" + code)
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if code.islower() else (0, (1 << bits) - 1)


_HEADER_RANGE = dict(zip(_HEADER_FIELDS, map(_field_range, _HEADER.format[1:]), strict=True))
_PROP_RANGE = dict(zip(_PROP_FIELDS, map(_field_range, _PROP.format[1:]), strict=True))

MAX_VCHANNEL_BYTES = _HEADER_RANGE["vchannel_len"][1]
MAX_PROPERTIES = _HEADER_RANGE["n_props"][1]
MAX_PROPERTY_KEY_BYTES = _PROP_RANGE["key_len"][1]
MAX_PROPERTY_VALUE_BYTES = _PROP_RANGE["value_len"][1]
MAX_PAYLOAD_BYTES = _HEADER_RANGE["payload_len"][1]
MAX_KEEPALIVE_MS = _HEADER_RANGE["keepalive_ms"][1]
if _HEADER_RANGE["keepalive_ms"] != (0, txn_keepalive.MAX_KEEPALIVE_MS):  # the check lives there: keep it true
    raise ImportError("wal.txn_keepalive's bound disagrees with the header's keepalive field")
MAX_MESSAGE_BYTES = _field_range(_LEN.format[1])[1]
"""The record's length prefix bounds a whole encoded message."""
_U16_MAX = MAX_VCHANNEL_BYTES
_U32_MAX = MAX_PAYLOAD_BYTES
_TIMETICK_MAX = _HEADER_RANGE["timetick"][1]
_UTF8_MAX = 4
"""Bytes per character at most in UTF-8."""


def _refuse(field: str, what: str, value: int, limit: tuple[int, int]) -> InvalidArgumentError:
    lo, hi = limit
    return InvalidArgumentError(f"{field}: {what} {value} is outside what the log can store ({lo} to {hi})",
                                field=field, limit=hi)


def _utf8(value: str, field: str) -> bytes:
    try:
        return value.encode()
    except UnicodeEncodeError as exc:  # a lone surrogate, from an embedded caller: not UTF-8
        raise InvalidArgumentError(f"{field} is not valid UTF-8: {exc.reason} at {exc.start}", field=field) from exc


def check_properties(props: dict[str, str], field: str = "properties") -> int:
    """Refuse properties that do not fit the codec (count, key and value lengths), naming ``field``
    and the limit; return their encoded size."""
    if len(props) > MAX_PROPERTIES:
        raise _refuse(field, "count", len(props), (0, MAX_PROPERTIES))
    size = 0
    for k, v in props.items():
        kb = _utf8(k, f"{field} key")
        if len(kb) > MAX_PROPERTY_KEY_BYTES:
            raise _refuse(f"{field} key", "length in bytes", len(kb), (0, MAX_PROPERTY_KEY_BYTES))
        vb = _utf8(v, f"{field}[{k[:64]!r}]")
        if len(vb) > MAX_PROPERTY_VALUE_BYTES:
            raise _refuse(f"{field}[{k[:64]!r}]", "length in bytes", len(vb), (0, MAX_PROPERTY_VALUE_BYTES))
        size += _PROP.size + len(kb) + len(vb)
    return size


def properties_fit(props: dict[str, str]) -> bool:
    """True when ``check_properties`` surely accepts ``props`` (valid UTF-8 assumed, as protobuf
    strings are), judged by lengths in characters alone: the produce path's cheap pre-check."""
    return (len(props) <= MAX_PROPERTIES and max(map(len, props), default=0) * _UTF8_MAX <= MAX_PROPERTY_KEY_BYTES
            and max(map(len, props.values()), default=0) * _UTF8_MAX <= MAX_PROPERTY_VALUE_BYTES)


def check_encodable(msg: Message, field: str = "message") -> None:
    """Refuse (``InvalidArgumentError`` naming the field and its limit) a message that some fixed-width
    field of the format cannot hold; ``field`` prefixes the names (``messages[3]``).

    Not on the hot path: an append calls it only for the messages ``needs_width_check`` picks.
    """
    vc = len(_utf8(msg._vchannel, f"{field}.vchannel"))
    if vc > MAX_VCHANNEL_BYTES:
        raise _refuse(f"{field}.vchannel", "length in bytes", vc, (0, MAX_VCHANNEL_BYTES))
    payload = len(msg._payload)
    if payload > MAX_PAYLOAD_BYTES:
        raise _refuse(f"{field}.payload", "length in bytes", payload, (0, MAX_PAYLOAD_BYTES))
    props = check_properties(msg._properties, f"{field}.properties") if msg._properties else 0
    for name, value in (("timetick", msg._timetick), ("term", msg._term), ("last_confirmed", msg._last_confirmed)):
        limit = _HEADER_RANGE[name]
        if value is not None and not limit[0] <= value <= limit[1]:
            raise _refuse(f"{field}.{name}", "value", value, limit)
    txn = msg._txn
    if txn is not None:
        check_keepalive(txn.keepalive_ms, f"{field}.txn.keepalive_ms")
        limit = _HEADER_RANGE["txn_id"]
        if not limit[0] <= txn.txn_id <= limit[1]:
            raise _refuse(f"{field}.txn.txn_id", "value", txn.txn_id, limit)
    size = _HEADER_SIZE + vc + props + payload
    if size > MAX_MESSAGE_BYTES:
        raise _refuse(field, "encoded length in bytes", size, (0, MAX_MESSAGE_BYTES))


PLAIN_VCHANNEL_CHARS = MAX_VCHANNEL_BYTES // _UTF8_MAX
"""A vchannel of at most this many characters fits, whatever they are."""
PLAIN_PAYLOAD_BYTES = MAX_MESSAGE_BYTES - MAX_VCHANNEL_BYTES - _HEADER_SIZE
"""A payload of at most this many bytes fits, with any vchannel that fits and no properties."""
MAX_TIMETICK = _TIMETICK_MAX


def needs_width_check(msg: Message) -> bool:
    """Whether ``check_encodable`` might refuse ``msg``.  False, at the cost of a few comparisons, for
    the usual message (no properties, no transaction, a short vchannel and payload, a timestamp in
    range), so that an append path runs the full check only for the others.  (``WAL.append_batch``
    inlines this test: a call per message would cost more than the test.)"""
    return bool(msg._properties or msg._txn is not None or len(msg._vchannel) > PLAIN_VCHANNEL_CHARS
                or len(msg._payload) > PLAIN_PAYLOAD_BYTES or not 0 <= msg._timetick <= MAX_TIMETICK)


_TYPES: dict[int, MessageType] = {t.value: t for t in MessageType}
_MARKED_TYPES = frozenset(
    {MessageType.TIME_TICK, MessageType.BEGIN_TXN, MessageType.COMMIT_TXN, MessageType.ROLLBACK_TXN}
)

_pack_header = _HEADER.pack
_unpack_header = _HEADER.unpack_from
_unpack_len = _LEN.unpack_from


def _encode_parts(msg: Message, out: list[bytes]) -> int:
    """Append the encoded message to ``out`` as parts; return its length."""
    vc = msg._vchannel.encode()
    props = msg._properties
    flags = 0
    lc = msg._last_confirmed
    if lc is None:
        lc = 0
    else:
        flags = _FLAG_LAST_CONFIRMED
    txn = msg._txn
    if txn is None:
        txn_id = keepalive = 0
    else:
        flags |= _FLAG_TXN
        txn_id, keepalive = txn.txn_id, txn.keepalive_ms
    payload = msg._payload
    if len(vc) > _U16_MAX or len(props) > _U16_MAX or len(payload) > _U32_MAX:
        raise CodecError("message too large to encode: vchannel, properties or payload exceeds limits")
    try:
        header = _pack_header(
            MESSAGE_VERSION, msg._type, flags, msg._timetick, msg._term, lc, txn_id, keepalive,
            len(vc), len(props), len(payload),
        )
    except struct.error as exc:
        raise CodecError(f"message field out of range: {exc}") from exc
    size = _HEADER_SIZE + len(vc) + len(payload)
    out.append(header)
    out.append(vc)
    if props:
        for k, v in props.items():
            kb = k.encode()
            vb = v.encode()
            if len(kb) > _U16_MAX:
                raise CodecError(f"property key too long ({len(kb)} bytes)")
            out.append(_PROP.pack(len(kb), len(vb)))
            out.append(kb)
            out.append(vb)
            size += 6 + len(kb) + len(vb)
    out.append(payload)
    return size


def encode_message(msg: Message) -> bytes:
    """Encode one message (without its id)."""
    parts: list[bytes] = []
    _encode_parts(msg, parts)
    return b"".join(parts)


def _decode_at(data: bytes, pos: int, end: int, message_id: MessageID | None = None) -> Message:
    """The message encoded in ``data[pos:end]``, with id ``message_id`` (immutable) or none (mutable)."""
    if end - pos < _HEADER_SIZE:
        raise CodecError(f"truncated message: {end - pos} bytes, header needs {_HEADER_SIZE}")
    (version, type_code, flags, ts, term, lc, txn_id, keepalive, vc_len, n_props, payload_len) = (
        _unpack_header(data, pos)
    )
    if version != MESSAGE_VERSION:
        raise CodecError(f"unsupported message version {version} (this build reads {MESSAGE_VERSION})")
    mtype = _TYPES.get(type_code)
    if mtype is None:
        raise CodecError(f"unknown message type code {type_code}")
    if flags & ~_KNOWN_FLAGS:
        raise CodecError(f"unknown message flags {flags:#x}")
    pos += _HEADER_SIZE
    if pos + vc_len > end:
        raise CodecError("truncated message: vchannel runs past the end")
    try:
        vchannel = data[pos : pos + vc_len].decode()
    except UnicodeDecodeError as exc:
        raise CodecError("vchannel is not valid UTF-8") from exc
    pos += vc_len
    props: dict[str, str] = {}
    for _ in range(n_props):
        if pos + 6 > end:
            raise CodecError("truncated message: property header runs past the end")
        klen, vlen = _PROP.unpack_from(data, pos)
        pos += 6
        if pos + klen + vlen > end:
            raise CodecError("truncated message: property runs past the end")
        try:
            props[data[pos : pos + klen].decode()] = data[pos + klen : pos + klen + vlen].decode()
        except UnicodeDecodeError as exc:
            raise CodecError("property is not valid UTF-8") from exc
        pos += klen + vlen
    if pos + payload_len != end:
        raise CodecError(
            f"message length mismatch: payload of {payload_len} bytes leaves {end - pos - payload_len}"
        )
    return decoded_message(
        mtype, vchannel, data[pos:end], props, ts, term, lc if flags & _FLAG_LAST_CONFIRMED else None,
        TxnContext(txn_id, keepalive) if flags & _FLAG_TXN else None, message_id, False,
    )


def decode_message(data: bytes) -> Message:
    """Decode one message; the result has no id (it is still mutable)."""
    if not isinstance(data, bytes):
        raise CodecError(f"expected bytes, got {type(data).__name__}")
    return _decode_at(data, 0, len(data))


__all__ = [
    "MAX_KEEPALIVE_MS",
    "MAX_MESSAGE_BYTES",
    "MAX_PAYLOAD_BYTES",
    "MAX_PROPERTIES",
    "MAX_PROPERTY_KEY_BYTES",
    "MAX_PROPERTY_VALUE_BYTES",
    "MAX_TIMETICK",
    "MAX_VCHANNEL_BYTES",
    "MESSAGE_VERSION",
    "PLAIN_PAYLOAD_BYTES",
    "PLAIN_VCHANNEL_CHARS",
    "check_encodable",
    "check_keepalive",
    "check_properties",
    "decode_message",
    "encode_message",
    "needs_width_check",
    "properties_fit",
]
