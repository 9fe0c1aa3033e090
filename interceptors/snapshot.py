"""Recovery snapshots: the replayed state of the stateful steps as of a message id.

Recovery rebuilds dedup, shard and txn state by replaying the log (see ``streaming.py``).  Once the
log is truncated, the messages that state came from are gone — the CreateCollection of a collection
still written to, the next segment id (Parquet paths name segment ids, so one must never be handed
out twice), the dedup window.  A snapshot carries that state across the truncation: it is the state
after replaying every message with an id below ``message_id``, stored as one WAL meta value
(``SNAPSHOT_META``), and recovery imports it and replays only from ``message_id`` on.

The retention step builds a snapshot *offline*, with fresh steps and a ``ShadowReplay`` over the
stored log, never from the live chain (whose state includes appends still in flight), and stores it
before it truncates: a crash in between leaves a snapshot above the first retained id, which is
valid — recovery starts at the snapshot and ignores the messages below it.

A snapshot is taken only where no transaction is open: a transaction's BeginTxn is always replayed,
so no session ever has to be carried over, and a reader from the first retained message sees every
retained transaction whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from interceptors.base import Interceptor, RecoverableInterceptor, SnapshotInterceptor
from interceptors.txn import TxnManager
from wal.errors import CorruptedError
from wal.message import Message, MessageID, MessageType
from wal.wal import WAL

SNAPSHOT_META = "recovery_snapshot"
_VERSION = 1
_READ_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class RecoverySnapshot:
    """The state of each snapshot step (by name) after every message with an id < ``message_id``."""

    message_id: MessageID
    steps: dict[str, Any]

    def encode(self) -> bytes:
        doc = {"version": _VERSION, "message_id": self.message_id, "steps": self.steps}
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes, pchannel: str) -> RecoverySnapshot:
        try:
            doc = json.loads(raw)
            version, message_id, steps = doc["version"], int(doc["message_id"]), dict(doc["steps"])
        except (ValueError, TypeError, KeyError) as exc:
            raise CorruptedError(f"recovery snapshot of pchannel {pchannel!r} is unreadable: {exc!r}",
                                 channel=pchannel) from None
        if version != _VERSION:
            raise CorruptedError(f"recovery snapshot of pchannel {pchannel!r} has unknown version {version!r}",
                                 channel=pchannel)
        return cls(message_id, steps)


def snapshot_steps(steps: Iterable[object]) -> list[SnapshotInterceptor]:
    """The steps whose replayed state a snapshot carries: those that replay and can export."""
    return [s for s in steps if isinstance(s, RecoverableInterceptor) and isinstance(s, SnapshotInterceptor)]


async def load_snapshot(wal: WAL) -> RecoverySnapshot | None:
    raw = await wal.get_meta(SNAPSHOT_META)
    return None if raw is None else RecoverySnapshot.decode(raw, wal.pchannel)


async def store_snapshot(wal: WAL, snapshot: RecoverySnapshot) -> None:
    """Durably replace the pchannel's snapshot (synced before it returns)."""
    await wal.put_meta(SNAPSHOT_META, snapshot.encode())


def import_snapshot(snapshot: RecoverySnapshot, steps: Iterable[object], pchannel: str) -> None:
    """Load each snapshot step's state; a step the snapshot does not cover makes it unusable."""
    for step in snapshot_steps(steps):
        state = snapshot.steps.get(step.name)
        if state is None:
            raise CorruptedError(
                f"recovery snapshot of pchannel {pchannel!r} has no state for step {step.name!r}",
                channel=pchannel, message_id=snapshot.message_id,
            )
        try:
            step.import_state(state)
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            raise CorruptedError(
                f"recovery snapshot of pchannel {pchannel!r}: state of step {step.name!r} is unreadable: {exc!r}",
                channel=pchannel, message_id=snapshot.message_id,
            ) from None


class ShadowReplay:
    """Replays the stored log into fresh steps, as recovery would, up to a chosen id.

    ``steps`` and ``txns`` are new instances, not the live chain's.  Persisted TimeTicks expire idle
    transactions exactly as they did live (a tick at ``T`` is written after every allocation below
    ``T`` finished, so nothing written later can revive a transaction expired at ``T``): otherwise a
    transaction abandoned without a rollback would hold every later snapshot back forever.
    """

    def __init__(self, wal: WAL, steps: list[Interceptor], txns: TxnManager) -> None:
        self._wal = wal
        self._steps = snapshot_steps(steps)
        self._replay = [s for s in steps if isinstance(s, RecoverableInterceptor)]
        self._txns = txns
        self.position: MessageID = wal.first_id
        """The next id to replay: the state is that after every message below it."""
        self.payload_bytes = 0
        """Payload bytes of the messages replayed (what a truncation up to ``position`` frees, roughly)."""

    def load(self, snapshot: RecoverySnapshot | None) -> None:
        """Start from ``snapshot`` (or from the first retained message when there is none)."""
        if snapshot is not None:
            import_snapshot(snapshot, self._steps, self._wal.pchannel)
            self.position = snapshot.message_id

    async def advance(self, stop: MessageID) -> None:
        """Replay the stored messages with ids in [``position``, ``stop``)."""
        while self.position < stop:
            batch = await self._wal.read_stored(self.position, _READ_BYTES)
            batch = [m for m in batch if m.message_id is not None and m.message_id < stop]
            if not batch:
                break
            start = 0
            for i, m in enumerate(batch):
                self.payload_bytes += len(m.payload)
                if m.message_type is MessageType.TIME_TICK:
                    self._apply(batch[start:i + 1])
                    self._txns.expire(m.timetick)
                    start = i + 1
            self._apply(batch[start:])
            self.position = batch[-1].message_id + 1  # type: ignore[operator]

    def _apply(self, part: list[Message]) -> None:
        if part:
            for step in self._replay:
                step.replay(part)

    def open_txn_floor(self) -> MessageID | None:
        """The BeginTxn id of the oldest transaction open at ``position``, if any."""
        return self._txns.min_open_begin_id()

    def capture(self) -> RecoverySnapshot:
        """The snapshot at ``position`` (raises InvalidArgumentError while a transaction is open)."""
        return RecoverySnapshot(self.position, {s.name: s.export_state() for s in self._steps})


__all__ = [
    "SNAPSHOT_META", "RecoverySnapshot", "ShadowReplay", "import_snapshot", "load_snapshot", "snapshot_steps",
    "store_snapshot",
]
