"""The independent checker of a chaos run: reads what the clients saw and what the log holds, and says
whether the node kept its promises.

It imports nothing of the node, the WAL, the SDK or the harness, only the run directory's files
(``history.jsonl``, ``reads/<node>/<pchannel>.jsonl``, ``run.json``: the chaos history format).  Outcomes
follow Jepsen: ``ok`` is done, ``fail`` certainly not done, ``info`` (or no completion) unknown.  Each
check is one function returning its violations:

- ``sends``: an acknowledged send is stored exactly once (at the id its ack named), an unknown one at
  most once, a failed one never; nothing is stored that no invoke produced, or elsewhere than it said.
- ``order``: per producer and vchannel, acknowledged messages are stored in acknowledgement order.
- ``txns``: committed ones whole, rolled-back and failed ones absent, unknown ones all or nothing; a
  visible one is delivered whole (DESIGN.md, the read path).  Order inside a transaction is not promised.
- ``group-positions``: after an acknowledged commit a group's position is never behind it, and a resumed
  group receives nothing again from before it.
- ``group-resume``: a resumed group skips no acknowledged message.
- ``terms``: in message id order a pchannel's WAL term never goes down (else a stale owner wrote).
- ``agreement``: after heal, every node's read of a pchannel is the same sequence.

``python -m tests.chaos.checker RUN_DIR`` prints a summary and every violation with the history lines
(``i``) involved; it exits 1 on any violation, 0 on none, 2 when the run directory cannot be read.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUTCOMES = ("ok", "fail", "info", "pending")
"""``pending``: invoked, and the history ended before it completed (an unknown outcome, like ``info``)."""


class MalformedRunError(Exception):
    """The run directory cannot be read as a chaos run: names the file, the line (1-based) and why."""

    def __init__(self, source: str, line: int | None, problem: str) -> None:
        where = source if line is None else f"{source}:{line}"
        super().__init__(f"{where}: {problem}")


@dataclass(frozen=True)
class Violation:
    """One broken promise: the check that found it, what is wrong, and the history lines (``i``) involved."""

    check: str
    message: str
    lines: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "lines", tuple(sorted(set(self.lines))))


@dataclass(frozen=True, kw_only=True)
class Operation:
    """An invoke and its completion.  ``done`` is the completion's line, None while pending."""

    pchannel: str
    vchannel: str
    outcome: str
    invoke: int
    done: int | None

    @property
    def lines(self) -> tuple[int, ...]:
        return (self.invoke,) if self.done is None else (self.invoke, self.done)

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


@dataclass(frozen=True, kw_only=True)
class Send(Operation):
    id: str
    producer: str
    acked_at: int | None
    """The message id the acknowledgement named, if it named one."""


@dataclass(frozen=True, kw_only=True)
class Txn(Operation):
    key: str
    ids: tuple[str, ...]
    decision: str


@dataclass(frozen=True, kw_only=True)
class GroupCommit(Operation):
    group: str
    position: int


@dataclass(frozen=True, kw_only=True)
class GroupResume(Operation):
    group: str
    position: int | None
    """None: the group had no committed position and started from the earliest message."""
    first_ids: tuple[str, ...]


@dataclass(frozen=True)
class Entry:
    """One delivered message of a read; ``line`` is its 0-based line in the read file."""

    vchannel: str
    id: str
    txn: str | None
    term: int
    message_id: int
    timetick: int
    line: int


@dataclass(frozen=True)
class Delivery:
    """What a reader of one vchannel (with broadcasts) receives, in order, indexed by chaos and message id."""

    entries: list[Entry]
    at: dict[str, int]
    """chaos id -> index of its first delivery."""
    by_message_id: dict[int, int]


