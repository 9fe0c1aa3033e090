"""The seed of a crash test: drawn fresh each run (kills land at other moments every time), printed and
recorded in the test report, and replayed with ``STREAMINGNODE_CRASH_SEED=<seed>``."""

from __future__ import annotations

import os
import random
from collections.abc import Callable

import pytest

SEED_ENV = "STREAMINGNODE_CRASH_SEED"


@pytest.fixture
def crash_seed(record_property: Callable[[str, object], None]) -> int:
    raw = os.environ.get(SEED_ENV)
    seed = int(raw) if raw else random.SystemRandom().randrange(1 << 32)
    # Printed: pytest shows it with the failure (captured output), and -s shows it for a passing run.
    print(f"crash seed {seed} (replay: {SEED_ENV}={seed})")
    record_property("crash_seed", seed)
    return seed

