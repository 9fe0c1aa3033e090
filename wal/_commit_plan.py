"""What goes into one group-commit write, decided without I/O.

The planner of ``wal._committer``: which queued requests a write takes (``take``), which ids they get
(``assign_ids``), which write mode carries them (``choose_mode``), and how they are sealed into blocks
for the backend (``seal``); plus the inverse of sealing when nothing was stored (``give_back``).  None
of it touches a backend, a thread or the event loop, so every decision can be tested on plain values
(tests/unit/test_commit_plan.py).  The strategies that carry out a write are in
``wal._commit_modes``.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from wal._codec import encode_block
from wal._record import check_encodable
from wal.backend import TickEntry, WriteGroup
from wal.errors import CodecError, InvalidArgumentError, StreamingError
from wal.message import Message, MessageID, MessageType

if TYPE_CHECKING:
    import asyncio

    from wal.wal import WAL

_TIME_TICK = MessageType.TIME_TICK
BLOCK_TARGET_BYTES = 1 << 20
"""A pchannel's messages of one write are cut into blocks of about this many bytes."""
LONE_BYTES = 64 << 10
"""A lone request up to this size is written and synced in one go (see ``choose_mode``)."""


class Request:
    """One ``submit``: a batch of one WAL, its encoded size and the future its caller awaits."""

    __slots__ = ("first_id", "future", "messages", "nbytes", "wal")

    def __init__(self, wal: WAL, messages: list[Message], nbytes: int, future: asyncio.Future[None]) -> None:
        self.wal = wal
        self.messages = messages
        self.nbytes = nbytes
        self.future = future
        self.first_id: MessageID = 0


class Commit:
    """What one write produced for one WAL: consecutive ids, for the tail buffer."""

    __slots__ = ("first_id", "max_timetick", "messages", "nbytes", "ticked", "wal")

    def __init__(self, wal: WAL, first_id: MessageID, max_timetick: int) -> None:
        self.wal = wal
        self.first_id = first_id
        self.messages: list[Message] = []
        self.nbytes = 0
        self.max_timetick = max_timetick
        self.ticked = False  # holds a TimeTick (set with the write group, on the writer thread)


class InFlight:
    """A pipelined write whose store is not confirmed yet: its requests and commits, both pruned of
    the pchannels whose store failed (``prune_failed``)."""

    __slots__ = ("commits", "reqs")

    def __init__(self, reqs: list[Request], commits: list[Commit]) -> None:
        self.reqs = reqs
        self.commits = commits


class Mode(enum.Enum):
    """How one write is carried out (``wal._commit_modes`` has one strategy for each)."""

    INLINE = "inline"
    """A lone request, written and synced on the event loop (fast disk, nothing on the writer thread)."""
    LONE_THREAD = "lone-thread"
    """A lone request, written and synced in one call on the writer thread (the disk is slow now)."""
    WHOLE = "whole"
    """Written (and synced, in SYNC durability) in one call on the writer thread."""
    SPLIT = "split"
    """Written on the writer thread, synced on the sync thread while the next write is encoded."""
    PIPELINED = "pipelined"
    """Started on the writer thread; acknowledged when the backend confirms the store (JetStream)."""


def take(queue: list[Request], held: int, max_commit_bytes: int) -> tuple[list[Request], list[Request]]:
    """Split ``queue`` into what the next write takes and what stays queued.

    A held write (``held`` requests at the front, put back after an UNAVAILABLE answer) is taken
    exactly as it was: the same requests, so the same ids and blocks (a backend that could not tell
    whether the refused attempt landed recognises a stored block by its bytes; merged with newer
    appends it would look like another writer's).  Otherwise requests are taken in order up to
    ``max_commit_bytes``, and always at least one."""
    if held:
        n = min(held, len(queue))
    else:
        total = 0
        n = 0
        while n < len(queue) and (n == 0 or total + queue[n].nbytes <= max_commit_bytes):
            total += queue[n].nbytes
            n += 1
    return queue[:n], queue[n:]


def assign_ids(taken: list[Request], held: bool) -> tuple[list[Request], list[tuple[Request, StreamingError]]]:
    """Hand out consecutive ids to the requests a write takes, per WAL in order; return those to
    write and those refused, each with its error (its WAL was fenced, closed or destroyed meanwhile).

    A request whose caller gave up before the write is skipped, unless the write is a held one: that
    one is written again exactly as before (its append's fate was unknown to its caller anyway)."""
    reqs: list[Request] = []
    refused: list[tuple[Request, StreamingError]] = []
    for req in taken:
        if req.future.done() and not held:  # the caller was cancelled before the write: skip it
            continue
        wal = req.wal
        err = wal._write_refusal()
        if err is not None:
            refused.append((req, err))
            continue
        req.first_id = wal._next_alloc
        wal._next_alloc += len(req.messages)
        reqs.append(req)
    return reqs, refused


def is_lone(reqs: list[Request], queued: int, ack_pending: bool) -> bool:
    """A lone small append: one small request, nothing else queued, no acknowledgement pending.  It
    gains nothing from the pipeline and is written and synced in one go."""
    return len(reqs) == 1 and not queued and reqs[0].nbytes <= LONE_BYTES and not ack_pending


