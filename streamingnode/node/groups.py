"""Consumer groups of one pchannel: a named group keeps one committed Position per vchannel.

The groups of a pchannel are one metadata record of its WAL (written on the WAL's writer thread, in
the same database as the log, so a backup or a crash sees groups and log consistently), cached in
memory.  Changes are written before they are acknowledged: a commit that returned is never lost.

Changes are batched (a group commit of their own): at most one store of the record is in flight, and
every change that arrives meanwhile waits in a queue; when the store ends, the next one writes all of
them at once, and each caller returns when the store holding its change is durable (or fails with it:
a failed store fails every change it held, and the durable state stays as before).  So 1,000 groups
acking at once cost one ``put_meta`` per store time, not 1,000, and the writer thread the appends use
sees one job per store.  Each group's part of the record is encoded when it changes and kept, so a
store joins cached text instead of encoding every group again.  The record stays one key in the
format it always had (a JSON object: group -> vchannel -> [message id, timetick]): a store is one
synced write whatever its size, whereas finer records would need one synced (on JetStream: fenced)
put per key, and salvage and older nodes read the record as it is.

Lag is defined as Kafka defines it, per (group, vchannel): how far the committed position is behind
the newest message *of that vchannel* (its own messages and broadcasts; time ticks are not messages
here).  Nothing left to read on the vchannel is lag 0, however much other vchannels of the pchannel
receive.  The newest message of each vchannel (its high-water) is kept in memory from the appends
(``observe_append``, fed by the channel's append observer); after a restart it is rebuilt, once, by
reading what follows the oldest committed position (``refresh``): what lies before every group's
position cannot make any group lag.

A group's position moves only where its readers have been.  A commit names, for each vchannel, a
position within the pchannel's retained range (``message_id`` from the oldest retained id through
the next id to be written, a timetick no newer than the read point).  An ack of a Consume stream
must also lie no further than the end of the last pack that stream sent (its *ceiling*), and not
behind the group's committed position on that vchannel (the Kafka rule: between where the group
stands and what was delivered); that check runs against the state the store starts from, so two
acks racing cannot both pass it on a stale view.  A seek may move a group back.  Any refusal fails
the whole commit: nothing of it is stored.  ``problems`` names stored positions that are out of range
(left by an older version that checked less), so that they are reported rather than obeyed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass

from wal import names
from wal.clock import physical_ms
from wal.errors import (
    ConsumerGroupExistError,
    ConsumerGroupNotExistError,
    CorruptedError,
    InvalidArgumentError,
    OutOfRangeError,
    StreamingError,
)
from wal.message import BROADCAST_VCHANNEL, Message, MessageID, MessageType, Position, all_on_vchannel
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


_State = dict[str, dict[str, tuple[MessageID, int]]]
"""Groups -> vchannel -> (message id, timetick) of the committed position."""

Newest = tuple[MessageID, int]
"""The largest id and the largest timetick among a vchannel's messages."""


def behind(position: tuple[MessageID, int], of: tuple[MessageID, int]) -> bool:
    """Whether ``position`` (message id, timetick) lies behind ``of`` in either part: resuming from
    it would deliver again something resuming from ``of`` would not."""
    return position[0] < of[0] or position[1] < of[1]


def range_problem(
    message_id: int, timetick: int, first_id: MessageID, next_id: MessageID, read_point: int,
) -> str | None:
    """Why a position cannot be resumed from on a pchannel whose retained ids are ``[first_id,
    next_id)`` and whose newest timetick is ``read_point`` (None: it can).  A position's id may be
    ``next_id`` itself (everything stored delivered); a timetick above the read point hides every
    message until the clock reaches it, which for 2^64-1 is never."""
    if message_id > next_id:
        return f"message_id {message_id} is past the pchannel's newest message (the next id is {next_id})"
    if message_id < first_id:
        return f"message_id {message_id} is below the oldest retained id {first_id}"
    if timetick > read_point:
        return f"timetick {timetick} is in the future (the pchannel's newest timetick is {read_point})"
    return None


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


