"""Produce batches in column form (ProduceBatch.columns) against a real node, through a raw stub."""

from __future__ import annotations

import pytest

from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from tests.integration.rpc_helpers import columns, consume, data, payloads, produce, produce_batches

pytestmark = pytest.mark.integration

def _stored(packs: list[pb.MsgPack]) -> list[tuple[object, ...]]:
    return [(m.type, m.vchannel, m.payload, dict(m.properties), m.HasField("txn"))
            for p in packs for m in p.messages if m.type != pb.MESSAGE_TYPE_TIME_TICK]


async def test_column_batches_store_what_message_batches_store(stub) -> None:
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["rows", "cols"]))
    batches = [
        [data("v1", b"a"), data("v2", b"b", color="red"), data("", b"broadcast")],
        [data("v1", bytes(range(256)) * 4)],
        [data("v2", b"", k="v", other="w"), data("v1", b"z")],
    ]
    _, row_results = await produce(stub, "rows", batches)
    _, col_results = await produce(stub, "cols", batches, as_columns=True)
    assert all(r.HasField("appended") for r in row_results + col_results)
    for batch, result in zip(batches, col_results, strict=True):
        appended = result.appended
        assert not appended.results, "a column batch is answered in column form"
        assert len(appended.ids) == len(appended.timeticks) == len(batch) and not appended.txn_ids
        assert list(appended.ids) == sorted(appended.ids) and list(appended.timeticks) == sorted(appended.timeticks)
    rows = await consume(stub, spb.ConsumeOpen(pchannel="rows"), until=6)
    cols = await consume(stub, spb.ConsumeOpen(pchannel="cols"), until=6)
    assert _stored(cols) == _stored(rows) and len(_stored(cols)) == 6
    delivered = {int.from_bytes(m.id.id, "big"): m.timetick for p in cols for m in p.messages
                 if m.type == pb.MESSAGE_TYPE_DATA}
    answered = {i: t for r in col_results for i, t in zip(r.appended.ids, r.appended.timeticks, strict=True)}
    assert answered == delivered, "each answer names the id and timetick the message was stored with"


async def test_pipelined_batches_keep_their_order_on_each_vchannel(stub) -> None:
    # Behind a broadcast (exclusive over the pchannel), the next two batches wait together; the later
    # one must not take its timestamps first when the broadcast's lock is released.
    names = [f"p{i}" for i in range(60)]
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=names))
    batches = [[data("v1", b"a"), data("v2", b"b"), data("", b"all")], [data("v1", b"c")],
               [data("v2", b"d"), data("v1", b"e")]]
    for name in names:
        await produce(stub, name, batches, as_columns=True)
        packs = await consume(stub, spb.ConsumeOpen(pchannel=name, vchannel="v1"), until=4)
        assert payloads(packs) == [b"a", b"all", b"c", b"e"], name


async def test_column_batches_of_an_idempotent_producer_never_duplicate(stub) -> None:
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    batches = [[data("v", b"a"), data("v", b"b")], [data("v", b"c")]]
    _, first = await produce(stub, "p", batches, producer_id="prod", first_sequence=7, as_columns=True)
    _, again = await produce(stub, "p", batches, producer_id="prod", first_sequence=7, as_columns=True)
    assert [r.appended for r in first] == [r.appended for r in again]
    assert len(first[0].appended.ids) == 2
    packs = await consume(stub, spb.ConsumeOpen(pchannel="p"), until=3)
    assert payloads(packs) == [b"a", b"b", b"c"]
    seqs = [m.properties["producer_seq"] for p in packs for m in p.messages if m.type == pb.MESSAGE_TYPE_DATA]
    assert seqs == ["7", "8", "9"]


async def test_column_batches_in_a_transaction_answer_the_txn_id(stub) -> None:
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    begun = await stub.BeginTxn(spb.BeginTxnRequest(pchannel="p", vchannel="v", keepalive_ms=60_000))
    txn = pb.TxnContext(txn_id=begun.txn_id)
    _, results = await produce(stub, "p", [[data("v", b"in"), data("v", b"too")]], txn=txn, as_columns=True)
    assert list(results[0].appended.txn_ids) == [txn.txn_id, txn.txn_id]
    await stub.CommitTxn(spb.CommitTxnRequest(pchannel="p", vchannel="v", txn_id=txn.txn_id))
    packs = await consume(stub, spb.ConsumeOpen(pchannel="p"), until=2)
    assert [(m.payload, m.txn.txn_id) for p in packs for m in p.messages if m.type == pb.MESSAGE_TYPE_DATA] == [
        (b"in", txn.txn_id), (b"too", txn.txn_id)]


