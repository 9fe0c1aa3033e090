"""The checker against a plain model of the system: valid histories pass, one mutation is always caught.

``Walk`` plays producers, transactions and consumer groups against a model node, one seeded random step
at a time, and writes the history and the final reads in the run directory format, the way the harness
does.  Operations overlap (each process has one in flight, several may feed one producer), unknown
outcomes land now, later or never, owners are replaced (the term goes up), transaction bodies take their
ids when written and are delivered whole at the commit (so delivery order is not id order), a group's
commit behind its position is refused, and positions are recorded as the last message consumed or as the
node's position (the smallest id not yet delivered).  Whatever the walk does, the checker must find
nothing (no false positive); after one mutation of the log or of a resume it must report the kind of
fault planted (no false negative).
"""

from __future__ import annotations

import functools
import itertools
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.chaos.checker import Run, check, parse_run

Record = dict[str, Any]
SEEDS = range(300)


@dataclass
class _Pending:
    """An operation in flight: its process, kind and what it will write when it takes effect."""

    process: str
    f: str
    value: Record
    reserved: list[Record] = field(default_factory=list)
    """A transaction's bodies: stored (id and term fixed) at the invoke, delivered at the commit."""
    term: int = 0
    begin: int = 0
    """A transaction's BeginTxn id (no chaos message: reads never show it)."""
    covers: tuple[int, str, str] = (0, "", "")
    """A group commit's (messages of the delivery it covers, last message id, node's position id)."""


@dataclass
class _Group:
    name: str
    pchannel: str
    vchannel: str
    process: str
    covered: int = 0
    """How many messages of the vchannel's delivery the committed position covers."""
    resume_at: str | None = None
    """The committed position as a reopened group reports it."""
    seen: int = 0
    """How many messages of the vchannel's delivery its consumer has received."""


