"""Consumer groups of one pchannel: a named group keeps one committed Position per vchannel.

The groups of a pchannel are one metadata record of its WAL (written on the WAL's writer thread, in
the same database as the log, so a backup or a crash sees groups and log consistently), cached in
memory.  Changes are serialised by a lock and written before they are acknowledged: a commit that
returned is never lost.  A group is small (one position per vchannel it read), so rewriting the whole
record on each commit costs less than the bookkeeping of finer records would.

Lag is defined as Kafka defines it, per (group, vchannel): how far the committed position is behind
the newest message *of that vchannel* (its own messages and broadcasts; time ticks are not messages
here).  Nothing left to read on the vchannel is lag 0, however much other vchannels of the pchannel
receive.  The newest message of each vchannel (its high-water) is kept in memory from the appends
(``observe_append``, fed by the channel's append observer); after a restart it is rebuilt, once, by
reading what follows the oldest committed position (``refresh``): what lies before every group's
position cannot make any group lag.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from wal import names
from wal.clock import physical_ms
from wal.errors import ConsumerGroupExistError, ConsumerGroupNotExistError, CorruptedError, InvalidArgumentError
from wal.message import BROADCAST_VCHANNEL, Message, MessageID, MessageType, Position
from wal.wal import WAL

_TIME_TICK = MessageType.TIME_TICK
_CATCH_UP_BYTES = 4 << 20

META_KEY = "consumer_groups"


def check_group_name(name: str, field: str = "group") -> str:
    """``name`` when ``wal.names.CONSUMER_GROUP`` accepts it, else InvalidArgumentError naming ``field``."""
    return names.CONSUMER_GROUP.check(name, field)


@dataclass(frozen=True, slots=True)
class VchannelProgress:
    """Where a group stands on one vchannel, and how far behind the log that is."""

    vchannel: str
    committed: Position
    lag_messages: int
    """WAL ids from the committed id through the vchannel's newest message (ids are per pchannel, so
    other vchannels' messages and time ticks in that range count too); 0 exactly when nothing is
    left to read on the vchannel."""
    lag_ms: int
    """Milliseconds from the committed timetick to the timetick of the vchannel's newest message; 0
    when nothing is left to read on the vchannel."""


Newest = tuple[MessageID, int]
"""The largest id and the largest timetick among a vchannel's messages."""


def lag(newest: Newest | None, message_id: MessageID, timetick: int) -> tuple[int, int]:
    """(WAL ids, milliseconds) a position ``(message_id, timetick)`` is behind ``newest``.

    A position has delivered every message of timetick <= its own (see ``Position``), so it is
    behind exactly when the newest message's timetick is above it; the count then runs from the
    position's id (the first not delivered) through the newest id, and is at least 1.
    """
    if newest is None or newest[1] <= timetick:
        return 0, 0
    return max(newest[0] - message_id + 1, 1), max(physical_ms(newest[1]) - physical_ms(timetick), 0)


def _merge(a: Newest | None, b: Newest | None) -> Newest | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a[0], b[0]), max(a[1], b[1])


