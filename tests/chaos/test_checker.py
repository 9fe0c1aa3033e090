"""The checker's self-test: one hand-written valid run, and doctored copies each caught by the right check.

The base run (nodes n1 and n2, pchannel p0):

- producer ``a`` sends a1, a2, a3 to v0, all acknowledged; producer ``b`` sends to v1: b1 acknowledged,
  b2 failed, b3 unknown (not stored), then b4 acknowledged from a fresh process;
- txn t1 (commit) acknowledged, t2 (rollback) acknowledged, t3 (commit) unknown and stored;
- group g commits a1's then a2's position on v0, and a reopened g resumes from a2 and receives a3, t1's.

Delivery on p0 is a1 a2 b1 a3 t1.0 t1.1 t3.0 t3.1 b4, with message ids 1 2 3 6 4 5 7 8 9: t1's bodies
took ids 4 and 5 before a3 but are delivered at t1's commit, after it.  Terms are 1 up to b1, 2 after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.checker import CHECKS, MalformedRunError, check, main, parse_run

Record = dict[str, Any]
ROOT = Path(__file__).resolve().parents[2]


class Base:
    """The base run as records, with the history line of each step kept by name for the assertions."""

    def __init__(self) -> None:
        self.history: list[Record] = []
        self.at: dict[str, int] = {}
        self.meta: Record = {"seed": 7, "started": "2026-01-01T00:00:00Z", "duration_s": 3.0,
                             "nodes": ["n1", "n2"], "pchannels": ["p0"], "faults": {"kill": 1}}
        self.send("a", "a.0", "v0", "a1", "ok", "1")
        self.send("a", "a.0", "v0", "a2", "ok", "2")
        self.send("b", "b.0", "v1", "b1", "ok", "3")
        self.send("b", "b.0", "v1", "b2", "fail")
        self.send("b", "b.0", "v1", "b3", "info")
        self.line("nemesis", "info", "start", {"fault": "kill", "target": "n1"})
        self.line("nemesis", "info", "stop", {"fault": "kill", "target": "n1"})
        self.txn("t1", ["t1.0", "t1.1"], "commit", "ok", invoke_only=True)
        self.send("a", "a.0", "v0", "a3", "ok", "6")
        self.complete("tx1", "ok", "txn", {}, "t1")
        self.txn("t2", ["t2.0"], "rollback", "ok")
        self.txn("t3", ["t3.0", "t3.1"], "commit", "info")
        self.send("b", "b.1", "v1", "b4", "ok", "9")
        self.commit("c1", "1", "ok")
        self.commit("c2", "2", "ok")
        self.at["resume"] = self.line("g.1", "invoke", "group_resume", {"pchannel": "p0", "vchannel": "v0",
                                                                          "group": "g"})
        self.line("g.1", "ok", "group_resume", {"pchannel": "p0", "vchannel": "v0", "group": "g", "position": "2",
                                                "first_ids": ["a3", "t1.0", "t1.1"]})
        log = [("v0", "a1", None, 1, 1), ("v0", "a2", None, 1, 2), ("v1", "b1", None, 1, 3), ("v0", "a3", None, 2, 6),
               ("v0", "t1.0", "t1", 2, 4), ("v0", "t1.1", "t1", 2, 5), ("v0", "t3.0", "t3", 2, 7),
               ("v0", "t3.1", "t3", 2, 8), ("v1", "b4", None, 2, 9)]
        self.log = [{"vchannel": v, "id": i, "txn": t, "term": term, "message_id": str(mid), "timetick": 100 + n}
                    for n, (v, i, t, term, mid) in enumerate(log)]
        self.reads: dict[str, dict[str, list[Record]]] = {n: {"p0": [dict(e) for e in self.log]} for n in ("n1", "n2")}

    def line(self, process: str, kind: str, f: str, value: Record) -> int:
        i = len(self.history)
        self.history.append({"i": i, "t": 0.5 * i, "process": process, "type": kind, "f": f, "value": value})
        return i

    def complete(self, process: str, kind: str, f: str, value: Record, name: str) -> None:
        self.at[name + "!"] = self.line(process, kind, f, value)

    def send(self, producer: str, process: str, vchannel: str, chaos_id: str, kind: str, mid: str = "") -> None:
        value = {"pchannel": "p0", "vchannel": vchannel, "producer": producer, "id": chaos_id}
        self.at[chaos_id] = self.line(process, "invoke", "send", value)
        self.complete(process, kind, "send", {"message_id": mid} if mid else {}, chaos_id)

    def txn(self, key: str, ids: list[str], decision: str, kind: str, *, invoke_only: bool = False) -> None:
        value = {"pchannel": "p0", "vchannel": "v0", "txn": key, "ids": ids, "decision": decision}
        self.at[key] = self.line("tx" + key[1:], "invoke", "txn", value)
        if not invoke_only:
            self.complete("tx" + key[1:], kind, "txn", {}, key)

    def commit(self, name: str, position: str, kind: str) -> None:
        value = {"pchannel": "p0", "vchannel": "v0", "group": "g", "position": position}
        self.at[name] = self.line("g.0", "invoke", "group_commit", value)
        self.complete("g.0", kind, "group_commit", {}, name)

    def everywhere(self, change: Any) -> None:
        for by_pchannel in self.reads.values():
            change(by_pchannel["p0"])

    def entry(self, chaos_id: str, **changes: Any) -> Record:
        return {**next(e for e in self.log if e["id"] == chaos_id), **changes}

    def found(self) -> dict[str, list[tuple[int, ...]]]:
        out: dict[str, list[tuple[int, ...]]] = {}
        for v in check(parse_run(self.meta, self.history, self.reads)):
            out.setdefault(v.check, []).append(v.lines)
        return out

    def write(self, run_dir: Path) -> Path:
        (run_dir / "run.json").write_text(json.dumps(self.meta))
        (run_dir / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in self.history))
        for node, by_pchannel in self.reads.items():
            (run_dir / "reads" / node).mkdir(parents=True)
            for pchannel, entries in by_pchannel.items():
                text = "".join(json.dumps(e) + "\n" for e in entries)
                (run_dir / "reads" / node / f"{pchannel}.jsonl").write_text(text)
        return run_dir


def test_the_base_run_is_valid() -> None:
    assert Base().found() == {}


def test_a_dropped_acknowledged_send_is_caught() -> None:
    b = Base()
    b.everywhere(lambda log: log.pop(1))  # a2
    assert b.found() == {"sends": [(b.at["a2"], b.at["a2!"])]}


def test_a_duplicated_send_is_caught() -> None:
    b = Base()
    b.everywhere(lambda log: log.append(b.entry("a1", message_id="10", term=2, timetick=200)))
    assert b.found() == {"sends": [(b.at["a1"], b.at["a1!"])]}


def test_an_unknown_send_stored_twice_is_caught() -> None:
    b = Base()
    b.everywhere(lambda log: log.extend([b.entry("b4", id="b3", message_id=str(m)) for m in (10, 11)]))
    assert b.found() == {"sends": [(b.at["b3"], b.at["b3!"])]}


def test_an_unknown_send_stored_once_is_valid() -> None:
    b = Base()
    b.everywhere(lambda log: log.append(b.entry("b4", id="b3", message_id="10", timetick=200)))
    assert b.found() == {}


def test_a_send_the_history_never_completed_is_unknown() -> None:
    b = Base()
    b.at["b5"] = b.line("b.2", "invoke", "send", {"pchannel": "p0", "vchannel": "v1", "producer": "b", "id": "b5"})
    b.everywhere(lambda log: log.append(b.entry("b4", id="b5", message_id="10", timetick=200)))
    assert b.found() == {}
    b.everywhere(lambda log: log.append(b.entry("b4", id="b5", message_id="11", timetick=201)))
    assert b.found() == {"sends": [(b.at["b5"],)]}


def test_a_failed_send_that_is_present_is_caught() -> None:
    b = Base()
    b.everywhere(lambda log: log.append(b.entry("b4", id="b2", message_id="10", timetick=200)))
    assert b.found() == {"sends": [(b.at["b2"], b.at["b2!"])]}


def test_a_message_no_invoke_produced_is_caught() -> None:
    b = Base()
    b.everywhere(lambda log: log.append(b.entry("b4", id="zz", message_id="10", timetick=200)))
    assert b.found() == {"sends": [()]}


def test_a_send_stored_at_another_id_than_its_ack_named_is_caught() -> None:
    b = Base()
    b.everywhere(lambda log: log[0].update(message_id="0"))
    assert b.found() == {"sends": [(b.at["a1"], b.at["a1!"])]}


def test_a_reordered_pair_is_caught() -> None:
    b = Base()
    b.everywhere(lambda log: log.__setitem__(slice(2, 9), [log[8], *log[3:8], log[2]]))  # b4 before b1
    assert b.found() == {"order": [(b.at["b1"], b.at["b1!"], b.at["b4"], b.at["b4!"])]}


def test_a_half_transaction_is_caught() -> None:
    b = Base()
    b.everywhere(lambda log: log.pop(7))  # t3.1: t3's outcome is unknown, so all or nothing
    assert b.found() == {"txns": [(b.at["t3"], b.at["t3!"])]}


def test_an_unknown_transaction_absent_whole_is_valid() -> None:
    b = Base()
    b.everywhere(lambda log: log.__delitem__(slice(6, 8)))
    assert b.found() == {}


def test_a_committed_transaction_missing_a_message_is_caught() -> None:
    b = Base()
    b.everywhere(lambda log: log.pop(5))  # t1.1, which the resumed group also received
    found = b.found()
    assert found["txns"] == [(b.at["t1"], b.at["t1!"])]
    assert set(found) == {"txns", "group-resume"}


def test_a_rolled_back_transaction_that_is_visible_is_caught() -> None:
    b = Base()
    b.everywhere(lambda log: log.append(b.entry("t1.0", id="t2.0", txn="t2", message_id="10", timetick=200)))
    assert b.found() == {"txns": [(b.at["t2"], b.at["t2!"])]}


def test_a_transaction_not_delivered_whole_is_caught() -> None:
    b = Base()
    b.everywhere(lambda log: log.__setitem__(slice(3, 6), [log[4], log[3], log[5]]))  # a3 between t1.0 and t1.1
    assert b.found() == {"txns": [(b.at["t1"], b.at["t1!"])]}


def test_a_stale_term_write_is_caught() -> None:
    b = Base()
    b.everywhere(lambda log: log[8].update(term=1))  # b4, stored after term 2 began, says term 1
    assert b.found() == {"terms": [(b.at["t3"], b.at["t3!"], b.at["b4"], b.at["b4!"])]}


def test_a_group_position_going_backwards_is_caught() -> None:
    b = Base()
    b.commit("c3", "1", "ok")
    assert b.found() == {"group-positions": [(b.at["c2"], b.at["c2!"], b.at["c3"], b.at["c3!"])]}


def test_a_refused_commit_behind_the_group_is_valid() -> None:
    b = Base()
    b.commit("c3", "1", "fail")
    assert b.found() == {}


def test_a_group_resuming_before_its_acknowledged_position_is_caught() -> None:
    b = Base()
    b.history[-1]["value"]["position"] = "1"  # and it received a3 after a1: a2 skipped too
    found = b.found()
    resume = (b.at["resume"], b.at["resume"] + 1)
    assert found["group-positions"] == [(b.at["c2"], b.at["c2!"], *resume)]
    assert set(found) == {"group-positions", "group-resume"}


def test_a_group_committing_a_lower_id_delivered_later_is_valid() -> None:
    """t1.1 (id 5) is delivered after a3 (id 6): a consumer's last message may go down in id order."""
    b = Base()
    b.commit("c3", "6", "ok")
    b.commit("c4", "5", "ok")
    assert b.found() == {}


