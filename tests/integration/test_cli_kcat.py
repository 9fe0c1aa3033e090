"""The CLI as kcat and ``nats`` users reach for it: raw input, ``--exit``, type filters, readable times,
reconnect notices, commands that can run twice, and errors and hints that read right.

Every command runs as a subprocess against a real node (see test_cli.py for why).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamingnode.cli.parsing import ts_text
from streamingnode.cli.progress import ProgressBar
from streamingnode.client import Client
from streamingnode.server import ServerThread
from tests.integration.conftest import node_config
from tests.integration.test_cli import TIMEOUT, _env, _start_consumer, cli, consumed, ok

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def channel(server: str) -> str:
    ok(server, "channels", "create", "p")
    return "p"


def _lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


# --- produce --format raw ----------------------------------------------------------------------------
def test_raw_lines_are_payloads_and_the_delimiter_splits_off_the_vchannel(server: str, channel: str) -> None:
    stdin = 'eu:order {"id": 1}\nus:a:b\nno delimiter\n\n'
    ok(server, "produce", "--channel", channel, "--format", "raw", "-K", ":", "--vchannel", "dflt", stdin=stdin)
    ok(server, "produce", "--channel", channel, "--format", "raw", stdin="eu:kept whole\n")
    got = consumed(server, "--channel", channel, "--count", "4")
    assert [(m["vchannel"], m["payload"]) for m in got] == [
        ("eu", 'order {"id": 1}'), ("us", "a:b"), ("dflt", "no delimiter"), ("", "eu:kept whole")]


def test_the_delimiter_needs_raw(server: str, channel: str) -> None:
    proc = cli(server, "produce", "--channel", channel, "-K", ":", stdin="a:b\n")
    assert proc.returncode == 1 and "needs --format raw" in proc.stderr


def test_no_progress_bar_over_what_is_typed_in_a_terminal(server: str, channel: str) -> None:
    in_master, in_slave = pty.openpty()
    err_master, err_slave = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "streamingnode", "produce", "--channel", channel,
                                 "--addr", server], stdin=in_slave, stdout=subprocess.DEVNULL, stderr=err_slave,
                                env=_env())
        os.write(in_master, b'"typed"\n\x04')  # a line, then Ctrl-D: the end of the input
        assert proc.wait(timeout=TIMEOUT) == 0
        err = b""
        while select.select([err_master], [], [], 0)[0]:
            chunk = os.read(err_master, 65536)
            if not chunk:
                break
            err += chunk
    finally:
        for fd in (in_master, in_slave, err_master, err_slave):
            os.close(fd)
    assert b"produced 1 msgs" in err, err
    assert b"\r1 msgs" not in err and b"\x1b[K" not in err, "no bar drawn while someone types"


def test_the_progress_bar_keeps_its_last_character(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "70")
    out = io.StringIO()
    bar = ProgressBar(out, 10)
    bar.draw(10, 0, force=True)
    line = out.getvalue().removeprefix("\r").removesuffix("\x1b[K")
    assert line.endswith(" s"), line  # "... 0.0 s": the unit is there
    assert len(line) == 69 and line.startswith("[#") and "]  100%" in line


# --- consume -----------------------------------------------------------------------------------------
def test_consume_exit_stops_at_the_end_of_the_log(server: str, channel: str) -> None:
    proc = cli(server, "consume", "--channel", channel, "--exit")
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr  # an empty log ends at once
    ok(server, "produce", "--channel", channel, "--vchannel", "v", stdin="".join(f'"m{i}"\n' for i in range(3)))
    ok(server, "produce", "--channel", channel, "--vchannel", "w", stdin='"other"\n')
    got = _lines(ok(server, "consume", "--quiet", "--channel", channel, "--exit").stdout)
    assert [m["payload"] for m in got] == ['"m0"', '"m1"', '"m2"', '"other"']
    got = _lines(ok(server, "consume", "--quiet", "--channel", channel, "--vchannel", "v", "-e").stdout)
    assert [m["payload"] for m in got] == ['"m0"', '"m1"', '"m2"']


def test_type_filters_and_readable_times(server: str, channel: str) -> None:
    with Client(server) as client, client.txn(channel, "v") as tx:
        tx.send(b"in txn")
    ok(server, "produce", "--channel", channel, "--vchannel", "v", stdin='"plain"\n')
    every = _lines(ok(server, "consume", "--quiet", "--channel", channel, "--exit").stdout)
    assert [m["type"] for m in every] == ["BEGIN_TXN", "DATA", "COMMIT_TXN", "DATA"]
    for m in every:
        assert m["time"] == ts_text(m["timetick"]) and re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+\+00:00", m["time"])
    data = _lines(ok(server, "consume", "--quiet", "--channel", channel, "--exit", "--type", "data").stdout)
    assert [m["payload"] for m in data] == ["in txn", '"plain"']
    framing = _lines(ok(server, "consume", "--quiet", "--channel", channel, "--exit",
                        "--type", "BEGIN_TXN,commit_txn").stdout)
    assert [m["type"] for m in framing] == ["BEGIN_TXN", "COMMIT_TXN"]
    proc = cli(server, "consume", "--channel", channel, "--type", "nope")
    assert proc.returncode == 1 and "unknown message type 'NOPE'" in proc.stderr
    # What consume prints, produce takes back (the time is ignored like the timetick).
    ok(server, "channels", "create", "copy")
    ok(server, "produce", "--channel", "copy", stdin="\n".join(json.dumps(m) for m in data) + "\n")


def test_consume_as_a_group_says_where_it_resumes(server: str, channel: str) -> None:
    ok(server, "groups", "create", "--channel", channel, "g")
    ok(server, "produce", "--channel", channel, stdin='"a"\n"b"\n')
    first = cli(server, "consume", "--channel", channel, "--group", "g", "--count", "1")
    assert "group 'g': no committed position yet, from earliest" in first.stderr, first.stderr
    acked = json.loads(first.stdout)
    second = cli(server, "consume", "--channel", channel, "--group", "g", "--count", "1")
    assert second.returncode == 0, second.stderr
    assert re.search(r"group 'g': resuming after its committed position, message id (\d+) \(timetick \d+, 20",
                     second.stderr), second.stderr
    assert json.loads(second.stdout)["payload"] == '"b"'
    assert acked["payload"] == '"a"'


class _Node:
    """A node that stops and starts again on the same port over the same data."""

    def __init__(self, data_dir: Path) -> None:
        self.thread = ServerThread(node_config(data_dir)).start()
        self.address = self.thread.address
        self.config = dataclasses.replace(self.thread.config, listen=self.address)
        self.running = True

    def stop(self) -> None:
        if self.running:
            self.thread.stop(grace=0.2)
            self.running = False

    def start(self) -> None:
        self.thread = ServerThread(self.config).start()
        self.running = True


@pytest.fixture
def node(tmp_path: Path) -> Iterator[_Node]:
    n = _Node(tmp_path / "data")
    try:
        yield n
    finally:
        n.stop()


def test_consume_says_when_it_loses_the_node_and_when_it_is_back(node: _Node) -> None:
    ok(node.address, "channels", "create", "p")
    proc = _start_consumer(node.address, "--channel", "p", "--reconnect-timeout", "60")
    try:
        assert proc.stderr is not None and proc.stdout is not None
        node.stop()
        assert proc.stderr.readline().startswith(f"disconnected from {node.address}: reconnecting (for up to 60 s)")
        node.start()
        ok(node.address, "produce", "--channel", "p", stdin='"after"\n')
        assert json.loads(proc.stdout.readline())["payload"] == '"after"'  # back: the notice came before
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert err.splitlines()[:1] == [f"reconnected to {node.address}"], err


def test_consume_gives_up_after_its_reconnect_timeout(node: _Node) -> None:
    ok(node.address, "channels", "create", "p")
    proc = _start_consumer(node.address, "--channel", "p", "--reconnect-timeout", "0.5")
    try:
        node.stop()
        _, err = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
    assert proc.returncode == 1
    assert err.startswith("disconnected from"), err
    assert "error: UNAVAILABLE: " in err


# --- create commands that can run twice, and the README's snippets ---------------------------------------
def test_create_commands_with_if_not_exists_run_twice(server: str) -> None:
    assert ok(server, "channels", "create", "a", "--if-not-exists").stdout.strip() == "created a"
    assert ok(server, "channels", "create", "a", "b", "--if-not-exists").stdout.split("\n")[:2] == [
        "exists a", "created b"]
    assert cli(server, "channels", "create", "a").returncode == 1, "without it, an existing channel is an error"
    assert ok(server, "groups", "create", "--channel", "a", "g", "--if-not-exists").stdout.strip() == \
        "created group g on a"
    assert ok(server, "groups", "create", "--channel", "a", "g", "h", "--if-not-exists").stdout.splitlines() == [
        "group g exists on a", "created group h on a"]
    assert cli(server, "groups", "create", "--channel", "a", "g").returncode == 1


def _readme_block(heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split(f"## {heading}\n", 1)[1]
    return section.split("```bash run\n", 1)[1].split("```", 1)[0]


def test_the_readme_quick_start_runs_twice(server: str) -> None:
    # tests/integration/test_docs_snippets.py runs every block of the README; this one checks the tour's
    # commands, lighter, with --if-not-exists where a second run needs it.
    script = _readme_block("A one-minute tour")
    assert "--if-not-exists" in script
    script = script.replace(".venv/bin/streamingnode", f"{sys.executable} -m streamingnode")
    script = script.replace("--count 10000", "--count 100")  # the same commands, a lighter load
    for run in (1, 2):
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True,
                              timeout=120, env={**_env(), "STREAMINGNODE_ADDR": server}, check=False)
        assert proc.returncode == 0, (run, proc.stderr)


# --- errors and hints ----------------------------------------------------------------------------------
def test_an_unreachable_node_says_unavailable_once() -> None:
    import socket  # noqa: PLC0415

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{s.getsockname()[1]}"  # bound, never listening: connections are refused
        proc = cli(addr, "channels", "list")
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: UNAVAILABLE: ") and "UNAVAILABLE: UNAVAILABLE" not in proc.stderr
    assert f"is the node running at {addr}?" in proc.stderr


def test_a_host_name_that_does_not_resolve_gets_the_dns_hint() -> None:
    proc = cli("nohost.invalid:1", "channels", "list")
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: UNAVAILABLE: ") and "UNAVAILABLE: UNAVAILABLE" not in proc.stderr
    assert "hint: a host name of nohost.invalid:1 does not resolve (DNS)" in proc.stderr, proc.stderr
    assert "is the node running" not in proc.stderr
