"""Crash points for crash tests: a process that SIGKILLs itself right after a named step.

A crash test sets an environment variable (each component has its own) to ``<step>[:<n>]``; the
component calls its ``CrashPoints`` after each step, and the ``n``-th completion (default 1) of
``<step>`` kills the process on the spot, as a power cut or an OOM kill would.  The variable is read
once, when the component's module is imported, so an unset hook costs one ``is None`` test.
"""

from __future__ import annotations

import os
import signal


class CrashPoints:
    """The steps a component may be killed after, and the one the environment asks for."""

    def __init__(self, env: str, steps: tuple[str, ...]) -> None:
        self.env = env
        self.steps = steps
        self._kill_at = self.parse(os.environ.get(env))
        self._seen: dict[str, int] = {}

    @property
    def armed(self) -> bool:
        """Whether the environment names a step (so a caller may skip preparing for a kill)."""
        return self._kill_at is not None

    def parse(self, raw: str | None) -> tuple[str, int] | None:
        """``<step>[:<n>]`` as (step, n); None when unset; ValueError naming the variable otherwise."""
        if not raw:
            return None
        step, _, count = raw.partition(":")
        if step not in self.steps:
            raise ValueError(f"{self.env}={raw!r}: step must be one of {self.steps}")
        return step, int(count or "1")

    def __call__(self, step: str) -> None:
        """Kill this process here if the hook names ``step`` (a no-op otherwise)."""
        if self._kill_at is None or self._kill_at[0] != step:
            return
        self._seen[step] = self._seen.get(step, 0) + 1
        if self._seen[step] >= self._kill_at[1]:
            os.kill(os.getpid(), signal.SIGKILL)


__all__ = ["CrashPoints"]
