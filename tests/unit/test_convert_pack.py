"""``codec.consume_pack_response`` encodes a pack in fragments; it must parse to exactly the
ConsumeResponse that one SerializeToString of the whole would give, whatever the pack holds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.wire import codec
from wal.message import Message, MessageType, Position, TxnContext
from wal.scanner import MsgPack


@st.composite
def messages(draw: st.DrawFn) -> Message:
    txn = draw(st.none() | st.builds(TxnContext, st.integers(1, 2**40), st.integers(0, 10**6)))
    m = Message(
        draw(st.sampled_from(sorted(MessageType))),
        draw(st.sampled_from(["v", "", "é-vchannel"])),
        draw(st.binary(max_size=300)),
        draw(st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3)),
        timetick=draw(st.integers(0, 2**63 - 1)),
        txn=txn,
    )
    m._term = draw(st.integers(0, 2**31))
    m._last_confirmed = draw(st.none() | st.integers(0, 2**63 - 1))
    m._id = draw(st.none() | st.integers(0, 2**63 - 1))
    return m


def whole(pack: MsgPack, vchannel: str) -> spb.ConsumeResponse:
    return spb.ConsumeResponse(pack=codec.msgpack_to_pb(pack, vchannel))


@settings(max_examples=60, deadline=None)
@given(msgs=st.lists(messages(), max_size=200), begin=st.integers(0, 2**63), end=st.integers(0, 2**63),
       vchannel=st.sampled_from(["", "v"]))
def test_fragments_parse_to_the_whole(msgs: list[Message], begin: int, end: int, vchannel: str) -> None:
    pack = MsgPack(begin, end, msgs, Position("p", 3, begin), Position("p", 3 + len(msgs), end))
    got = spb.ConsumeResponse.FromString(codec.consume_pack_response(pack, vchannel))
    assert got == whole(pack, vchannel)
    assert got.WhichOneof("response") == "pack"


def test_a_pack_of_megabytes_has_a_multi_byte_length() -> None:
    msgs = []
    for i in range(2100):  # about 2.1 MiB: the length prefix takes 4 bytes
        m = Message(MessageType.DATA, "v", bytes([i % 256]) * 1024, timetick=i + 1)
        m._id = i
        msgs.append(m)
    pack = MsgPack(0, 3000, msgs, Position("p", 0, 0), Position("p", 2100, 3000))
    raw = codec.consume_pack_response(pack, "v")
    assert len(raw) > 2 << 20
    got = spb.ConsumeResponse.FromString(raw)
    assert got == whole(pack, "v")
    assert [m.payload[0] for m in got.pack.messages] == [i % 256 for i in range(2100)]


@settings(max_examples=60, deadline=None)
@given(msgs=st.lists(messages(), max_size=50))
def test_a_delivered_message_reads_back_field_for_field(msgs: list[Message]) -> None:
    pack = MsgPack(0, 1, msgs, Position("p", 0, 0), Position("p", len(msgs), 1))
    parsed = spb.ConsumeResponse.FromString(codec.consume_pack_response(pack, "v")).pack
    for sent, pm in zip(msgs, parsed.messages, strict=True):
        got = codec.message_from_pb(pm)
        for slot in Message.__slots__:
            want = getattr(sent, slot)
            if slot == "_not_persisted":
                want = sent._id is None  # on the wire, "not persisted" is "has no id"
            assert getattr(got, slot) == want, slot


@settings(max_examples=60, deadline=None)
@given(groups=st.lists(st.lists(messages(), max_size=40), min_size=1, max_size=6),
       ticks=st.lists(st.integers(0, 2**62), min_size=7, max_size=7, unique=True),
       vchannel=st.sampled_from(["", "v"]))
def test_joined_responses_parse_to_the_pack_they_make_together(
    groups: list[list[Message]], ticks: list[int], vchannel: str,
) -> None:
    # Consecutive packs, each encoded alone, then joined on the wire without decoding a message.
    ticks.sort()
    packs, at = [], 3
    for k, msgs in enumerate(groups):
        packs.append(MsgPack(ticks[k], ticks[k + 1], msgs, Position("p", at, ticks[k]),
                             Position("p", at + len(msgs), ticks[k + 1])))
        at += len(msgs)
    whole_pack = MsgPack(packs[0].begin_ts, packs[-1].end_ts, [m for p in packs for m in p.messages],
                         packs[0].start_position, packs[-1].end_position)
    responses = [codec.consume_pack_response(p, vchannel) for p in packs]
    joined = codec.joined_pack_response(whole_pack, vchannel, responses)
    assert joined is not None
    assert spb.ConsumeResponse.FromString(joined) == whole(whole_pack, vchannel)


def test_only_whole_message_packs_can_be_joined() -> None:
    m = Message(MessageType.DATA, "v", b"x", timetick=2)
    m._id = 3
    pack = MsgPack(1, 2, [m], Position("p", 3, 1), Position("p", 4, 2))
    plain = codec.consume_pack_response(pack, "v")
    assert codec.pack_messages_offset(plain) is not None
    for other in (codec.consume_pack_response(pack, "v", continued=True),  # a part of a larger pack
                  codec.consume_columns_response(pack, "v"),  # extras count from the pack's first message
                  spb.ConsumeResponse(opened=spb.ConsumeOpened(consumer_id=1)).SerializeToString(),
                  plain[:-1]):  # cut short
        assert codec.pack_messages_offset(other) is None
        assert codec.joined_pack_response(pack, "v", [plain, other]) is None
