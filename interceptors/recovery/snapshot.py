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

Snapshots are also written *periodically* (``PERIODIC_METAS``, every N messages or S seconds; see
``streamingnode.node.retention``), independent of truncation, so that restart time does not grow with the
retained log: recovery starts from the newest valid snapshot of all (``newest_snapshot``).  The
periodic ones alternate between two slots, so the previous one stays until the new one is durable; a
snapshot that fails its checksum or does not decode is passed over, with a warning naming it, for
the one before it (or for full replay when none is left).  The truncation snapshot (``SNAPSHOT_META``)
stays the state exactly at the cut: the flusher seeds its collections from it.

A snapshot is taken only where no transaction is open: a transaction's BeginTxn is always replayed,
so no session ever has to be carried over, and a reader from the first retained message sees every
retained transaction whole.

The shadow replay decodes and applies in a worker thread (``asyncio.to_thread``), never on the event
loop: its steps are its own (nothing on the loop touches them), and the loop only reads the stored
blocks (through the WAL's reader pool) and hands them over.  Messages still in the WAL's in-memory
tail are taken from there, already decoded: periodic snapshots follow the log as it grows, and a read
of storage would fetch back every block just written (on the shared log, a network round trip and the
servers' reads per block).
"""

from __future__ import annotations

import asyncio
import json
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import structlog

from interceptors.base import Interceptor, RecoverableInterceptor, SnapshotInterceptor, plain_skipping_types
from interceptors.txn import TxnManager
from wal.errors import CorruptedError
from wal.message import Message, MessageID, MessageType, payloads, replay_picks
from wal.wal import WAL

log = structlog.get_logger(__name__)

SNAPSHOT_META = "recovery_snapshot"
"""The truncation snapshot: the state exactly at the first retained id (written by retention)."""
PERIODIC_METAS = ("recovery_snapshot.0", "recovery_snapshot.1")
"""The two slots of periodic snapshots, written alternately."""
_VERSION = 2
"""2: the JSON document, a newline and its CRC-32 in hex.  1 (still read): the JSON document alone."""
_TAIL_MESSAGES = 16_384
"""Messages taken per step from the WAL's in-memory tail (no read, no decode: a step is only the replay)."""
_READ_BYTES = 4 << 20
"""Bytes read per step of a shadow replay: each is decoded and applied in one worker-thread call
(few steps: under load each hop to a thread and back waits for a turn of the busy loop)."""
_DECODE_BYTES = 256 << 10
"""Bytes of blocks a worker thread decodes at once (the GIL is offered back between them)."""
_YIELD_SECONDS = 0.0005
"""How long the worker thread replays between two offers of the GIL to the event loop's thread."""
_PART = 64
"""Messages the steps replay at once, between two looks at the clock (see ``_YIELD_SECONDS``)."""
_SCAN = 1024
"""Messages scanned for the ones a step acts on between two looks at the clock."""
_TIME_TICK = MessageType.TIME_TICK
_DATA = MessageType.DATA


_EVERY_TYPE: frozenset[MessageType] = frozenset(MessageType)
"""What ``_steps_act_on`` answers when a step does not say which plain messages it skips."""


def _steps_act_on(steps: list[Any]) -> frozenset[MessageType]:
    """The types of messages without properties or a transaction that some step's replay acts on,
    with the TimeTick (the shadow expires transactions at each); ``_EVERY_TYPE`` when a step does not
    declare its types (``plain_skipping_types``): then every message reaches every step."""
    found: set[MessageType] = {_TIME_TICK}
    for step in steps:
        types = plain_skipping_types(step)
        if types is None:
            return _EVERY_TYPE
        found |= types
    return frozenset(found)


@dataclass(frozen=True, slots=True)
class RecoverySnapshot:
    """The state of each snapshot step (by name) after every message with an id < ``message_id``."""

    message_id: MessageID
    steps: dict[str, Any]

    def encode(self) -> bytes:
        doc = {"version": _VERSION, "message_id": self.message_id, "steps": self.steps}
        body = json.dumps(doc, separators=(",", ":")).encode()
        return body + b"\n" + f"{zlib.crc32(body):08x}".encode()

    @classmethod
    def decode(cls, raw: bytes, pchannel: str) -> RecoverySnapshot:
        body, sep, crc = raw.rpartition(b"\n")
        if sep and body.startswith(b"{"):
            if crc != f"{zlib.crc32(body):08x}".encode():
                raise CorruptedError(f"recovery snapshot of pchannel {pchannel!r} fails its checksum",
                                     channel=pchannel)
            raw = body
        try:
            doc = json.loads(raw)
            version, message_id, steps = doc["version"], int(doc["message_id"]), dict(doc["steps"])
        except (ValueError, TypeError, KeyError) as exc:
            raise CorruptedError(f"recovery snapshot of pchannel {pchannel!r} is unreadable: {exc!r}",
                                 channel=pchannel) from None
        if version not in (1, _VERSION) or (version == _VERSION and not sep):
            raise CorruptedError(f"recovery snapshot of pchannel {pchannel!r} has unknown version {version!r}",
                                 channel=pchannel)
        return cls(message_id, steps)


def snapshot_steps(steps: Iterable[object]) -> list[SnapshotInterceptor]:
    """The steps whose replayed state a snapshot carries: those that replay and can export."""
    return [s for s in steps if isinstance(s, RecoverableInterceptor) and isinstance(s, SnapshotInterceptor)]


async def load_snapshot(wal: WAL, name: str = SNAPSHOT_META) -> RecoverySnapshot | None:
    raw = await wal.get_meta(name)
    return None if raw is None else RecoverySnapshot.decode(raw, wal.pchannel)


async def store_snapshot(wal: WAL, snapshot: RecoverySnapshot, name: str = SNAPSHOT_META) -> None:
    """Durably replace the pchannel's snapshot in slot ``name`` (synced before it returns)."""
    await wal.put_meta(name, snapshot.encode())


async def stored_snapshots(wal: WAL) -> dict[str, RecoverySnapshot]:
    """Every valid stored snapshot by slot; a damaged one is left out with a warning naming it."""
    found: dict[str, RecoverySnapshot] = {}
    for name in (SNAPSHOT_META, *PERIODIC_METAS):
        try:
            snapshot = await load_snapshot(wal, name)
        except CorruptedError as exc:
            log.warning("recovery snapshot damaged: passed over", pchannel=wal.pchannel, snapshot=name,
                        error=str(exc))
            continue
        if snapshot is None:
            continue
        if snapshot.message_id > wal.next_id:
            log.warning("recovery snapshot damaged: passed over", pchannel=wal.pchannel, snapshot=name,
                        error=f"at id {snapshot.message_id}, past the end of the log ({wal.next_id})")
            continue
        found[name] = snapshot
    return found


async def newest_snapshot(wal: WAL) -> tuple[str, RecoverySnapshot] | None:
    """The valid stored snapshot with the highest id (and its slot), None when there is none."""
    found = await stored_snapshots(wal)
    if not found:
        return None
    name = max(found, key=lambda n: found[n].message_id)
    return name, found[name]


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
        self._acts_on = _steps_act_on(self._replay)
        self._txns = txns
        self.position: MessageID = wal.first_id
        """The next id to replay: the state is that after every message below it."""
        self.payload_bytes = 0
        """Payload bytes of the messages replayed (what a truncation up to ``position`` frees, roughly)."""
        self._since = 0.0  # when the replay last offered the GIL to the loop

    def load(self, snapshot: RecoverySnapshot | None) -> None:
        """Start from ``snapshot`` (or from the first retained message when there is none)."""
        if snapshot is not None:
            import_snapshot(snapshot, self._steps, self._wal.pchannel)
            self.position = snapshot.message_id

    async def advance(self, stop: MessageID, *, clear_from: MessageID | None = None) -> bool:
        """Replay the stored messages with ids in [``position``, ``stop``).

        With ``clear_from``: stop early at the first point at or above it where no transaction is
        open (at a TimeTick or the end of a read), and return True there; False when ``stop`` came
        first with a transaction still open.  Without it, True.
        """
        while self.position < stop:
            cached = self._wal.read_cached(self.position, _TAIL_MESSAGES)
            if cached:  # still in memory: replayed as they are (a copy of the tail's list)
                if await asyncio.to_thread(self._replay_messages, cached, stop, clear_from):
                    return True
                continue
            # The read runs in the WAL's reader pool; the decode and the replay in a worker thread.
            blocks = await self._wal.read_blocks(self.position, _READ_BYTES)
            if await asyncio.to_thread(self._replay_blocks, blocks, stop, clear_from):
                return True
            if not blocks:
                break
        return clear_from is None or (self.position >= clear_from and self._txns.min_open_begin_id() is None)

    def _replay_blocks(self, blocks: list[tuple[MessageID, bytes, bool]], stop: MessageID,
                       clear_from: MessageID | None) -> bool:
        """Decode ``blocks`` (read from ``position``) and replay them up to ``stop``; True when it
        stopped at a clear point (see ``advance``).  Runs in a worker thread, a group of blocks
        (``_DECODE_BYTES``) at a time, offering the GIL to the loop every ``_YIELD_SECONDS``."""
        self._since = time.perf_counter()
        g = 0
        while g < len(blocks) and self.position < stop:
            group: list[tuple[MessageID, bytes, bool]] = []
            size = 0
            while g < len(blocks) and (not group or size < _DECODE_BYTES):
                group.append(blocks[g])
                size += len(blocks[g][1])
                g += 1
            if self._replay_batch(self._wal.decode_blocks(self.position, group), stop, clear_from):
                return True
        return self._clear(clear_from)

    def _replay_messages(self, messages: list[Message], stop: MessageID, clear_from: MessageID | None) -> bool:
        """``_replay_blocks`` for messages already decoded (the WAL's in-memory tail, from ``position``)."""
        self._since = time.perf_counter()
        return self._replay_batch(messages, stop, clear_from) or self._clear(clear_from)

    def _replay_batch(self, messages: list[Message], stop: MessageID, clear_from: MessageID | None) -> bool:
        """Replay ``messages`` (in id order, from ``position``) up to ``stop``; True when it stopped at a
        clear point.  Offers the GIL to the loop every ``_YIELD_SECONDS``.

        Every appended message passes here once more, so the pass over single messages is one test
        (``wal.message.replay_picks``, a pass that reads slots only): it picks the messages some step
        acts on and the TimeTicks (``_steps_act_on``; a plain DATA record fails it at its first three
        slot reads), and the steps replay only those, ``_PART`` at a time.  Ids are consecutive in the tail and in a
        decoded block, so ``stop`` cuts by position; the payload bytes are summed in C
        (``sum(map(len, ...))``), per run between two TimeTicks."""
        acts_on = self._acts_on
        every = acts_on is _EVERY_TYPE  # a step that did not declare its types sees the ticks too
        plain = None if _DATA in acts_on else _DATA
        end = 0
        for lo in range(0, len(messages), _SCAN):
            chunk = messages[lo:lo + _SCAN]
            first, last = chunk[0].message_id, chunk[-1].message_id
            if first is not None and last is not None and last - first == len(chunk) - 1:
                done = last >= stop
                if done:
                    chunk = chunk[:max(0, stop - first)]
                if not chunk:
                    break
                # A message's place in the chunk is its id - first: no enumerate.
                picks = replay_picks(chunk, first, acts_on, plain, _TIME_TICK)
            else:  # not consecutive (not expected): by id, message by message
                kept = [m for m in chunk if m.message_id is not None and m.message_id < stop]
                done = any(m.message_id is not None and m.message_id >= stop for m in chunk)
                chunk = kept
                if not chunk:
                    break
                picks = [(i, m, m.message_type is _TIME_TICK) for i, m in enumerate(chunk)
                         if m.properties or m.txn is not None or m.message_type in acts_on]
            sizes = payloads(chunk)
            nbytes = self.payload_bytes
            summed = 0  # sizes[:summed] are in nbytes
            run: list[Message] = []
            for i, m, tick in picks:
                if not tick:
                    run.append(m)
                    if len(run) >= _PART:
                        self._apply_part(run)
                        run = []
                    continue
                if every:
                    run.append(m)
                self._apply_part(run)
                run = []
                self._txns.expire(m.timetick)
                self.position = m.message_id + 1  # type: ignore[operator]
                nbytes += sum(map(len, sizes[summed:i + 1]))
                summed = i + 1
                self.payload_bytes = nbytes
                if self._clear(clear_from):
                    return True
            self._apply_part(run)
            self.payload_bytes = nbytes + sum(map(len, sizes[summed:]))
            end = chunk[-1].message_id + 1  # type: ignore[operator]
            self._offer_gil()
            if done:
                break
        self.position = end if end else stop
        return False

    def _apply_part(self, part: list[Message]) -> None:
        """Replay ``part`` (no TimeTick in it) into every step."""
        if part:
            for step in self._replay:
                step.replay(part)
            self._offer_gil()

    def _offer_gil(self) -> None:
        """Hand the GIL to the loop's thread now if this worker has held it for ``_YIELD_SECONDS``,
        rather than after the interpreter's switch interval (5 ms): an append waiting for the loop
        waits less."""
        if time.perf_counter() - self._since >= _YIELD_SECONDS:
            time.sleep(0)
            self._since = time.perf_counter()

    def _clear(self, clear_from: MessageID | None) -> bool:
        return clear_from is not None and self.position >= clear_from and self._txns.min_open_begin_id() is None

    def open_txn_floor(self) -> MessageID | None:
        """The BeginTxn id of the oldest transaction open at ``position``, if any."""
        return self._txns.min_open_begin_id()

    def capture(self) -> RecoverySnapshot:
        """The snapshot at ``position`` (raises InvalidArgumentError while a transaction is open)."""
        return RecoverySnapshot(self.position, {s.name: s.export_state() for s in self._steps})


__all__ = [
    "PERIODIC_METAS", "SNAPSHOT_META", "RecoverySnapshot", "ShadowReplay", "import_snapshot", "load_snapshot",
    "newest_snapshot", "snapshot_steps", "store_snapshot", "stored_snapshots",
]
