"""The contract is usable from another language with proto/ alone: examples/node/demo.js (grpc-js and
proto-loader from npm) creates a pchannel, produces, runs a transaction, consumes everything back and
decodes the ErrorInfo of a refused call, against a real node.

The packages are installed with ``npm ci`` from the committed lock file when examples/node/node_modules
does not hold the pinned versions (CI installs them first, in .ci/run).  Node.js is a requirement of
the suite, like Debian's prometheus: a machine without it fails here, saying what to install.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from tests.integration.rpc_helpers import consume

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "node"
TWO_TO_THE_53 = 2**53


def _installed() -> bool:
    """Whether node_modules holds exactly the versions package.json pins."""
    pinned = json.loads((EXAMPLE / "package.json").read_text())["dependencies"]
    for name, version in pinned.items():
        manifest = EXAMPLE / "node_modules" / name / "package.json"
        if not manifest.is_file() or json.loads(manifest.read_text()).get("version") != version:
            return False
    return True


def _node() -> str:
    node, npm = shutil.which("node") or shutil.which("nodejs"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("Node.js and npm are needed by this test: apt-get install nodejs npm")
    if not _installed():
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=EXAMPLE, capture_output=True, text=True,
                              timeout=240, check=False)
        assert done.returncode == 0, f"npm ci failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        assert _installed()
    return node


async def test_the_node_example_produces_consumes_runs_a_transaction_and_decodes_error_info(server: str,
                                                                                           stub) -> None:
    node = await asyncio.to_thread(_node)
    run = await asyncio.to_thread(subprocess.run, [node, str(EXAMPLE / "demo.js"), server, "from-node"],
                                  capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, f"demo.js failed:\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}"
    steps = {line["step"]: line for line in map(json.loads, run.stdout.splitlines())}
    assert list(steps) == ["created", "produced", "transaction", "consumed", "refused", "refused_batch",
                           "idempotent", "fenced", "mismatch"]

    messages = steps["consumed"]["messages"]
    txn_id = steps["transaction"]["txn_id"]
    assert [(m["type"], m["payload"], m["txn_id"]) for m in messages] == [
        ("MESSAGE_TYPE_DATA", "one", "0"), ("MESSAGE_TYPE_DATA", "two", "0"),
        ("MESSAGE_TYPE_BEGIN_TXN", "", txn_id), ("MESSAGE_TYPE_DATA", "in the transaction", txn_id),
        ("MESSAGE_TYPE_COMMIT_TXN", "", txn_id)]
    assert steps["transaction"]["body"] == "appended"
    assert steps["consumed"]["timeticks_beyond_2_53"] is True

    # The timeticks JavaScript saw are the node's, to the last bit (they are beyond 2^53).
    packs = await consume(stub, spb.ConsumeOpen(pchannel="from-node", vchannel="v"), until=5)
    ours = [str(m.timetick) for p in packs for m in p.messages if m.type != pb.MESSAGE_TYPE_TIME_TICK]
    assert [m["timetick"] for m in messages] == ours
    assert all(int(t) > TWO_TO_THE_53 for t in ours)
    assert steps["produced"]["timeticks"] == ours[:2]
    assert steps["transaction"]["commit_timetick"] == ours[-1]

    refused = steps["refused"]
    assert refused["grpc_code"] == "NOT_FOUND"
    assert refused["error_info"] == {
        "status_code": 5, "message": "pchannel 'no-such-pchannel' does not exist", "reason": "CHANNEL_NOT_EXIST",
        "domain": "streamingnode", "metadata": {"channel": "no-such-pchannel"}}
    assert steps["refused_batch"] == {"step": "refused_batch", "outcome": "error",
                                      "code": "ERROR_CODE_INVALID_ARGUMENT",
                                      "message": "INSERT needs the 'collection' property"}

    # Producer identity from another language: epochs, the next sequence, and the two refusals.
    assert steps["idempotent"] == {"step": "idempotent", "epoch": "1", "next_sequence": "0", "outcome": "appended",
                                   "reopened_epoch": "2", "reopened_next_sequence": "1"}
    fenced = steps["fenced"]
    assert fenced["grpc_code"] == "FAILED_PRECONDITION"
    assert fenced["error_info"]["reason"] == "PRODUCER_FENCED"
    assert fenced["error_info"]["metadata"] == {"producer_id": "node-demo-producer", "epoch": "1",
                                                "current_epoch": "2"}
    assert steps["mismatch"] == {"step": "mismatch", "outcome": "error",
                                 "code": "ERROR_CODE_DUPLICATE_SEQUENCE_MISMATCH",
                                 "metadata": {"producer_id": "node-demo-producer", "sequence": "0"}}
    packs = await consume(stub, spb.ConsumeOpen(pchannel="from-node", vchannel="idem"), until=1)
    assert [m.payload for p in packs for m in p.messages if m.type == pb.MESSAGE_TYPE_DATA] == [b"once"]


async def test_the_node_example_runs_twice_on_the_same_pchannel(server: str, stub) -> None:
    node = await asyncio.to_thread(_node)
    runs = []
    for _ in range(2):
        run = await asyncio.to_thread(subprocess.run, [node, str(EXAMPLE / "demo.js"), server, "twice"],
                                      capture_output=True, text=True, timeout=120, check=False)
        assert run.returncode == 0, f"demo.js failed:\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}"
        runs.append({line["step"]: line for line in map(json.loads, run.stdout.splitlines())})
    first, second = runs
    assert first["created"] == {"step": "created", "pchannel": "twice", "existed": False}
    assert second["created"] == {"step": "created", "pchannel": "twice", "existed": True}
    assert list(second) == list(first)
    # The second run reads what it wrote, not the first run's messages.
    for steps in runs:
        txn_id = steps["transaction"]["txn_id"]
        assert [(m["type"], m["payload"], m["txn_id"]) for m in steps["consumed"]["messages"]] == [
            ("MESSAGE_TYPE_DATA", "one", "0"), ("MESSAGE_TYPE_DATA", "two", "0"),
            ("MESSAGE_TYPE_BEGIN_TXN", "", txn_id), ("MESSAGE_TYPE_DATA", "in the transaction", txn_id),
            ("MESSAGE_TYPE_COMMIT_TXN", "", txn_id)]
        assert [m["timetick"] for m in steps["consumed"]["messages"][:2]] == steps["produced"]["timeticks"]
    assert first["transaction"]["txn_id"] != second["transaction"]["txn_id"]
    # The producer continues where the node says: the next epoch and sequence, fenced and refused alike.
    idem = second["idempotent"]
    assert idem == {"step": "idempotent", "epoch": "3", "next_sequence": "1", "outcome": "appended",
                    "reopened_epoch": "4", "reopened_next_sequence": "2"}
    assert second["fenced"]["error_info"]["reason"] == "PRODUCER_FENCED"
    assert second["mismatch"] == {"step": "mismatch", "outcome": "error",
                                  "code": "ERROR_CODE_DUPLICATE_SEQUENCE_MISMATCH",
                                  "metadata": {"producer_id": "node-demo-producer", "sequence": "1"}}
    packs = await consume(stub, spb.ConsumeOpen(pchannel="twice", vchannel="idem"), until=2)
    assert [m.payload for p in packs for m in p.messages if m.type == pb.MESSAGE_TYPE_DATA] == [b"once", b"once"]
