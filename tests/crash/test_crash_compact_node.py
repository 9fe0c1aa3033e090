"""SIGKILL a running node (``streamingnode serve``) in the middle of a background compaction, after
each of its steps; after a restart every acknowledged visible row is read exactly once.

The node compacts on its own (a short interval, no horizon, no grace period) once the client has
written its rows and deletes; ``STREAMINGNODE_COMPACT_KILL_AT`` makes the node's process kill itself
right after the step, as a power cut there would.  The restarted node recovers the interrupted pass
(finishes a committed record, removes uncommitted outputs) and compacts again; the rows read before
and after that second pass are the acknowledged ones, each once.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from flusher import layout
from flusher.compaction_record import KILL_ENV, STEPS
from flusher.read.spark import read_collection_arrow
from streamingnode.client import AsyncClient
from tests.crash.evidence import stderr_on_failure
from tests.node_process import NodeProcess
from tests.waiting import until

pytestmark = pytest.mark.crash

SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("name", pa.string())])
FILES = 6
ROWS = 10
COMPACTION = ("--compaction-interval-seconds", "0.2", "--compaction-min-files", str(FILES),
              "--compaction-horizon-seconds", "0")


def _env(kill_at: str | None) -> dict[str, str]:
    env = dict(os.environ, STREAMINGNODE_COMPACTION_GRACE_SECONDS="0")  # inputs go in the same pass
    env.pop(KILL_ENV, None)
    if kill_at is not None:
        env[KILL_ENV] = kill_at
    return env


async def _write(address: str) -> tuple[dict[int, str], dict[int, str]]:
    """Rows of collection d, left buffered (never flushed before the kill), so the flusher's checkpoint
    stays before everything of c and a restart replays all of c; then, for c, FILES flushed inserts
    of ROWS rows, the first key of each of the first four deleted (one row in ten: no file is worth
    compacting for its dead rows alone, so the pass starts only with the last file).  Returns the
    acknowledged visible rows of c and of d."""
    visible: dict[int, str] = {}
    async with AsyncClient(address) as client:
        data = client.data("p")
        await data.create_collection("v", "d", SCHEMA, primary_key="pk")
        buffered = {k: f"d-{k}" for k in range(ROWS)}
        await data.insert("v", "d", pa.record_batch([pa.array(list(buffered)), pa.array(list(buffered.values()))],
                                                    schema=SCHEMA))
        await data.create_collection("v", "c", SCHEMA, primary_key="pk")
        for i in range(FILES):
            keys = list(range(i * ROWS, (i + 1) * ROWS))
            names = [f"row-{k}" for k in keys]
            await data.insert("v", "c", pa.record_batch([pa.array(keys), pa.array(names)], schema=SCHEMA))
            visible.update(zip(keys, names, strict=True))
            if i == FILES - 2:
                gone = [k * ROWS for k in range(4)]
                await data.delete("v", "c", gone)
                for k in gone:
                    del visible[k]
                await data.flush("v", "c")  # the delete file, with the fifth data file
            elif i < FILES - 2:
                await data.flush("v", "c")
        await data.flush("v", "c")  # the sixth small file: the node compacts from now on
    return visible, buffered


def _root(data_dir: Path) -> Path:
    [coll] = [p for p in (data_dir / "parquet").rglob("c") if p.is_dir() and layout.DELETES_DIR not in p.parts]
    return coll.parent


def _check(root: Path, want: dict[int, str], name: str = "c") -> None:
    t = read_collection_arrow(root, name)
    got = Counter(zip(t.column("pk").to_pylist(), t.column("name").to_pylist(), strict=True))
    twice = [r for r, n in got.items() if n > 1]
    assert not twice, f"rows read twice: {twice[:10]}"
    assert dict(got) == {(k, v): 1 for k, v in want.items()}, (
        f"missing {sorted(set(want.items()) - set(got))[:10]}, extra {sorted(set(got) - set(want.items()))[:10]}")


@pytest.mark.parametrize("step", STEPS)
async def test_a_node_killed_after_each_compaction_step_reads_every_acknowledged_row_once_after_a_restart(
    tmp_path: Path, step: str,
) -> None:
    data_dir = tmp_path / "data"
    node = NodeProcess(data_dir, None, "--channels", "p", *COMPACTION, env=_env(step)).start()
    try:
        with stderr_on_failure(lambda: node.stderr, "node"):
            want, buffered = await _write(node.address)
            proc = node.proc
            assert proc is not None
            await until(lambda: proc.poll() is not None, f"the node to kill itself after compaction step {step!r}")
            assert proc.returncode == -signal.SIGKILL, f"the node exited {proc.returncode}, not by its kill hook"
            node.kill()  # reap it and close its pipes
            root = _root(data_dir)
            committed = bool(layout.read_records(root, "c"))
            assert committed == (step != "output")
            _check(root, want)  # readers, before any recovery

            node.env = _env(None)
            node.start()
            async with AsyncClient(node.address) as client:
                await client.data("p").flush("v", "c")
                await client.data("p").flush("v", "d")
            _check(root, want)  # the replay of c's messages wrote none of them again
            _check(root, buffered, "d")

            # The restarted node finishes the work: one data file, no hidden name left, same rows.
            def done() -> bool:
                try:
                    files, deletes, _ = layout.visible_files(root, "c")
                    return len(files) == 1 and not deletes and not list(root.rglob(".*.parquet"))
                except FileNotFoundError:  # the node removed a directory while it was listed: look again
                    return False

            await until(done, "the restarted node to finish compacting")
            _check(root, want)
            assert node.terminate() == 0
    finally:
        node.kill()
