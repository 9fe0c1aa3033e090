"""``decoded_message`` / ``decoded_messages``: the one constructor from decoded fields builds what the
public constructor and setters build."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from wal.message import Message, MessageType, TxnContext, decoded_message, decoded_messages

_fields = st.tuples(
    st.sampled_from(list(MessageType)), st.text(max_size=8), st.binary(max_size=16),
    st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2), st.integers(0, 2**63 - 1),
    st.integers(0, 2**31), st.none() | st.integers(0, 2**40),
    st.none() | st.builds(TxnContext, st.integers(1, 2**40), st.integers(1, 2**31)), st.none() | st.integers(0, 2**40),
)


def _reference(t, vchannel, payload, props, ts, term, lc, txn, mid) -> Message:  # type: ignore[no-untyped-def]
    m = Message(t, vchannel, payload, props, timetick=ts, txn=txn).with_wal_term(term)
    if lc is not None:
        m.with_last_confirmed(lc)
    if mid is not None:
        m._seal(mid)
    return m


@given(_fields)
def test_decoded_message_equals_the_public_constructor(f: tuple) -> None:  # type: ignore[type-arg]
    t, vchannel, payload, props, ts, term, lc, txn, mid = f
    m = decoded_message(t, vchannel, payload, dict(props), ts, term, lc, txn, mid, False)
    assert m == _reference(*f)
    assert m.is_immutable is (mid is not None)


@given(st.lists(_fields, max_size=5))
def test_decoded_messages_builds_one_per_row_without_properties(rows: list) -> None:  # type: ignore[type-arg]
    out: list[Message] = [Message(MessageType.DATA)]
    got = decoded_messages([(t, v, p, ts, term, lc, txn, mid) for t, v, p, _, ts, term, lc, txn, mid in rows], out)
    assert got is out and len(out) == len(rows) + 1
    for m, (t, v, p, _, ts, term, lc, txn, mid) in zip(out[1:], rows, strict=True):
        assert m == _reference(t, v, p, {}, ts, term, lc, txn, mid)
        assert m.properties == {} and not m.not_persisted
