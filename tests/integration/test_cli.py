"""The client commands of the ``streamingnode`` CLI against a real node.

Every command runs as a subprocess, exactly as a user runs it: pipes and signals need one anyway,
and in-process runs would mix the node's log lines (the node runs in this process) into the
captured stdout.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from streamingnode.cli import DEFAULT_ADDR, CliError, parse_record, parse_where
from streamingnode.client import Client
from streamingnode.config import DEFAULT_ADDR as CONFIG_DEFAULT_ADDR
from wal.options import DeliverPolicy

pytestmark = pytest.mark.integration

TIMEOUT = 30  # a wedged CLI fails the test instead of hanging the run
SUMMARY = re.compile(
    r"produced (\d+) msgs, (\d+) bytes in ([\d.]+) s: ([\d.]+) msgs/s, ([\d.]+) MiB/s, "
    r"ack latency p50 ([\d.]+) ms p99 ([\d.]+) ms")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("STREAMINGNODE_ADDR", None)  # only the address each test passes counts
    return env


def cli(server: str | None, *args: str, stdin: str | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "streamingnode", *args]
    if server is not None:
        argv += ["--addr", server]
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=TIMEOUT,
                          env=env or _env(), check=False)


def ok(server: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    proc = cli(server, *args, stdin=stdin)
    assert proc.returncode == 0, proc.stderr
    return proc


def consumed(server: str, *args: str) -> list[dict[str, Any]]:
    out = ok(server, "consume", "--quiet", *args).stdout
    return [json.loads(line) for line in out.splitlines()]


def run(server: str, *args: str) -> tuple[int, str, str]:
    proc = cli(server, *args)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture
def channel(server: str) -> str:
    ok(server, "channels", "create", "p")
    return "p"


@pytest.fixture
def client(server: str) -> Iterator[Client]:
    with Client(server) as c:
        yield c


# --- produce and consume -------------------------------------------------------------------------
def test_produced_json_lines_are_consumed_exactly_and_in_order(server: str, channel: str) -> None:
    lines = [
        {"vchannel": "v1", "payload": "hello", "properties": {"k": "1"}},
        [1, 2, 3],
        "just a string",
        {"not": "an envelope"},
        {"vchannel": "v2", "payload_b64": base64.b64encode(b"\xff\x00bin").decode()},
        {"payload": "ünïcode"},
    ]
    stdin = "\n".join(json.dumps(x) for x in lines) + "\n\n"  # a blank line is skipped
    proc = ok(server, "produce", "--channel", channel, "--vchannel", "dflt", stdin=stdin)
    summary = SUMMARY.search(proc.stderr)
    assert summary is not None, proc.stderr
    assert int(summary[1]) == len(lines)

    got = consumed(server, "--channel", channel, "--count", str(len(lines)))
    assert [(m["vchannel"], m.get("payload"), m.get("payload_b64"), m["properties"]) for m in got] == [
        ("v1", "hello", None, {"k": "1"}),
        ("dflt", json.dumps([1, 2, 3]), None, {}),
        ("dflt", json.dumps("just a string"), None, {}),
        ("dflt", json.dumps({"not": "an envelope"}), None, {}),
        ("v2", None, base64.b64encode(b"\xff\x00bin").decode(), {}),
        ("dflt", "ünïcode", None, {}),
    ]
    assert all(m["type"] == "DATA" and "txn_id" not in m for m in got)
    ids = [m["id"] for m in got]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    timeticks = [m["timetick"] for m in got]
    assert timeticks == sorted(timeticks)


def test_generated_load_reports_every_message(server: str, channel: str) -> None:
    proc = ok(server, "produce", "--channel", channel, "--vchannel", "v", "--count", "200", "--size", "100",
              "--linger", "0.001", "--batch-bytes", "4096", "--producer-id", "load-1", "--progress")
    summary = SUMMARY.search(proc.stderr)
    assert summary is not None, proc.stderr
    assert (int(summary[1]), int(summary[2])) == (200, 200 * 100)
    p50, p99 = float(summary[6]), float(summary[7])
    assert 0 < p50 <= p99
    assert "200/200 msgs" in proc.stderr, "--progress draws the bar even when stderr is not a terminal"

    got = consumed(server, "--channel", channel, "--vchannel", "v", "--count", "200")
    assert len(got) == 200
    sizes = {len(base64.b64decode(m["payload_b64"]) if "payload_b64" in m else m["payload"].encode()) for m in got}
    assert sizes == {100}
    # --producer-id makes the producer idempotent: the node stamps the dedup properties.
    assert {m["properties"]["producer_id"] for m in got} == {"load-1"}
    assert sorted(int(m["properties"]["producer_seq"]) for m in got) == list(range(200))


def test_no_progress_bar_without_a_terminal(server: str, channel: str) -> None:
    proc = ok(server, "produce", "--channel", channel, "--count", "3", "--size", "1")
    assert "\r" not in proc.stderr and "msgs/s" in proc.stderr


def test_consume_from_a_message_id_and_from_a_time(server: str, channel: str) -> None:
    ok(server, "produce", "--channel", channel, "--vchannel", "v", stdin="".join(f'"m{i}"\n' for i in range(5)))
    first = consumed(server, "--channel", channel, "--count", "5")
    third = first[2]["id"]
    got = consumed(server, "--channel", channel, "--from", str(third), "--count", "2")
    assert [m["payload"] for m in got] == ['"m2"', '"m3"']

    # A second run appends later: a start time at its first message's millisecond skips the first run.
    ok(server, "produce", "--channel", channel, "--vchannel", "v", stdin='"later"\n')
    later = consumed(server, "--channel", channel, "--count", "6")[5]
    ms = later["timetick"] >> 18
    assert ms > first[-1]["timetick"] >> 18, "separate runs are milliseconds apart"
    iso = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
    for start in (iso, f"@{ms / 1000:.3f}"):
        got = consumed(server, "--channel", channel, "--from", start, "--count", "1")
        assert [m["payload"] for m in got] == ['"later"'], start


def _start_consumer(server: str, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "streamingnode", "consume", *args, "--addr", server],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    assert proc.stderr is not None
    # The status line is printed once the read is open (and 'latest' anchored): the readiness signal.
    line = proc.stderr.readline()
    if not line.startswith("consuming"):
        proc.kill()
        pytest.fail(f"consumer did not open: {line}{proc.communicate(timeout=TIMEOUT)[1]}")
    return proc


def test_consume_from_latest_sees_only_what_comes_after(server: str, channel: str) -> None:
    ok(server, "produce", "--channel", channel, stdin='"before"\n')
    proc = _start_consumer(server, "--channel", channel, "--from", "latest", "--count", "1")
    try:
        ok(server, "produce", "--channel", channel, stdin='"after"\n')
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert [json.loads(line)["payload"] for line in out.splitlines()] == ['"after"']


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_consume_without_count_runs_until_a_signal_and_exits_0(server: str, channel: str, sig: int) -> None:
    proc = _start_consumer(server, "--channel", channel)
    try:
        assert proc.stdout is not None
        ok(server, "produce", "--channel", channel, stdin='"one"\n')
        assert json.loads(proc.stdout.readline())["payload"] == '"one"'  # it is running and printing
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err


def test_interrupted_produce_on_an_idle_pipe_exits_at_once_with_its_summary(server: str, channel: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamingnode", "produce", "--channel", channel, "--progress", "--addr", server],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    try:
        assert proc.stdin is not None and proc.stderr is not None
        proc.stdin.write(b'"one"\n')
        proc.stdin.flush()
        # The progress bar (redrawn in place, no newline) reports the ack: the message is durable.
        seen = b""
        while b"\r1 msgs" not in seen:
            chunk = os.read(proc.stderr.fileno(), 4096)
            assert chunk, f"produce ended early: {seen!r}"
            seen += chunk
        proc.send_signal(signal.SIGINT)  # stdin stays open and idle: the reader thread is blocked
        _, err = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
    assert proc.returncode == 130
    summary = SUMMARY.search(err.decode())
    assert summary is not None and summary[1] == "1", err
    assert b"interrupted" in err and b"Fatal" not in err and b"Traceback" not in err


def test_consume_pipes_into_produce_to_copy_a_channel(server: str, channel: str) -> None:
    ok(server, "channels", "create", "copy")
    ok(server, "produce", "--channel", channel, "--producer-id", "orig",
       stdin='{"vchannel": "v", "payload": "a", "properties": {"x": "y"}}\n"b"\n')
    dump = ok(server, "consume", "--quiet", "--channel", channel, "--count", "2").stdout
    # The copy drops the original producer's dedup stamps: kept, they would make the node answer with
    # the original results instead of writing.
    ok(server, "produce", "--channel", "copy", stdin=dump)
    got = consumed(server, "--channel", "copy", "--count", "2")
    assert [(m["vchannel"], m["payload"], m["properties"]) for m in got] == [("v", "a", {"x": "y"}), ("", '"b"', {})]


def test_consume_as_group_resumes_after_what_it_acked(server: str, channel: str) -> None:
    ok(server, "groups", "create", "--channel", channel, "g")
    # One run, so the five messages arrive in one pack: --count 2 cuts the pack, and the ack covers
    # only what was printed.
    ok(server, "produce", "--channel", channel, "--vchannel", "v", stdin="".join(f'"m{i}"\n' for i in range(5)))
    first = consumed(server, "--channel", channel, "--group", "g", "--count", "2")
    second = consumed(server, "--channel", channel, "--group", "g", "--count", "3")
    assert [m["payload"] for m in first + second] == [f'"m{i}"' for i in range(5)]

    ok(server, "produce", "--channel", channel, "--vchannel", "v", stdin='"m5"\n')
    assert [m["payload"] for m in consumed(server, "--channel", channel, "--group", "g", "--count", "1")] == ['"m5"']
    # Without the group, consume starts at the beginning again.
    assert consumed(server, "--channel", channel, "--count", "1")[0]["payload"] == '"m0"'


def test_group_count_inside_a_transaction_redelivers_it_whole(server: str, channel: str, client: Client) -> None:
    ok(server, "groups", "create", "--channel", channel, "g")
    with client.txn(channel, "v") as tx:
        for i in range(3):
            tx.send(b"t%d" % i)
    first = consumed(server, "--channel", channel, "--group", "g", "--count", "2")
    assert [m["type"] for m in first] == ["BEGIN_TXN", "DATA"]
    assert {m["txn_id"] for m in first} == {tx.txn_id}
    again = consumed(server, "--channel", channel, "--group", "g", "--count", "5")
    assert [m["type"] for m in again] == ["BEGIN_TXN", "DATA", "DATA", "DATA", "COMMIT_TXN"]
    assert [m["payload"] for m in again if m["type"] == "DATA"] == ["t0", "t1", "t2"]


# --- channels ------------------------------------------------------------------------------------
def test_channels_create_list_describe_destroy(server: str) -> None:
    rc, out, _ = run(server, "channels", "create", "a", "b", "--role", "writer",
                          "--address", "10.0.0.1:1", "--description", "test owner")
    assert rc == 0 and out.split() == ["created", "a", "created", "b"]
    rc, out, _ = run(server, "channels", "create", "--num", "2", "--json")
    generated = json.loads(out)
    assert rc == 0 and len(generated) == 2

    rc, out, _ = run(server, "channels", "list")
    header, *rows = out.splitlines()
    assert rc == 0 and header.split()[:2] == ["NAME", "TERM"]
    assert sorted(r.split()[0] for r in rows) == sorted(["a", "b", *generated])

    rc, out, _ = run(server, "channels", "describe", "a", "--json")
    (described,) = json.loads(out)
    assert described["name"] == "a"
    assert described["owner"] == {"role": "writer", "address": "10.0.0.1:1", "description": "test owner"}
    assert described["term"] >= 1
    rc, out, _ = run(server, "channels", "describe", "a")
    assert rc == 0 and re.search(r"owner\s+role=writer, address=10.0.0.1:1, description=test owner", out)

    rc, out, _ = run(server, "channels", "destroy", "a", *generated)
    assert rc == 0 and out.split("\n")[0] == "destroyed a"
    rc, out, _ = run(server, "channels", "list", "--json")
    assert [c["name"] for c in json.loads(out)] == ["b"]


def test_channels_create_needs_names_or_num(server: str) -> None:
    rc, _, err = run(server, "channels", "create")
    assert rc == 1 and "NAMEs or --num" in err


# --- groups --------------------------------------------------------------------------------------
def test_groups_create_describe_seek_destroy(server: str, channel: str) -> None:
    ok(server, "produce", "--channel", channel, "--vchannel", "v", stdin="".join(f'"m{i}"\n' for i in range(4)))
    ids = [m["id"] for m in consumed(server, "--channel", channel, "--count", "4")]

    rc, out, _ = run(server, "groups", "create", "--channel", channel, "g1", "g2")
    assert rc == 0 and out.splitlines() == ["created group g1 on p", "created group g2 on p"]
    rc, out, _ = run(server, "groups", "list", "--json")
    assert json.loads(out) == [{"pchannel": "p", "group": "g1"}, {"pchannel": "p", "group": "g2"}]

    rc, out, _ = run(server, "groups", "seek", "--channel", channel, "g1", "--vchannel", "v",
                          "--to", str(ids[2]), "--json")
    assert rc == 0 and json.loads(out)["message_id"] == ids[2]
    rc, out, _ = run(server, "groups", "describe", "--channel", channel, "g1", "--json")
    (g1,) = json.loads(out)
    (progress,) = g1["vchannels"]
    assert progress["vchannel"] == "v" and progress["committed"]["message_id"] == ids[2]
    # Lag counts every message after the committed one, persisted TimeTicks too: at least m2 and m3.
    assert progress["lag_messages"] >= ids[-1] + 1 - ids[2]
    rc, out, _ = run(server, "groups", "describe", "--channel", channel, "g1")
    header, row = out.splitlines()
    assert header.split() == ["PCHANNEL", "GROUP", "VCHANNEL", "COMMITTED_ID", "COMMITTED_TIME", "LAG_MSGS", "LAG_MS"]
    assert row.split()[:4] == ["p", "g1", "'v'", str(ids[2])]
    assert int(row.split()[5]) >= ids[-1] + 1 - ids[2]

    # A consumer of the group on that vchannel starts at the sought message.
    got = consumed(server, "--channel", channel, "--vchannel", "v", "--group", "g1", "--count", "2")
    assert [m["id"] for m in got] == ids[2:4]

    rc, out, _ = run(server, "groups", "seek", "--channel", channel, "g1", "--vchannel", "v",
                          "--to", "earliest")
    assert rc == 0 and "now at message id" in out
    got = consumed(server, "--channel", channel, "--vchannel", "v", "--group", "g1", "--count", "1")
    assert [m["id"] for m in got] == ids[:1]
    rc, out, _ = run(server, "groups", "seek", "--channel", channel, "g1", "--vchannel", "v",
                          "--to", "latest", "--json")
    assert rc == 0 and json.loads(out)["message_id"] >= ids[-1]

    rc, out, _ = run(server, "groups", "destroy", "--channel", channel, "g1")
    assert rc == 0 and out.strip() == "destroyed group g1 on p"
    rc, out, _ = run(server, "groups", "list", "--channel", channel)
    assert [r.split()[1] for r in out.splitlines()[1:]] == ["g2"]
    rc, _, err = run(server, "groups", "describe", "--channel", channel, "g1")
    assert rc == 1 and err.startswith("error: CONSUMER_GROUP_NOT_EXIST: ")


# --- flush ---------------------------------------------------------------------------------------
def test_flush_prints_files_and_flush_timetick(server: str, channel: str) -> None:
    ok(server, "produce", "--channel", channel, "--vchannel", "v", stdin='"x"\n')
    last = consumed(server, "--channel", channel, "--count", "1")[0]["timetick"]
    rc, out, _ = run(server, "flush", "--channel", channel, "--vchannel", "v", "--json")
    answer = json.loads(out)
    assert rc == 0 and answer["flush_timetick"] > last and isinstance(answer["files"], list)
    rc, out, err = run(server, "flush", "--channel", channel, "--vchannel", "v")
    match = re.match(r"flush timetick (\d+) \(\S+\)\n(\d+) file\(s\)", out)
    assert rc == 0 and match is not None, err
    assert int(match[1]) > answer["flush_timetick"] and int(match[2]) == len(out.splitlines()) - 2
    # --collection reaches the node: this one has no collection 'c'.
    rc, _, err = run(server, "flush", "--channel", channel, "--vchannel", "v", "--collection", "c")
    assert rc == 1 and err.startswith("error: COLLECTION_NOT_EXIST: ")


# --- errors --------------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [
    ["produce", "--channel", "nope", "--count", "1"],
    ["consume", "--channel", "nope", "--count", "1"],
    ["channels", "describe", "nope"],
    ["groups", "create", "--channel", "nope", "g"],
    ["flush", "--channel", "nope", "--vchannel", "v"],
])
def test_a_missing_channel_is_error_channel_not_exist_exit_1(server: str, args: list[str]) -> None:
    proc = cli(server, *args, stdin="")
    assert proc.returncode == 1
    assert "error: CHANNEL_NOT_EXIST: " in proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_unreachable_node_gets_a_hint() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{s.getsockname()[1]}"  # bound, never listening: connections are refused
        rc, _, err = run(addr, "channels", "list")
    assert rc == 1
    assert err.startswith("error: UNAVAILABLE: ")
    assert f"is the node running at {addr}?" in err


def test_bad_input_line_stops_after_acking_what_came_before(server: str, channel: str) -> None:
    proc = cli(server, "produce", "--channel", channel, stdin='"good"\n{not json\n"never"\n')
    assert proc.returncode == 1
    assert "error: stdin line 2: not JSON" in proc.stderr
    summary = SUMMARY.search(proc.stderr)
    assert summary is not None and summary[1] == "1"
    assert [m["payload"] for m in consumed(server, "--channel", channel, "--count", "1")] == ['"good"']


def test_address_from_the_environment(server: str) -> None:
    proc = cli(None, "channels", "create", "viaenv", env={**_env(), "STREAMINGNODE_ADDR": server})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "created viaenv"


def test_help_does_not_load_grpc() -> None:
    code = ("import sys\nfrom streamingnode.__main__ import main\n"
            "try:\n    main(['consume', '--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'google', 'wal', 'rocksdict')"
            " and m not in ('wal', 'wal.clock', 'wal.error_codes', 'wal.errors', 'wal.tasks', 'wal.txn_keepalive',"
            " 'wal.zoned_time')))")
    # (standard library only, all of them)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT, check=True)
    assert "--group" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "[]"


# --- parsing (no node needed, kept beside the commands they serve) --------------------------------
def test_default_address_matches_the_config() -> None:
    assert DEFAULT_ADDR == CONFIG_DEFAULT_ADDR


def test_where_parsing() -> None:
    assert parse_where("earliest", "--from") == DeliverPolicy.all()
    assert parse_where("latest", "--from") == DeliverPolicy.latest()
    assert parse_where("42", "--from") == DeliverPolicy.start_from(42)
    assert parse_where("@1.5", "--from") == DeliverPolicy.start_at_time(1500 << 18)
    assert parse_where("1700000000.25", "--from") == DeliverPolicy.start_at_time(1_700_000_000_250 << 18)
    assert parse_where("2024-01-01T00:00:00Z", "--from") == DeliverPolicy.start_at_time(1_704_067_200_000 << 18)
    assert parse_where("2024-01-01T01:00:00+01:00", "--to") == DeliverPolicy.start_at_time(1_704_067_200_000 << 18)


def test_record_parsing_rejects_what_it_cannot_send() -> None:
    assert parse_record(b' {"payload": "x", "id": 3, "type": "DATA"} ', 1, "d") == ("d", b"x", None)
    assert parse_record(b'{"payload": "x", "properties": {"producer_id": "p", "producer_seq": "0", "k": "v"}}',
                        1, "d") == ("d", b"x", {"k": "v"})
    for bad, why in [
        (b'{"payload": "x", "paylod_b64": "eA=="}', "unknown key"),
        (b'{"payload": 1}', "payload must be a string"),
        (b'{"payload": "x", "payload_b64": "eA=="}', "not both"),
        (b'{"payload_b64": "!!"}', "not base64"),
        (b'{"payload": "x", "properties": {"k": 1}}', "properties must be"),
        (b'{"payload": "x", "vchannel": 3}', "vchannel must be"),
        (b"\xff", "not JSON"),
    ]:
        with pytest.raises(CliError, match=f"stdin line 7: .*{why}"):
            parse_record(bad, 7, "d")