@dataclass
class Run:
    """A parsed run: the operations by kind, and every node's read of every pchannel."""

    meta: dict[str, Any]
    sends: dict[str, Send] = field(default_factory=dict)
    txns: dict[str, Txn] = field(default_factory=dict)
    commits: list[GroupCommit] = field(default_factory=list)
    resumes: list[GroupResume] = field(default_factory=list)
    reads: dict[str, dict[str, list[Entry]]] = field(default_factory=dict)
    """pchannel -> node -> entries in delivery order."""
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    origins: dict[str, Send | Txn] = field(default_factory=dict)
    """chaos id -> the operation that produced it."""
    history_lines: int = 0
    _views: dict[tuple[str, str], Delivery] = field(default_factory=dict, repr=False)

    def log(self, pchannel: str) -> list[Entry]:
        """The reference read of a pchannel, which every check but ``agreement`` reads: the longest (the
        first in run.json's order among equals), so a read cut short shows as a disagreement, not a loss."""
        by_node = self.reads.get(pchannel, {})
        return max((by_node[node] for node in self.meta["nodes"] if node in by_node), key=len, default=[])

    def lines_of(self, *chaos_ids: str) -> tuple[int, ...]:
        """The history lines of the operations that produced these messages (none for a phantom)."""
        return tuple(n for cid in chaos_ids if (op := self.origins.get(cid)) is not None for n in op.lines)

    def occurrences(self) -> dict[str, list[tuple[str, Entry]]]:
        """Every chaos id -> where it lies in the reference logs: (pchannel, entry)."""
        out: dict[str, list[tuple[str, Entry]]] = defaultdict(list)
        for pchannel in self.meta["pchannels"]:
            for e in self.log(pchannel):
                out[e.id].append((pchannel, e))
        return out

    def delivery(self, pchannel: str, vchannel: str) -> Delivery:
        """The reference log as a reader of this vchannel receives it (built once per vchannel)."""
        view = self._views.get((pchannel, vchannel))
        if view is None:
            entries = [e for e in self.log(pchannel) if e.vchannel in (vchannel, "")]
            first = list(reversed(list(enumerate(entries))))  # so the first delivery of an id wins
            view = Delivery(entries, {e.id: n for n, e in first}, {e.message_id: n for n, e in first})
            self._views[(pchannel, vchannel)] = view
        return view

    def acknowledged(self) -> set[str]:
        """Ids whose writing the node acknowledged: ok sends and ok committed transactions."""
        committed = (i for t in self.txns.values() if t.ok and t.decision == "commit" for i in t.ids)
        return {s.id for s in self.sends.values() if s.ok}.union(committed)


# ---------------------------------------------------------------------------------------------- parsing

_RUN_KEYS = ("seed", "started", "duration_s", "nodes", "pchannels", "faults")
_INVOKE_KEYS: dict[str, tuple[str, ...]] = {
    "send": ("pchannel", "vchannel", "producer", "id"),
    "txn": ("pchannel", "vchannel", "txn", "ids", "decision"),
    "group_commit": ("pchannel", "vchannel", "group", "position"),
    "group_resume": (),
}
_RESUME_KEYS = ("pchannel", "vchannel", "group", "position", "first_ids")
_ENTRY_KEYS = ("vchannel", "id", "txn", "term", "message_id", "timetick")


def _message_id(text: object, source: str, line: int, name: str) -> int:
    # The SDK's ids are integers (offsets, totally ordered per pchannel) written as decimal strings.
    if not isinstance(text, str) or not text.isdecimal():
        raise MalformedRunError(source, line, f"{name} must be a message id (a decimal string), got {text!r}")
    return int(text)


def _strings(value: dict[str, Any], keys: Iterable[str], source: str, line: int) -> None:
    for k in keys:
        if k not in value:
            raise MalformedRunError(source, line, f"value has no {k!r}")
        if k in ("ids", "first_ids"):
            if not isinstance(value[k], list) or not all(isinstance(x, str) for x in value[k]):
                raise MalformedRunError(source, line, f"{k!r} must be a list of strings")
        elif k != "position" and not isinstance(value[k], str):
            raise MalformedRunError(source, line, f"{k!r} must be a string, got {value[k]!r}")


