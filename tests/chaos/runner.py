"""One chaos run, start to end: build the hosts, start the cluster, run the workload in the client
namespace while the nemesis injects faults, heal, stop the workload, read every pchannel from earliest
through every node, write ``history.jsonl``, ``reads/`` and ``run.json``, and check them.

    python -m tests.chaos.runner [--seconds 1800] [--seed N] [--run-dir DIR]   (what ``make chaos`` runs)

It prints the seed first (``--seed`` replays it) and a table at the end: faults by kind, acknowledged
messages, unknown outcomes, takeovers, and the time from the last acknowledged append of a term to the
first of the next (p50/p99).  Exit status: the checker's (0 when the history holds).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.cluster import CLIENT, NATS_HOSTS, NODE_HOSTS, REPO, ChaosCluster
from tests.chaos.history import Writer, merge, read_lines
from tests.chaos.nemesis import KINDS, Nemesis
from tests.chaos.netns import Network

PCHANNELS = ("c0", "c1", "c2", "c3")
LEASE_S = 3.0


@dataclass
class Run:
    """A live run, handed to a scenario's ``during`` hook."""

    run_dir: Path
    cluster: ChaosCluster
    nemesis: Nemesis
    pchannels: tuple[str, ...]
    workload: subprocess.Popen[bytes] | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    """What a scenario observed (written into run.json)."""

    def acked(self) -> int:
        return sum(1 for x in read_lines(self.run_dir / "ops.jsonl") if x["type"] == "ok" and x["f"] == "send")

    def wait_acks(self, more: int, timeout: float = 120.0) -> None:
        """Wait until the workload acknowledged ``more`` sends beyond what it had."""
        want = self.acked() + more
        deadline = time.monotonic() + timeout
        while self.acked() < want:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the workload did not get {more} acks within {timeout} s; see {self.run_dir}")
            if self.workload is not None and self.workload.poll() is not None:
                raise RuntimeError(f"the workload exited {self.workload.returncode}; see {self.run_dir}/workload.log")
            time.sleep(0.3)


def _workload(cluster: ChaosCluster, run_dir: Path, cmd: str, *args: str) -> list[str]:
    return [*cluster.net.exec_prefix(CLIENT), sys.executable, "-m", "tests.chaos.workload", cmd, str(run_dir), *args]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "GRPC_VERBOSITY": "ERROR"}


def chaos_run(run_dir: Path, *, seed: int, seconds: float = 60.0, kinds: tuple[str, ...] = KINDS,
              during: Callable[[Run], None] | None = None, lease_s: float = LEASE_S,
              pchannels: tuple[str, ...] = PCHANNELS) -> Run:
    """Run the whole thing; ``during`` (default: the nemesis' random schedule for ``seconds``) is what
    happens while the workload runs.  Everything it started is gone when it returns or raises."""
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    net = Network([*NATS_HOSTS, *NODE_HOSTS, CLIENT])
    hist = Writer(run_dir / "nemesis.jsonl", names="n")
    cluster = ChaosCluster(net, run_dir / "cluster", lease_s=lease_s)
    nem = Nemesis(cluster, hist, list(pchannels), seed)
    run = Run(run_dir, cluster, nem, pchannels)
    seeds, pchs = ",".join(cluster.seeds), ",".join(pchannels)
    wlog = open(run_dir / "workload.log", "ab")  # noqa: SIM115
    try:
        net.build()
        cluster.start()
        subprocess.run(_workload(cluster, run_dir, "setup", "--seeds", seeds, "--pchannels", pchs),
                       check=True, cwd=REPO, env=_env(), stdout=wlog, stderr=subprocess.STDOUT, timeout=180)
        run.workload = subprocess.Popen(
            _workload(cluster, run_dir, "run", "--seeds", seeds, "--pchannels", pchs, "--seed", str(seed)),
            cwd=REPO, env=_env(), stdout=wlog, stderr=subprocess.STDOUT, start_new_session=True)
        run.wait_acks(20)
        if during is None:
            nem.schedule(seconds, kinds)
        else:
            during(run)
        nem.heal_all()
        for h in NODE_HOSTS:
            cluster.wait_node_started(h)
        run.wait_acks(20, timeout=180)  # healed: the workload makes progress again
        run.workload.send_signal(signal.SIGTERM)
        run.workload.wait(120)
        nodes = [f"--node={h}={cluster.node_address(h)}" for h in NODE_HOSTS]
        subprocess.run(_workload(cluster, run_dir, "read", "--pchannels", pchs, *nodes),
                       check=True, cwd=REPO, env=_env(), stdout=wlog, stderr=subprocess.STDOUT, timeout=3 * 3600)
    finally:
        if run.workload is not None and run.workload.poll() is None:
            os.killpg(run.workload.pid, signal.SIGKILL)
            run.workload.wait(30)
        wlog.close()
        cluster.stop()
        net.destroy()
        hist.close()
        merge(run_dir)
        nem.save_notes(run_dir)
        (run_dir / "run.json").write_text(json.dumps({
            "seed": seed, "started": started, "duration_s": round(time.time() - started, 1),
            "nodes": list(NODE_HOSTS), "pchannels": list(pchannels), "faults": dict(nem.counts),
            "lease_s": lease_s, "node_start_retries": cluster.start_retries, "facts": run.facts}, indent=1))
    return run


