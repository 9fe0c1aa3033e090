"""The message model: what is appended to, stored in and read from a WAL.

A ``Message`` is mutable while it travels the append path (interceptors stamp its timetick, term,
last-confirmed id and txn context) and becomes immutable the moment the WAL gives it an id.  One class
serves both states so that the append path never copies a message; the ``with_*`` setters refuse to run
once ``message_id`` is set.

Message ids are plain ``int`` offsets, totally ordered per pchannel and dense (every id in
``[first, last]`` exists until truncated).  On the wire they are 8-byte big-endian strings
(``encode_message_id``), so clients may treat them as opaque ordered bytes.
"""

from __future__ import annotations

import enum
from collections.abc import Container, Iterable
from dataclasses import dataclass
from typing import NamedTuple

from wal.errors import ImmutableMessageError, InvalidArgumentError

MessageID = int
"""Offset of a message in its pchannel.  See module docstring."""


class MessageType(enum.IntEnum):
    """Message kinds.  Codes below 1000 keep the numbers of the original MsgType table."""

    UNDEFINED = 0
    CREATE_COLLECTION = 100
    DROP_COLLECTION = 101
    CREATE_PARTITION = 200
    DROP_PARTITION = 201
    INSERT = 400
    DELETE = 401
    FLUSH = 402
    """A segment sealed and to be flushed (written by the shard step, replayed on reopen)."""
    MANUAL_FLUSH = 403
    """A user asked to flush a vchannel (exclusive)."""
    CREATE_SEGMENT = 404
    UPSERT = 405
    """Rows like an INSERT that replace every older version of their keys: one atomic delete-then-insert."""
    DATA = 1000
    """An opaque user message: payload and properties, no schema; the shard step lets it through."""
    TIME_TICK = 1200
    BEGIN_TXN = 1300
    COMMIT_TXN = 1301
    ROLLBACK_TXN = 1302

    @property
    def is_system(self) -> bool:
        """System messages pass every MessageType filter: they carry time and transaction framing."""
        return self in _SYSTEM_TYPES

    @property
    def is_exclusive(self) -> bool:
        """Messages that take the vchannel's lock exclusively (DDL and manual flush)."""
        return self in _EXCLUSIVE_TYPES


_SYSTEM_TYPES = frozenset(
    {MessageType.TIME_TICK, MessageType.BEGIN_TXN, MessageType.COMMIT_TXN, MessageType.ROLLBACK_TXN}
)
_EXCLUSIVE_TYPES = frozenset(
    {
        MessageType.CREATE_COLLECTION,
        MessageType.DROP_COLLECTION,
        MessageType.CREATE_PARTITION,
        MessageType.DROP_PARTITION,
        MessageType.MANUAL_FLUSH,
    }
)

MESSAGE_ID_BYTES = 8


def encode_message_id(message_id: MessageID) -> bytes:
    """The wire form of an id: 8 bytes, big-endian, so byte order equals id order."""
    return message_id.to_bytes(MESSAGE_ID_BYTES, "big")


def decode_message_id(raw: bytes) -> MessageID:
    if len(raw) != MESSAGE_ID_BYTES:
        raise InvalidArgumentError(
            f"message id must be {MESSAGE_ID_BYTES} bytes, got {len(raw)}", length=len(raw)
        )
    return int.from_bytes(raw, "big")


@dataclass(frozen=True, slots=True)
class TxnContext:
    """Marks a message as part of transaction ``txn_id``.

    ``keepalive_ms`` is how long the transaction may stay idle, measured on message timestamps (the
    physical part), before readers and writers treat it as expired.
    """

    txn_id: int
    keepalive_ms: int


class Position(NamedTuple):
    """Where a reader is: the seed's MsgPosition.

    Resuming with ``StartFrom(message_id)`` plus ``TimeTickGT(timetick)`` delivers exactly what comes
    after this position — ``message_id`` is the smallest id not yet fully delivered, not the last id
    read, because messages are released in timestamp order rather than id order.
    """

    pchannel: str
    message_id: MessageID
    timetick: int


class AppendResult(NamedTuple):
    message_id: MessageID
    timetick: int
    txn_id: int | None


BROADCAST_VCHANNEL = ""
"""A message on this vchannel is delivered to every vchannel of its pchannel."""


