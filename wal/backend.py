"""The storage backend contract: what a WAL needs from an engine, and nothing more.

A backend stores many pchannels.  Each pchannel is a sequence of *record blocks* (the codec's
checksummed groups of encoded messages, keyed by the id of their first message) plus a *time index*
of persisted TimeTick messages.  Ids are dense: a block holding ``n`` messages starting at ``first``
covers ``[first, first + n)`` and the next block starts at ``first + n``.

Every method here is synchronous and may block on I/O: the WAL layer calls them from worker threads,
never from the event loop.  ``write`` is called by a single writer thread at a time; the read methods
may run concurrently with it and with each other.

Lifetimes: a backend outlives every WAL opened on it (backend ⊃ WAL ⊃ Scanner).
"""

from __future__ import annotations

import abc
import concurrent.futures
import enum
from dataclasses import dataclass, field

from wal.message import MessageID


class Durability(enum.Enum):
    """When an append is acknowledged.

    SYNC: after its batch is on stable storage (fsync).  Nothing acknowledged is ever lost.
    RELAXED: after its batch is in the operating system (write(2) returned); a background task syncs
    every ``relaxed_sync_interval``.  A crash of the process loses nothing acknowledged; a crash of the
    machine (power loss, kernel panic) may lose what was acknowledged during the last interval.
    """

    SYNC = "sync"
    RELAXED = "relaxed"


@dataclass(slots=True)
class ChannelInfo:
    """A pchannel's recovered state.  ``first_id == next_id`` means the channel holds no messages."""

    name: str
    key: int
    """Internal numeric key; never reused, even after the channel is destroyed."""
    term: int
    first_id: MessageID
    next_id: MessageID
    last_timetick: int
    properties: dict[str, str] = field(default_factory=dict)

    @property
    def last_id(self) -> MessageID | None:
        return self.next_id - 1 if self.next_id > self.first_id else None


@dataclass(slots=True)
class TickEntry:
    """One entry of the time index: a persisted TimeTick and where a reader should start for it."""

    timetick: int
    message_id: MessageID
    resume_id: MessageID
    """The smallest id a reader must start from to see every message with a larger timestamp."""


@dataclass(slots=True)
class WriteGroup:
    """One block for one channel, written atomically with every other group of the same ``write``."""

    channel_key: int
    first_id: MessageID
    block: bytes
    ticks: list[TickEntry]
    max_timetick: int
    """The largest timestamp ever acknowledged on the channel, this block included; stored with it so
    that recovery never sees time go backwards, whatever order timestamps were written in."""


class Backend(abc.ABC):
    """A storage engine for many pchannels.  See the module docstring for the threading contract."""

    path: str | None
    """Where the data lives, for error messages; None for in-memory backends."""

    split_sync: bool = False
    """True when ``write(durable=False)`` followed by ``sync()`` is as durable as a durable write and
    ``sync`` lets other Python threads run: the committer then pipelines writes and syncs."""

    pipelined: bool = False
    """True when the backend takes ``start_write``: the committer then sends a write before the
    previous one is stored, and acknowledges each once its own store is confirmed."""

    # --- channels --------------------------------------------------------------------------------
    @abc.abstractmethod
    def create_channel(self, name: str, properties: dict[str, str]) -> ChannelInfo:
        """Create an empty pchannel with term 0.  Raises ChannelExistError."""

    @abc.abstractmethod
    def open_channel(self, name: str) -> ChannelInfo:
        """Durably increment the term and return the recovered state.  Raises ChannelNotExistError."""

    @abc.abstractmethod
    def describe_channel(self, name: str) -> ChannelInfo:
        """The current state, without changing the term.  Raises ChannelNotExistError."""

    @abc.abstractmethod
    def list_channels(self) -> list[str]:
        """Names of every pchannel, sorted."""

    @abc.abstractmethod
    def destroy_channel(self, name: str) -> None:
        """Remove a pchannel and all its data.  Raises ChannelNotExistError."""

    # --- data ------------------------------------------------------------------------------------
    @abc.abstractmethod
    def write(self, groups: list[WriteGroup], durable: bool) -> None:
        """Write every group atomically; with ``durable``, return only once they are on stable storage."""

    def start_write(self, groups: list[WriteGroup]) -> concurrent.futures.Future[dict[int, BaseException]]:
        """Send ``groups`` (only when ``pipelined``) and return at once; the future resolves once every
        group is stored or known failed, to the failures by channel key (empty: all stored).

        Writes are stored in the order they were started, each channel's groups all or none, and a
        channel's group is only ever stored right after the one before it: once a write of a channel
        failed, every write of it already started after that one fails too, until one starts again
        from the end of what is stored (the ids the WAL handed back).  A write stored although its
        future failed (its confirmation was lost) is found by the next write of that channel: stored
        as the same blocks it is kept, else that write fails UNRECOVERABLE (reopen the WAL)."""
        raise NotImplementedError(f"{type(self).__name__} does not pipeline writes")

    @abc.abstractmethod
    def read_blocks(
        self, channel_key: int, from_id: MessageID, max_bytes: int
    ) -> list[tuple[MessageID, bytes]]:
        """Blocks in id order, starting with the one that holds ``from_id``, until ``max_bytes`` is
        reached (always at least one block when any holds ids >= ``from_id``)."""

    @abc.abstractmethod
    def seek_time(self, channel_key: int, timetick: int) -> TickEntry | None:
        """The last time-index entry with ``timetick <= timetick``, or None."""

    @abc.abstractmethod
    def truncate(self, channel_key: int, before_id: MessageID) -> MessageID:
        """Drop whole blocks whose every id is < ``before_id``; return the new first id.

        A block that straddles ``before_id`` is kept, so truncation may retain a few older ids
        (as Kafka deletes whole segments).
        """

    @abc.abstractmethod
    def put_meta(self, channel_key: int, name: str, value: bytes) -> None:
        """Durably store a small named value of a channel (e.g. the timestamp allocation window)."""

    @abc.abstractmethod
    def get_meta(self, channel_key: int, name: str) -> bytes | None:
        """The value stored by ``put_meta``, or None."""

    @abc.abstractmethod
    def sync(self) -> None:
        """Make everything written so far durable (used by RELAXED durability)."""

    @abc.abstractmethod
    def backup(self, dest: str) -> None:
        """Write a consistent copy of every channel to the new directory ``dest``; the copy opens
        as a backend of the same kind."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the storage.  Idempotent.  No method may be called afterwards."""


__all__ = ["Backend", "ChannelInfo", "Durability", "TickEntry", "WriteGroup"]
