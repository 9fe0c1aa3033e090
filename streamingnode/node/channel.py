"""A pchannel as the node holds it: the ``Channel`` it serves (streaming WAL, consumer groups, flusher,
retention), the ``Owner`` description stored with the channel (the seed's OwnerDescription), and the
``Failure`` that keeps a FAILED pchannel from serving, with the refusal every call on it gets.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import structlog

from flusher.flusher import Flusher
from interceptors.recovery.streaming_wal import StreamingWAL
from streamingnode.node.groups import ConsumerGroups
from streamingnode.node.retention import ChannelRetention
from wal.errors import ErrorCode, StreamingError

log = structlog.get_logger(__name__)

LOST_CLOSE_SECONDS = 5.0
"""How long the close of a pchannel whose lease went waits for the appends still in flight before it
counts as closed (they end by themselves, failed or fenced, and its log closes then)."""

OWNER_ROLE = "owner.role"
OWNER_ADDRESS = "owner.address"
OWNER_TEXT = "owner.description_text"
FAILURE_CHARS = 300
"""How much of the cause's message a failure keeps (a message can quote a path, a key range, a file)."""


@dataclass(frozen=True, slots=True)
class Owner:
    role: str = ""
    address: str = ""
    description_text: str = ""

    def properties(self) -> dict[str, str]:
        return {OWNER_ROLE: self.role, OWNER_ADDRESS: self.address, OWNER_TEXT: self.description_text}

    @classmethod
    def from_properties(cls, props: dict[str, str]) -> Owner:
        return cls(props.get(OWNER_ROLE, ""), props.get(OWNER_ADDRESS, ""), props.get(OWNER_TEXT, ""))


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a pchannel is FAILED: the code and the (shortened) message of what stopped it."""

    code: ErrorCode
    message: str
    error_class: type[StreamingError] = StreamingError
    fields: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, exc: BaseException) -> Failure:
        if isinstance(exc, StreamingError):
            # The cause's structured fields (file, offset, key range, ...) ride along on every refusal.
            return cls(exc.code, _cut(str(exc)), type(exc), dict(exc.fields))
        # Not an error the node names (a bug, a library's exception): its type says the most.
        return cls(ErrorCode.UNKNOWN, _cut(f"{type(exc).__name__}: {exc}"))

    @property
    def reason(self) -> str:
        """What DescribeChannels shows: ``CODE: message``."""
        return f"{self.code.name}: {self.message}"

    def refusal(self, name: str) -> StreamingError:
        """The error a call on the failed pchannel ``name`` is refused with."""
        fields = {**self.fields, "channel": name}
        return self.error_class(f"pchannel {name!r} is FAILED and serves no calls: {self.reason}",
                                code=self.code, **fields)


def _cut(text: str) -> str:
    return text if len(text) <= FAILURE_CHARS else f"{text[:FAILURE_CHARS]}... ({len(text)} chars)"


@dataclass(slots=True)
class Channel:
    """A pchannel the node serves: its streaming WAL, its consumer groups and its flusher."""

    stream: StreamingWAL
    groups: ConsumerGroups
    flusher: Flusher | None = None
    retention: ChannelRetention | None = None
    closed: asyncio.Event = field(default_factory=asyncio.Event, compare=False)
    """Set once the close has ended, done or failed (a failed one is logged by the caller): the
    ``pchannel_closing`` gauge shows a pchannel no longer served whose close is still under way, or
    was never started."""

    async def aclose(self, *, lost: bool = False) -> None:
        """Close everything of the pchannel.  ``lost``: its lease went (expired on this node's clock,
        or taken by another node), often because the log's servers are out of reach: the writers stop
        first and nothing waits on the log.  The flusher's buffered rows are replayed from its
        checkpoint by the next owner, and retention stores no last snapshot (the next owner's fence
        would refuse it); appends in flight get ``LOST_CLOSE_SECONDS`` before the close counts as
        done, and end by themselves (failed or fenced)."""
        closing: asyncio.Future[None] | None = None
        try:
            if lost:
                if self.flusher is not None:
                    await self.flusher.aclose()
                if self.retention is not None:
                    await self.retention.abandon()
                closing = asyncio.ensure_future(self.stream.aclose())
                # The log's close may outlive this call (appends still in flight): it ends the close.
                closing.add_done_callback(lambda _: self.closed.set())
                done, _ = await asyncio.wait([closing], timeout=LOST_CLOSE_SECONDS)
                if not done:
                    log.warning("appends still in flight on a pchannel whose lease went: its log closes once they "
                                "end", pchannel=self.stream.pchannel, waited_seconds=LOST_CLOSE_SECONDS)
                return
            # Retention first: it reads the flusher's checkpoint and the groups, and truncates the WAL.
            if self.retention is not None:
                await self.retention.aclose()
            # Then the flusher: it reads the WAL, and whatever it buffered is replayed from its checkpoint.
            if self.flusher is not None:
                await self.flusher.aclose()
            await self.stream.aclose()
        finally:
            if closing is None:
                self.closed.set()


__all__ = ["FAILURE_CHARS", "OWNER_ADDRESS", "OWNER_ROLE", "OWNER_TEXT", "Channel", "Failure", "Owner"]
