"""Wall-clock skew for a chaos node: loaded at interpreter start-up (this directory is put first on the
node's PYTHONPATH), it shifts ``time.time`` and ``time.time_ns`` by the seconds written in the file
``$CHAOS_SKEW_FILE`` (re-read at most every 0.2 s, so the nemesis skews a running node).  The monotonic
clock is left alone: a skewed host is one whose wall clock is wrong while its elapsed time is right, as
a host whose NTP stepped or drifted.

Why not libfaketime: Debian 12's libfaketime 0.9.10 either fakes CLOCK_MONOTONIC too, or, with
``FAKETIME_DONT_FAKE_MONOTONIC=1``, makes Python's ``time.sleep`` fail with EINVAL (its
``clock_nanosleep`` on the monotonic clock), so a node under it cannot run at all.
"""

from __future__ import annotations

import os
import time

_path = os.environ.get("CHAOS_SKEW_FILE", "")
if _path:
    _real_time, _real_time_ns, _monotonic = time.time, time.time_ns, time.monotonic
    _cache = [0.0, -1.0]  # offset (s), monotonic time it was read

    def _offset() -> float:
        now = _monotonic()
        if now - _cache[1] > 0.2:
            try:
                with open(_path) as f:
                    _cache[0] = float(f.read().strip() or 0)
            except (OSError, ValueError):
                pass
            _cache[1] = now
        return _cache[0]

    def _time() -> float:
        return _real_time() + _offset()

    def _time_ns() -> int:
        return _real_time_ns() + int(_offset() * 1e9)

    time.time = _time
    time.time_ns = _time_ns