class Walk:
    """A seeded random run of the model system, written as history records and reads."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        rng = self.rng
        self.nodes = [f"n{k}" for k in range(rng.randint(1, 3))]
        self.pchannels = [f"p{k}" for k in range(rng.randint(1, 2))]
        self.vchannels = [f"v{k}" for k in range(rng.randint(1, 3))]
        self.history: list[Record] = []
        self.delivery: dict[str, list[Record]] = {p: [] for p in self.pchannels}
        self.next_mid = dict.fromkeys(self.pchannels, 1)
        self.term = dict.fromkeys(self.pchannels, 1)
        self.tick = 0
        self.fresh = itertools.count()
        # A producer may be fed by several processes at once, as the harness's senders share one.
        self.producers = {f"prod{k}": (rng.choice(self.pchannels), [f"prod{k}.{n}" for n in range(rng.randint(1, 3))])
                          for k in range(rng.randint(1, 3))}
        self.groups = [_Group(f"g{k}", rng.choice(self.pchannels), rng.choice(self.vchannels), f"g{k}.0")
                       for k in range(rng.randint(0, 2))]
        self.in_flight: dict[str, _Pending] = {}
        self.deferred: list[_Pending] = []
        self.faults: dict[str, int] = {}
        self.begin_of: dict[str, int] = {}
        # What a group commit names, and what a resume reports: the last message consumed, or the node's
        # position (the smallest id not yet delivered).  The harness may record either; the node stores
        # the second.
        self.commits_name, self.resumes_name = rng.choice([("consumed", "consumed"), ("consumed", "node"),
                                                           ("node", "node")])

    # ------------------------------------------------------------------------------------------ writing
    def line(self, process: str, kind: str, f: str, value: Record) -> int:
        i = len(self.history)
        self.history.append({"i": i, "t": float(i), "process": process, "type": kind, "f": f, "value": value})
        return i

    def store(self, pchannel: str, vchannel: str, chaos_id: str, txn: str | None) -> Record:
        """Append to the log: the next id, the owner's term, the next timetick."""
        mid = self.next_mid[pchannel]
        self.next_mid[pchannel] += self.rng.choice((1, 1, 2))  # ids of time ticks and txn markers leave gaps
        self.tick += 1
        return {"vchannel": vchannel, "id": chaos_id, "txn": txn, "term": self.term[pchannel],
                "message_id": str(mid), "timetick": self.tick}

    def vdelivery(self, pchannel: str, vchannel: str) -> list[Record]:
        return [e for e in self.delivery[pchannel] if e["vchannel"] == vchannel]

    # ---------------------------------------------------------------------------------------- the steps
    def run(self, steps: int) -> tuple[Record, list[Record], dict[str, dict[str, list[Record]]]]:
        actions: list[Callable[[], None]] = [self.send, self.send, self.txn, self.group_step,
                                             self.complete, self.complete, self.complete, self.nemesis, self.land]
        for _ in range(steps):
            self.rng.choice(actions)()
        for op in [*self.in_flight.values(), *self.deferred]:  # the history ends: unknown, either way
            if self.rng.random() < 0.5:
                self.take_effect(op)
        meta = {"seed": 0, "started": "2026-01-01T00:00:00Z", "duration_s": 1.0, "nodes": self.nodes,
                "pchannels": self.pchannels, "faults": self.faults}
        reads = {n: {p: [dict(e) for e in self.delivery[p]] for p in self.pchannels} for n in self.nodes}
        return meta, self.history, reads

    def invoke(self, process: str, f: str, value: Record) -> _Pending:
        op = _Pending(process, f, value)
        self.in_flight[process] = op
        self.line(process, "invoke", f, value)
        return op

    def send(self) -> None:
        producer = self.rng.choice(list(self.producers))
        pchannel, processes = self.producers[producer]
        process = self.rng.choice(processes)
        if process not in self.in_flight:
            value = {"pchannel": pchannel, "vchannel": self.rng.choice(self.vchannels), "producer": producer,
                     "id": f"m{next(self.fresh)}"}
            self.invoke(process, "send", value)

    def txn(self) -> None:
        if sum(op.f == "txn" for op in self.in_flight.values()) >= 2:
            return
        process = f"tx{next(self.fresh)}"  # one transaction per process
        pchannel, vchannel = self.rng.choice(self.pchannels), self.rng.choice(self.vchannels)
        key = f"t{next(self.fresh)}"
        ids = [f"{key}.{k}" for k in range(self.rng.randint(1, 4))]
        value = {"pchannel": pchannel, "vchannel": vchannel, "txn": key, "ids": ids,
                 "decision": self.rng.choice(("commit", "commit", "rollback"))}
        op = self.invoke(process, "txn", value)
        op.begin = self.begin_of[key] = self.next_mid[pchannel]
        self.next_mid[pchannel] += 1
        op.reserved = [self.store(pchannel, vchannel, i, key) for i in ids]
        op.term = self.term[pchannel]

    def group_step(self) -> None:
        if not self.groups:
            return
        g = self.rng.choice(self.groups)
        if g.process in self.in_flight:
            return
        base = {"pchannel": g.pchannel, "vchannel": g.vchannel, "group": g.name}
        seen = self.vdelivery(g.pchannel, g.vchannel)
        if self.rng.random() < 0.3:
            self.invoke(g.process, "group_resume", base)
        elif g.seen < len(seen):
            g.seen = min(len(seen), g.seen + self.rng.randint(1, 3))
            last, node = seen[g.seen - 1]["message_id"], str(self.node_position(g, seen))
            op = self.invoke(g.process, "group_commit",
                             {**base, "position": last if self.commits_name == "consumed" else node})
            op.covers = (g.seen, last, node)

    def node_position(self, g: _Group, seen: list[Record]) -> int:
        """The smallest id not yet delivered to the consumer: of a message, an open transaction's BeginTxn
        (delivered or not), or the next id to be written (Position in proto/README.md)."""
        ids = [int(e["message_id"]) if e["txn"] is None else self.begin_of[e["txn"]] for e in seen[g.seen:]]
        ids += [op.begin for op in [*self.in_flight.values(), *self.deferred] if op.f == "txn" and op.reserved
                and (op.value["pchannel"], op.value["vchannel"]) == (g.pchannel, g.vchannel)]
        return min([*ids, self.next_mid[g.pchannel]])

    def nemesis(self) -> None:
        """An owner is replaced: its term ends, the next owner writes with term + 1."""
        pchannel = self.rng.choice(self.pchannels)
        self.term[pchannel] += 1
        self.faults["kill"] = self.faults.get("kill", 0) + 1
        self.line("nemesis", "info", "start", {"fault": "kill", "target": pchannel})
        self.line("nemesis", "info", "stop", {"fault": "kill", "target": pchannel})

    def land(self) -> None:
        """An unknown-outcome write the node took effect on only later (a retry that got through)."""
        if self.deferred:
            self.take_effect(self.deferred.pop(self.rng.randrange(len(self.deferred))))

    def complete(self) -> None:
        if not self.in_flight:
            return
        op = self.in_flight.pop(self.rng.choice(list(self.in_flight)))
        outcome = self.rng.choices(("ok", "fail", "info"), (7, 1, 2))[0]
        value: Record = {}
        if op.f == "txn" and op.value["decision"] == "commit" and self.term[op.value["pchannel"]] != op.term:
            outcome = self.rng.choice(("fail", "info"))  # the owner changed: recovery rolled it back
            op.reserved = []
        if op.f == "group_commit" and op.covers[0] < self.group(op.value["group"]).covered:
            outcome = "fail"  # the node refuses a position behind the group's
        if op.f == "group_resume":
            outcome = "ok" if outcome == "ok" else "fail"
            value = self.resume(self.group(op.value["group"])) if outcome == "ok" else {}
        if outcome == "ok":
            value = {**value, **self.take_effect(op)}
        elif outcome == "info":
            choice = self.rng.random()
            if choice < 0.4:
                self.take_effect(op)
            elif choice < 0.7:
                self.deferred.append(op)
        self.line(op.process, outcome, op.f, value)
        if outcome == "info":
            self.retire(op.process)

    def take_effect(self, op: _Pending) -> Record:
        v = op.value
        if op.f == "send":
            entry = self.store(v["pchannel"], v["vchannel"], v["id"], None)
            self.delivery[v["pchannel"]].append(entry)
            return {"message_id": entry["message_id"]}
        if op.f == "txn" and v["decision"] == "commit" and self.term[v["pchannel"]] == op.term:
            self.delivery[v["pchannel"]].extend(op.reserved)  # whole, at the commit
            op.reserved = []
        elif op.f == "group_commit":
            g = self.group(v["group"])
            if op.covers[0] >= g.covered:  # else refused: behind the group's position
                g.covered = op.covers[0]
                g.resume_at = op.covers[1] if self.resumes_name == "consumed" else op.covers[2]
        return {}

    def resume(self, g: _Group) -> Record:
        """A reopened group: after what its position covers (a group that names the last message consumed
        may receive that one again), up to eight messages."""
        seen = self.vdelivery(g.pchannel, g.vchannel)
        again = g.covered > 0 and self.resumes_name == "consumed" and self.rng.random() < 0.3
        start = g.covered - again
        first = seen[start:start + self.rng.randint(0, 8)]
        g.seen = start + len(first)
        return {"position": g.resume_at, "first_ids": [e["id"] for e in first]}

    def retire(self, process: str) -> None:
        """After an unknown outcome a process is never reused: its actor takes a fresh name."""
        fresh = f"{process.split('.', maxsplit=1)[0]}.r{next(self.fresh)}"
        for _, processes in self.producers.values():
            if process in processes:
                processes[processes.index(process)] = fresh
        for g in self.groups:
            if g.process == process:
                g.process = fresh

    def group(self, name: str) -> _Group:
        return next(g for g in self.groups if g.name == name)