def parse_run(meta: object, history: Sequence[object], reads: Mapping[str, Mapping[str, Sequence[object]]]) -> Run:
    """Build a Run from decoded records: run.json, history lines, and reads[node][pchannel] lines."""
    if not isinstance(meta, dict) or any(k not in meta for k in _RUN_KEYS):
        raise MalformedRunError("run.json", None, f"must be an object with {', '.join(_RUN_KEYS)}")
    for k in ("nodes", "pchannels"):
        if not isinstance(meta[k], list) or not all(isinstance(x, str) for x in meta[k]):
            raise MalformedRunError("run.json", None, f"{k!r} must be a list of names")
    run = Run(meta=meta, history_lines=len(history))
    _parse_history(run, history)
    for node, by_pchannel in reads.items():
        if node not in meta["nodes"]:
            raise MalformedRunError(f"reads/{node}", None, "a node run.json does not name")
        for pchannel, records in by_pchannel.items():
            source = f"reads/{node}/{pchannel}.jsonl"
            if pchannel not in meta["pchannels"]:
                raise MalformedRunError(source, None, "a pchannel run.json does not name")
            run.reads.setdefault(pchannel, {})[node] = [_parse_entry(r, source, n) for n, r in enumerate(records)]
    for pchannel in meta["pchannels"]:
        if not run.reads.get(pchannel):
            raise MalformedRunError(f"reads/*/{pchannel}.jsonl", None, "no node has a read of this pchannel")
    return run


def _parse_entry(r: object, source: str, n: int) -> Entry:
    if not isinstance(r, dict) or any(k not in r for k in _ENTRY_KEYS):
        raise MalformedRunError(source, n + 1, f"a read line is an object with {', '.join(_ENTRY_KEYS)}")
    if not isinstance(r["vchannel"], str) or not isinstance(r["id"], str) or not isinstance(r["txn"], str | None):
        raise MalformedRunError(source, n + 1, "vchannel and id must be strings, txn a string or null")
    if any(not isinstance(r[k], int) or isinstance(r[k], bool) for k in ("term", "timetick")):
        raise MalformedRunError(source, n + 1, f"term and timetick must be integers, got {r['term']!r}, "
                                f"{r['timetick']!r}")
    mid = _message_id(r["message_id"], source, n + 1, "message_id")
    return Entry(r["vchannel"], r["id"], r["txn"], r["term"], mid, r["timetick"], n)


def _parse_history(run: Run, records: Sequence[object]) -> None:
    source = "history.jsonl"
    in_flight: dict[str, tuple[str, dict[str, Any], int]] = {}
    retired: set[str] = set()
    for n, rec in enumerate(records):
        if not isinstance(rec, dict) or any(k not in rec for k in ("i", "t", "process", "type", "f", "value")):
            raise MalformedRunError(source, n + 1, "a history line is an object with i, t, process, type, f, value")
        if rec["i"] != n:
            raise MalformedRunError(source, n + 1, f"'i' is {rec['i']!r}, expected {n} (the line number from 0)")
        process, kind, f, value = rec["process"], rec["type"], rec["f"], rec["value"]
        if not isinstance(value, dict) or not isinstance(f, str) or not isinstance(process, str):
            raise MalformedRunError(source, n + 1, "process and f must be strings, value an object")
        if process == "nemesis":
            if kind != "info" or f not in ("start", "stop") or "fault" not in value:
                raise MalformedRunError(source, n + 1, "a nemesis line is info, start|stop, with a fault")
            if f == "start":
                run.faults[str(value["fault"])] += 1
            continue
        if kind == "invoke":
            if process in in_flight:
                raise MalformedRunError(source, n + 1, f"{process} invokes while line {in_flight[process][2]} runs")
            if process in retired:
                raise MalformedRunError(source, n + 1, f"{process} is reused after an info outcome")
            if f in _INVOKE_KEYS:
                _strings(value, _INVOKE_KEYS[f], source, n + 1)
            in_flight[process] = (f, value, n)
        elif kind in ("ok", "fail", "info"):
            started = in_flight.pop(process, None)
            if started is None or started[0] != f:
                raise MalformedRunError(source, n + 1, f"{kind} {f!r} of {process} completes no invoke of {f!r}")
            if kind == "info":
                retired.add(process)
            _add_operation(run, f, {**started[1], **value}, kind, started[2], n)
        else:
            raise MalformedRunError(source, n + 1, f"unknown type {kind!r}")
    for f, value, n in in_flight.values():
        _add_operation(run, f, value, "pending", n, None)


