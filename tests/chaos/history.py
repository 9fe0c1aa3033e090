"""The chaos history, Jepsen style: one JSON object per line, invoke / ok / fail / info, with the writer's
``time.monotonic()`` (the machine's one monotonic clock: every process of a run reads the same one).

Two writers feed a run: the workload (``ops.jsonl``, in the client namespace) and the nemesis
(``nemesis.jsonl``, in the harness).  Each appends its own file under its own lock; ``merge`` joins them
into ``history.jsonl`` by time (stable, so each writer's order is kept) and numbers the lines ``i``.
The format is in tests/chaos/README.md.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from pathlib import Path
from typing import Any


class Writer:
    """Appends history lines to one file; ``fresh()`` names a new logical process."""

    def __init__(self, path: Path, *, names: str = "p") -> None:
        self.path = path
        self._file = open(path, "a", buffering=1)  # noqa: SIM115  (closed by close())
        self._lock = threading.Lock()
        self._names = (f"{names}{n}" for n in itertools.count())

    def fresh(self) -> str:
        """A process name never used before (after an ``info`` the old one is retired)."""
        with self._lock:
            return next(self._names)

    def write(self, process: str, type_: str, f: str, value: dict[str, Any]) -> None:
        with self._lock:
            line = {"t": round(time.monotonic(), 6), "process": process, "type": type_, "f": f, "value": value}
            self._file.write(json.dumps(line, separators=(",", ":")) + "\n")

    def nemesis(self, start: bool, fault: str, target: object, **extra: object) -> None:
        self.write("nemesis", "info", "start" if start else "stop", {"fault": fault, "target": target, **extra})

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a writer killed mid-line: its last line is incomplete
    return out


def merge(run_dir: Path, parts: tuple[str, ...] = ("ops.jsonl", "nemesis.jsonl")) -> int:
    """Write ``history.jsonl`` from the writers' files; returns its number of lines."""
    lines = sorted((line for part in parts for line in read_lines(run_dir / part)), key=lambda x: x["t"])
    with open(run_dir / "history.jsonl", "w") as out:
        for i, line in enumerate(lines):
            out.write(json.dumps({"i": i, **line}, separators=(",", ":")) + "\n")
    return len(lines)


__all__ = ["Writer", "merge", "read_lines"]
