"""What an operator meets in the first hour: raw payloads out of ``consume``, unknown groups named, a
``groups create --if-not-exists`` the node does not count as a refusal, a refused produce that prints
only its error, and "did you mean" for a mistyped command, choice or flag.

Every command runs as a subprocess against a real node (see test_cli.py for why).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import pytest

from streamingnode.client import Client
from streamingnode.server import ServerThread
from tests.integration.test_cli import SUMMARY, TIMEOUT, _env, cli, consumed, ok
from tests.integration.test_metrics import scrape

pytestmark = pytest.mark.integration


def raw_out(server: str, *args: str) -> bytes:
    """stdout of ``consume --quiet --exit`` with ``args``, as bytes."""
    proc = subprocess.run([sys.executable, "-m", "streamingnode", "consume", "--quiet", "--exit", *args,
                           "--addr", server], capture_output=True, timeout=TIMEOUT, env=_env(), check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


# --- consume --format raw --------------------------------------------------------------------------------
def test_consume_raw_prints_payload_bytes_then_the_delimiter(server: str) -> None:
    ok(server, "channels", "create", "p")
    binary = bytes([0, 255, 10, 13]) + "é".encode()
    lines = [{"vchannel": "eu", "payload": "one"}, {"vchannel": "us", "payload_b64": base64.b64encode(binary).decode()},
             {"vchannel": "eu", "payload": ""}]
    ok(server, "produce", "--channel", "p", stdin="".join(json.dumps(x) + "\n" for x in lines))
    with Client(server) as client, client.txn("p", "eu") as tx:
        tx.send(b"in txn")  # its BEGIN_TXN and COMMIT_TXN carry no payload: not printed

    assert raw_out(server, "--channel", "p", "--format", "raw") == b"one\n" + binary + b"\n\nin txn\n"
    assert raw_out(server, "--channel", "p", "--format", "raw", "-K", ":", "-D", r"\0") == (
        b"eu:one\0us:" + binary + b"\0eu:\0eu:in txn\0")
    assert raw_out(server, "--channel", "p", "--format", "raw", "--delimiter", "") == b"one" + binary + b"in txn"
    assert raw_out(server, "--channel", "p", "--format", "raw", "--vchannel", "us") == binary + b"\n"
    # --type still chooses: framing messages print their (empty) payloads when asked for.
    assert raw_out(server, "--channel", "p", "--format", "raw", "--type", "begin_txn,commit_txn") == b"\n\n"
    assert raw_out(server, "--channel", "p", "--format", "raw", "--count", "1") == b"one\n"


def test_raw_consume_output_is_what_raw_produce_reads(server: str) -> None:
    ok(server, "channels", "create", "src")
    ok(server, "channels", "create", "dst")
    ok(server, "produce", "--channel", "src", "--format", "raw", "-K", ":", stdin="eu:a b\nus:c:d\n")
    copied = raw_out(server, "--channel", "src", "--format", "raw", "-K", ":")
    assert copied == b"eu:a b\nus:c:d\n"
    ok(server, "produce", "--channel", "dst", "--format", "raw", "-K", ":", stdin=copied.decode())
    assert [(m["vchannel"], m["payload"]) for m in consumed(server, "--channel", "dst", "--exit")] == [
        ("eu", "a b"), ("us", "c:d")]


def test_raw_options_need_raw_and_known_escapes(server: str) -> None:
    ok(server, "channels", "create", "p")
    for option in (["-K", ":"], ["-D", ";"]):
        proc = cli(server, "consume", "--channel", "p", "--exit", *option)
        assert proc.returncode == 1 and "need --format raw" in proc.stderr, proc.stderr
    proc = cli(server, "consume", "--channel", "p", "--exit", "--format", "raw", "-D", r"\q")
    assert proc.returncode == 1 and r"-D/--delimiter: unknown escape '\\q'" in proc.stderr, proc.stderr


# --- groups describe: unknown groups are named, exit 1 -------------------------------------------------
def test_groups_describe_names_unknown_groups_and_fails(server: str) -> None:
    ok(server, "channels", "create", "orders")
    ok(server, "groups", "create", "--channel", "orders", "billing")
    # The --channel forgotten: "orders" is taken as a group name.
    proc = cli(server, "groups", "describe", "orders", "billing")
    assert proc.returncode == 1
    assert "orders    billing" in proc.stdout, proc.stdout  # what was found is still shown
    assert proc.stderr.strip() == ("error: no pchannel has a consumer group named 'orders' ('orders' is a pchannel: "
                                   "did you mean --channel orders?)"), proc.stderr
    proc = cli(server, "groups", "describe", "--json", "nope", "gone")
    assert proc.returncode == 1 and json.loads(proc.stdout) == []
    assert proc.stderr.strip() == "error: no pchannel has a consumer group named 'nope' or 'gone'", proc.stderr
    # Found everywhere asked: exit 0, as before; with --channel the node names an unknown group itself.
    assert "billing" in ok(server, "groups", "describe", "billing").stdout
    assert "billing" in ok(server, "groups", "describe", "--channel", "orders", "billing").stdout
    proc = cli(server, "groups", "describe", "--channel", "orders", "nope")
    assert proc.returncode == 1 and "CONSUMER_GROUP_NOT_EXIST" in proc.stderr, proc.stderr


# --- groups create --if-not-exists: quiet on the node -------------------------------------------------
def _refusals(server_thread: ServerThread) -> dict[str, float]:
    assert server_thread.metrics_address is not None
    return {dict(labels)["rpc"] + "/" + dict(labels)["code"]: v
            for (name, labels), v in scrape(server_thread.metrics_address).items()
            if name == "streamingnode_refusals_total"}


def test_groups_create_if_not_exists_is_no_refusal(server_thread: ServerThread) -> None:
    server = server_thread.address
    ok(server, "channels", "create", "a", "b")
    ok(server, "groups", "create", "--channel", "b", "g")  # the same name on another pchannel
    assert ok(server, "groups", "create", "--channel", "a", "g", "--if-not-exists").stdout == "created group g on a\n"
    for _ in range(3):
        assert ok(server, "groups", "create", "--channel", "a", "g", "h", "--if-not-exists").stdout.splitlines() in (
            ["group g exists on a", "created group h on a"], ["group g exists on a", "group h exists on a"])
    assert _refusals(server_thread) == {}, "an existing group is no refusal with --if-not-exists"
    # Without it, an existing group is still an error the node refuses (and counts).
    proc = cli(server, "groups", "create", "--channel", "a", "g")
    assert proc.returncode == 1 and "CONSUMER_GROUP_EXIST" in proc.stderr, proc.stderr
    assert list(_refusals(server_thread)) == ["CreateConsumerGroup/consumer_group_exist"]


# --- a refused produce prints only its error ------------------------------------------------------------
def test_a_refused_produce_prints_only_the_error(server: str) -> None:
    ok(server, "channels", "create", "p")
    proc = cli(server, "produce", "--channel", "p", "--vchannel", "bad/name", stdin='"x"\n')
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: INVALID_ARGUMENT: invalid vchannel name"), proc.stderr
    assert "produced" not in proc.stderr, proc.stderr
    proc = cli(server, "produce", "--channel", "p", stdin="not json\n")
    assert proc.returncode == 1 and proc.stderr.startswith("error: stdin line 1: not JSON"), proc.stderr
    assert "produced" not in proc.stderr
    # What was acknowledged before a failure is still summed up: it is durable.
    proc = cli(server, "produce", "--channel", "p", stdin='"a"\n"b"\nnot json\n')
    assert proc.returncode == 1 and "error: stdin line 3: not JSON" in proc.stderr
    match = SUMMARY.search(proc.stderr)
    assert match is not None and match.group(1) == "2", proc.stderr


# --- did you mean --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("argv", "said"), [
    (["grops", "list"], "invalid choice: 'grops' (choose from 'serve', "),
    (["grops", "list"], "; did you mean 'groups'?"),
    (["groups", "describ"], "streamingnode groups: error: argument action: invalid choice: 'describ' "
                            "(choose from 'create', 'destroy', 'list', 'describe', 'seek'); did you mean 'describe'?"),
    (["groups", "describe", "--chanel", "p"],
     "streamingnode groups describe: error: unrecognized arguments: --chanel; --chanel: did you mean --channel?"),
    (["consume", "--channel", "p", "--format", "rw"],
     "argument --format: invalid choice: 'rw' (choose from 'json', 'raw'); did you mean 'raw'?"),
    # A mistyped required flag fails as "required", and says which flag was meant.
    (["produce", "--chanel", "p"], "the following arguments are required: --channel; --chanel: did you mean "
                                   "--channel or --vchannel?"),
    (["produce", "--channel", "p", "--formt=raw"], "--formt: did you mean --format?"),
    (["serve", "--data-dri", "x"], "unrecognized arguments: --data-dri x; --data-dri: did you mean --data-dir"),
])
def test_mistyped_commands_and_flags_get_a_did_you_mean(argv: list[str], said: str) -> None:
    proc = cli(None, *argv)
    assert proc.returncode == 2
    assert said in proc.stderr, proc.stderr
    assert proc.stderr.startswith("usage: "), proc.stderr


def test_nothing_close_gets_no_guess() -> None:
    proc = cli(None, "groups", "describe", "--zzzzzz")
    assert proc.returncode == 2
    assert proc.stderr.rstrip().endswith("error: unrecognized arguments: --zzzzzz"), proc.stderr
    proc = cli(None, "xyzzy")
    assert proc.returncode == 2 and "did you mean" not in proc.stderr, proc.stderr