def _add_operation(run: Run, f: str, value: dict[str, Any], outcome: str, invoke: int, done: int | None) -> None:
    run.outcomes[(f, outcome)] += 1
    source, line = "history.jsonl", (done if done is not None else invoke) + 1
    common: dict[str, Any] = {"outcome": outcome, "invoke": invoke, "done": done}
    if f == "send":
        cid = value["id"]
        if cid in run.origins:
            raise MalformedRunError(source, invoke + 1, f"message id {cid!r} is used twice")
        acked = value.get("message_id")
        acked_at = _message_id(acked, source, line, "message_id") if outcome == "ok" and acked is not None else None
        run.sends[cid] = run.origins[cid] = Send(pchannel=value["pchannel"], vchannel=value["vchannel"], id=cid,
                                                 producer=value["producer"], acked_at=acked_at, **common)
    elif f == "txn":
        key = value["txn"]
        if key in run.txns or value["decision"] not in ("commit", "rollback"):
            raise MalformedRunError(source, invoke + 1, f"txn {key!r} is used twice or has no commit|rollback")
        if any(i in run.origins for i in value["ids"]) or len(set(value["ids"])) != len(value["ids"]):
            raise MalformedRunError(source, invoke + 1, f"txn {key!r} reuses a message id")
        txn = run.txns[key] = Txn(pchannel=value["pchannel"], vchannel=value["vchannel"], key=key,
                                  ids=tuple(value["ids"]), decision=value["decision"], **common)
        run.origins.update(dict.fromkeys(txn.ids, txn))
    elif f == "group_commit":
        run.commits.append(GroupCommit(pchannel=value["pchannel"], vchannel=value["vchannel"], group=value["group"],
                                       position=_message_id(value["position"], source, invoke + 1, "position"),
                                       **common))
    elif f == "group_resume" and outcome == "ok":
        _strings(value, _RESUME_KEYS, source, line)
        raw = value["position"]
        position = None if raw in (None, "") else _message_id(raw, source, line, "position")
        run.resumes.append(GroupResume(pchannel=value["pchannel"], vchannel=value["vchannel"], group=value["group"],
                                       position=position, first_ids=tuple(value["first_ids"]), **common))


def load_run(run_dir: Path) -> Run:
    """Read a run directory; MalformedRunError names the file and line that cannot be read."""
    meta = _read_jsonl(run_dir / "run.json", run_dir, whole=True)[0]
    history = _read_jsonl(run_dir / "history.jsonl", run_dir)
    reads_dir = run_dir / "reads"
    if not reads_dir.is_dir():
        raise MalformedRunError("reads/", None, "missing: the final reads of every pchannel")
    reads: dict[str, dict[str, Sequence[object]]] = {}
    for node_dir in sorted(p for p in reads_dir.iterdir() if p.is_dir()):
        reads[node_dir.name] = {p.name.removesuffix(".jsonl"): _read_jsonl(p, run_dir)
                                for p in sorted(node_dir.glob("*.jsonl"))}
    return parse_run(meta, history, reads)


def _read_jsonl(path: Path, root: Path, *, whole: bool = False) -> list[object]:
    """One JSON value per line (or the whole file as one, ``whole``); errors name the file and line."""
    name = str(path.relative_to(root))
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise MalformedRunError(name, None, str(e)) from e
    out: list[object] = []
    for n, line in enumerate([text] if whole else text.splitlines()):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise MalformedRunError(name, None if whole else n + 1, f"not JSON: {e}") from e
    return out


# ----------------------------------------------------------------------------------------------- checks