def reread(run_dir: Path, lease_s: float = LEASE_S) -> None:
    """The final read again, on the stores a finished run left in ``run_dir/cluster``: the cluster is
    started on them as it was (same names, addresses and stores, no fault), every pchannel read from
    earliest through every node into ``reads/`` (replacing what was there), and the cluster removed.
    For a run whose final read broke off; its history is the run's own."""
    info = json.loads((run_dir / "run.json").read_text())
    net = Network([*NATS_HOSTS, *NODE_HOSTS, CLIENT])
    cluster = ChaosCluster(net, run_dir / "cluster", lease_s=lease_s)
    wlog = open(run_dir / "workload.log", "ab")  # noqa: SIM115
    try:
        net.build()
        cluster.start()
        nodes = [f"--node={h}={cluster.node_address(h)}" for h in NODE_HOSTS]
        subprocess.run(_workload(cluster, run_dir, "read", "--pchannels", ",".join(info["pchannels"]), *nodes),
                       check=True, cwd=REPO, env=_env(), stdout=wlog, stderr=subprocess.STDOUT, timeout=3 * 3600)
    finally:
        wlog.close()
        cluster.stop()
        net.destroy()


# --- checking ---------------------------------------------------------------------------------------
def run_checker(run_dir: Path) -> int:
    """The history checker's exit code (0: no violation).  ``tests/chaos/checker.py`` is the real one;
    until it is in the tree, ``placeholder_check`` stands in."""
    if (REPO / "tests" / "chaos" / "checker.py").exists():
        return subprocess.run([sys.executable, "-m", "tests.chaos.checker", str(run_dir)],
                              cwd=REPO, env=_env(), check=False).returncode
    return placeholder_check(run_dir)


def placeholder_check(run_dir: Path) -> int:
    """A stand-in until the independent checker lands (it replaces this): every acknowledged send and
    every committed transaction's ids appear exactly once in every node's read, no rolled-back one does,
    no message id is given to two messages, and no read holds a lower term after a higher one."""
    history = read_lines(run_dir / "history.jsonl")
    acked = {x["value"]["id"] for x in history if x["type"] == "ok" and x["f"] == "send"}
    committed = {i for x in history if x["type"] == "ok" and x["f"] == "txn" and x["value"]["decision"] == "commit"
                 for i in x["value"]["ids"]}
    rolled = {i for x in history if x["type"] in ("ok", "fail") and x["f"] == "txn"
              and (x["type"] == "fail" or x["value"]["decision"] == "rollback") for i in x["value"]["ids"]}
    bad = 0
    for read in sorted((run_dir / "reads").glob("*/*.jsonl")):
        pch = read.stem
        lines = read_lines(read)
        seen: dict[str, int] = {}
        for line in lines:
            seen[line["id"]] = seen.get(line["id"], 0) + 1
        want = {i for x in history if x["type"] == "ok" and x["f"] == "send" and x["value"]["pchannel"] == pch
                for i in [x["value"]["id"]]} & acked
        want |= {i for x in history if x["type"] == "ok" and x["f"] == "txn" and x["value"]["pchannel"] == pch
                 and x["value"]["decision"] == "commit" for i in x["value"]["ids"]} & committed
        for i in sorted(want):
            if seen.get(i, 0) != 1:
                print(f"{read}: acknowledged {i} seen {seen.get(i, 0)} times")
                bad += 1
        for i in sorted(rolled & seen.keys()):
            print(f"{read}: {i} of a rolled-back or failed transaction is visible")
            bad += 1
        ids: dict[str, str] = {}
        for line in lines:
            if ids.setdefault(line["message_id"], line["id"]) != line["id"]:
                print(f"{read}: message id {line['message_id']} holds both {ids[line['message_id']]} and {line['id']}")
                bad += 1
        top = 0
        for line in lines:
            if line["term"] < top:
                print(f"{read}: {line['id']} of term {line['term']} after term {top}")
                bad += 1
            top = max(top, line["term"])
    print(f"placeholder check: {len(acked)} acknowledged sends, {len(committed)} committed txn messages, "
          f"{bad} violations")
    return 1 if bad else 0