def walk(seed: int) -> tuple[Record, list[Record], dict[str, dict[str, list[Record]]]]:
    """A fresh copy of the seed's walk (each test may mutate it; the walk itself is played once)."""
    meta, history, reads = json.loads(_walked(seed))
    return meta, history, reads


@functools.cache
def _walked(seed: int) -> str:
    return json.dumps(Walk(seed).run(120))


# ---------------------------------------------------------------------------------------------- mutations
Reads = dict[str, dict[str, list[Record]]]


def _acked_sends(history: list[Record]) -> dict[str, tuple[int, int, Record]]:
    """Acknowledged send id -> (invoke line, ok line, invoke value)."""
    invoked: dict[str, Record] = {}
    out: dict[str, tuple[int, int, Record]] = {}
    for r in history:
        if r["f"] == "send" and r["type"] == "invoke":
            invoked[r["process"]] = r
        elif r["f"] == "send" and r["type"] == "ok":
            invoke = invoked[r["process"]]
            out[invoke["value"]["id"]] = (invoke["i"], r["i"], invoke["value"])
    return out


def _everywhere(reads: Reads, pchannel: str, change: Callable[[list[Record]], None]) -> None:
    for by_pchannel in reads.values():
        change(by_pchannel[pchannel])


def drop_ack(rng: random.Random, history: list[Record], reads: Reads) -> str | None:
    acked = _acked_sends(history)
    if not acked:
        return None
    chaos_id = rng.choice(sorted(acked))
    _everywhere(reads, acked[chaos_id][2]["pchannel"], lambda log: log.remove(next(e for e in log
                                                                                    if e["id"] == chaos_id)))
    return "sends"


