"""Compaction never loses a delete: the flusher and compaction against a plain model (``tests/compaction_model.py``).

The CI run walks ``STEPS`` steps from a fresh seed (printed; ``STREAMINGNODE_MODEL_SEED`` replays one) and
compares the pyarrow and DuckDB readers with the model at random timeticks at or after the horizon.  The long
run (``make model-long``: ``STREAMINGNODE_MODEL_SECONDS=1200``) walks fresh seeds one after another for that
long and prints its figures.
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.compaction_model import SECONDS_ENV, SEED_ENV, Figures, Walk, arrow_reader, duckdb_reader
from tests.seeds import draw_seed
from wal import WALManager

STEPS = 300
READERS = {"pyarrow": arrow_reader, "duckdb": duckdb_reader}


@pytest.mark.parametrize("harness", ["rocksdb"], indirect=True)  # the data path, not the backends, is under test
async def test_readers_agree_with_the_model_through_flushes_compactions_and_restarts(
    manager: WALManager, tmp_path: Path, record_property: Callable[[str, object], None],
) -> None:
    budget = float(os.environ.get(SECONDS_ENV) or 0)
    seed = draw_seed(SEED_ENV, record_property)
    if not budget:
        try:
            figures = await Walk(manager, tmp_path / "out", seed, READERS).run(STEPS)
        except AssertionError as exc:
            pytest.fail(str(exc), pytrace=False)
        print(figures.line())
        return
    # The long run: fresh seeds, one walk after another, each in its own directory and pchannel.
    started = time.monotonic()
    total = Figures()
    walks = 0
    rng = random.Random(seed)
    while time.monotonic() - started < budget:
        walk_seed = rng.randrange(1 << 32)
        walk = Walk(manager, tmp_path / f"out{walks}", walk_seed, READERS, pchannel=f"p{walks}")
        try:
            figures = await walk.run(STEPS)
        except AssertionError as exc:
            pytest.fail(f"long run, walk {walks + 1}: {exc}", pytrace=False)
        walks += 1
        print(f"walk {walks} (seed {walk_seed}), {time.monotonic() - started:.0f} s: {figures.line()}",
              file=sys.__stderr__, flush=True)  # progress, should the run be cut short
        total.steps.update(figures.steps)
        total.reads += figures.reads
        total.compactions += figures.compactions
        total.delete_entries_dropped += figures.delete_entries_dropped
    line = f"{walks} walks of {STEPS} steps in {time.monotonic() - started:.0f} s: {total.line()}"
    print(line)
    print(line, file=sys.__stderr__)  # past pytest's capture of sys.stdout (``make model-long``)
    record_property("long_run", line)

