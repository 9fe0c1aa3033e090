"""Column packs (ConsumeOpen.columns): ``codec.consume_columns_response`` on the node and
``codec.msgpack_from_pb`` on the client must give exactly the MsgPack that the messages form gives,
whatever the pack holds and wherever its fragments are cut; malformed columns are refused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.wire import codec
from wal.errors import InvalidArgumentError
from wal.message import Message, MessageType, Position, TxnContext
from wal.scanner import MsgPack

U64 = 2**64 - 1


def _message(t: MessageType, vchannel: str, payload: bytes, timetick: int, term: int, mid: int | None,
             lc: int | None, props: dict[str, str] | None = None, txn: TxnContext | None = None) -> Message:
    m = Message(t, vchannel, payload, props, timetick=timetick, txn=txn, not_persisted=mid is None)
    m._term = term
    m._last_confirmed = lc
    m._id = mid
    return m


@st.composite
def stored(draw: st.DrawFn) -> Message:
    """What a catch-up read mostly holds: an id and a last_confirmed, nothing else."""
    return _message(MessageType.DATA, draw(st.sampled_from(["v1", "v2"])), draw(st.binary(max_size=40)),
                    draw(st.integers(0, U64)), draw(st.integers(0, 2**40)), draw(st.integers(0, U64)),
                    draw(st.integers(0, U64)))


@st.composite
def anything(draw: st.DrawFn) -> Message:
    """Any field set or not: properties, txn, last_confirmed, no id (a tick delivered unpersisted),
    broadcast, unusual types."""
    txn = draw(st.none() | st.builds(TxnContext, st.integers(0, 2**62), st.integers(0, 10**6)))
    return _message(
        draw(st.sampled_from(sorted(MessageType))), draw(st.sampled_from(["", "v1", "v2", "é-vchannel"])),
        draw(st.binary(max_size=60)), draw(st.integers(0, U64)), draw(st.integers(-(2**63), 2**63 - 1)),
        draw(st.none() | st.integers(0, U64)), draw(st.none() | st.integers(0, U64)),
        draw(st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3)), txn,
    )


def _pack(msgs: list[Message], begin: int = 5, end: int = 9) -> MsgPack:
    return MsgPack(begin, end, msgs, Position("p", 3, begin), Position("p", 3 + len(msgs), end))


def _as_messages(pack: MsgPack, vchannel: str) -> spb.ConsumeResponse:
    return spb.ConsumeResponse.FromString(codec.consume_pack_response(pack, vchannel))


def _as_columns(pack: MsgPack, vchannel: str, **kw: int) -> spb.ConsumeResponse:
    return spb.ConsumeResponse.FromString(codec.consume_columns_response(pack, vchannel, **kw))


def _same_as_messages_form(pack: MsgPack, vchannel: str, **kw: int) -> pb.MsgPack:
    cols = _as_columns(pack, vchannel, **kw)
    want = _as_messages(pack, vchannel)
    assert cols.WhichOneof("response") == "pack"
    assert not cols.pack.messages
    assert cols.pack.HasField("columns") == bool(pack.messages)
    for field in ("begin_ts", "end_ts", "start_positions", "end_positions"):
        assert getattr(cols.pack, field) == getattr(want.pack, field), field
    got = codec.msgpack_from_pb(cols.pack)
    assert got == codec.msgpack_from_pb(want.pack)
    for a, b in zip(got.messages, codec.msgpack_from_pb(want.pack).messages, strict=True):
        for slot in Message.__slots__:  # Message.__eq__ ignores nothing, but say which slot differs
            assert getattr(a, slot) == getattr(b, slot), slot
    return cols.pack


@settings(max_examples=150, deadline=None)
@given(msgs=st.lists(stored() | anything(), max_size=60), fragment=st.integers(1, 9),
       vchannel=st.sampled_from(["", "v1"]))
def test_columns_read_back_as_the_messages_form(msgs: list[Message], fragment: int, vchannel: str) -> None:
    # Small fragments: the cuts fall everywhere, between plain and special messages, inside runs.
    _same_as_messages_form(_pack(msgs), vchannel, fragment=fragment)


@settings(max_examples=20, deadline=None)
@given(msgs=st.lists(stored(), min_size=1, max_size=600), specials=st.lists(anything(), max_size=5),
       data=st.data())
def test_default_fragments_of_a_large_pack(msgs: list[Message], specials: list[Message], data: st.DataObject) -> None:
    for s in specials:
        msgs.insert(data.draw(st.integers(0, len(msgs))), s)
    _same_as_messages_form(_pack(msgs), "v1")


def test_a_delivered_message_reads_back_field_for_field() -> None:
    sent = [
        _message(MessageType.DATA, "v1", b"a", 10, 2, 7, 6),
        _message(MessageType.TIME_TICK, "", b"", 11, 2, None, 7),
        _message(MessageType.BEGIN_TXN, "v2", b"", 12, 2, 8, 7, txn=TxnContext(4, 1000)),
        _message(MessageType.DATA, "v2", b"b", 13, 2, 9, None, {"k": "v"}, TxnContext(4, 1000)),
        _message(MessageType.DATA, "v1", b"c", 14, 2, 0, 0),
    ]
    got = codec.msgpack_from_pb(_as_columns(_pack(sent), "").pack).messages
    for s, g in zip(sent, got, strict=True):
        for slot in Message.__slots__:
            assert getattr(g, slot) == getattr(s, slot), slot
    assert got[0].is_immutable and not got[0].not_persisted
    assert got[1].message_id is None and got[1].not_persisted, "no id on the wire: not persisted"


def test_only_messages_with_more_than_the_columns_have_extras() -> None:
    plain = [_message(MessageType.DATA, "v", b"x", i, 1, i, None) for i in range(300)]
    cols = _as_columns(_pack(plain), "v").pack.columns
    assert not cols.extras and not cols.last_confirmeds
    plain[150]._last_confirmed = 42
    plain[299]._properties = {"a": "b"}
    extras = _as_columns(_pack(plain), "v").pack.columns.extras
    assert [e.index for e in extras] == [150, 299]
    assert int.from_bytes(extras[0].last_confirmed.id, "big") == 42 and not extras[0].properties
    assert dict(extras[1].properties) == {"a": "b"} and not extras[1].HasField("last_confirmed")


def test_last_confirmed_travels_as_a_column_when_every_message_has_one() -> None:
    msgs = [_message(MessageType.DATA, "v", b"x", i, 1, i, i // 2) for i in range(300)]
    msgs[7]._properties = {"a": "b"}
    cols = _as_columns(_pack(msgs), "v").pack.columns
    assert list(cols.last_confirmeds) == [i // 2 for i in range(300)]
    assert [e.index for e in cols.extras] == [7] and not cols.extras[0].HasField("last_confirmed")
    _same_as_messages_form(_pack(msgs), "v", fragment=64)


def test_a_last_confirmed_column_of_the_wrong_length_is_refused() -> None:
    msgs = [_message(MessageType.DATA, "v", b"x", i, 1, i, i) for i in range(3)]
    cols = _as_columns(_pack(msgs), "v").pack.columns
    cols.last_confirmeds.append(9)
    with pytest.raises(InvalidArgumentError, match="last_confirmeds has 4 entries for 3"):
        codec.messages_from_columns(cols)


def test_presence_with_default_values_reads_as_message_from_pb() -> None:
    # Submessages present but empty (other writers than this node may send them): the column form
    # must read them as message_from_pb reads the same message.
    sent = pb.Message(type=pb.MESSAGE_TYPE_DATA, vchannel="v", id=pb.MessageID(id=bytes(8)),
                      last_confirmed=pb.MessageID(), txn=pb.TxnContext())
    cols = pb.MessageColumns(types=[sent.type], vchannels=[sent.vchannel], timeticks=[0], wal_terms=[0], ids=[0],
                             payloads=[b""], extras=[pb.MessageExtras(index=0, last_confirmed=pb.MessageID(),
                                                                      txn=pb.TxnContext())])
    (got,) = codec.messages_from_columns(cols)
    assert got == codec.message_from_pb(sent)
    assert got.last_confirmed == 0 and got.txn == TxnContext(0, 0)

# --- malformed columns, as a client may receive them ----------------------------------------------
def _good_columns(n: int = 3) -> pb.MessageColumns:
    return pb.MessageColumns(
        types=[pb.MESSAGE_TYPE_DATA] * n, vchannels=["v"] * n, timeticks=range(1, n + 1), wal_terms=[1] * n,
        ids=range(n), payloads=[b"x"] * n,
        extras=[pb.MessageExtras(index=1, properties={"a": "b"}), pb.MessageExtras(index=2, no_id=True)],
    )


def _with_positions(cols: pb.MessageColumns) -> pb.MsgPack:
    pos = pb.Position(pchannel="p", message_id=pb.MessageID(id=bytes(8)), timetick=1)
    return pb.MsgPack(begin_ts=0, end_ts=3, start_positions=[pos], end_positions=[pos], columns=cols)


def test_good_columns_decode() -> None:
    got = codec.msgpack_from_pb(_with_positions(_good_columns())).messages
    assert [m.properties for m in got] == [{}, {"a": "b"}, {}]
    assert [m.message_id for m in got] == [0, 1, None]


@pytest.mark.parametrize("column", ["vchannels", "timeticks", "wal_terms", "ids", "payloads"])
@pytest.mark.parametrize("change", ["drop", "add"])
def test_columns_of_other_lengths_are_refused(column: str, change: str) -> None:
    cols = _good_columns()
    field = getattr(cols, column)
    if change == "drop":
        del field[-1]
    else:
        field.append(field[0])
    with pytest.raises(InvalidArgumentError, match=rf"columns\.{column}") as err:
        codec.msgpack_from_pb(_with_positions(cols))
    assert err.value.fields["field"] == f"columns.{column}"


def test_fewer_types_than_the_other_columns_are_refused() -> None:
    cols = _good_columns()
    del cols.types[-1]
    with pytest.raises(InvalidArgumentError, match="columns"):
        codec.msgpack_from_pb(_with_positions(cols))


@pytest.mark.parametrize("indices", [[3], [0, 7], [2**32 - 1], [1, 1], [2, 1]])
def test_extras_out_of_range_or_order_are_refused(indices: list[int]) -> None:
    cols = _good_columns()
    del cols.extras[:]
    for i in indices:
        cols.extras.add(index=i, properties={"k": "v"})
    with pytest.raises(InvalidArgumentError, match=r"columns\.extras") as err:
        codec.msgpack_from_pb(_with_positions(cols))
    assert err.value.fields["field"] == "columns.extras"


def test_extras_with_no_messages_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match=r"columns\.extras"):
        codec.msgpack_from_pb(_with_positions(pb.MessageColumns(extras=[pb.MessageExtras(index=0, no_id=True)])))


def test_a_pack_with_messages_and_columns_is_refused() -> None:
    p = _with_positions(_good_columns())
    p.messages.add(type=pb.MESSAGE_TYPE_DATA, vchannel="v")
    with pytest.raises(InvalidArgumentError, match="not both"):
        codec.msgpack_from_pb(p)
