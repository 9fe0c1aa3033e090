"""Produce batches in column form convert to exactly the messages the per-message form gives."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamingnode.v1 import common_pb2 as pb
from streamingnode.wire import codec
from wal.errors import InvalidArgumentError, MessageTooLargeError

_TYPES = sorted(int(t) for t in codec.PRODUCIBLE_TYPES)
_text = st.text(max_size=6)
_message = st.builds(
    lambda t, vc, payload, props: pb.Message(type=t, vchannel=vc, payload=payload, properties=props),
    st.sampled_from(_TYPES), st.sampled_from(["", "v1", "v2", "ü"]), st.binary(max_size=64),
    st.dictionaries(_text, _text, max_size=3),
)


def _columns(msgs: list[pb.Message]) -> pb.MessageColumns:
    out = pb.MessageColumns(types=[m.type for m in msgs], vchannels=[m.vchannel for m in msgs],
                            payloads=[m.payload for m in msgs])
    for i, m in enumerate(msgs):
        if m.properties:
            out.extras.add(index=i, properties=dict(m.properties))
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(_message, min_size=1, max_size=20), st.integers(min_value=0, max_value=90))
def test_columns_give_the_messages_the_message_form_gives(msgs: list[pb.Message], limit: int) -> None:
    try:
        expected = [codec.produced_message(m, i, limit) for i, m in enumerate(msgs)]
    except MessageTooLargeError as exc:
        with pytest.raises(MessageTooLargeError) as err:
            codec.produced_columns(_columns(msgs), limit)
        assert str(err.value) == str(exc), "the same message is named as too large"
        return
    got, txns = codec.produced_columns(_columns(msgs), limit)
    assert got == expected and not txns
    assert len({id(m.properties) for m in got}) == len(got), "every message has its own properties map"


def test_a_transaction_named_in_extras_is_returned_by_index() -> None:
    cols = _columns([pb.Message(type=pb.MESSAGE_TYPE_DATA, vchannel="v", payload=b"a")] * 3)
    cols.extras.add(index=2).txn.txn_id = 9
    _, txns = codec.produced_columns(cols, 1 << 20)
    assert list(txns) == [2] and txns[2].txn_id == 9


def test_column_lengths_must_agree() -> None:
    cols = _columns([pb.Message(type=pb.MESSAGE_TYPE_DATA, vchannel="v", payload=b"a")] * 2)
    cols.payloads.append(b"extra")
    with pytest.raises(InvalidArgumentError, match="2 types, 2 vchannels and 3 payloads"):
        codec.produced_columns(cols, 1 << 20)