def duplicate(rng: random.Random, history: list[Record], reads: Reads) -> str | None:
    acked = _acked_sends(history)
    if not acked:
        return None
    chaos_id = rng.choice(sorted(acked))

    def again(log: list[Record]) -> None:
        last = max(log, key=lambda e: int(e["message_id"]))
        copy = next(e for e in log if e["id"] == chaos_id)
        log.append({**copy, "message_id": str(int(last["message_id"]) + 1), "term": last["term"]})

    _everywhere(reads, acked[chaos_id][2]["pchannel"], again)
    return "sends"


def reorder(rng: random.Random, history: list[Record], reads: Reads) -> str | None:
    """Swap two messages one producer sent one after the other on one vchannel, and acknowledged in order."""
    acked = _acked_sends(history)
    streams: dict[tuple[str, str], list[tuple[int, int, str]]] = {}
    for chaos_id, (invoke, ok, v) in acked.items():
        streams.setdefault((v["producer"], v["vchannel"]), []).append((invoke, ok, chaos_id))
    pairs = [(a[2], b[2]) for s in streams.values() for a, b in itertools.pairwise(sorted(s)) if a[1] < b[1]]
    if not pairs:
        return None
    first, second = rng.choice(pairs)
    pchannel = acked[first][2]["pchannel"]

    def swap(log: list[Record]) -> None:
        a, b = (next(n for n, e in enumerate(log) if e["id"] == x) for x in (first, second))
        log[a], log[b] = log[b], log[a]

    _everywhere(reads, pchannel, swap)
    return "order"


def lower_term(rng: random.Random, history: list[Record], reads: Reads) -> str | None:
    """A message stored after another (higher id) with a lower term: written by a stale owner."""
    pchannel = rng.choice(sorted(next(iter(reads.values()))))
    log = next(iter(reads.values()))[pchannel]
    if len(log) < 2:
        return None
    stored = sorted(log, key=lambda e: int(e["message_id"]))
    n = rng.randrange(1, len(stored))
    victim, term = stored[n]["message_id"], stored[n - 1]["term"] - 1
    _everywhere(reads, pchannel, lambda log: next(e for e in log if e["message_id"] == victim).update(term=term))
    return "terms"


def one_node_differs(rng: random.Random, history: list[Record], reads: Reads) -> str | None:
    nodes = sorted(reads)
    pchannel = rng.choice(sorted(reads[nodes[0]]))
    if len(nodes) < 2 or not reads[nodes[0]][pchannel]:
        return None
    reads[rng.choice(nodes[1:])][pchannel].pop(rng.randrange(len(reads[nodes[0]][pchannel])))
    return "agreement"


def half_txn(rng: random.Random, history: list[Record], reads: Reads) -> str | None:
    visible = [(p, e["txn"]) for log in next(iter(reads.values())).items() for p in [log[0]] for e in log[1]
               if e["txn"] is not None]
    sizes = {k: n for k, n in ((k, sum(1 for x in visible if x == k)) for k in set(visible)) if n >= 2}
    if not sizes:
        return None
    pchannel, key = rng.choice(sorted(sizes))
    _everywhere(reads, pchannel, lambda log: log.remove(next(e for e in log if e["txn"] == key)))
    return "txns"


