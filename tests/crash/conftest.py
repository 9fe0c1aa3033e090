"""The seed of a crash test: drawn fresh each run (kills land at other moments every time), printed and
recorded in the test report, and replayed with ``STREAMINGNODE_CRASH_SEED=<seed>``."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.seeds import draw_seed


@pytest.fixture
def crash_seed(record_property: Callable[[str, object], None]) -> int:
    return draw_seed("STREAMINGNODE_CRASH_SEED", record_property, "crash seed")