def test_a_resume_at_a_position_naming_no_message_is_not_compared_by_id() -> None:
    """The node's position is the smallest id not yet delivered, often a BeginTxn's or a time tick's:
    below the consumer's last message in id order when a transaction is open, and not behind it."""
    b = Base()
    b.history[-1]["value"]["position"] = "0"
    assert b.found() == {}


def test_a_resumed_group_receiving_again_what_a_commit_covered_is_caught() -> None:
    b = Base()
    b.history[-1]["value"]["first_ids"] = ["a1", "a2", "a3", "t1.0"]
    resume = (b.at["resume"], b.at["resume"] + 1)
    assert b.found() == {"group-positions": [(b.at["a1"], b.at["a1!"], b.at["c2"], b.at["c2!"], *resume)]}


def test_a_resumed_group_skipping_a_message_is_caught() -> None:
    b = Base()
    b.history[-1]["value"]["first_ids"] = ["t1.0", "t1.1"]  # a3 follows a2 and was never received
    resume = (b.at["resume"], b.at["resume"] + 1)
    assert b.found() == {"group-resume": [(b.at["a3"], b.at["a3!"], *resume)]}


def test_a_resumed_group_receiving_again_the_message_at_its_position_is_valid() -> None:
    b = Base()
    b.history[-1]["value"]["first_ids"] = ["a2", "a3", "t1.0"]
    assert b.found() == {}