class Message:
    """A WAL message.  See the module docstring for the mutable/immutable contract."""

    __slots__ = (
        "_id",
        "_last_confirmed",
        "_not_persisted",
        "_payload",
        "_properties",
        "_term",
        "_timetick",
        "_txn",
        "_type",
        "_vchannel",
    )

    def __init__(
        self,
        message_type: MessageType,
        vchannel: str = BROADCAST_VCHANNEL,
        payload: bytes = b"",
        properties: dict[str, str] | None = None,
        *,
        timetick: int = 0,
        txn: TxnContext | None = None,
        not_persisted: bool = False,
    ) -> None:
        self._type = message_type
        self._vchannel = vchannel
        self._payload = payload
        self._properties = properties if properties is not None else {}
        self._timetick = timetick
        self._term = 0
        self._last_confirmed: MessageID | None = None
        self._txn = txn
        self._not_persisted = not_persisted
        self._id: MessageID | None = None

    # --- read side -------------------------------------------------------------------------------
    @property
    def message_type(self) -> MessageType:
        return self._type

    @property
    def vchannel(self) -> str:
        return self._vchannel

    @property
    def payload(self) -> bytes:
        return self._payload

    @property
    def properties(self) -> dict[str, str]:
        """Headers.  Treat as read-only once the message has an id."""
        return self._properties

    @property
    def timetick(self) -> int:
        return self._timetick

    @property
    def wal_term(self) -> int:
        return self._term

    @property
    def last_confirmed(self) -> MessageID | None:
        return self._last_confirmed

    @property
    def txn(self) -> TxnContext | None:
        return self._txn

    @property
    def not_persisted(self) -> bool:
        return self._not_persisted

    @property
    def message_id(self) -> MessageID | None:
        """None while the message is being appended; set once, by the WAL."""
        return self._id

    @property
    def is_immutable(self) -> bool:
        return self._id is not None

    # --- append side -----------------------------------------------------------------------------
    def _check_mutable(self) -> None:
        if self._id is not None:
            raise ImmutableMessageError(
                f"message {self._id} already has an id and cannot change", message_id=self._id
            )

    def with_timetick(self, ts: int) -> Message:
        self._check_mutable()
        self._timetick = ts
        return self

    def with_wal_term(self, term: int) -> Message:
        self._check_mutable()
        self._term = term
        return self

    def with_last_confirmed(self, message_id: MessageID) -> Message:
        self._check_mutable()
        self._last_confirmed = message_id
        return self

    def with_txn(self, txn: TxnContext | None) -> Message:
        self._check_mutable()
        self._txn = txn
        return self

    def with_property(self, key: str, value: str) -> Message:
        self._check_mutable()
        self._properties[key] = value
        return self

    def _seal(self, message_id: MessageID) -> None:
        """Give the message its id; from now on it is immutable.  Called only by the WAL."""
        self._id = message_id

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return (
            self._id == other._id
            and self._type == other._type
            and self._vchannel == other._vchannel
            and self._timetick == other._timetick
            and self._term == other._term
            and self._last_confirmed == other._last_confirmed
            and self._txn == other._txn
            and self._not_persisted == other._not_persisted
            and self._properties == other._properties
            and self._payload == other._payload
        )

    __hash__ = None  # type: ignore[assignment]  # mutable while appending

    def __repr__(self) -> str:
        return (
            f"Message(id={self._id}, type={self._type.name}, vchannel={self._vchannel!r}, "
            f"ts={self._timetick}, term={self._term}, txn={self._txn}, payload={len(self._payload)}B)"
        )


_new = Message.__new__


def decoded_message(  # noqa: PLR0917  (positional: the cheapest call in CPython)
    message_type: MessageType,
    vchannel: str,
    payload: bytes,
    properties: dict[str, str],
    timetick: int,
    term: int,
    last_confirmed: MessageID | None,
    txn: TxnContext | None,
    message_id: MessageID | None,
    not_persisted: bool,
) -> Message:
    """A message from fields already decoded and checked (stored blocks, the wire): every field as it
    is, no copy, no validation.  ``properties`` becomes the message's own dict.  With a
    ``message_id`` the message is immutable, as the WAL hands it out; without, it is still mutable.

    The decoders build one per message read or received, so this skips ``__init__`` (its defaults and
    keyword handling) and fills the slots directly: the one place outside the class that knows them."""
    m = _new(Message)  # (exactly ten positional parameters: CPython's cheapest call)
    m._type = message_type
    m._vchannel = vchannel
    m._payload = payload
    m._properties = properties
    m._timetick = timetick
    m._term = term
    m._last_confirmed = last_confirmed
    m._txn = txn
    m._id = message_id
    m._not_persisted = not_persisted
    return m


