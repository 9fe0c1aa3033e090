"""Consumer groups of one pchannel: a named group keeps one committed Position per vchannel.

The groups of a pchannel are one metadata record of its WAL (written on the WAL's writer thread, in
the same database as the log, so a backup or a crash sees groups and log consistently), cached in
memory.  Changes are serialised by a lock and written before they are acknowledged: a commit that
returned is never lost.  A group is small (one position per vchannel it read), so rewriting the whole
record on each commit costs less than the bookkeeping of finer records would.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from wal import names
from wal.clock import physical_ms
from wal.errors import ConsumerGroupExistError, ConsumerGroupNotExistError, CorruptedError, InvalidArgumentError
from wal.message import MessageID, Position
from wal.wal import WAL

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
    """Messages appended after the committed id (of every vchannel of the pchannel)."""
    lag_ms: int
    """Milliseconds from the committed timetick to the channel's read point (its MVCC timetick)."""


class ConsumerGroups:
    """The groups of one pchannel.  Load with ``await ConsumerGroups.load(wal)``."""

    def __init__(self, wal: WAL, groups: dict[str, dict[str, tuple[MessageID, int]]]) -> None:
        self._wal = wal
        self._groups = groups
        self._lock = asyncio.Lock()

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

    def progress(self, group: str, now_ts: int) -> list[VchannelProgress]:
        """The group's committed position on each vchannel it has one for (by vchannel), with its lag
        behind the end of the log and behind ``now_ts`` (the channel's MVCC timetick)."""
        pchannel, next_id, now_ms = self._wal.pchannel, self._wal.next_id, physical_ms(now_ts)
        return [
            VchannelProgress(vchannel, Position(pchannel, mid, ts), max(next_id - mid, 0),
                             max(now_ms - physical_ms(ts), 0))
            for vchannel, (mid, ts) in sorted(self.require(group).items())
        ]

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
