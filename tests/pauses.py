"""Record the pauses a retry policy takes (every ``asyncio.sleep`` while patched), still sleeping them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest


def record_pauses(monkeypatch: pytest.MonkeyPatch, *, zero: bool = True) -> list[float]:
    """The delays passed to ``asyncio.sleep`` from now on, in order (``zero=False``: without the
    zero-second yields)."""
    taken: list[float] = []
    real = asyncio.sleep

    async def sleep(delay: float, *args: Any) -> Any:
        if delay or zero:
            taken.append(delay)
        return await real(delay, *args)
    monkeypatch.setattr(asyncio, "sleep", sleep)
    return taken


class Scripted:
    """A request that fails with ``failures`` in turn, then answers ``answer``; ``timeouts`` holds the
    timeout each call was given (keyword ``timeout``, else the last positional argument)."""

    def __init__(self, *failures: BaseException, answer: object = "answer") -> None:
        self.pending = list(failures)
        self.answer = answer
        self.timeouts: list[float | None] = []

    async def __call__(self, *args: Any, **kwargs: Any) -> object:
        self.timeouts.append(kwargs["timeout"] if "timeout" in kwargs else args[-1] if args else None)
        if self.pending:
            raise self.pending.pop(0)
        return self.answer