DecodedFields = tuple[MessageType, str, bytes, int, int, "MessageID | None", "TxnContext | None", "MessageID | None"]
"""One row for ``decoded_messages``: type, vchannel, payload, timetick, term, last confirmed id, txn,
message id."""


def decoded_messages(rows: Iterable[DecodedFields], out: list[Message]) -> list[Message]:
    """``decoded_message`` for many: a message per row, without properties and not marked "not
    persisted", appended to ``out``, which is returned.  The batch form costs no Python call per
    message: a decoder of columns (a columnar pack) passes a ``zip`` of them, whose tuples CPython
    reuses."""
    append = out.append
    new = _new
    for t, vchannel, payload, ts, term, lc, txn, mid in rows:
        m = new(Message)
        m._type = t
        m._vchannel = vchannel
        m._payload = payload
        m._properties = {}
        m._timetick = ts
        m._term = term
        m._last_confirmed = lc
        m._txn = txn
        m._id = mid
        m._not_persisted = False
        append(m)
    return out


# --- facts about a batch ---------------------------------------------------------------------------------
# Plain loops over the slots: in CPython 3.11 a loop reading a slot is cheaper per message than a
# property, a generator (``all(... for m in batch)``) or ``map`` over an ``operator.attrgetter``
# (instructions counted under callgrind: 530 against 1,130 a message for the payload sum through the
# ``payload`` property, 190 against 380 for one type through a generator).
def payload_bytes(messages: Iterable[Message]) -> int:
    """The summed payload lengths of ``messages``."""
    return sum([len(m._payload) for m in messages])


def all_of_type(messages: Iterable[Message], message_type: MessageType) -> bool:
    """Whether every message of ``messages`` has type ``message_type``."""
    for m in messages:  # noqa: SIM110  (a loop, not all() of a generator: see above)
        if m._type is not message_type:
            return False
    return True


def of_types(messages: Iterable[Message], types: frozenset[MessageType]) -> list[Message]:
    """The messages of ``messages`` whose type is in ``types``, in order (a reader that acts on a few
    types picks them in one pass, without a property call per message)."""
    return [m for m in messages if m._type in types]


def all_on_vchannel(messages: Iterable[Message], vchannel: str) -> bool:
    """Whether every message of ``messages`` is on ``vchannel``."""
    for m in messages:  # noqa: SIM110  (a loop, not all() of a generator: see above)
        if m._vchannel != vchannel:
            return False
    return True


# --- the append side, a batch at a time --------------------------------------------------------------
# One loop over a produce batch each, with the immutability guard of the with_* setters: the service
# edge prepares thousands of messages per second, so these neither call a setter per message nor
# build anything per message they do not change.
def bind_txn(messages: Iterable[Message], txn: TxnContext) -> None:
    """Put every message of ``messages`` into transaction ``txn`` (``with_txn`` for a batch)."""
    for m in messages:
        if m._id is not None:
            m._check_mutable()
        m._txn = txn


def stamp_sequence(messages: Iterable[Message], tag: tuple[str, str], sequence_key: str, first: int) -> None:
    """Set the property ``tag`` (key, value) on every message, and ``sequence_key`` to its decimal
    sequence number, counting from ``first`` in the order of ``messages`` (an idempotent producer's
    stamps: its id and each message's sequence)."""
    key, value = tag
    for seq, m in enumerate(messages, first):
        if m._id is not None:
            m._check_mutable()
        props = m._properties
        props[key] = value
        props[sequence_key] = str(seq)


def first_property(messages: Iterable[Message], keys: Iterable[str]) -> tuple[int, str] | None:
    """``(index, key)`` of the first message that carries one of ``keys`` (first of ``keys`` on it),
    or None when none does."""
    keys = tuple(keys)
    for i, m in enumerate(messages):
        props = m._properties
        if props:  # most messages carry no properties: one truth test each
            for key in keys:
                if key in props:
                    return i, key
    return None