def _bad_batches(txn_id: int) -> list[tuple[spb.ProduceBatch, str, str]]:
    """(batch, error code, a word its message must contain); request ids are set by the caller."""
    one = columns([data("v", b"x")])

    def cols(**change: object) -> spb.ProduceBatch:
        out = spb.ProduceBatch(columns=one)
        for name, value in change.items():
            field = getattr(out.columns, name)
            del field[:]
            field.extend(value)  # type: ignore[arg-type]
        return out

    both = spb.ProduceBatch(columns=one, messages=[data("v", b"y")])
    empty = spb.ProduceBatch()
    empty.columns.SetInParent()
    extras_out_of_range = spb.ProduceBatch(columns=one)
    extras_out_of_range.columns.extras.add(index=1, properties={"k": "v"})
    extras_out_of_order = spb.ProduceBatch(columns=columns([data("v", b"x", a="1"), data("v", b"y", b="2")]))
    extras_out_of_order.columns.extras.reverse()
    no_id = spb.ProduceBatch(columns=one)
    no_id.columns.extras.add(index=0, no_id=True)
    reserved = spb.ProduceBatch(columns=columns([data("v", b"x", producer_id="me")]))
    other_txn = spb.ProduceBatch(columns=one, txn=pb.TxnContext(txn_id=txn_id, keepalive_ms=1000))
    other_txn.columns.extras.add(index=0).txn.txn_id = txn_id + 1
    return [
        (both, "INVALID_ARGUMENT", "not both"),
        (empty, "INVALID_ARGUMENT", "at least one message"),
        (cols(payloads=[b"a", b"b"]), "INVALID_ARGUMENT", "one of each"),
        (cols(vchannels=[]), "INVALID_ARGUMENT", "one of each"),
        (cols(timeticks=[5]), "INVALID_ARGUMENT", "columns.timeticks"),
        (cols(ids=[5]), "INVALID_ARGUMENT", "columns.ids"),
        (cols(last_confirmeds=[5]), "INVALID_ARGUMENT", "columns.last_confirmeds"),
        (cols(types=[pb.MESSAGE_TYPE_TIME_TICK]), "INVALID_ARGUMENT", "TIME_TICK"),
        (cols(types=[777]), "INVALID_ARGUMENT", "777"),
        (extras_out_of_range, "INVALID_ARGUMENT", "out of range"),
        (extras_out_of_order, "INVALID_ARGUMENT", "out of order"),
        (no_id, "INVALID_ARGUMENT", "assigned by the node"),
        (reserved, "INVALID_ARGUMENT", "reserved"),
        (other_txn, "INVALID_ARGUMENT", "names transaction"),
        (cols(payloads=[b"x" * ((4 << 20) + 1)]), "MESSAGE_TOO_LARGE", "over the limit"),
    ]


async def test_bad_column_batches_are_refused_in_band_and_write_nothing(stub) -> None:
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    bad = _bad_batches(txn_id=12345)
    batches = [spb.ProduceBatch(columns=columns([data("v", b"before")]))]
    batches += [b for b, _, _ in bad]
    batches.append(spb.ProduceBatch(columns=columns([data("v", b"after")])))
    for i, b in enumerate(batches):
        b.request_id = i + 1
    _, results = await produce_batches(stub, "p", batches)
    assert [r.request_id for r in results] == [b.request_id for b in batches], "the stream went on after each error"
    assert results[0].HasField("appended") and results[-1].HasField("appended")
    for (_, code, word), result in zip(bad, results[1:-1], strict=True):
        assert result.HasField("error"), word
        assert pb.ErrorCode.Name(result.error.code) == f"ERROR_CODE_{code}", (word, result.error.message)
        assert word in result.error.message, result.error.message
    assert payloads(await consume(stub, spb.ConsumeOpen(pchannel="p"), until=2)) == [b"before", b"after"]
