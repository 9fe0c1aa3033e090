"""Plain, immutable answers of the admin RPCs (so callers never handle protobuf objects)."""

from __future__ import annotations

from dataclasses import dataclass, field

from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.wire import codec
from wal.errors import ErrorCode
from wal.message import MessageID, Position


@dataclass(frozen=True, slots=True)
class Owner:
    """Who owns a channel (the Milvus message-stream OwnerDescription)."""

    role: str = ""
    address: str = ""
    description: str = ""

    def to_pb(self) -> pb.OwnerDescription:
        return pb.OwnerDescription(role=self.role, address=self.address, description_text=self.description)


@dataclass(frozen=True, slots=True)
class ChannelDescription:
    """The state of one pchannel.  Ids are None while the channel is empty.

    ``state`` is "serving" or "failed" ("unspecified" from a node that does not say); a failed
    pchannel refuses every call with ``failure_code``, and ``failure`` says why.  ``problems`` lists
    damage found that does not stop the pchannel (one line per finding).
    """

    name: str
    owner: Owner
    term: int
    first_id: MessageID | None
    last_id: MessageID | None
    last_timetick: int
    state: str = "serving"
    failure: str = ""
    failure_code: ErrorCode | None = None
    problems: tuple[str, ...] = field(default=())

    @property
    def failed(self) -> bool:
        return self.state == "failed"

    @classmethod
    def from_pb(cls, d: pb.ChannelDescription) -> ChannelDescription:
        state = pb.ChannelState.Name(d.state).removeprefix("CHANNEL_STATE_").lower()
        failed = d.state == pb.CHANNEL_STATE_FAILED
        return cls(
            name=d.channel_name,
            owner=Owner(d.owner.role, d.owner.address, d.owner.description_text),
            term=d.term,
            first_id=codec.message_id_from_pb(d.first_id, "first_id") if d.HasField("first_id") else None,
            last_id=codec.message_id_from_pb(d.last_id, "last_id") if d.HasField("last_id") else None,
            last_timetick=d.last_timetick,
            state=state,
            failure=d.failure,
            failure_code=_code(d.failure_code) if failed else None,
            problems=tuple(d.problems),
        )


def _code(value: int) -> ErrorCode:
    """The code of a failure; UNKNOWN for one a newer node added that this client does not know."""
    try:
        return ErrorCode(value)
    except ValueError:
        return ErrorCode.UNKNOWN


@dataclass(frozen=True, slots=True)
class GroupProgress:
    """A consumer group's committed position on one vchannel, and how far behind it is."""

    vchannel: str
    committed: Position
    lag_messages: int
    lag_ms: int
    problem: str = ""
    """Empty, or why the committed position cannot be resumed from (stored out of range by an older
    version): opening the group on this vchannel fails until a seek moves it."""


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """One consumer group of one pchannel."""

    pchannel: str
    group: str
    vchannels: tuple[GroupProgress, ...]

    @classmethod
    def from_pb(cls, d: spb.ConsumerGroupDescription) -> GroupDescription:
        progress = tuple(
            GroupProgress(p.vchannel, codec.position_from_pb(p.committed)[0], p.lag_messages, p.lag_ms, p.problem)
            for p in d.vchannels
        )
        return cls(d.pchannel, d.group, progress)

    def committed(self, vchannel: str = "") -> Position | None:
        """The committed position on ``vchannel``, None when the group has none there."""
        for p in self.vchannels:
            if p.vchannel == vchannel:
                return p.committed
        return None


@dataclass(frozen=True, slots=True)
class TxnInfo:
    """An open transaction, as BeginTxn answered."""

    pchannel: str
    vchannel: str
    txn_id: int
    begin_timetick: int
    message_id: MessageID | None
    keepalive_ms: int


__all__ = ["ChannelDescription", "GroupDescription", "GroupProgress", "Owner", "TxnInfo"]
