"""The transaction keepalive bound (wal.txn_keepalive): one check, at every way a transaction begins.

The message header holds a keepalive in 32 bits.  The gRPC BeginTxn checked both ends, the config and
the txn manager only the lower one, so an embedded ``begin_txn`` with a keepalive over 32 bits handed
out a transaction id and failed only when its BeginTxn could not be encoded."""

from __future__ import annotations

import pytest

from interceptors.recovery.streaming_wal import ChainConfig, open_streaming_wal
from interceptors.txn import TxnManager
from streamingnode.config import NodeConfig
from wal import WALManager
from wal.errors import InvalidArgumentError
from wal.txn_keepalive import MAX_KEEPALIVE_MS, check_keepalive

TOO_LONG = MAX_KEEPALIVE_MS + 1


@pytest.mark.parametrize("bad", [-1, TOO_LONG, 1 << 64, 1.5, True, "10"])
def test_the_check(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="keepalive_ms") as caught:
        check_keepalive(bad)
    assert caught.value.fields["field"] == "keepalive_ms"


def test_the_bounds_pass() -> None:
    assert MAX_KEEPALIVE_MS == (1 << 32) - 1
    for good in (0, 1, MAX_KEEPALIVE_MS):
        assert check_keepalive(good) == good


async def test_embedded_begin_txn_refuses_a_keepalive_over_32_bits(manager: WALManager) -> None:
    await manager.create_channel("p")
    swal = await open_streaming_wal(manager, "p", ChainConfig(tick_interval=0.02))
    try:
        await swal.ready()
        first = swal.txns.next_txn_id
        with pytest.raises(InvalidArgumentError, match=f"outside .*{MAX_KEEPALIVE_MS}") as caught:
            await swal.begin_txn("v", TOO_LONG)
        assert caught.value.fields["field"] == "keepalive_ms"
        assert swal.txns.next_txn_id == first, "refused before an id is handed out"
        ctx, _ = await swal.begin_txn("v", MAX_KEEPALIVE_MS)
        assert ctx.keepalive_ms == MAX_KEEPALIVE_MS
    finally:
        await swal.aclose()


def test_txn_manager_begin() -> None:
    with pytest.raises(InvalidArgumentError, match="keepalive_ms"):
        TxnManager().begin("v", TOO_LONG)
    with pytest.raises(InvalidArgumentError, match="keepalive_ms"):
        TxnManager().begin("v", -1)


def test_config() -> None:
    with pytest.raises(InvalidArgumentError, match="txn_keepalive_ms"):
        NodeConfig(txn_keepalive_ms=TOO_LONG)
    with pytest.raises(InvalidArgumentError, match="txn_keepalive_ms"):
        NodeConfig(txn_keepalive_ms=-1)
    assert NodeConfig(txn_keepalive_ms=MAX_KEEPALIVE_MS).txn_keepalive_ms == MAX_KEEPALIVE_MS
