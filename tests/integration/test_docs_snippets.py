"""Every code block of README.md and docs/ says whether it runs, and the ones that run do, twice in a row,
against one real node, as a reader would paste them.

A block declares itself in its fence's info string, after the language (which is all a renderer reads):

- ``run``: a ``bash`` or ``python`` block that works against a node started with ``make run`` (gRPC on
  localhost:19530, data in ./data), from the repository root.  This test starts such a node on a free
  port of 127.0.0.1 with its data directory at ``./data`` of a scratch directory, rewrites
  ``localhost:19530`` to its address and ``.venv/bin/`` to this interpreter's directory, and runs each
  block of a file in order, each twice before the next: bash with ``-euo pipefail`` in the directory
  holding ``data/``; python as a script in a directory of its own (where ``./data`` is not the running
  node's: a block that opens a data directory means a stopped node's, or its own).
- ``norun``: not runnable as it stands (shell set-up, a synopsis with placeholders, a fragment, a file).
- ``spark-job``: the streaming job of docs/spark.md, which tests/spark_stream/test_readme.py runs
  under Spark against a node of its own.

Blocks run twice because readers run them twice: a block that creates what it needs must create it
only when it is missing, and a block that makes something new must give it a new name.  Links between
the pages (files and #anchors) are checked too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from streamingnode.server import ServerThread
from tests.integration.conftest import node_config
from tests.node_process import REPO

pytestmark = pytest.mark.integration

KINDS = ("run", "norun", "spark-job")
RUNNABLE = ("bash", "python")
BLOCK_TIMEOUT_S = 900  # one run of one block, against a hang: Spark's cold JVM takes ~15 s quiet, minutes loaded
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^`\n]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    kind: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, in order, with the kind each declares ("" when none)."""
    text = path.read_text()
    found = []
    for m in FENCE.finditer(text):
        words = m.group("info").split()
        lang = words[0] if words else ""
        kinds = [w for w in words[1:] if w in KINDS]
        indent = m.group("indent")
        body = "".join(line.removeprefix(indent) for line in m.group("body").splitlines(keepends=True))
        found.append(Block(path, text.count("\n", 0, m.start()) + 1, lang, kinds[0] if len(kinds) == 1 else "",
                           body))
    return found


def runnable(path: Path) -> list[Block]:
    return [b for b in blocks(path) if b.kind == "run"]


def test_every_block_declares_whether_it_runs() -> None:
    undeclared = [f"{b.where} ({b.lang or 'no language'})" for p in doc_files() for b in blocks(p)
                  if b.kind == "" or (b.kind == "run" and b.lang not in RUNNABLE)]
    assert not undeclared, ("fenced blocks need `<language> run` (bash or python), `<language> norun` or "
                            f"`python spark-job` after their opening ```: {undeclared}")
    assert sum(len(runnable(p)) for p in doc_files()) >= 8, "the runnable blocks are not found"


def test_the_fence_pattern_reads_indented_and_plain_blocks(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("# t\n\n```bash run\necho a\n```\n\n- item:\n\n  ```toml norun\n  [a]\n  b = 1\n  ```\n")
    got = [(b.line, b.lang, b.kind, b.code) for b in blocks(doc)]
    assert got == [(3, "bash", "run", "echo a\n"), (9, "toml", "norun", "[a]\nb = 1\n")]


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {anchor(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def test_links_between_the_pages_resolve() -> None:
    """A page moved or a heading renamed breaks no link of README.md or docs/ (files and #anchors)."""
    broken = []
    for page in doc_files():
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not checked here
            file_part, _, fragment = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            if not dest.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, broken


def test_anchors_follow_githubs_rule() -> None:
    assert anchor("Retention (truncating the WAL)") == "retention-truncating-the-wal"
    assert anchor("With `--wal rocksdb`") == "with---wal-rocksdb"
    assert anchor("Tokens, permissions, TLS") == "tokens-permissions-tls"


def _prepared(block: Block, address: str) -> str:
    code = block.code.replace("localhost:19530", address)
    return code.replace(".venv/bin/", f"{Path(sys.executable).parent}/")


def _run(block: Block, address: str, shell_dir: Path, python_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STREAMINGNODE_ADDR": address, "GRPC_VERBOSITY": "ERROR", "SPARK_LOCAL_IP": "127.0.0.1"}
    code = _prepared(block, address)
    if block.lang == "bash":
        argv, cwd = ["bash", "-euo", "pipefail", "-c", code], shell_dir
    else:
        script = python_dir / "snippet.py"
        script.write_text(code)
        argv, cwd = [sys.executable, str(script)], python_dir
    return subprocess.run(argv, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S, cwd=cwd, env=env,
                          check=False)


def _doc_params() -> list[Any]:
    """One test per page with runnable blocks; a page whose blocks start Spark carries the spark mark."""
    return [pytest.param(p.relative_to(REPO).as_posix(),
                         marks=[pytest.mark.spark] if any("spark" in b.code for b in runnable(p)) else [])
            for p in doc_files() if runnable(p)]


@pytest.mark.timeout(3600)  # docs/spark.md starts Spark twice; a loaded two-core machine takes minutes each
@pytest.mark.parametrize("doc", _doc_params())
def test_the_runnable_blocks_run_twice_on_one_node(doc: str, tmp_path: Path) -> None:
    shell_dir, python_dir = tmp_path / "repo", tmp_path / "py"
    python_dir.mkdir(parents=True)
    srv = ServerThread(node_config(shell_dir / "data", tick_interval=0.2))
    srv.start()
    try:
        for block in runnable(REPO / doc):
            for attempt in (1, 2):
                proc = _run(block, srv.address, shell_dir, python_dir)
                assert proc.returncode == 0, (
                    f"{block.where} failed on run {attempt} (exit {proc.returncode}):\n"
                    f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-6000:]}")
    finally:
        srv.stop()
