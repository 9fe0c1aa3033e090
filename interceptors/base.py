"""The interceptor contract: one small required method, optional abilities detected by the builder.

An interceptor sees a *batch* of messages (one produce request's worth) once, does its work for the
whole batch, and calls ``append_next`` with what should continue down the chain.  It returns one
``AppendResult`` per message it was given, in order.  Per-message Python work is the cost to avoid:
do per-message work only where it must be done.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from wal.message import AppendResult, Message, MessageType

AppendNext = Callable[[list[Message]], Awaitable[list[AppendResult]]]
"""Continue the chain with these messages; returns their results in order."""


@runtime_checkable
class Interceptor(Protocol):
    """Required: ``do_append`` and ``close``."""

    async def do_append(self, batch: list[Message], append_next: AppendNext) -> list[AppendResult]:
        """Process ``batch`` and return one result per message, in order."""
        ...

    async def close(self) -> None:
        """Release resources.  Called once, after the last ``do_append`` returned."""
        ...


@runtime_checkable
class ReadyInterceptor(Protocol):
    """Optional: appends wait until every interceptor that has ``ready`` is ready (e.g. recovered)."""

    async def ready(self) -> None: ...


@runtime_checkable
class RecoverableInterceptor(Protocol):
    """Optional: rebuild state from what the WAL already holds, before the first append.

    ``replay`` is called with stored messages in id order (in batches), then ``recovered`` once at
    the end; both before ``ready`` resolves.  Replay must not append.
    """

    def replay(self, batch: list[Message]) -> None: ...

    async def recovered(self) -> None: ...


def plain_skipping_types(step: object) -> frozenset[MessageType] | None:
    """The message types a replaying step acts on besides messages with properties or a transaction,
    when it declares them (``replay_types``: its replay leaves its state unchanged for every other
    message that has no properties and no transaction); None when it does not, and every message
    must reach its replay.  The shadow replay of periodic snapshots follows every message written,
    and skips, with one test per message, the plain ones no step acts on."""
    types = getattr(step, "replay_types", None)
    return types if isinstance(types, frozenset) else None


@runtime_checkable
class SnapshotInterceptor(Protocol):
    """Optional: the state ``replay`` rebuilds, as a JSON value, so that recovery can start from a
    snapshot taken at a message id instead of from the first message ever written (and the log
    below that id can be truncated).  ``import_state`` of an exported state, then ``replay`` of the
    messages from that id on, must leave the same state as ``replay`` of every message.
    """

    name: str

    def export_state(self) -> Any: ...

    def import_state(self, state: Any) -> None: ...


@runtime_checkable
class NamedInterceptor(Protocol):
    """Optional: the name under which the builder reports the interceptor's time."""

    name: str


__all__ = [
    "AppendNext", "Interceptor", "NamedInterceptor", "ReadyInterceptor", "RecoverableInterceptor",
    "SnapshotInterceptor",
]