# --- the table --------------------------------------------------------------------------------------
def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def summary(run_dir: Path) -> dict[str, Any]:
    """Faults by kind, acknowledged messages, unknown outcomes, takeovers (term changes seen in the final
    read of each pchannel) and, per takeover, the time from the last acknowledged append of the old term
    to the first of the new one."""
    history = read_lines(run_dir / "history.jsonl")
    info = json.loads((run_dir / "run.json").read_text())
    ack_t = {x["value"]["id"]: x["t"] for x in history if x["type"] == "ok" and x["f"] == "send"}
    gaps: list[float] = []
    takeovers = 0
    first_node = sorted((run_dir / "reads").iterdir())[0] if (run_dir / "reads").exists() else None
    for read in sorted(first_node.glob("*.jsonl")) if first_node else []:
        lines = read_lines(read)
        last_t: float | None = None
        term = None
        pending = False
        for line in lines:
            t = ack_t.get(line["id"])
            if term is not None and line["term"] != term:
                takeovers += 1
                pending = True
            term = line["term"]
            if t is None:
                continue
            if pending and last_t is not None:
                gaps.append(t - last_t)
                pending = False
            last_t = t if last_t is None else max(last_t, t)
    return {
        "seed": info["seed"], "duration_s": info["duration_s"], "faults": info["faults"],
        "faults_total": sum(info["faults"].values()),
        "acknowledged": len(ack_t) + sum(len(x["value"]["ids"]) for x in history if x["type"] == "ok"
                                         and x["f"] == "txn" and x["value"]["decision"] == "commit"),
        "unknown": sum(1 for x in history if x["type"] == "info" and x["process"] != "nemesis"),
        "takeovers": takeovers,
        "first_append_after_takeover_s": {"p50": round(_pct(gaps, 0.5), 2), "p99": round(_pct(gaps, 0.99), 2),
                                          "n": len(gaps)},
    }


def print_table(s: dict[str, Any]) -> None:
    print("| fault | count |\n|---|---|")
    for kind in KINDS:
        print(f"| {kind} | {s['faults'].get(kind, 0)} |")
    g = s["first_append_after_takeover_s"]
    print(f"\n| seed | seconds | faults | acknowledged | unknown outcomes | takeovers | first append after "
          f"takeover p50 / p99 (s) |\n|---|---|---|---|---|---|---|\n| {s['seed']} | {s['duration_s']} | "
          f"{s['faults_total']} | {s['acknowledged']} | {s['unknown']} | {s['takeovers']} | {g['p50']} / {g['p99']} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.runner")
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("CHAOS_SECONDS") or 1800))
    parser.add_argument("--seed", type=int, default=int(os.environ.get("CHAOS_SEED") or random.randrange(1 << 31)))
    parser.add_argument("--run-dir", type=Path, default=None)
    parser.add_argument("--reread", action="store_true",
                        help="read back and check the run in --run-dir again, on the stores it left")
    args = parser.parse_args(argv)
    if args.reread:
        if args.run_dir is None:
            parser.error("--reread needs --run-dir")
        reread(args.run_dir)
        code = run_checker(args.run_dir)
        print_table(summary(args.run_dir))
        print(f"checker exit {code}; history in {args.run_dir}")
        return code
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix=f"chaos-{args.seed}-"))
    print(f"chaos run: seed {args.seed}, {args.seconds:.0f} s, in {run_dir}\n"
          f"replay: make chaos CHAOS_SEED={args.seed} CHAOS_SECONDS={args.seconds:.0f}"
          + (f" CHAOS_PACE={os.environ['CHAOS_PACE']}" if os.environ.get("CHAOS_PACE") else ""), flush=True)
    chaos_run(run_dir, seed=args.seed, seconds=args.seconds)
    code = run_checker(run_dir)
    print_table(summary(run_dir))
    print(f"checker exit {code}; history in {run_dir}")
    return code


if __name__ == "__main__":
    sys.exit(main())
