"""Between the wire (``streamingnode.v1`` protobuf) and the WAL's own types, in both directions.

The node and the client share these functions, so a message, position or read option means the same
on both ends.  Everything that comes from the wire is checked here and refused with an
``InvalidArgumentError`` that names the field; nothing unchecked reaches the WAL.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, cast

from streamingnode.v1 import common_pb2 as pb
from wal._codec import check_properties, properties_fit
from wal.errors import InvalidArgumentError, MessageTooLargeError
from wal.message import (
    MESSAGE_ID_BYTES,
    Message,
    MessageID,
    MessageType,
    Position,
    TxnContext,
    decoded_message,
    decoded_messages,
    encode_message_id,
)
from wal.names import VCHANNEL
from wal.options import DeliverFilter, DeliverPolicy, FilterKind, PolicyKind
from wal.scanner import MsgPack

# Types a client may produce.  The rest are written by the node itself: TimeTick by the clock,
# transaction framing by the Txn RPCs, Flush and CreateSegment by the shard step.
PRODUCIBLE_TYPES = frozenset(
    {
        MessageType.DATA,
        MessageType.INSERT,
        MessageType.DELETE,
        MessageType.UPSERT,
        MessageType.CREATE_COLLECTION,
        MessageType.DROP_COLLECTION,
        MessageType.CREATE_PARTITION,
        MessageType.DROP_PARTITION,
        MessageType.MANUAL_FLUSH,
    }
)

_TYPE_BY_NUMBER = {int(t): t for t in MessageType}
_UNDEFINED = MessageType.UNDEFINED
_PRODUCIBLE_BY_NUMBER = {int(t): t for t in PRODUCIBLE_TYPES}


def message_id_to_pb(message_id: MessageID | None) -> pb.MessageID | None:
    return None if message_id is None else pb.MessageID(id=encode_message_id(message_id))


def message_id_from_pb(mid: pb.MessageID, field: str) -> MessageID:
    raw = mid.id
    if len(raw) != MESSAGE_ID_BYTES:
        raise InvalidArgumentError(f"{field}: a message id is {MESSAGE_ID_BYTES} bytes, got {len(raw)}", field=field)
    return int.from_bytes(raw, "big")


def message_type_from_pb(number: int, field: str = "message.type") -> MessageType:
    t = _TYPE_BY_NUMBER.get(number)
    if t is None or t is MessageType.UNDEFINED:
        raise InvalidArgumentError(f"{field}: unknown message type {number}", field=field)
    return t


# --- messages ------------------------------------------------------------------------------------
def check_vchannels(vchannels: Sequence[str], field: str) -> None:
    """The vchannel name rule over one batch's vchannels, checked once per distinct name (a batch
    usually names one or a few); ``field`` formats the index of the first bad one."""
    bad = next((v for v in set(vchannels) if not VCHANNEL.is_valid(v, allow_empty=True)), None)
    if bad is not None:
        VCHANNEL.check(bad, field.format(list(vchannels).index(bad)), allow_empty=True)


def produced_messages(messages: Sequence[pb.Message], max_bytes: int) -> list[Message]:
    """A batch of produced messages, checked (``produced_message``; vchannel names once per batch)."""
    check_vchannels([m.vchannel for m in messages], "messages[{}].vchannel")
    return [produced_message(m, i, max_bytes) for i, m in enumerate(messages)]


def produced_message(m: pb.Message, index: int, max_bytes: int) -> Message:
    """A message a client produced, checked: type, size (its vchannel's name by the caller:
    ``produced_messages``).  What the node assigns is ignored.

    This runs for every produced message, so the common case (a known type, no properties) takes
    no dict copy and no generator.
    """
    t = _PRODUCIBLE_BY_NUMBER.get(m.type)
    if t is None:
        t = message_type_from_pb(m.type, f"messages[{index}].type")
        raise InvalidArgumentError(
            f"messages[{index}]: type {t.name} is written by the node, not by producers", field="type"
        )
    payload = m.payload
    vchannel = m.vchannel
    size = len(payload) + len(vchannel)
    raw_props = m.properties
    props: dict[str, str] = {}
    if len(raw_props):
        props = dict(raw_props)
        if not properties_fit(props):  # what the block codec's fixed-width fields cannot hold
            check_properties(props, f"messages[{index}].properties")
        for k, v in props.items():
            size += len(k.encode()) + len(v.encode())  # bytes, as the limit is: a character may take 4
    if size > max_bytes:
        raise MessageTooLargeError(
            f"messages[{index}] is {size} bytes, over the limit of {max_bytes}", size=size, limit=max_bytes
        )
    return Message(t, vchannel, payload, props)


def _ordered_extras(cols: pb.MessageColumns, n: int) -> Iterator[tuple[int, pb.MessageExtras]]:
    """``cols.extras`` with their indices, refused unless they increase and stay under ``n``."""
    last = -1
    for e in cols.extras:
        i = e.index
        if not last < i < n:
            raise InvalidArgumentError(
                f"columns.extras: index {i} is out of range or out of order ({n} messages, previous index {last})",
                field="columns.extras")
        last = i
        yield i, e


_ASSIGNED_COLUMNS = ("timeticks", "wal_terms", "ids", "last_confirmeds")


def produced_columns(cols: pb.MessageColumns, max_bytes: int) -> tuple[list[Message], dict[int, pb.TxnContext]]:
    """The messages of a batch sent as ``MessageColumns``, checked as ``produced_message`` checks one,
    and the transaction each message names in its extras (by index).

    This is the per-message path of every SDK producer, so the usual batch (one type, no extras,
    every message under the size limit) costs one slot-filling loop and no per-message check.
    """
    types = cols.types
    n = len(types)
    if n == 0:
        raise InvalidArgumentError("a produce batch needs at least one message", field="columns.types")
    payloads = list(cols.payloads)
    vchannels = list(cols.vchannels)
    if len(payloads) != n or len(vchannels) != n:
        raise InvalidArgumentError(
            f"columns has {n} types, {len(vchannels)} vchannels and {len(payloads)} payloads: "
            "every message needs one of each", field="columns")
    check_vchannels(vchannels, "columns.vchannels[{}]")
    for name in _ASSIGNED_COLUMNS:
        if len(getattr(cols, name)):
            raise InvalidArgumentError(
                f"columns.{name} is assigned by the node and must be empty in a produce batch", field=f"columns.{name}")
    by_number: dict[int, MessageType] = {}
    for number in set(types):
        t = _PRODUCIBLE_BY_NUMBER.get(number)
        if t is None:
            i = list(types).index(number)
            t = message_type_from_pb(number, f"columns.types[{i}]")
            raise InvalidArgumentError(
                f"columns.types[{i}]: type {t.name} is written by the node, not by producers", field="type")
        by_number[number] = t
    props_of: dict[int, dict[str, str]] = {}
    txns: dict[int, pb.TxnContext] = {}
    for i, e in _ordered_extras(cols, n):
        if e.no_id or e.HasField("last_confirmed"):
            raise InvalidArgumentError(
                f"columns.extras[{i}]: no_id and last_confirmed are assigned by the node", field="columns.extras")
        if len(e.properties):
            props_of[i] = dict(e.properties)
            if not properties_fit(props_of[i]):  # what the block codec's fixed-width fields cannot hold
                check_properties(props_of[i], f"messages[{i}].properties")
        if e.HasField("txn"):
            txns[i] = e.txn
    # One bound for the whole batch first: only a batch that might hold an oversize message is
    # checked message by message.
    if props_of or max(map(len, payloads)) + max(map(len, vchannels)) > max_bytes:
        for i, (vchannel, payload) in enumerate(zip(vchannels, payloads, strict=True)):
            size = len(payload) + len(vchannel) + sum(
                len(k.encode()) + len(v.encode()) for k, v in props_of.get(i, {}).items())
            if size > max_bytes:
                raise MessageTooLargeError(
                    f"messages[{i}] is {size} bytes, over the limit of {max_bytes}", size=size, limit=max_bytes)
    out: list[Message] = []
    if len(by_number) == 1:
        mtypes: Iterable[MessageType] = itertools.repeat(next(iter(by_number.values())))
    else:
        mtypes = [by_number[t] for t in types]
    zeros = itertools.repeat(0)
    nones = itertools.repeat(None)
    # (strict=False: the repeats are endless; the columns' lengths were checked above)
    decoded_messages(zip(mtypes, vchannels, payloads, zeros, zeros, nones, nones, nones, strict=False), out)
    for i, props in props_of.items():  # (rare) rebuilt with their properties
        m = out[i]
        out[i] = decoded_message(m.message_type, m.vchannel, m.payload, props, 0, 0, None, None, None, False)
    return out, txns


def fill_message_pb(out: pb.Message, m: Message) -> None:
    """Write ``m`` into ``out`` in place (``pack.messages.add()``): no second copy into the pack."""
    out.type = m._type  # type: ignore[assignment]  # an IntEnum is an int: no enum descriptor call
    out.vchannel = m._vchannel
    out.timetick = m._timetick
    out.wal_term = m._term
    out.payload = m._payload
    if m._id is not None:
        out.id.id = m._id.to_bytes(MESSAGE_ID_BYTES, "big")
    if m._last_confirmed is not None:
        out.last_confirmed.id = m._last_confirmed.to_bytes(MESSAGE_ID_BYTES, "big")
    if m._txn is not None:
        out.txn.txn_id = m._txn.txn_id
        out.txn.keepalive_ms = m._txn.keepalive_ms
    if m._properties:
        out.properties.update(m._properties)


def message_to_pb(m: Message) -> pb.Message:
    out = pb.Message()
    fill_message_pb(out, m)
    return out


def message_from_pb(p: pb.Message) -> Message:
    """A delivered message as the WAL type (immutable when it carries an id).

    Runs once per message a client receives, so it fills the slots directly rather than going
    through ``Message.__init__`` and its setters (a quarter of the cost, measured).
    """
    has = p.HasField
    props = p.properties
    # On the wire, "not persisted" is "has no id".
    mid = int.from_bytes(p.id.id, "big") if has("id") else None
    return decoded_message(
        _TYPE_BY_NUMBER.get(p.type, _UNDEFINED), p.vchannel, p.payload, dict(props) if len(props) else {},
        p.timetick, p.wal_term,
        int.from_bytes(p.last_confirmed.id, "big") if has("last_confirmed") else None,
        TxnContext(p.txn.txn_id, p.txn.keepalive_ms) if has("txn") else None,
        mid, mid is None,
    )


# --- positions -----------------------------------------------------------------------------------
def position_to_pb(pos: Position, vchannel: str = "") -> pb.Position:
    return pb.Position(
        pchannel=pos.pchannel, message_id=pb.MessageID(id=encode_message_id(pos.message_id)),
        timetick=pos.timetick, vchannel=vchannel,
    )


def position_from_pb(p: pb.Position, field: str = "position") -> tuple[Position, str]:
    """(position, vchannel)."""
    if not p.HasField("message_id"):
        raise InvalidArgumentError(f"{field}.message_id is required", field=field)
    return Position(p.pchannel, message_id_from_pb(p.message_id, f"{field}.message_id"), p.timetick), p.vchannel


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


_PER_MESSAGE_COLUMNS = ("vchannels", "timeticks", "wal_terms", "ids", "payloads")


def messages_from_columns(c: pb.MessageColumns) -> list[Message]:
    """The messages of a column pack, each equal to what ``message_from_pb`` gives for the same
    message sent as a ``Message``.

    Runs once per message a client receives: the columns are zipped and the slots filled directly;
    only the extras are visited one by one.
    """
    types = c.types
    n = len(types)
    for name in _PER_MESSAGE_COLUMNS:
        got = len(getattr(c, name))
        if got != n:
            raise InvalidArgumentError(
                f"columns.{name} has {got} entries for {n} messages (columns.types)", field=f"columns.{name}")
    dense = c.last_confirmeds
    lcs: list[int | None]
    if len(dense):
        if len(dense) != n:
            raise InvalidArgumentError(
                f"columns.last_confirmeds has {len(dense)} entries for {n} messages (columns.types)",
                field="columns.last_confirmeds")
        lcs = list(dense)
    else:
        lcs = [None] * n
    rare: list[pb.MessageExtras] = []
    for i, e in _ordered_extras(c, n):
        # HasField only when the id is empty: an id present but empty is 0, as in message_from_pb.
        if raw := e.last_confirmed.id:
            lcs[i] = int.from_bytes(raw, "big")
        elif e.HasField("last_confirmed"):
            lcs[i] = 0
        if e.no_id or len(e.properties) or e.HasField("txn"):
            rare.append(e)
    out: list[Message] = []
    tget = _TYPE_BY_NUMBER.get
    undefined = _UNDEFINED
    decoded_messages(
        zip([tget(t, undefined) for t in types], c.vchannels, c.payloads, c.timeticks, c.wal_terms, lcs,
            itertools.repeat(None), c.ids, strict=False),  # (the columns' lengths were checked above)
        out,
    )
    new = decoded_message
    for e in rare:  # (indices increase: each message is rebuilt once)
        i = e.index
        m = out[i]
        out[i] = new(
            m.message_type, m.vchannel, m.payload, dict(e.properties) if len(e.properties) else {}, m.timetick,
            m.wal_term, m.last_confirmed, TxnContext(e.txn.txn_id, e.txn.keepalive_ms) if e.HasField("txn") else None,
            # as message_from_pb: on the wire, "not persisted" is "has no id"
            None if e.no_id else m.message_id, bool(e.no_id),
        )
    return out


def msgpack_from_pb(p: pb.MsgPack) -> MsgPack:
    start = [position_from_pb(x)[0] for x in p.start_positions]
    end = [position_from_pb(x)[0] for x in p.end_positions]
    if not start or not end:
        raise InvalidArgumentError("a MsgPack needs start and end positions")
    if p.HasField("columns"):
        if len(p.messages):
            raise InvalidArgumentError("a MsgPack carries its messages as messages or as columns, not both",
                                       field="columns")
        messages = messages_from_columns(p.columns)
    else:
        messages = [message_from_pb(m) for m in p.messages]
    return MsgPack(p.begin_ts, p.end_ts, messages, start[0], end[0])


def join_continued(parts: list[MsgPack], last: MsgPack) -> MsgPack:
    """The pack sent as ``parts`` (each ``MsgPack.continued``) then ``last``: their messages in order,
    the first part's start, the last part's end (see ``MsgPack.continued`` in common.proto)."""
    first = parts[0]
    messages = [m for p in parts for m in p.messages]
    messages.extend(last.messages)
    return MsgPack(first.begin_ts, last.end_ts, messages, first.start_position, last.end_position)


# --- read options --------------------------------------------------------------------------------
def policy_from_pb(p: pb.DeliverPolicy | None, field: str = "policy") -> DeliverPolicy:
    if p is None:
        return DeliverPolicy.all()
    which = p.WhichOneof("policy")
    if which is None or which == "all":
        return DeliverPolicy.all()
    if which == "latest":
        return DeliverPolicy.latest()
    if which == "start_from":
        return DeliverPolicy.start_from(message_id_from_pb(p.start_from, f"{field}.start_from"))
    if which == "start_after":
        return DeliverPolicy.start_after(message_id_from_pb(p.start_after, f"{field}.start_after"))
    return DeliverPolicy.start_at_time(p.start_at_time)


def policy_to_pb(policy: DeliverPolicy) -> pb.DeliverPolicy:
    out = pb.DeliverPolicy()
    kind = policy.kind
    if kind is PolicyKind.ALL:
        out.all.SetInParent()
    elif kind is PolicyKind.LATEST:
        out.latest.SetInParent()
    elif kind is PolicyKind.START_FROM:
        assert policy.message_id is not None
        out.start_from.id = encode_message_id(policy.message_id)
    elif kind is PolicyKind.START_AFTER:
        assert policy.message_id is not None
        out.start_after.id = encode_message_id(policy.message_id)
    else:
        assert policy.timetick is not None
        out.start_at_time = policy.timetick
    return out


def filters_from_pb(filters: Sequence[pb.DeliverFilter]) -> tuple[DeliverFilter, ...]:
    out: list[DeliverFilter] = []
    for i, f in enumerate(filters):
        which = f.WhichOneof("filter")
        if which == "timetick_gt":
            out.append(DeliverFilter.timetick_gt(f.timetick_gt))
        elif which == "timetick_gte":
            out.append(DeliverFilter.timetick_gte(f.timetick_gte))
        elif which == "message_types":
            types = [message_type_from_pb(t, f"filters[{i}].message_types") for t in f.message_types.types]
            out.append(DeliverFilter.message_type(types))
        else:
            raise InvalidArgumentError(f"filters[{i}] is empty", field="filters")
    return tuple(out)


def filters_to_pb(filters: Iterable[DeliverFilter]) -> list[pb.DeliverFilter]:
    out: list[pb.DeliverFilter] = []
    for f in filters:
        if f.kind is FilterKind.TIMETICK_GT:
            out.append(pb.DeliverFilter(timetick_gt=f.timetick))
        elif f.kind is FilterKind.TIMETICK_GTE:
            out.append(pb.DeliverFilter(timetick_gte=f.timetick))
        else:
            types = cast(Any, sorted(int(t) for t in f.types))
            out.append(pb.DeliverFilter(message_types=pb.MessageTypeSet(types=types)))
    return out


__all__ = [
    "PRODUCIBLE_TYPES",
    "check_vchannels",
    "consume_columns_response",
    "consume_pack_response",
    "filters_from_pb",
    "filters_to_pb",
    "message_from_pb",
    "message_id_from_pb",
    "message_id_to_pb",
    "message_to_pb",
    "message_type_from_pb",
    "messages_from_columns",
    "msgpack_from_pb",
    "msgpack_to_pb",
    "policy_from_pb",
    "policy_to_pb",
    "position_from_pb",
    "position_to_pb",
    "produced_columns",
    "produced_message",
    "produced_messages",
]