def any_transactional(messages: Iterable[Message], types: frozenset[MessageType] = frozenset()) -> bool:
    """Whether a message of ``messages`` is in a transaction, or has one of ``types`` (transaction
    framing, say): the one cheap pass that lets a batch with none go straight through."""
    for m in messages:  # noqa: SIM110  (a loop, not any() of a generator: see above)
        if m._txn is not None or m._type in types:
            return True
    return False


def stamp_times(messages: Iterable[Message], first: int, last_confirmed: MessageID | None) -> int:
    """Give the messages the timestamps ``first``, ``first + 1``, ... in order and the last-confirmed id
    ``last_confirmed`` (``with_timetick`` and ``with_last_confirmed`` for a batch); return the next
    timestamp after them."""
    ts = first
    for m in messages:
        if m._id is not None:
            m._check_mutable()
        m._timetick = ts
        m._last_confirmed = last_confirmed
        ts += 1
    return ts


# --- the readers of a batch: dedup and the snapshot's shadow replay, once per message -------------------
def has_property(messages: Iterable[Message], key: str) -> bool:
    """Whether a message of ``messages`` carries the property ``key`` (most carry none: one truth test
    each)."""
    for m in messages:
        props = m._properties
        if props and key in props:
            return True
    return False


def content_fields(messages: Iterable[Message]) -> list[tuple[dict[str, str], str, bytes, MessageType]]:
    """``(properties, vchannel, payload, type)`` of each message, in order: what its writer chose and a
    resend must repeat (the parts a content digest covers), read in one pass.  The properties are
    the message's own dict, not a copy: read them, do not change them."""
    return [(m._properties, m._vchannel, m._payload, m._type) for m in messages]


def written_with(messages: Iterable[Message], key: str) -> list[tuple[dict[str, str], AppendResult, int, Message]]:
    """For each written message (one with an id) that carries the property ``key``, in order: its
    properties (its own dict: read only), the ``AppendResult`` its append answered (id, timetick,
    txn id), its payload length, and the message itself.  A replay's one pass over stored messages
    (producer stamps, say)."""
    out: list[tuple[dict[str, str], AppendResult, int, Message]] = []
    for m in messages:
        props = m._properties
        if props and key in props and m._id is not None:
            txn = m._txn
            out.append((props, AppendResult(m._id, m._timetick, txn.txn_id if txn else None), len(m._payload), m))
    return out


def replay_picks(
    messages: Iterable[Message], first: MessageID, types: Container[MessageType], skip: MessageType | None,
    tick: MessageType,
) -> list[tuple[int, Message, bool]]:
    """The messages a replay must act on, each as ``(id - first, message, its type is tick)``: those
    that carry properties, are in a transaction, or have a type in ``types``.  ``skip`` is a type known
    not to be in ``types``, tested first (by identity) as the cheap exit for the common kind.  Every
    message must have an id (stored messages do)."""
    return [(m._id - first, m, m._type is tick) for m in messages  # type: ignore[operator]
            if m._properties or m._txn is not None or (m._type is not skip and m._type in types)]


def payloads(messages: Iterable[Message]) -> list[bytes]:
    """The payloads of ``messages``, in order."""
    return [m._payload for m in messages]


def new_time_tick(ts: int, *, last_confirmed: MessageID | None = None, persist: bool = True) -> Message:
    """A TimeTick barrier at ``ts`` on every vchannel of the pchannel."""
    msg = Message(MessageType.TIME_TICK, BROADCAST_VCHANNEL, timetick=ts, not_persisted=not persist)
    if last_confirmed is not None:
        msg._last_confirmed = last_confirmed
    return msg


__all__ = [
    "BROADCAST_VCHANNEL",
    "MESSAGE_ID_BYTES",
    "AppendResult",
    "DecodedFields",
    "Message",
    "MessageID",
    "MessageType",
    "Position",
    "TxnContext",
    "all_of_type",
    "all_on_vchannel",
    "any_transactional",
    "bind_txn",
    "content_fields",
    "decode_message_id",
    "decoded_message",
    "decoded_messages",
    "encode_message_id",
    "first_property",
    "has_property",
    "new_time_tick",
    "of_types",
    "payload_bytes",
    "payloads",
    "replay_picks",
    "stamp_sequence",
    "stamp_times",
    "written_with",
]