def phantom(rng: random.Random, history: list[Record], reads: Reads) -> str | None:
    pchannel = rng.choice(sorted(next(iter(reads.values()))))
    log = next(iter(reads.values()))[pchannel]
    top = max((int(e["message_id"]) for e in log), default=0)
    term = max((e["term"] for e in log), default=1)
    entry = {"vchannel": "v0", "id": "nobody-sent-this", "txn": None, "term": term, "message_id": str(top + 1),
             "timetick": 10**9}
    _everywhere(reads, pchannel, lambda log: log.append(dict(entry)))
    return "sends"


def _resumes(history: list[Record]) -> list[tuple[int, str, Record]]:
    """Acknowledged resumes: (invoke line, group, ok record)."""
    invoked: dict[str, Record] = {}
    out = []
    for r in history:
        if r["type"] == "invoke":
            invoked[r["process"]] = r
        elif r["f"] == "group_resume" and r["type"] == "ok":
            out.append((invoked[r["process"]]["i"], invoked[r["process"]]["value"]["group"], r))
    return out


def resume_forgets(rng: random.Random, history: list[Record], reads: Reads) -> str | None:
    """A reopened group reports no position although a commit of it was acknowledged before."""
    invoked: dict[str, Record] = {}
    acked: list[tuple[int, str]] = []
    for r in history:
        if r["type"] == "invoke":
            invoked[r["process"]] = r["value"]
        elif r["f"] == "group_commit" and r["type"] == "ok":
            acked.append((r["i"], invoked[r["process"]]["group"]))
    forgot = [r for invoke, group, r in _resumes(history) if any(g == group and i < invoke for i, g in acked)]
    if not forgot:
        return None
    rng.choice(forgot)["value"]["position"] = None
    return "group-positions"


def resume_skips(rng: random.Random, history: list[Record], reads: Reads) -> str | None:
    """A reopened group does not receive an acknowledged message between two it received."""
    acked = set(_acked_sends(history))
    skippable = [(r, k) for _, _, r in _resumes(history) for k in range(1, len(r["value"]["first_ids"]) - 1)
                 if r["value"]["first_ids"][k] in acked]
    if not skippable:
        return None
    resume, k = rng.choice(skippable)
    resume["value"]["first_ids"].pop(k)
    return "group-resume"


MUTATIONS = [drop_ack, duplicate, reorder, lower_term, one_node_differs, half_txn, phantom, resume_forgets,
             resume_skips]


def _parse(meta: Record, history: list[Record], reads: Reads) -> Run:
    return parse_run(meta, history, reads)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_valid_history_of_the_model_has_no_violation(seed: int) -> None:
    violations = check(_parse(*walk(seed)))
    assert violations == [], "\n".join(f"[{v.check}] {v.message} {v.lines}" for v in violations)


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.__name__)
def test_one_mutation_of_a_valid_history_is_caught_by_its_check(mutation: Callable[..., str | None]) -> None:
    applied = 0
    for seed in SEEDS:
        meta, history, reads = walk(seed)
        expected = mutation(random.Random(seed), history, reads)
        if expected is None:
            continue  # this walk has nothing to mutate that way (no acknowledged send, a single node, ...)
        applied += 1
        found = {v.check for v in check(_parse(meta, history, reads))}
        assert expected in found, f"seed {seed}: {mutation.__name__} not caught by {expected} (found {found})"
    assert applied >= len(SEEDS) // 10, f"{mutation.__name__} applied to only {applied} walks"


def test_the_walks_exercise_what_the_checker_reads() -> None:
    """The model really makes unknown outcomes, takeovers, transactions of each fate and group resumes."""
    seen: set[tuple[str, str]] = set()
    resumes_with_messages = below = 0
    for seed in SEEDS[:60]:
        run = _parse(*walk(seed))
        seen.update(k for k, n in run.outcomes.items() if n)
        resumes_with_messages += sum(1 for r in run.resumes if r.first_ids and r.position is not None)
        acked = [c for c in run.commits if c.ok]
        below += sum(1 for r in run.resumes if r.position is not None
                     and any(c.done is not None and c.done < r.invoke and c.position > r.position for c in acked))
        assert run.faults["kill"] >= 0
    for f in ("send", "txn", "group_commit"):
        assert {(f, "ok"), (f, "fail"), (f, "info")} <= seen, f
    assert ("group_resume", "ok") in seen
    assert resumes_with_messages > 10
    assert below > 0, "no resume reported a node position below the last message consumed (an open txn)"
