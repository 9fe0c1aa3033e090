"""A one-line progress bar on a terminal stream, redrawn in place (no dependency)."""

from __future__ import annotations

import shutil
import time
from typing import TextIO

MIB = 1 << 20


def rate(count: float, seconds: float) -> float:
    """``count`` per second, 0 for an empty interval (a run that ended before the clock moved)."""
    return count / seconds if seconds > 0 else 0.0


class ProgressBar:
    """Draws ``[#####.....]  45%  4500/10000 msgs  0.4 MiB  12000 msgs/s  0.4 s`` on ``stream``.

    ``total`` None (reading a pipe: the end is unknown) draws the counters without a bar.  ``draw``
    is cheap to call often: it redraws at most every ``interval`` seconds, because a terminal write
    per message would cost more than the messages themselves.
    """

    def __init__(self, stream: TextIO, total: int | None, *, interval: float = 0.1) -> None:
        self._stream = stream
        self._total = total
        self._interval = interval
        self._start = time.monotonic()
        self._last_draw = float("-inf")
        self._drawn = False

    def draw(self, done: int, nbytes: int, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_draw < self._interval:
            return
        self._last_draw = now
        elapsed = now - self._start
        counters = f"{nbytes / MIB:.1f} MiB  {rate(done, elapsed):.0f} msgs/s  {elapsed:.1f} s"
        width = shutil.get_terminal_size((80, 24)).columns
        if self._total:
            fraction = min(done / self._total, 1.0)
            text = f"{fraction:4.0%}  {done}/{self._total} msgs  {counters}"
            # width - 1 columns in all (a line that fills the last column makes some terminals wrap):
            # the brackets and two spaces take 4.
            bar_width = max(width - 1 - len(text) - 4, 10)
            filled = int(bar_width * fraction)
            line = f"[{'#' * filled}{'.' * (bar_width - filled)}]  {text}"
        else:
            line = f"{done} msgs  {counters}"
        # \r and erase-to-end-of-line: a shorter line must not leave the tail of a longer one.
        self._stream.write(f"\r{line[: width - 1]}\x1b[K")
        self._stream.flush()
        self._drawn = True

    def clear(self) -> None:
        """Erase the bar, so the summary that follows starts on a clean line."""
        if self._drawn:
            self._stream.write("\r\x1b[K")
            self._stream.flush()
            self._drawn = False