def check_sends(run: Run) -> list[Violation]:
    """Acknowledged: once, at its acked id; unknown: at most once; failed: never; nothing unproduced."""
    out: list[Violation] = []
    where = run.occurrences()
    for s in run.sends.values():
        found = where.get(s.id, [])
        if s.ok and not found:
            out.append(Violation("sends", f"acknowledged send {s.id!r} is not in the log", s.lines))
        if s.outcome == "fail" and found:
            out.append(Violation("sends", f"failed send {s.id!r} is in the log", s.lines))
        if len(found) > 1:
            out.append(Violation("sends", f"{s.outcome} send {s.id!r} is in the log {len(found)} times", s.lines))
        for pchannel, e in found:
            if (pchannel, e.vchannel, e.txn) != (s.pchannel, s.vchannel, None):
                out.append(Violation("sends", f"send {s.id!r} to {s.pchannel}/{s.vchannel} is stored in "
                                     f"{pchannel}/{e.vchannel} (txn {e.txn})", s.lines))
            elif s.acked_at is not None and e.message_id != s.acked_at and len(found) == 1:
                out.append(Violation("sends", f"send {s.id!r} was acknowledged at message id {s.acked_at} "
                                     f"but is stored at {e.message_id}", s.lines))
    for cid, found in where.items():
        if cid not in run.origins:
            spots = ", ".join(f"{p} line {e.line}" for p, e in found)
            out.append(Violation("sends", f"message {cid!r} in the log ({spots}) was produced by no invoke", ()))
    return out


def check_order(run: Run) -> list[Violation]:
    """Per producer and vchannel, acknowledged messages lie in the log in send and acknowledgement order.
    Only pairs whose invoke and ack orders agree are compared: the others say nothing of the log."""
    out: list[Violation] = []
    streams: dict[tuple[str, str, str], list[Send]] = defaultdict(list)
    for s in run.sends.values():
        if s.ok and s.id in run.delivery(s.pchannel, s.vchannel).at:
            streams[(s.producer, s.pchannel, s.vchannel)].append(s)
    for (producer, pchannel, vchannel), sends in streams.items():
        sends.sort(key=lambda s: s.invoke)
        at = run.delivery(pchannel, vchannel).at
        for a, b in itertools.pairwise(sends):
            if a.done is not None and b.done is not None and a.done < b.done and at[b.id] < at[a.id]:
                out.append(Violation("order", f"producer {producer!r} on {pchannel}/{vchannel}: {a.id!r} was "
                                     f"acknowledged before {b.id!r} but lies after it in the log",
                                     a.lines + b.lines))
    return out


def check_txns(run: Run) -> list[Violation]:
    """Committed whole, rolled back and failed absent, unknown all or nothing; visible ones delivered whole."""
    out: list[Violation] = []
    where = run.occurrences()
    for t in run.txns.values():
        found = [(p, e) for i in t.ids for p, e in where.get(i, [])]
        present = {e.id for _, e in found}
        label = f"txn {t.key!r} ({t.decision}, {t.outcome})"
        if found and (t.decision == "rollback" or t.outcome == "fail"):
            out.append(Violation("txns", f"{label} is visible: {sorted(present)}", t.lines))
            continue
        missing = [i for i in t.ids if i not in present]
        if ((t.ok and t.decision == "commit") or present) and missing:
            out.append(Violation("txns", f"{label} is half there: missing {missing}", t.lines))
        if len(found) > len(present):
            out.append(Violation("txns", f"{label} has duplicated messages", t.lines))
        for p, e in found:
            if (p, e.vchannel, e.txn) != (t.pchannel, t.vchannel, t.key):
                out.append(Violation("txns", f"{label}: {e.id!r} is stored in {p}/{e.vchannel} with txn {e.txn}",
                                     t.lines))
        if found and not missing:
            view = run.delivery(t.pchannel, t.vchannel)
            spots = sorted(view.at[i] for i in present if i in view.at)
            if spots and spots[-1] - spots[0] + 1 != len(spots):
                out.append(Violation("txns", f"{label} is not delivered whole: other messages of "
                                     f"{t.pchannel}/{t.vchannel} lie between its messages", t.lines))
    return out


