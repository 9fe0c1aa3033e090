"""Opening a pchannel for streaming: the chain dedup → lock → shard → timetick → redo → txn, recovery
and the fence.

``open_streaming_wal`` opens the WAL with a new term (fencing any older handle), builds the chain in
front of it, and starts recovery in the background; appends wait (through the adaptor) until it is
done.  Recovery imports the newest valid recovery snapshot (periodic or retention's; see
``snapshot.py``), replays every stored message from there, in id order, into the steps that keep
state (dedup, shard, txn), starts the clock above everything ever handed out, rolls back the
transactions the previous owner left open, and writes the fence: a persisted TimeTick in the new term.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import structlog
from opentelemetry.trace import Tracer

from interceptors.base import Interceptor, RecoverableInterceptor
from interceptors.chain import Chain, build_chain
from interceptors.dedup import DEFAULT_WINDOW, DedupInterceptor
from interceptors.lock import LockInterceptor
from interceptors.recovery.snapshot import RecoverySnapshot, import_snapshot, newest_snapshot, snapshot_steps
from interceptors.redo import MAX_SECONDS as REDO_MAX_SECONDS
from interceptors.redo import RedoInterceptor
from interceptors.shard.interceptor import ShardInterceptor
from interceptors.timetick.interceptor import TimeTickInterceptor
from interceptors.txn import TxnInterceptor, TxnManager, TxnSession, TxnState, commit_message, rollback_message
from wal.adaptor import WALAdaptor
from wal.clock import TICK_INTERVAL, WINDOW_MS
from wal.errors import (
    InvalidTxnStateError,
    OnShutdownError,
    StreamingError,
    TxnNotFoundError,
    TxnTooLargeError,
)
from wal.manager import WALManager
from wal.message import AppendResult, Message, MessageID, Position, TxnContext, any_transactional
from wal.options import ReadOption
from wal.scanner import Scanner
from wal.tasks import cancel_and_wait
from wal.wal import WAL

log = structlog.get_logger(__name__)

_REPLAY_BATCH_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class ChainConfig:
    """Tunables of the chain.  Defaults suit a node; tests shorten the intervals."""

    tick_interval: float = TICK_INTERVAL
    """Seconds between TimeTicks (persisted when data was written since the last one)."""
    ts_window_ms: int = WINDOW_MS
    """How far ahead the persisted timestamp window reaches (one durable write per window)."""
    dedup_window: int = DEFAULT_WINDOW
    redo_max_seconds: float = REDO_MAX_SECONDS
    segment_max_rows: int = 1_000_000
    segment_max_bytes: int = 64 << 20
    segment_max_age_seconds: float = 600.0
    seal_check_interval: float = 1.0
    """How often growing segments are checked for age (a seal is also checked on every insert)."""
    txn_max_messages: int | None = None
    """Most bodies one transaction may hold (None: unbounded); see ``TxnManager``."""
    txn_max_bytes: int | None = None
    """Most bytes (payload, vchannel and properties) the bodies of one transaction may hold."""


class _RecoveringChain:
    """The chain as the adaptor sees it: ready once recovery (started by ``StreamingWAL.start``)
    finished."""

    def __init__(self, chain: Chain) -> None:
        self._chain = chain
        self.recovery: asyncio.Future[None] | None = None

    async def ready(self) -> None:
        # The adaptor asks only once started, and StreamingWAL.start sets recovery before that.
        assert self.recovery is not None
        await asyncio.shield(self.recovery)

    async def close(self) -> None:
        if self.recovery is not None and not self.recovery.done():
            self.recovery.cancel()
        await self._chain.close()

    async def __call__(self, batch: list[Message]) -> list[AppendResult]:
        return await self._chain.append(batch)


class StreamingWAL:
    """A pchannel opened for streaming: append through the chain, read through scanners."""

    def __init__(
        self, wal: WAL, chain: Chain, *, timetick: TimeTickInterceptor, txns: TxnManager, shard: ShardInterceptor,
        config: ChainConfig,
    ) -> None:
        self.wal = wal
        self.chain = chain
        self.timetick = timetick
        self.txns = txns
        self.shard = shard
        self.config = config
        self._sealer: asyncio.Task[None] | None = None
        self._recovery: asyncio.Future[None] | None = None
        self._recovering = _RecoveringChain(chain)
        self.adaptor = WALAdaptor(wal, self._recovering)
        self.recovery_replayed: int | None = None
        """How many stored messages recovery replayed (None until it finished)."""
        self.recovered_snapshot: RecoverySnapshot | None = None
        """The replayed state at the end of recovery, when no transaction was open there: where the
        periodic snapshots (``streamingnode.node.retention``) start, instead of replaying again."""

    def start(self) -> None:
        """Start recovery in the background; appends wait (through the adaptor) until it is done.
        Idempotent; ``open_streaming_wal`` calls it."""
        if self._recovery is not None:
            return
        self._recovery = self._recovering.recovery = asyncio.ensure_future(self._recover())
        self.adaptor.start()

    @property
    def pchannel(self) -> str:
        return self.wal.pchannel

    @property
    def term(self) -> int:
        return self.wal.term

    async def ready(self) -> None:
        """Wait until recovery finished (raises what it failed with)."""
        if self._recovery is None:
            raise OnShutdownError(f"pchannel {self.pchannel!r} is not started", channel=self.pchannel)
        await asyncio.shield(self._recovery)

    async def append(self, message: Message, *, deadline: float | None = None) -> AppendResult:
        try:
            return await self.adaptor.append(message, deadline=deadline)
        except TxnTooLargeError as exc:
            await self._roll_back_too_large(exc)
            raise

    async def append_batch(self, messages: list[Message], *, deadline: float | None = None) -> list[AppendResult]:
        try:
            return await self.adaptor.append_batch(messages, deadline=deadline)
        except TxnTooLargeError as exc:
            await self._roll_back_too_large(exc)
            raise

    def start_append(self, messages: list[Message], *, nbytes: int | None = None
                     ) -> asyncio.Future[list[AppendResult]] | None:
        """``WALAdaptor.start_append`` for a batch without transactions (None otherwise, or while
        recovering: use ``append_batch``, which rolls back a transaction grown too large before
        answering).  Refusals raise here; await the future through ``asyncio.shield``.  ``nbytes``:
        the batch's summed payload lengths, when the caller has them (see ``WALAdaptor.start_append``)."""
        if any_transactional(messages):
            return None
        return self.adaptor.start_append(messages, nbytes=nbytes)

    async def _roll_back_too_large(self, exc: TxnTooLargeError) -> None:
        """The txn step failed a transaction that grew over its bound: write its RollbackTxn before the
        caller hears of it, so readers forget it at once (it can never commit now)."""
        session = self.txns.get(exc.fields.get("txn_id", -1))
        if session is None or session.rollback_written or session.failure is None:
            return  # nothing of it was written, or its rollback is already there
        try:
            await self.append(rollback_message(session))
        except StreamingError as failed:  # e.g. the client's own RollbackTxn came first; expiry still ends it
            log.warning("rollback of a transaction over its bound failed", pchannel=self.pchannel,
                        txn_id=session.txn_id, error=repr(failed))

    def read(self, option: ReadOption | None = None) -> Scanner:
        return self.wal.read(option)

    # --- transactions ----------------------------------------------------------------------------
    async def begin_txn(
        self, vchannel: str, keepalive_ms: int, *, deadline: float | None = None
    ) -> tuple[TxnContext, AppendResult]:
        """Start a transaction on ``vchannel``; its context goes on every body message."""
        begin = self.txns.begin_message(vchannel, keepalive_ms)
        result = await self.append(begin, deadline=deadline)
        assert begin.txn is not None
        return begin.txn, result

    def _session(self, txn_id: int) -> TxnSession:
        session = self.txns.get(txn_id)
        if session is None:
            raise TxnNotFoundError(f"transaction {txn_id} of pchannel {self.pchannel!r} does not exist",
                                   txn_id=txn_id, channel=self.pchannel)
        return session

    async def commit_txn(self, txn_id: int, *, deadline: float | None = None) -> AppendResult:
        """Commit: returns once the CommitTxn is durable; readers then get the transaction whole."""
        return await self.append(commit_message(self._session(txn_id)), deadline=deadline)

    async def rollback_txn(self, txn_id: int, *, deadline: float | None = None) -> AppendResult:
        session = self._session(txn_id)
        if session.state is TxnState.COMMITTED:
            raise InvalidTxnStateError(f"transaction {txn_id} is already committed", txn_id=txn_id)
        return await self.append(rollback_message(session), deadline=deadline)

    def mvcc_timetick(self) -> int:
        """Every message at or below this timestamp is acknowledged: a consistent read point."""
        return self.timetick.mvcc_timetick()

    def latest_position(self) -> Position | None:
        """Where to resume to read only what comes from now on (None while the log is empty).

        Its id is the last one, held back to the oldest BeginTxn still open: a transaction open now
        commits later than this position's timetick, and resuming must still see its BeginTxn to
        deliver it whole.
        """
        wal = self.wal
        last = wal.last_id
        if last is None:
            return None
        oldest = self.txns.min_open_begin_id()
        return Position(wal.pchannel, last if oldest is None else min(last, oldest), wal.last_timetick)

    async def aclose(self) -> None:
        if self._sealer is not None:
            await cancel_and_wait(self._sealer)
        await self.adaptor.aclose()

    async def _seal_by_age(self) -> None:
        """Seal growing segments that outlived ``segment_max_age_seconds`` even when no insert comes."""
        while True:
            await asyncio.sleep(self.config.seal_check_interval)
            seals = self.shard.seal_expired()
            if not seals:
                continue
            try:
                await self.append_batch(seals)
            except StreamingError as exc:  # returned again by the next check
                if self.wal.state.value != "running":
                    return
                log.warning("age seal failed", pchannel=self.pchannel, error=repr(exc))

    async def _recover(self) -> None:
        recoverable = [i for i in self.chain.interceptors if isinstance(i, RecoverableInterceptor)]
        nid = await self._load_snapshot(recoverable) if recoverable else self.wal.first_id
        replayed = 0
        while recoverable and nid < self.wal.next_id:
            batch = await self.wal.read_stored(nid, _REPLAY_BATCH_BYTES)
            for step in recoverable:
                step.replay(batch)
            nid = batch[-1].message_id + 1  # type: ignore[operator]
            replayed += len(batch)
        self.recovery_replayed = replayed
        if recoverable and self.txns.min_open_begin_id() is None:
            # A copy (through its encoding): the live steps go on changing the exported values.
            state = RecoverySnapshot(nid, {s.name: s.export_state() for s in snapshot_steps(recoverable)})
            self.recovered_snapshot = RecoverySnapshot.decode(state.encode(), self.pchannel)
        for step in recoverable:
            await step.recovered()
        await self.timetick.start()
        # The previous owner's open transactions can never commit now: roll them back in the log, so
        # readers drop them at once instead of holding them until their keepalive runs out.
        orphans = self.txns.take_orphans()
        for session in orphans:
            await self.chain.append([rollback_message(session)])
        fence = await self.timetick.emit_tick(persist=True)
        self._sealer = asyncio.get_running_loop().create_task(self._seal_by_age(), name=f"sealer-{self.pchannel}")
        log.info(
            "pchannel recovered", pchannel=self.pchannel, term=self.term, replayed=replayed,
            rolled_back=len(orphans), fence_ts=fence,
        )

    async def _load_snapshot(self, steps: list[Any]) -> MessageID:
        """Import the newest valid recovery snapshot, if any; return the id replay starts from.

        A damaged snapshot (checksum, decoding, past the end of the log) is passed over with a
        warning for the one before it, or for full replay from the first retained id.
        """
        wal = self.wal
        newest = await newest_snapshot(wal)
        if newest is None:
            return wal.first_id
        name, snapshot = newest
        log.info("recovery starts from a snapshot", pchannel=self.pchannel, snapshot=name,
                 snapshot_id=snapshot.message_id, first_id=wal.first_id, next_id=wal.next_id)
        import_snapshot(snapshot, steps, self.pchannel)
        if snapshot.message_id < wal.first_id:
            # Someone truncated past the snapshot without moving it: what lay between is lost.
            log.warning("log truncated past the recovery snapshot", pchannel=self.pchannel,
                        snapshot_id=snapshot.message_id, first_id=wal.first_id)
            return wal.first_id
        return snapshot.message_id


