"""The JetStream backend's policy for asking NATS again (``_retrying``, shared with the publish chain):
only the failures that may pass (no answer, no responder, a lost connection), padding an attempt that
was refused at once to ``_RETRY_PAUSE``, counting each retry, until the deadline; then the last failure.
No NATS needed: the requests are faked."""

from __future__ import annotations

import asyncio

import nats.errors
import pytest

from tests.pauses import Scripted, record_pauses
from wal.backends._js_connection import _RETRY_PAUSE
from wal.backends.jetstream import JetStreamBackend


def _backend() -> JetStreamBackend:
    backend = JetStreamBackend.__new__(JetStreamBackend)  # not connected: only the retry policy is used
    backend.timeout, backend.attempt_timeout, backend.retries = 5.0, 1.0, 0
    return backend


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    return record_pauses(monkeypatch, zero=False)


def _ask(*failures: BaseException) -> tuple[Scripted, list[float | None]]:
    ask = Scripted(*failures)
    return ask, ask.timeouts


async def test_refusals_at_once_are_padded_and_counted(pauses: list[float]) -> None:
    backend = _backend()
    ask, timeouts = _ask(nats.errors.NoRespondersError(), nats.errors.TimeoutError())
    assert await backend._retrying(ask) == "answer"
    assert backend.retries == 2 and len(timeouts) == 3
    assert len(pauses) == 2 and all(0 < p <= _RETRY_PAUSE for p in pauses)
    assert all(t is not None and 0.05 <= t <= backend.attempt_timeout for t in timeouts)


async def test_other_failures_are_raised_at_once(pauses: list[float]) -> None:
    backend = _backend()
    ask, timeouts = _ask(ValueError("bad request"))
    with pytest.raises(ValueError, match="bad request"):
        await backend._retrying(ask)
    assert backend.retries == 0 and pauses == [] and len(timeouts) == 1


async def test_the_deadline_ends_it_with_the_last_failure(pauses: list[float]) -> None:
    backend = _backend()
    ask, timeouts = _ask(*[nats.errors.NoRespondersError() for _ in range(100)])
    deadline = asyncio.get_running_loop().time() + 0.35
    with pytest.raises(nats.errors.NoRespondersError):
        await backend._retrying(ask, deadline)
    assert backend.retries == len(pauses) == len(timeouts) - 1 >= 1