def _behind(view: Delivery, earlier: int, later: int | None) -> bool:
    """Whether position ``later`` (None: no position) is behind ``earlier``.  Positions naming delivered
    messages compare in delivery order (a transaction's bodies keep their early ids), two naming none by
    id (the node's order); one of each is not compared: a consumer's last message and the node's position
    (the smallest id not yet delivered: an open transaction's BeginTxn) are different kinds."""
    if later is None:
        return True
    a, b = view.by_message_id.get(earlier), view.by_message_id.get(later)
    if a is not None and b is not None:
        return b < a
    return a is None and b is None and later < earlier


def check_group_positions(run: Run) -> list[Violation]:
    """No commit or resume is behind the latest commit acknowledged before it was invoked, and a resumed
    group receives again nothing delivered before the message that commit named."""
    out: list[Violation] = []
    acked: dict[tuple[str, str, str], list[GroupCommit]] = defaultdict(list)
    for c in sorted((c for c in run.commits if c.ok), key=lambda c: c.done or 0):
        acked[(c.group, c.pchannel, c.vchannel)].append(c)
    ends = {key: [c.done or 0 for c in commits] for key, commits in acked.items()}
    ops: list[GroupCommit | GroupResume] = [*run.commits, *run.resumes]
    for op in ops:
        key = (op.group, op.pchannel, op.vchannel)
        n = bisect.bisect_left(ends.get(key, []), op.invoke)
        if not op.ok or n == 0:
            continue
        prior, view = acked[key][n - 1], run.delivery(op.pchannel, op.vchannel)
        where = f"group {op.group!r} on {op.pchannel}/{op.vchannel}"
        if _behind(view, prior.position, op.position):
            what = "committed" if isinstance(op, GroupCommit) else "resumed from"
            out.append(Violation("group-positions", f"{where} {what} {op.position} after {prior.position} was "
                                 "acknowledged", prior.lines + op.lines))
        covered = view.by_message_id.get(prior.position)
        if isinstance(op, GroupResume) and covered is not None:
            again = [i for i in op.first_ids if view.at.get(i, covered) < covered]
            if again:
                out.append(Violation("group-positions", f"{where} resumed and received {again} again, delivered "
                                     f"before {prior.position} that an acknowledged commit covered",
                                     prior.lines + op.lines + run.lines_of(*again)))
    return out


def check_group_resumes(run: Run) -> list[Violation]:
    """Between the resumed position and the furthest message received, every acknowledged one was received."""
    out: list[Violation] = []
    acked = run.acknowledged()
    for r in run.resumes:
        view = run.delivery(r.pchannel, r.vchannel)
        label = f"group {r.group!r} resumed on {r.pchannel}/{r.vchannel} from {r.position}"
        strays = [i for i in r.first_ids if i not in view.at]
        if strays:
            out.append(Violation("group-resume", f"{label} received {strays}, which its vchannel's log does not "
                                 "hold", r.lines + run.lines_of(*strays)))
        received = [view.at[i] for i in r.first_ids if i in view.at]
        if not received:
            continue
        # The message at the position may come again (at-least-once); what follows it must all come.  A
        # position that names no message of the vchannel leaves only the span of what was received.
        start = -1 if r.position is None else view.by_message_id.get(r.position, min(received))
        given = set(r.first_ids)
        skipped = [e.id for e in view.entries[start + 1:max(received) + 1] if e.id in acked and e.id not in given]
        if skipped:
            out.append(Violation("group-resume", f"{label} skipped acknowledged {skipped}",
                                 r.lines + run.lines_of(*skipped)))
    return out


def check_terms(run: Run) -> list[Violation]:
    """In message id order a pchannel's terms never go down: a lower term is a stale owner's write."""
    out: list[Violation] = []
    for pchannel in run.meta["pchannels"]:
        stored = sorted(run.log(pchannel), key=lambda e: e.message_id)
        for a, b in itertools.pairwise(stored):
            if b.term < a.term:
                out.append(Violation("terms", f"{pchannel}: {b.id!r} at message id {b.message_id} has term {b.term} "
                                     f"after {a.id!r} at {a.message_id} with term {a.term}: a write by a stale owner",
                                     run.lines_of(a.id, b.id)))
    return out


