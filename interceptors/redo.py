"""redo: run the inner chain again when it answers "redo" or the backend fails transiently.

Retries use exponential backoff (tenacity) and stop at the caller's deadline (``append_deadline``,
a loop-time instant set by whoever calls the chain) or after ``max_seconds``.  Fencing, invalid
input, a full disk (STORAGE_FULL) and every other non-retriable error pass straight through:
retrying them cannot help and could hide a real problem.  A failed write leaves nothing behind (its
ids are handed back and the messages unsealed), which is what makes running it again safe.
"""

from __future__ import annotations

import asyncio

from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_delay,
    stop_before_delay,
    wait_exponential,
)

from interceptors.base import AppendNext
from wal.adaptor import append_deadline
from wal.error_codes import Behaviour, codes_with
from wal.errors import StreamingError
from wal.message import AppendResult, Message

# Retriable, but not here: a full disk clears in seconds to minutes (a flush, retention, an operator),
# not within this step's backoff, so holding the append for max_seconds would only hide the refusal
# from a client that backs off on its own.
_PASS_THROUGH = codes_with(Behaviour.NOT_REDONE)


def _retriable(exc: BaseException) -> bool:
    # ``held_seconds``: the group committer already held the write and tried it again, in order, for
    # that long (wal._committer); trying each append again on its own now could reorder a producer's
    # pipelined batches.
    return (isinstance(exc, StreamingError) and exc.retriable and exc.code not in _PASS_THROUGH
            and exc.held_seconds is None)


MAX_SECONDS = 10.0
"""How long the step holds an append by default (``ChainConfig.redo_max_seconds``)."""


class RedoInterceptor:
    name = "redo"

    def __init__(
        self, *, max_seconds: float = MAX_SECONDS, initial_backoff: float = 0.005, max_backoff: float = 0.5,
    ) -> None:
        self._max_seconds = max_seconds
        self._initial = initial_backoff
        self._max_backoff = max_backoff
        self.redos = 0
        """How many times an inner chain was run again (for metrics and tests)."""

    async def do_append(self, batch: list[Message], append_next: AppendNext) -> list[AppendResult]:
        try:
            return await append_next(batch)  # the common case pays for no retry machinery
        except StreamingError as exc:
            if not _retriable(exc):
                raise
        budget = self._max_seconds
        deadline = append_deadline.get()
        if deadline is not None:
            budget = min(budget, deadline - asyncio.get_running_loop().time())
        if budget <= 0:
            return await append_next(batch)
        retrying = AsyncRetrying(
            retry=retry_if_exception(_retriable),
            wait=wait_exponential(multiplier=self._initial, max=self._max_backoff),
            stop=stop_after_delay(budget) | stop_before_delay(budget),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                self.redos += 1
                return await append_next(batch)
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover

    async def close(self) -> None:
        return None


__all__ = ["RedoInterceptor"]