class ConsumerGroups:
    """The groups of one pchannel.  Load with ``await ConsumerGroups.load(wal)``."""

    def __init__(self, wal: WAL, groups: dict[str, dict[str, tuple[MessageID, int]]]) -> None:
        self._wal = wal
        self._groups = groups
        self._lock = asyncio.Lock()
        self._newest: dict[str, Newest] = {}
        """Per vchannel (BROADCAST_VCHANNEL: broadcasts), its newest message among those observed."""
        self._newest_any: Newest | None = None
        """The newest message of any vchannel (what a whole-pchannel reader is behind)."""
        self._known_from: MessageID | None = None
        """Every message from this id on is in ``_newest`` (None: nothing read back yet)."""
        self._catch_up = asyncio.Lock()

    @classmethod
    async def load(cls, wal: WAL) -> ConsumerGroups:
        raw = await wal.get_meta(META_KEY)
        groups: dict[str, dict[str, tuple[MessageID, int]]] = {}
        if raw:
            try:
                doc = json.loads(raw)
                groups = {g: {v: (int(p[0]), int(p[1])) for v, p in vs.items()} for g, vs in doc.items()}
            except (ValueError, TypeError, AttributeError, IndexError) as exc:
                raise CorruptedError(
                    f"consumer groups of pchannel {wal.pchannel!r} are unreadable: {exc}", channel=wal.pchannel
                ) from None
        return cls(wal, groups)

    async def _store(self, groups: dict[str, dict[str, tuple[MessageID, int]]]) -> None:
        doc = {g: {v: [p[0], p[1]] for v, p in vs.items()} for g, vs in groups.items()}
        await self._wal.put_meta(META_KEY, json.dumps(doc, separators=(",", ":"), sort_keys=True).encode())
        self._groups = groups

    def _copy(self) -> dict[str, dict[str, tuple[MessageID, int]]]:
        return {g: dict(vs) for g, vs in self._groups.items()}

    def names(self) -> list[str]:
        return sorted(self._groups)

    def exists(self, group: str) -> bool:
        return group in self._groups

    def require(self, group: str) -> dict[str, tuple[MessageID, int]]:
        found = self._groups.get(group)
        if found is None:
            check_group_name(group)  # a hostile name is refused as such, not quoted as a missing group
            raise ConsumerGroupNotExistError(
                f"consumer group {group!r} does not exist on pchannel {self._wal.pchannel!r}",
                channel=self._wal.pchannel, group=group,
            )
        return found

    # --- high-water and lag ----------------------------------------------------------------------
    def observe_append(self, batch: list[Message], seconds: float, error: BaseException | None) -> None:
        """An append batch ended (the signature of ``WALAdaptor.observer``): note each vchannel's
        newest message.  Timestamps and ids rise within a batch, so a batch of one vchannel (the
        usual case) costs one comparison per message and one update."""
        if error is not None or not batch:
            return
        last = batch[-1]
        if last._id is None:
            return
        top: Newest = (last._id, last._timetick)
        self._newest_any = _merge(self._newest_any, top)
        first = batch[0]._vchannel
        if all(m._vchannel == first for m in batch):
            self._note(first, top)
            return
        for m in batch:
            if m._id is not None and m._type is not _TIME_TICK:
                self._note(m._vchannel, (m._id, m._timetick))

    def _note(self, vchannel: str, newest: Newest) -> None:
        old = self._newest.get(vchannel)
        self._newest[vchannel] = newest if old is None else (max(old[0], newest[0]), max(old[1], newest[1]))

    def newest(self, vchannel: str) -> Newest | None:
        """The newest message a reader of ``vchannel`` is given ("": any vchannel), as far as known."""
        if vchannel == BROADCAST_VCHANNEL:
            return self._newest_any
        return _merge(self._newest.get(vchannel), self._newest.get(BROADCAST_VCHANNEL))

    async def refresh(self, from_id: MessageID | None = None) -> None:
        """Make the high-water cover every message from ``from_id`` (default: the oldest committed
        position of any group) by reading, once, the stored messages not observed yet.

        The observer must be attached first: what it has not seen then is below ``next_id``.  Each id
        is read at most once over the channel's life (the covered range only grows), so a scrape or a
        Describe pays nothing once caught up.
        """
        wal = self._wal
        if from_id is None:
            mids = [mid for vs in self._groups.values() for mid, _ in vs.values()]
            if not mids:
                return
            from_id = min(mids)
        from_id = max(from_id, wal.first_id)
        if self._known_from is not None and from_id >= self._known_from:
            return
        async with self._catch_up:
            end = wal.next_id if self._known_from is None else self._known_from
            nid = from_id
            while nid < end:
                batch = await wal.read_stored(nid, _CATCH_UP_BYTES)
                if not batch:
                    break
                for m in batch:
                    if m._id is None or m._id >= end:
                        break
                    if m._type is not _TIME_TICK:
                        self._note(m._vchannel, (m._id, m._timetick))
                        self._newest_any = _merge(self._newest_any, (m._id, m._timetick))
                nid = batch[-1].message_id + 1  # type: ignore[operator]
            if self._known_from is None or from_id < self._known_from:
                self._known_from = from_id

    def progress(self, group: str) -> list[VchannelProgress]:
        """The group's committed position on each vchannel it has one for (by vchannel), with its lag
        behind that vchannel's newest message (see ``lag``; ``refresh`` first after a restart)."""
        pchannel = self._wal.pchannel
        out = []
        for vchannel, (mid, ts) in sorted(self.require(group).items()):
            n, ms = lag(self.newest(vchannel), mid, ts)
            out.append(VchannelProgress(vchannel, Position(pchannel, mid, ts), n, ms))
        return out

    async def first_timetick(self, message_id: MessageID) -> int:
        """A timetick a position at ``message_id`` can carry without hiding anything from there on:
        just below the smallest timetick stored in the first read batch from ``message_id``.

        Timetick and id orders differ only among appends in flight together, which a group commit
        stores side by side, so that batch holds any message after ``message_id`` that is older.
        """
        batch = await self._wal.read_stored(message_id, 1 << 20)
        stamps = [m._timetick for m in batch if m._id is not None and m._id >= message_id]
        return max(min(stamps) - 1, 0) if stamps else 0

    def committed(self, group: str, vchannel: str) -> Position | None:
        p = self.require(group).get(vchannel)
        return None if p is None else Position(self._wal.pchannel, p[0], p[1])

    async def create(self, group: str) -> None:
        check_group_name(group)
        async with self._lock:
            if group in self._groups:
                raise ConsumerGroupExistError(
                    f"consumer group {group!r} already exists on pchannel {self._wal.pchannel!r}",
                    channel=self._wal.pchannel, group=group,
                )
            groups = self._copy()
            groups[group] = {}
            await self._store(groups)

    async def destroy(self, group: str) -> None:
        async with self._lock:
            self.require(group)
            groups = self._copy()
            del groups[group]
            await self._store(groups)

    async def commit(self, group: str, positions: list[tuple[str, Position]]) -> None:
        """Replace the group's committed position on each (vchannel, position); the vchannel "" holds
        the position of a read of every vchannel."""
        for vchannel, pos in positions:
            names.VCHANNEL.check(vchannel, allow_empty=True)
            if pos.pchannel != self._wal.pchannel:
                raise InvalidArgumentError(
                    f"position of pchannel {names.shorten(pos.pchannel)} cannot be committed on {self._wal.pchannel!r}",
                    channel=self._wal.pchannel,
                )
        async with self._lock:
            self.require(group)
            groups = self._copy()
            for vchannel, pos in positions:
                groups[group][vchannel] = (pos.message_id, pos.timetick)
            await self._store(groups)


__all__ = ["ConsumerGroups", "VchannelProgress", "check_group_name"]
