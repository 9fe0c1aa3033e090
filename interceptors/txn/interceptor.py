"""TxnInterceptor: the txn step of the chain, a thin driver of the claim protocol (``claim.py``)."""

from __future__ import annotations

from typing import Any

from interceptors.base import AppendNext
from interceptors.txn.manager import TxnManager
from interceptors.txn.session import FRAMING
from wal.message import AppendResult, Message, MessageType, any_transactional


class TxnInterceptor:
    """The txn step: validates transactional messages against ``manager`` before they are written."""

    name = "txn"
    replay_types: frozenset[MessageType] = frozenset()
    """Replay acts only on messages of a transaction: see ``plain_skipping_types``."""

    def __init__(self, manager: TxnManager) -> None:
        self.manager = manager

    async def do_append(self, batch: list[Message], append_next: AppendNext) -> list[AppendResult]:
        """Validate ``batch``, wait for what its commits need, write it, then apply it."""
        if not any_transactional(batch, FRAMING):  # the common batch: one cheap pass, then through
            return await append_next(batch)
        claim = self.manager.claim(batch)
        if claim is None:
            return await append_next(batch)
        try:
            if claim.commits:
                await claim.wait()
            results = await append_next(batch)
        except BaseException:
            claim.abort()
            raise
        claim.settle(results)
        return results

    def replay(self, batch: list[Message]) -> None:
        """Rebuild sessions from stored messages (see ``TxnManager.replay``)."""
        self.manager.replay(batch)

    def export_state(self) -> dict[str, Any]:
        """See ``TxnManager.export_state``."""
        return self.manager.export_state()

    def import_state(self, state: dict[str, Any]) -> None:
        """See ``TxnManager.import_state``."""
        self.manager.import_state(state)

    async def recovered(self) -> None:
        """Expire what replay left open; the owner collects them with ``take_orphans``."""
        self.manager.finish_recovery()

    async def close(self) -> None:
        """Nothing to release: sessions live in the manager."""
        return None


__all__ = ["TxnInterceptor"]