def _key(e: Entry) -> tuple[object, ...]:
    return (e.vchannel, e.id, e.txn, e.term, e.message_id, e.timetick)


def check_agreement(run: Run) -> list[Violation]:
    """Every node's read of a pchannel is the same sequence (reported at its first difference)."""
    out: list[Violation] = []
    for pchannel in run.meta["pchannels"]:
        reference = run.log(pchannel)
        by_node = run.reads.get(pchannel, {})
        first = next(n for n in run.meta["nodes"] if by_node.get(n) is reference)
        for node in run.meta["nodes"]:
            if node not in by_node:
                out.append(Violation("agreement", f"{pchannel}: node {node} has no read", ()))
                continue
            other = by_node[node]
            n = next((n for n, (a, b) in enumerate(zip(reference, other, strict=False)) if _key(a) != _key(b)),
                     min(len(reference), len(other)))
            if n == len(reference) == len(other):
                continue
            mine = _key(reference[n]) if n < len(reference) else "the end"
            theirs = _key(other[n]) if n < len(other) else "the end"
            ids = [x[n].id for x in (reference, other) if n < len(x)]
            out.append(Violation("agreement", f"{pchannel}: node {node} differs from node {first} at line {n}: "
                                 f"{theirs} against {mine}", run.lines_of(*ids)))
    return out


CHECKS: dict[str, Callable[[Run], list[Violation]]] = {
    "sends": check_sends,
    "order": check_order,
    "txns": check_txns,
    "group-positions": check_group_positions,
    "group-resume": check_group_resumes,
    "terms": check_terms,
    "agreement": check_agreement,
}


def check(run: Run) -> list[Violation]:
    """Every check's violations, in the order of CHECKS."""
    return [v for fn in CHECKS.values() for v in fn(run)]


# -------------------------------------------------------------------------------------------------- CLI

def summary(run: Run, violations: Sequence[Violation]) -> str:
    """The report: operations by type and outcome, faults, messages read, per-check counts, violations."""
    m = run.meta
    out = [f"run: seed {m['seed']}, {run.history_lines} history lines, nodes {', '.join(m['nodes'])}, "
           f"pchannels {', '.join(m['pchannels'])}", "operations:"]
    for f in sorted({f for f, _ in run.outcomes}):
        out.append(f"  {f:<14}" + "  ".join(f"{o} {run.outcomes[(f, o)]}" for o in OUTCOMES))
    faults = ", ".join(f"{k} {n}" for k, n in sorted(run.faults.items())) or "none"
    out.append(f"faults started: {faults}")
    per = ", ".join(f"{p} {len(run.log(p))}" for p in m["pchannels"])
    out.append(f"messages read: {sum(len(run.log(p)) for p in m['pchannels'])} ({per})")
    stored = run.occurrences()
    unknown = [i for i, op in run.origins.items() if op.outcome in ("info", "pending")
               and not (isinstance(op, Txn) and op.decision == "rollback")]
    landed = sum(1 for i in unknown if i in stored)
    out.append(f"messages acknowledged: {len(run.acknowledged())}; of unknown outcome: {len(unknown)} "
               f"({landed} stored, {len(unknown) - landed} not)")
    counts = Counter(v.check for v in violations)
    out.append("checks:")
    out.extend(f"  {name:<16}{counts[name]} violation(s)" for name in CHECKS)
    for v in violations:
        lines = ", ".join(map(str, v.lines)) or "none"
        out.append(f"VIOLATION [{v.check}] {v.message} (history lines: {lines})")
    out.append(f"result: {len(violations)} violation(s)" if violations else "result: valid")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.checker", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a chaos run directory (history.jsonl, reads/, run.json)")
    args = parser.parse_args(argv)
    try:
        run = load_run(args.run_dir)
    except MalformedRunError as e:
        print(f"unreadable run {args.run_dir}: {e}", file=sys.stderr)
        return 2
    violations = check(run)
    print(summary(run, violations))
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
