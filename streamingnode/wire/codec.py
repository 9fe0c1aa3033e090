"""Between the wire (``streamingnode.v1`` protobuf) and the WAL's own types, in both directions.

The node and the client share these functions, so a message, position or read option means the same
on both ends.  Everything that comes from the wire is checked here and refused with an
``InvalidArgumentError`` that names the field; nothing unchecked reaches the WAL.

This module is the one callers import: it holds the decoding of packs (rows, columns, continued
parts) and the read options, and re-exports the messages and positions (``wire.messages``) and the
node's ConsumeResponse encoders (``wire.responses``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any, cast

from streamingnode.v1 import common_pb2 as pb
from streamingnode.wire.messages import (
    _TYPE_BY_NUMBER,
    _UNDEFINED,
    PRODUCIBLE_TYPES,
    _ordered_extras,
    check_vchannels,
    fill_message_pb,
    message_from_pb,
    message_id_from_pb,
    message_id_to_pb,
    message_to_pb,
    message_type_from_pb,
    position_from_pb,
    position_to_pb,
    produced_columns,
    produced_message,
    produced_messages,
)
from streamingnode.wire.responses import (
    consume_columns_response,
    consume_pack_response,
    continued_part,
    joined_pack_response,
    msgpack_to_pb,
    pack_head_bytes,
    pack_messages_offset,
)
from wal.errors import InvalidArgumentError
from wal.message import (
    Message,
    TxnContext,
    decoded_message,
    decoded_messages,
    encode_message_id,
)
from wal.options import DeliverFilter, DeliverPolicy, FilterKind, PolicyKind
from wal.scanner import MsgPack

_PER_MESSAGE_COLUMNS = ("vchannels", "timeticks", "wal_terms", "ids", "payloads")


def messages_from_columns(c: pb.MessageColumns) -> list[Message]:
    """The messages of a column pack, each equal to what ``message_from_pb`` gives for the same
    message sent as a ``Message``.

    Runs once per message a client receives: the columns are zipped into ``decoded_messages`` (no call per message);
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
    "continued_part",
    "fill_message_pb",
    "filters_from_pb",
    "filters_to_pb",
    "join_continued",
    "joined_pack_response",
    "message_from_pb",
    "message_id_from_pb",
    "message_id_to_pb",
    "message_to_pb",
    "message_type_from_pb",
    "messages_from_columns",
    "msgpack_from_pb",
    "msgpack_to_pb",
    "pack_head_bytes",
    "pack_messages_offset",
    "policy_from_pb",
    "policy_to_pb",
    "position_from_pb",
    "position_to_pb",
    "produced_columns",
    "produced_message",
    "produced_messages",
]
