"""A node's start in cluster mode beside a NATS cluster that may still be forming.

Each step of the start (the shared log's connection, the configured pchannels, the cluster buckets,
the first ownership pass) is tried again while it fails with what a forming or electing cluster
answers, for up to ``FIRST_PASS_SECONDS``; any other error, or one that lasts longer, ends the start
with its cause.  Nothing here imports nats-py at import time: a single node never loads it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_delay, wait_fixed

from wal.errors import UnavailableError

log = structlog.get_logger(__name__)
T = TypeVar("T")

FIRST_PASS_SECONDS = 60.0
"""How long a node in cluster mode keeps trying each step of its start while NATS does not answer."""
FIRST_PASS_RETRY_SECONDS = 0.5


def forming(exc: BaseException) -> bool:
    """What a NATS cluster that is forming or electing answers for a while: a transient NATS error, or
    the shared log's UNAVAILABLE (how the JetStream WAL reports the same)."""
    from streamingnode.cluster.connection import transient  # noqa: PLC0415  (nats-py: cluster mode only)

    return transient(exc) or isinstance(exc, UnavailableError)


async def while_nats_forms(what: str, attempt: Callable[[], Awaitable[T]],
                           retriable: Callable[[BaseException], bool] = forming) -> T:
    """``attempt()``, tried again while it fails with an error a NATS cluster forming or electing
    answers (a node started beside a fresh cluster, a busy host) for up to ``FIRST_PASS_SECONDS``;
    past that, or on any other error, the cause is raised."""

    def again(rs: RetryCallState) -> None:
        log.warning(f"{what}: NATS not ready; trying again",
                    error=repr(rs.outcome.exception() if rs.outcome is not None else None))

    retrying = AsyncRetrying(retry=retry_if_exception(retriable), stop=stop_after_delay(FIRST_PASS_SECONDS),
                             wait=wait_fixed(FIRST_PASS_RETRY_SECONDS), before_sleep=again, reraise=True)
    async for tried in retrying:
        with tried:
            return await attempt()
    raise AssertionError("unreachable: tenacity either returns or re-raises")  # pragma: no cover
