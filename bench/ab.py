"""A/B: two trees measured alternately in one invocation, with medians and per-run ratios.

    .venv/bin/python bench/ab.py BASE [HEAD] [--runs 3] [--count 100000] [--nats-count 20000]
                                 [--instructions] [-- extra produce_consume.py arguments]

BASE (and HEAD, when given) is any commit: each gets a detached ``git worktree`` in a temporary
directory, removed at the end.  Without HEAD the other side is this checkout as it is (uncommitted
changes included).  Every run measures both trees back to back, the order alternating between runs
(BASE first in runs 1, 3, ...), so that the load of a shared host falls on both alike; a figure is
read as the ratio of the two sides of one run, and the median of those ratios.

Each side runs its own tree's ``bench/produce_consume.py --runs 1 --count N`` (its node, its SDK,
this interpreter and virtualenv) and reports, from that tree's table:

* durable produce through the SDK (msgs/s) and the node's CPU per message (µs, from /proc);
* catch-up consume through the SDK (msgs/s);
* single-message produce p50 (ms; the SDK with linger 0);
* JetStream with default settings (msgs/s): the same peer in both halves, a check that the host
  did not change between them.

Each run also measures the raw storage limit once (rocksdict, ``--count`` 1 KiB values in
WriteBatches of 1,000, each written with ``sync=True``) so that durable produce can be read against it.
``--instructions`` adds ``bench/append_instructions.py`` (this checkout's) on both trees: instructions
per appended message, which do not depend on the load (once; the count repeats).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_REPO = _HERE.parent

# (key, label, regex over the tree's produce_consume.py output, group, higher is better)
_PRODUCE_ROW = r"^durable produce, ours SDK\s*\|\s*([\d,.]+)\s*\|\s*([\d.]+)"
_METRICS: tuple[tuple[str, str, str, int, bool], ...] = (
    ("produce", "durable produce, SDK (msgs/s)", _PRODUCE_ROW, 1, True),
    ("node_cpu", "node CPU per message (µs)", _PRODUCE_ROW, 2, False),
    ("consume", "catch-up consume, SDK (msgs/s)", r"^catch-up consume, ours SDK\s*\|\s*([\d,.]+)", 1, True),
    ("p50", "single message p50 (ms)", r"^single-message produce, ours SDK \(linger 0\)\s*\|\s*([\d.]+)", 1, False),
    ("nats", "JetStream defaults (msgs/s), host check", r"^produce, JetStream defaults[^|]*\|\s*([\d,.]+)", 1, True),
)


def _git(*args: str, cwd: Path = _REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def _worktree(commit: str, parent: str) -> Path:
    sha = _git("rev-parse", "--short", commit)
    path = Path(parent) / f"ab-{sha}"
    _git("worktree", "add", "--detach", str(path), commit)
    return path


def _produce_consume(tree: Path, count: int, nats_count: int, extra: list[str]) -> dict[str, float]:
    cmd = [sys.executable, str(tree / "bench" / "produce_consume.py"), "--runs", "1", "--count", str(count),
           "--nats-count", str(nats_count), *extra]
    env = dict(os.environ, PYTHONPATH=str(tree), GRPC_VERBOSITY="ERROR")
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    out: dict[str, float] = {}
    for key, _label, pattern, group, _higher in _METRICS:
        m = re.search(pattern, proc.stdout, re.M)
        if m is not None:
            out[key] = float(m.group(group).replace(",", ""))
    return out


def _raw_limit(count: int, parent: str) -> float:
    """rocksdict: ``count`` 1 KiB values in WriteBatches of 1,000, each written with sync=True (msgs/s)."""
    from rocksdict import Options, Rdict, WriteBatch, WriteOptions  # noqa: PLC0415

    path = tempfile.mkdtemp(prefix="ab-raw-", dir=parent)
    try:
        db = Rdict(path, Options(raw_mode=True))
        sync = WriteOptions()
        sync.sync = True
        value = os.urandom(1024)
        t0 = time.perf_counter()
        for start in range(0, count, 1000):
            wb = WriteBatch(raw_mode=True)
            for k in range(start, min(start + 1000, count)):
                wb.put(k.to_bytes(12, "big"), value)
            db.write(wb, sync)
        rate = count / (time.perf_counter() - t0)
        db.close()
        return rate
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _instructions(tree: Path) -> dict[str, float]:
    proc = subprocess.run([sys.executable, str(_HERE / "append_instructions.py"), "--root", str(tree)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"append_instructions.py --root {tree} failed:\n{proc.stderr[-3000:]}")
    return {m.group(1): float(m.group(2).replace(",", ""))
            for m in re.finditer(r"^\s+(b100|b1)\s+([\d,]+)", proc.stdout, re.M)}


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.2f}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("base", help="the commit to compare against")
    p.add_argument("head", nargs="?", default=None, help="the other commit (default: this checkout as it is)")
    p.add_argument("--runs", type=int, default=3, help="alternations (default 3)")
    p.add_argument("--count", type=int, default=100_000, help="messages per produce and consume (default 100,000)")
    p.add_argument("--nats-count", type=int, default=20_000, help="JetStream messages per run (default 20,000)")
    p.add_argument("--instructions", action="store_true", help="also count instructions per appended message")
    p.add_argument("--dir", default=None, help="parent of the worktrees and databases (default: system temp)")
    args = p.parse_args(argv)
    if args.runs < 1 or args.count < 1000:
        p.error("--runs must be >= 1 and --count >= 1000")

    parent = tempfile.mkdtemp(prefix="ab-", dir=args.dir)
    trees: dict[str, Path] = {}
    try:
        trees["base"] = _worktree(args.base, parent)
        trees["head"] = _worktree(args.head, parent) if args.head else _REPO
        names = {"base": f"{args.base} ({_git('rev-parse', '--short', args.base)})",
                 "head": f"{args.head} ({_git('rev-parse', '--short', args.head)})" if args.head
                 else f"this checkout ({_git('rev-parse', '--short', 'HEAD')}"
                      f"{', with changes' if _git('status', '--porcelain', '--untracked-files=no') else ''})"}
        results: dict[str, list[dict[str, float]]] = {"base": [], "head": []}
        raw: list[float] = []
        for run in range(args.runs):
            order = ("base", "head") if run % 2 == 0 else ("head", "base")
            for side in order:
                r = _produce_consume(trees[side], args.count, args.nats_count, extra)
                results[side].append(r)
                print(f"run {run + 1} {side}: " + ", ".join(f"{k} {_fmt(v)}" for k, v in r.items()), flush=True)
            raw.append(_raw_limit(args.count, parent))
            print(f"run {run + 1} raw rocksdict WriteBatch(1000)+sync: {raw[-1]:,.0f} msgs/s", flush=True)
        print()
        print(f"A/B, {args.runs} alternation(s), produce_consume.py --runs 1 --count {args.count:,} in each tree")
        print(f"  base: {names['base']}\n  head: {names['head']}")
        print(f"{'metric':<42} | {'base median':>11} | {'head median':>11} | {'ratio':>6} | per-run head/base")
        print("-" * 110)
        for key, label, _pattern, _group, _higher in _METRICS:
            pairs = [(b[key], h[key]) for b, h in zip(results["base"], results["head"], strict=True)
                     if key in b and key in h]
            if not pairs:
                continue
            ratios = [h / b for b, h in pairs if b]
            print(f"{label:<42} | {_fmt(statistics.median(b for b, _ in pairs)):>11} | "
                  f"{_fmt(statistics.median(h for _, h in pairs)):>11} | {statistics.median(ratios):>6.2f} | "
                  + " · ".join(f"{x:.2f}" for x in ratios))
        fractions = {side: [r["produce"] / w for r, w in zip(results[side], raw, strict=True) if "produce" in r]
                     for side in ("base", "head")}
        print(f"raw rocksdict WriteBatch(1000)+sync (msgs/s): median {statistics.median(raw):,.0f} "
              f"({' · '.join(f'{x:,.0f}' for x in raw)})")
        for side in ("base", "head"):
            if fractions[side]:
                print(f"durable produce / raw limit, {side}: median {statistics.median(fractions[side]):.2f} "
                      f"({' · '.join(f'{x:.2f}' for x in fractions[side])})")
        if args.instructions:
            counts = {side: _instructions(trees[side]) for side in ("base", "head")}
            for case in ("b100", "b1"):
                b, h = counts["base"][case], counts["head"][case]
                print(f"instructions per appended message, {case}: base {b:,.0f}, head {h:,.0f}, ratio {h / b:.3f}")
    finally:
        for side, tree in trees.items():
            if side == "base" or args.head:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=_REPO, check=False,
                               capture_output=True)
        shutil.rmtree(parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