def choose_mode(*, lone: bool, inline_ok: bool, pipelined: bool, split_sync: bool) -> Mode:
    """The write mode for one write.  ``lone``: see ``is_lone``; ``inline_ok``: the lone writes have
    been fast enough for the loop and nothing runs on the writer thread; ``pipelined``: the backend
    confirms stores later (``Backend.pipelined``); ``split_sync``: a sync thread exists (SYNC
    durability and a backend whose sync runs without the GIL)."""
    if lone:
        return Mode.INLINE if inline_ok else Mode.LONE_THREAD
    if pipelined:
        return Mode.PIPELINED
    return Mode.SPLIT if split_sync else Mode.WHOLE


def seal(reqs: list[Request]) -> tuple[list[Commit], list[WriteGroup]]:
    """Seal and encode: give every message its id and term, cut each WAL's messages into blocks of
    about ``BLOCK_TARGET_BYTES``; return the commits (for the tail buffers) and the groups to write."""
    commits: list[Commit] = []
    groups: list[WriteGroup] = []
    open_commit: dict[int, Commit] = {}
    for req in reqs:
        wal = req.wal
        c = open_commit.get(id(wal))
        if c is None or c.nbytes >= BLOCK_TARGET_BYTES:
            if c is not None:
                groups.append(_group(c))
            c = Commit(wal, req.first_id, c.max_timetick if c is not None else wal._written_max_ts)
            open_commit[id(wal)] = c
            commits.append(c)
        term = wal.term
        mid = req.first_id
        max_ts = c.max_timetick
        for m in req.messages:
            m._id = mid
            m._term = term
            mid += 1
            if m._timetick > max_ts:  # noqa: PLR1730  (a comparison, not a call of max(), per message)
                max_ts = m._timetick
        c.max_timetick = max_ts
        wal._written_max_ts = max_ts  # the writer only: with two commits in flight it runs ahead
        c.messages.extend(req.messages)
        c.nbytes += req.nbytes
    for c in open_commit.values():
        groups.append(_group(c))
    return commits, groups


def seal_checked(reqs: list[Request]) -> tuple[list[Commit], list[WriteGroup]]:
    """``seal``, with a request that cannot be encoded failing alone (``Poisoned``)."""
    written_max_ts = {id(req.wal): (req.wal, req.wal._written_max_ts) for req in reqs}
    try:
        return seal(reqs)
    except Exception as exc:
        # The appends' checks should keep every unencodable message out; should one get in anyway,
        # it fails alone instead of failing the commit of every pchannel it shares.
        for wal, ts in written_max_ts.values():
            wal._written_max_ts = ts
        errors = unencodable(reqs)
        if not errors:
            raise
        raise Poisoned(errors) from exc


def _group(c: Commit) -> WriteGroup:
    ticks = [
        TickEntry(m._timetick, m._id, m._last_confirmed if m._last_confirmed is not None else m._id)
        for m in c.messages
        if m._type is _TIME_TICK and m._id is not None
    ]
    c.ticked = bool(ticks)
    return WriteGroup(c.wal._channel_key, c.first_id, encode_block(c.messages), ticks, c.max_timetick)


def give_back(reqs: list[Request]) -> None:
    """The write is atomic and nothing of it was stored: give the ids back and unseal the messages."""
    for req in reversed(reqs):
        req.wal._next_alloc = min(req.wal._next_alloc, req.first_id)
        for m in req.messages:
            m._id = None


class Poisoned(Exception):
    """A commit could not be encoded because of some of its requests (by index: the error each fails
    with); nothing was written."""

    def __init__(self, errors: dict[int, StreamingError]) -> None:
        super().__init__(f"{len(errors)} request(s) cannot be encoded")
        self.errors = errors


def unencodable(reqs: list[Request]) -> dict[int, StreamingError]:
    """The requests whose messages cannot be encoded alone, each with the most precise error known."""
    errors: dict[int, StreamingError] = {}
    for i, req in enumerate(reqs):
        try:
            encode_block(req.messages)
        except Exception as exc:  # noqa: BLE001  (whatever it is, it is this request's alone)
            err: StreamingError = CodecError(f"message cannot be encoded: {exc!r}")
            for j, m in enumerate(req.messages):
                try:
                    check_encodable(m, f"messages[{j}]")
                except InvalidArgumentError as precise:
                    err = precise
                    break
            errors[i] = err
    return errors


def prune_failed(in_flight: list[InFlight], entry: InFlight, failed: dict[int, BaseException]) -> list[Request]:
    """The requests to fail when the pipelined store of ``entry`` failed for the pchannels in
    ``failed`` (by channel key): those of ``entry`` and of every later write in flight of the same
    pchannels, each write pruned of them.  Ids are given back once, from ``entry``; the later writes'
    messages are only unsealed (their ids follow the ones given back).  A pchannel already pruned
    from ``entry`` (by an earlier failure) is skipped: a write of it started after that one stands on
    its own.  ``in_flight``: the pipelined writes not yet acknowledged, oldest first."""
    keys = {r.wal._channel_key for r in entry.reqs if r.wal._channel_key in failed}
    bad_all: list[Request] = []
    for later in in_flight[in_flight.index(entry):]:
        bad = [r for r in later.reqs if r.wal._channel_key in keys]
        if not bad:
            continue
        later.reqs = [r for r in later.reqs if r.wal._channel_key not in keys]
        later.commits = [c for c in later.commits if c.wal._channel_key not in keys]
        if later is entry:
            give_back(bad)
        else:
            for r in bad:  # ids after the ones handed back above: nothing to give back again
                for m in r.messages:
                    m._id = None
        bad_all.extend(bad)
    return bad_all
