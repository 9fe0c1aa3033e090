"""The txn step's per-transaction bounds: counted over batches, given back by failed writes, rebuilt
by replay, and a transaction over them failed for good."""

from __future__ import annotations

import pytest

from interceptors.txn import TxnInterceptor, TxnManager, TxnState
from tests.unit.test_txn import Harness, body, commit
from wal import Message, MessageType
from wal.errors import InvalidTxnStateError, TxnTooLargeError, UnavailableError


def bounded(max_messages: int | None = None, max_bytes: int | None = None) -> Harness:
    h = Harness()
    h.mgr = TxnManager(max_messages=max_messages, max_bytes=max_bytes)
    h.icpt = TxnInterceptor(h.mgr)
    return h


async def test_a_failed_write_gives_its_bodies_back_and_the_bound_holds_across_batches() -> None:
    h = bounded(max_messages=3)
    ctx = await h.begin()
    h.fake.fail = UnavailableError("transient")
    with pytest.raises(UnavailableError):
        await h.append(body(ctx), body(ctx))
    await h.append(body(ctx), body(ctx))  # the failed batch counted for nothing
    await h.append(body(ctx))
    with pytest.raises(TxnTooLargeError, match="txn_max_messages = 3") as caught:
        await h.append(body(ctx))
    assert caught.value.fields == {"txn_id": ctx.txn_id, "bound": "txn_max_messages", "limit": 3}
    s = h.session(ctx)
    assert s.state is TxnState.ROLLED_BACK and s.failure is not None and "txn_max_messages" in s.failure
    with pytest.raises(InvalidTxnStateError, match="txn_max_messages"):
        await h.append(commit(ctx))


async def test_bytes_count_payload_vchannel_and_properties() -> None:
    h = bounded(max_bytes=100)
    ctx = await h.begin()
    m = Message(MessageType.INSERT, "v", b"x" * 40, {"k\u00e9": "v"}, txn=ctx)  # 40 + 1 + 2 + 1
    await h.append(m)
    await h.append(body(ctx, payload=b"x" * 55))  # 44 + 56 = 100: at the bound
    with pytest.raises(TxnTooLargeError, match="txn_max_bytes = 100"):
        await h.append(body(ctx, payload=b""))


async def test_replay_rebuilds_the_counts() -> None:
    h = bounded(max_messages=2)
    ctx = await h.begin()
    await h.append(body(ctx), body(ctx))
    again = TxnManager(max_messages=2)
    again.replay(h.fake.log)
    s = again.get(ctx.txn_id)
    assert s is not None and s.messages == 2
    h2 = bounded(max_messages=2)
    h2.mgr, h2.icpt = again, TxnInterceptor(again)
    with pytest.raises(TxnTooLargeError):
        await h2.append(body(ctx))


async def test_a_batch_that_begins_a_transaction_over_its_bound_writes_nothing() -> None:
    h = bounded(max_messages=1)
    begin = h.mgr.begin_message("v", 0)
    assert begin.txn is not None
    with pytest.raises(TxnTooLargeError, match="nothing of it was written"):
        await h.append(begin, body(begin.txn), body(begin.txn))
    assert h.fake.log == [] and h.mgr.get(begin.txn.txn_id) is None
