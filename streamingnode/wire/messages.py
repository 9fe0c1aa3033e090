"""Messages and positions between the wire (``streamingnode.v1`` protobuf) and the WAL's own types:
what a producer sends (checked here, refused with an ``InvalidArgumentError`` naming the field) and
what a consumer receives.  ``streamingnode.wire.codec`` re-exports every name."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence

from streamingnode.v1 import common_pb2 as pb
from wal._record import check_properties, properties_fit
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
    every message under the size limit) costs one ``decoded_messages`` loop and no per-message check.
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