def default_interceptors(
    wal: WAL, config: ChainConfig
) -> tuple[list[Interceptor], TimeTickInterceptor, TxnManager, ShardInterceptor]:
    txns = TxnManager(max_messages=config.txn_max_messages, max_bytes=config.txn_max_bytes)
    shard = ShardInterceptor(
        max_rows=config.segment_max_rows, max_bytes=config.segment_max_bytes,
        max_age_seconds=config.segment_max_age_seconds,
    )
    timetick = TimeTickInterceptor(
        wal, interval=config.tick_interval, window_ms=config.ts_window_ms,
        min_open_txn_id=txns.min_open_begin_id, on_tick=txns.expire,
    )
    steps: list[Interceptor] = [
        DedupInterceptor(window=config.dedup_window, store=wal),
        LockInterceptor(on_exclusive=txns.on_exclusive),
        shard,
        timetick,
        RedoInterceptor(max_seconds=config.redo_max_seconds),
        TxnInterceptor(txns),
    ]
    return steps, timetick, txns, shard


async def open_streaming_wal(
    manager: WALManager, pchannel: str, config: ChainConfig | None = None, *, tracer: Tracer | None = None
) -> StreamingWAL:
    """Open ``pchannel`` with a new term and its chain, and start it: recovery runs in the background.
    With ``tracer`` every chain step runs in a span (see ``interceptors.chain``)."""
    config = config or ChainConfig()
    wal = await manager.open(pchannel)
    steps, timetick, txns, shard = default_interceptors(wal, config)
    chain = build_chain(steps, wal.append_batch, tracer=tracer)
    stream = StreamingWAL(wal, chain, timetick=timetick, txns=txns, shard=shard, config=config)
    stream.start()
    return stream


__all__ = ["ChainConfig", "StreamingWAL", "default_interceptors", "open_streaming_wal"]
