"""One strategy per group-commit write mode, and the in-flight slots they hold.

``wal._commit_plan.choose_mode`` picks the mode of each write; the strategy here carries it out:
writes the requests (on the loop, the writer thread or the backend's own pipeline), counts the commit,
and acknowledges the requests once their bytes are durable, or hands that to a task that does it in
commit order after the sync or the store.  A failed write raises out of ``write`` before anything is
counted; the committer's run loop then holds, isolates or fails the requests (``wal._committer``).

Every write holds a ``Slot`` from the committer's ``Slots`` from before its ids are handed out until
it is acknowledged or failed; the slot is released once, by whoever holds it last.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import TYPE_CHECKING

import structlog

from wal._commit_plan import Commit, InFlight, Mode, Request, prune_failed
from wal.errors import UnrecoverableError

if TYPE_CHECKING:
    from wal._committer import GroupCommitter

log = structlog.get_logger(__name__)


class Slot:
    """One permit of ``Slots``.  ``release`` is idempotent: the run loop releases every slot it took
    when the write's turn ends, which is a no-op for a slot handed to an acknowledging task."""

    __slots__ = ("_sem",)

    def __init__(self, sem: asyncio.Semaphore | None) -> None:
        self._sem = sem

    def release(self) -> None:
        sem, self._sem = self._sem, None
        if sem is not None:
            sem.release()

    def hand_off(self) -> Slot:
        """The permit, moved to a new holder (a task that acknowledges later); this one is spent."""
        sem, self._sem = self._sem, None
        return Slot(sem)


class Slots:
    """At most ``n`` writes between taking their requests and acknowledging them (the pipeline's
    depth: one encoding or writing while the other syncs or is stored)."""

    def __init__(self, n: int) -> None:
        self._sem = asyncio.Semaphore(n)

    async def acquire(self) -> Slot:
        await self._sem.acquire()
        return Slot(self._sem)


class _Strategy:
    __slots__ = ("_c",)

    def __init__(self, committer: GroupCommitter) -> None:
        self._c = committer

    async def write(self, reqs: list[Request], slot: Slot) -> None:
        raise NotImplementedError


class InlineWrite(_Strategy):
    """A lone request written and synced on the event loop itself: no thread hand-off."""

    __slots__ = ()

    async def write(self, reqs: list[Request], slot: Slot) -> None:
        self.now(reqs)

    def now(self, reqs: list[Request]) -> None:
        c = self._c
        commits = c._write_lone(reqs)
        c._written()
        c._ack(reqs, commits)


class LoneThreadWrite(_Strategy):
    """A lone request written and synced in one call on the writer thread (the disk is slow now)."""

    __slots__ = ()

    async def write(self, reqs: list[Request], slot: Slot) -> None:
        c = self._c
        commits = await asyncio.get_running_loop().run_in_executor(c._executor, c._write_lone, reqs)
        c._written()
        c._ack(reqs, commits)


class WholeWrite(_Strategy):
    """Written, and synced in SYNC durability, in one call on the writer thread."""

    __slots__ = ()

    async def write(self, reqs: list[Request], slot: Slot) -> None:
        c = self._c
        commits = await asyncio.get_running_loop().run_in_executor(c._executor, c._write, reqs, c._durable)
        c._written()
        c._ack(reqs, commits)


class SplitWrite(_Strategy):
    """Written on the writer thread without a sync; synced on the sync thread while the next write is
    encoded and written.  Acknowledged strictly in commit order, each after its own sync returned.  A
    failed sync is fatal: the written-but-unsynced data may or may not survive."""

    __slots__ = ()

    async def write(self, reqs: list[Request], slot: Slot) -> None:
        c = self._c
        loop = asyncio.get_running_loop()
        commits = await loop.run_in_executor(c._executor, c._write, reqs, False)
        c._written()
        synced = loop.run_in_executor(c._syncer, c._backend.sync)
        c._last_ack = loop.create_task(self._ack_after_sync(synced, c._last_ack, reqs, commits, slot.hand_off()))

    async def _ack_after_sync(
        self, synced: asyncio.Future[None], previous: asyncio.Task[None] | None,
        reqs: list[Request], commits: list[Commit], slot: Slot,
    ) -> None:
        c = self._c
        try:
            if previous is not None:
                await asyncio.wait([previous])  # acknowledge in commit order
            try:
                await synced
            except Exception as exc:
                c._fatal = UnrecoverableError(f"WAL sync failed, reopen the WAL: {exc!r}")
                log.exception("wal sync failed")
            if c._fatal is not None:
                for req in reqs:
                    if not req.future.done():
                        req.future.set_exception(c._fatal)
                return
            c._ack(reqs, commits)
        finally:
            slot.release()


class PipelinedWrite(_Strategy):
    """For a backend that pipelines its own writes (``Backend.pipelined``: JetStream, whose store is
    a network round trip): the write is started on the writer thread and acknowledged once the
    backend confirms that commit's store, so the next commit is encoded and queued meanwhile.  A
    failed store is one pchannel's: its appends of that commit and of every later commit in flight
    fail and get their ids back, the other pchannels' appends are acknowledged."""

    __slots__ = ()

    async def write(self, reqs: list[Request], slot: Slot) -> None:
        c = self._c
        loop = asyncio.get_running_loop()
        commits, stored = await loop.run_in_executor(c._executor, c._start, reqs)
        c._written()
        entry = InFlight(reqs, commits)
        c._in_flight.append(entry)
        c._last_ack = loop.create_task(self._ack_after_store(stored, c._last_ack, entry, slot.hand_off()))

    async def _ack_after_store(
        self, stored: concurrent.futures.Future[dict[int, BaseException]], previous: asyncio.Task[None] | None,
        entry: InFlight, slot: Slot,
    ) -> None:
        """Acknowledge a pipelined write once its store is confirmed, in commit order; fail the
        appends of the pchannels whose store failed."""
        c = self._c
        try:
            if previous is not None:
                await asyncio.wait([previous])  # acknowledge in commit order
            failed: dict[int, BaseException]
            try:
                failed = await asyncio.wait_for(asyncio.wrap_future(stored), c.store_timeout)
            except Exception as exc:  # noqa: BLE001  (the store as a whole failed, for every pchannel of it)
                err: BaseException = exc
                if isinstance(exc, TimeoutError):
                    err = UnrecoverableError(f"the WAL backend did not answer a write in {c.store_timeout:.0f} s")
                failed = {cm.wal._channel_key: err for cm in entry.commits}
            if c._fatal is not None:
                failed = {cm.wal._channel_key: c._fatal for cm in entry.commits}
            if failed:
                c._fail_stored(prune_failed(c._in_flight, entry, failed), failed)
            c._in_flight.remove(entry)
            c._ack(entry.reqs, entry.commits)
        except asyncio.CancelledError:
            if entry in c._in_flight:
                c._in_flight.remove(entry)
            c._fail(entry.reqs, asyncio.CancelledError())
            raise
        finally:
            slot.release()


def strategies(committer: GroupCommitter) -> dict[Mode, _Strategy]:
    """One strategy object per mode, bound to ``committer``."""
    return {
        Mode.INLINE: InlineWrite(committer),
        Mode.LONE_THREAD: LoneThreadWrite(committer),
        Mode.WHOLE: WholeWrite(committer),
        Mode.SPLIT: SplitWrite(committer),
        Mode.PIPELINED: PipelinedWrite(committer),
    }