def test_a_node_whose_read_differs_is_caught() -> None:
    b = Base()
    b.reads["n2"]["p0"][4]["term"] = 3
    assert b.found() == {"agreement": [(b.at["t1"], b.at["t1!"])]}


def test_a_node_whose_read_is_short_is_caught() -> None:
    b = Base()
    b.reads["n2"]["p0"].pop()
    assert b.found() == {"agreement": [(b.at["b4"], b.at["b4!"])]}


def test_a_read_cut_short_on_the_first_node_is_a_disagreement_not_a_loss() -> None:
    b = Base()
    b.reads["n1"]["p0"].pop()
    assert b.found() == {"agreement": [(b.at["b4"], b.at["b4!"])]}


def test_a_node_without_a_read_is_caught() -> None:
    b = Base()
    del b.reads["n1"]
    assert b.found() == {"agreement": [()]}


def test_every_check_is_exercised_by_a_doctored_run() -> None:
    """A new check needs a doctored run here: the names above cover every entry of CHECKS."""
    names = {"sends", "order", "txns", "group-positions", "group-resume", "terms", "agreement"}
    assert set(CHECKS) == names


# --------------------------------------------------------------------------------------------- the CLI

def test_the_cli_exits_0_on_a_valid_run_with_a_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(Base().write(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "send          ok 5  fail 1  info 1  pending 0" in out
    assert "txn           ok 2  fail 0  info 1  pending 0" in out
    assert "faults started: kill 1" in out
    assert "messages read: 9 (p0 9)" in out
    assert "  terms           0 violation(s)" in out
    assert out.rstrip().endswith("result: valid")


def test_the_cli_exits_1_naming_the_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = Base()
    b.everywhere(lambda log: log.pop(1))
    assert main([str(b.write(tmp_path))]) == 1
    out = capsys.readouterr().out
    assert (f"VIOLATION [sends] acknowledged send 'a2' is not in the log "
            f"(history lines: {b.at['a2']}, {b.at['a2!']})") in out
    assert "  sends           1 violation(s)" in out
    assert out.rstrip().endswith("result: 1 violation(s)")


@pytest.mark.parametrize(("damage", "named"), [
    (lambda d: (d / "history.jsonl").write_text('{"i": 0}\n{oops\n'), "history.jsonl:2: not JSON"),
    (lambda d: (d / "run.json").unlink(), "run.json"),
    (lambda d: (d / "reads" / "n2" / "p0.jsonl").write_text('{"id": "a1"}\n'), "reads/n2/p0.jsonl:1:"),
    (lambda d: (d / "reads" / "n3").mkdir(), "reads/n3: a node run.json does not name"),
], ids=["history", "run.json", "read line", "unknown node"])
def test_the_cli_exits_2_naming_the_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: Any, named: str,
) -> None:
    damage(Base().write(tmp_path))
    assert main([str(tmp_path)]) == 2
    assert named in capsys.readouterr().err


@pytest.mark.parametrize(("change", "problem"), [
    (lambda h: h[3].update(i=4), "history.jsonl:4: 'i' is 4, expected 3"),
    (lambda h: h.pop(0), "history.jsonl:1: ok 'send' of a.0 completes no invoke"),
    (lambda h: h[1].update(process="x"), "history.jsonl:2: ok 'send' of x completes no invoke"),
    (lambda h: h[0]["value"].pop("producer"), "history.jsonl:1: value has no 'producer'"),
    (lambda h: h[1]["value"].update(message_id="0x10"), "history.jsonl:2: message_id must be a message id"),
], ids=["i", "no invoke", "other process", "no producer", "bad message id"])
def test_a_malformed_history_names_its_line(change: Any, problem: str) -> None:
    b = Base()
    change(b.history)
    for n, r in enumerate(b.history):
        r["i"] = r["i"] if n == 3 else n
    with pytest.raises(MalformedRunError, match=problem.replace("(", r"\(")):
        parse_run(b.meta, b.history, b.reads)


def test_a_process_reused_after_an_unknown_outcome_is_malformed() -> None:
    b = Base()
    b.line("b.0", "invoke", "send", {"pchannel": "p0", "vchannel": "v1", "producer": "b", "id": "b5"})
    with pytest.raises(MalformedRunError, match=r"b\.0 is reused after an info outcome"):
        parse_run(b.meta, b.history, b.reads)


def test_python_m_runs_the_checker(tmp_path: Path) -> None:
    b = Base()
    b.reads["n2"]["p0"].pop()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "tests.chaos.checker", str(b.write(tmp_path))], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "VIOLATION [agreement] p0: node n2 differs from node n1 at line 8" in done.stdout
