"""Seeds of randomized tests: drawn fresh per run unless an environment variable fixes one, printed (pytest
shows it with a failure) and recorded in the report (``record_property``), so any run can be replayed."""

from __future__ import annotations

import os
import random
from collections.abc import Callable


def draw_seed(env: str, record_property: Callable[[str, object], None], name: str = "seed") -> int:
    raw = os.environ.get(env)
    seed = int(raw) if raw else random.SystemRandom().randrange(1 << 32)
    print(f"{name} {seed} (replay: {env}={seed})")
    record_property(name, seed)
    return seed