def _encode_group(group: str, positions: dict[str, tuple[MessageID, int]]) -> str:
    """One group's part of the record: ``"group":{"vchannel":[id,timetick],...}``."""
    return json.dumps(group) + ":" + json.dumps(
        {v: [p[0], p[1]] for v, p in positions.items()}, separators=(",", ":"), sort_keys=True)


@dataclass(slots=True)
class _Change:
    """A queued change of the groups: create, destroy or commit (``positions``) of ``group``."""

    kind: str
    group: str
    positions: list[tuple[str, Position]]
    done: asyncio.Future[None]
    """Settled when the store holding the change ended: None once durable, else the error."""
    fields: list[str]
    """The request field of each position, for the refusal that names it."""


def _settle(done: asyncio.Future[None], error: BaseException | None) -> None:
    if done.done():  # the caller was cancelled: nobody waits for the outcome
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)


class ConsumerGroups:
    """The groups of one pchannel.  Load with ``await ConsumerGroups.load(wal)``."""

    def __init__(self, wal: WAL, groups: _State) -> None:
        self._wal = wal
        self.read_point: Callable[[], int] = lambda: wal.last_timetick
        """The newest timetick a position may carry; the node sets it to its streaming WAL's read
        point (a tick delivered without being stored is newer than the WAL's last timetick)."""
        self._groups = groups
        """The durable state: what the record holds (a stored state is replaced, never changed)."""
        self._encoded = {g: _encode_group(g, vs) for g, vs in groups.items()}
        """Each durable group's part of the record, as stored."""
        self._queue: list[_Change] = []
        """Changes not yet in a store, in arrival order."""
        self._storing: asyncio.Task[None] | None = None
        self.stores = 0
        """Stores of the record so far (``put_meta`` calls; changes / stores = the batching factor)."""
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
        groups: _State = {}
        if raw:
            try:
                doc = json.loads(raw)
                groups = {g: {v: (int(p[0]), int(p[1])) for v, p in vs.items()} for g, vs in doc.items()}
            except (ValueError, TypeError, AttributeError, IndexError) as exc:
                raise CorruptedError(
                    f"consumer groups of pchannel {wal.pchannel!r} are unreadable: {exc}", channel=wal.pchannel
                ) from None
        return cls(wal, groups)

    async def _change(self, kind: str, group: str, positions: list[tuple[str, Position]] | None = None,
                      fields: list[str] | None = None) -> None:
        """Queue a change, have it stored, return once the store that held it is durable."""
        change = _Change(kind, group, positions or [], asyncio.get_running_loop().create_future(), fields or [])
        self._queue.append(change)
        if self._storing is None:
            self._storing = asyncio.get_running_loop().create_task(self._store_queued())
        await change.done

    async def _store_queued(self) -> None:
        """Store what is queued, batch after batch, until the queue is empty (one store in flight)."""
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                await self._store_batch(batch)
        finally:
            self._storing = None

    async def _store_batch(self, batch: list[_Change]) -> None:
        groups = dict(self._groups)  # copied per group only where changed: stored states stay as they were
        encoded = dict(self._encoded)
        changed: set[str] = set()
        kept: list[_Change] = []
        for change in batch:
            try:
                self._apply(groups, change, changed)
            except StreamingError as exc:  # refused against the state before it: not stored, fails alone
                _settle(change.done, exc)
            else:
                kept.append(change)
        if not kept:
            return
        for g in changed:
            if g in groups:
                encoded[g] = _encode_group(g, groups[g])
            else:
                encoded.pop(g, None)
        record = ("{" + ",".join(encoded.values()) + "}").encode()
        try:
            self.stores += 1
            await self._wal.put_meta(META_KEY, record)
        except Exception as exc:  # noqa: BLE001  (every change of the batch fails with its store)
            for change in kept:
                _settle(change.done, exc)
            return
        except BaseException:  # the store was cancelled (the loop is closing): nobody learns it is durable
            for change in kept:
                change.done.cancel()
            raise
        self._groups, self._encoded = groups, encoded
        for change in kept:
            _settle(change.done, None)

    def _apply(self, groups: _State, change: _Change, changed: set[str]) -> None:
        group = change.group
        if change.kind == "create":
            if group in groups:
                raise ConsumerGroupExistError(
                    f"consumer group {group!r} already exists on pchannel {self._wal.pchannel!r}",
                    channel=self._wal.pchannel, group=group,
                )
            groups[group] = {}
        else:
            self._require_in(groups, group)
            if change.kind == "destroy":
                del groups[group]
            else:
                current = groups[group]
                for k, (vchannel, pos) in enumerate(change.positions):
                    # Every position is checked before any is applied: a refused commit stores nothing.
                    was = current.get(vchannel)
                    if change.kind == "ack" and was is not None and behind((pos.message_id, pos.timetick), was):
                        field = change.fields[k] if k < len(change.fields) else "position"
                        raise InvalidArgumentError(
                            f"{field}: position ({pos.message_id}, {pos.timetick}) of vchannel "
                            f"{names.shorten(vchannel)} is behind consumer group {group!r}'s committed position "
                            f"({was[0]}, {was[1]}) on pchannel {self._wal.pchannel!r}: another consumer of the group "
                            "or a seek moved it; nothing was committed",
                            channel=self._wal.pchannel, group=group, field=field)
                if group not in changed:
                    groups[group] = dict(groups[group])
                for vchannel, pos in change.positions:
                    groups[group][vchannel] = (pos.message_id, pos.timetick)
        changed.add(group)

    def names(self) -> list[str]:
        return sorted(self._groups)

    def exists(self, group: str) -> bool:
        return group in self._groups

    def require(self, group: str) -> dict[str, tuple[MessageID, int]]:
        return self._require_in(self._groups, group)

    def _require_in(self, groups: _State, group: str) -> dict[str, tuple[MessageID, int]]:
        found = groups.get(group)
        if found is None:
            check_group_name(group)  # a hostile name is refused as such, not quoted as a missing group
            raise ConsumerGroupNotExistError(
                f"consumer group {group!r} does not exist on pchannel {self._wal.pchannel!r}",
                channel=self._wal.pchannel, group=group,
            )
        return found

    # --- high-water and lag ----------------------------------------------------------------------
    def observe_append(self, batch: list[Message], seconds: float, error: BaseException | None) -> None:
        """An append batch ended (told by the channel's ``WALAdaptor.observer``): note each vchannel's
        newest message.  Timestamps and ids rise within a batch, so a batch of one vchannel (the
        usual case) costs one comparison per message and one update."""
        if error is not None or not batch:
            return
        last = batch[-1]
        last_id = last.message_id
        if last_id is None:
            return
        top: Newest = (last_id, last.timetick)
        self._newest_any = _merge(self._newest_any, top)
        first = batch[0].vchannel
        if all_on_vchannel(batch, first):
            self._note(first, top)
            return
        # Several vchannels: each one's newest is its last message in the batch, so the batch is read
        # from the end and a vchannel is noted once (one property read for each message already noted).
        noted: set[str] = set()
        for m in reversed(batch):
            vchannel = m.vchannel
            if vchannel in noted:
                continue
            mid = m.message_id
            if mid is None or m.message_type is _TIME_TICK:
                continue
            noted.add(vchannel)
            self._note(vchannel, (mid, m.timetick))

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
                    mid = m.message_id
                    if mid is None or mid >= end:
                        break
                    if m.message_type is not _TIME_TICK:
                        newest = (mid, m.timetick)
                        self._note(m.vchannel, newest)
                        self._newest_any = _merge(self._newest_any, newest)
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
        stamps = [m.timetick for m in batch if (mid := m.message_id) is not None and mid >= message_id]
        return max(min(stamps) - 1, 0) if stamps else 0

    def committed(self, group: str, vchannel: str) -> Position | None:
        p = self.require(group).get(vchannel)
        return None if p is None else Position(self._wal.pchannel, p[0], p[1])

    async def create(self, group: str) -> None:
        check_group_name(group)
        await self._change("create", group)

    async def destroy(self, group: str) -> None:
        await self._change("destroy", group)

    def problem(self, message_id: int, timetick: int) -> str | None:
        """Why a position cannot be resumed from on this pchannel now (see ``range_problem``)."""
        wal = self._wal
        read_point = max(self.read_point(), wal.last_timetick)
        return range_problem(message_id, timetick, wal.first_id, wal.next_id, read_point)

    def problems(self, group: str) -> dict[str, str]:
        """The group's stored positions that are out of range now, by vchannel, and why."""
        out = {}
        for vchannel, (mid, ts) in self.require(group).items():
            why = self.problem(mid, ts)
            if why is not None:
                out[vchannel] = why
        return out

    async def commit(self, group: str, positions: list[tuple[str, Position]], *,
                     ceiling: tuple[MessageID, int] | None = None, reads: str | None = None,
                     fields: list[str] | None = None) -> None:
        """Replace the group's committed position on each (vchannel, position), all or none; the
        vchannel "" holds the position of a read of every vchannel.

        Each position must lie in the retained range, no further than the next id and the read point.
        An ack (``ceiling`` given: the (message id, timetick) its stream has delivered up to) must also
        lie at or below ``ceiling`` and not behind the group's committed position on its vchannel; a
        seek or a call of the embedded API may move the group back.  ``reads``: the vchannel the
        acking stream reads ("" = every one): a position of another vchannel is refused.  Refusals
        name ``fields[i]`` (default ``positions[i]``): OUT_OF_RANGE for a position outside the range
        or above the ceiling, INVALID_ARGUMENT otherwise.
        """
        wal = self._wal
        named = fields if fields is not None else [f"positions[{i}]" for i in range(len(positions))]
        read_point = max(self.read_point(), wal.last_timetick)
        top = (wal.next_id, read_point) if ceiling is None else ceiling
        if reads:
            for (vchannel, _), field in zip(positions, named, strict=True):
                if vchannel != reads:
                    raise InvalidArgumentError(
                        f"{field}.vchannel: this stream reads vchannel {names.shorten(reads)}, so it can commit "
                        f"only that vchannel's position, not {names.shorten(vchannel)}; nothing was committed",
                        channel=wal.pchannel, group=group, field=f"{field}.vchannel")
        for (vchannel, pos), field in zip(positions, named, strict=True):
            names.VCHANNEL.check(vchannel, f"{field}.vchannel", allow_empty=True)
            if pos.pchannel != wal.pchannel:
                raise InvalidArgumentError(
                    f"{field}: position of pchannel {names.shorten(pos.pchannel)} cannot be committed on "
                    f"{wal.pchannel!r}; nothing was committed", channel=wal.pchannel, field=field,
                )
            why = range_problem(pos.message_id, pos.timetick, wal.first_id, wal.next_id, read_point)
            if why is None and (pos.message_id > top[0] or pos.timetick > top[1]):
                why = f"({pos.message_id}, {pos.timetick}) is past ({top[0]}, {top[1]})"
                why += ", the end of what this stream has delivered" if ceiling is not None else ""
            if why is not None:
                raise OutOfRangeError(
                    f"{field}: cannot commit consumer group {group!r} on pchannel {wal.pchannel!r}: {why}; "
                    "nothing was committed", channel=wal.pchannel, group=group, field=field,
                    message_id=pos.message_id, timetick=pos.timetick)
        await self._change("commit" if ceiling is None else "ack", group, positions, named)


__all__ = ["ConsumerGroups", "VchannelProgress", "behind", "check_group_name", "range_problem"]
