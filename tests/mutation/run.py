"""Plant curated bugs, one at a time, in a copy of the repository, and check that the tests catch each.

    .venv/bin/python tests/mutation/run.py              # every mutant in mutants.toml
    .venv/bin/python tests/mutation/run.py ID [ID ...]  # only these
    .venv/bin/python tests/mutation/run.py --list       # ids and what each one breaks

Every entry of ``mutants.toml`` names a file, a text that must occur in it exactly once, the text that
replaces it, and the tests that must fail once it is replaced.  The repository is copied once to a
temporary directory (without .venv, .git, caches and a top-level data dir); the named tests first run
there unmodified (they must pass, or "killed" would mean nothing), then each mutant is planted, its
tests run with the repository's own interpreter (``-x -q -p no:cacheprovider``, a per-test and an
overall time limit), and the file is restored before the next one.  The working tree is never touched.

A mutant is killed when its tests fail (or time out), survived when they pass.  Exit status: 0 when
every mutant was killed, 1 when any survived, 2 when the list or the copy is wrong (a text not found
exactly once, an unknown id, tests that fail unmodified or cannot be collected).

Not a test module: pytest collects only ``test_*.py``, and nothing here is a test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MUTANTS = Path(__file__).with_name("mutants.toml")
# Never copied: the environment, history, caches, and a node's data dir left by `make run`.
SKIPPED_EVERYWHERE = {".venv", ".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis",
                      "node_modules"}
SKIPPED_AT_TOP = {"data", "streamingnode.egg-info"}
PER_TEST_TIMEOUT = 120  # seconds; a planted bug may turn a wait into a hang
PACKAGES = ("wal", "interceptors", "flusher", "streamingnode")


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str
    old: str
    new: str
    tests: list[str]
    why: str


class ListError(Exception):
    """The list of mutants, or the copy it runs in, is wrong: fix the list, not the code."""


def load(path: Path = MUTANTS) -> list[Mutant]:
    with open(path, "rb") as f:
        raw = tomllib.load(f)
    out: list[Mutant] = []
    for entry in raw.get("mutant", []):
        missing = {"id", "file", "old", "new", "tests", "why"} - set(entry)
        if missing:
            raise ListError(f"mutant {entry.get('id', '?')!r} lacks {sorted(missing)}")
        if not entry["tests"]:
            raise ListError(f"mutant {entry['id']!r} names no tests")
        if entry["old"] == entry["new"]:
            raise ListError(f"mutant {entry['id']!r} changes nothing")
        out.append(Mutant(entry["id"], entry["file"], entry["old"], entry["new"], list(entry["tests"]), entry["why"]))
    ids = [m.id for m in out]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ListError(f"duplicate mutant ids: {dupes}")
    return out


def plant(root: Path, mutant: Mutant) -> str:
    """Apply ``mutant`` under ``root``; returns the original text of the file (to restore it)."""
    path = root / mutant.file
    if not path.is_file():
        raise ListError(f"{mutant.id}: {mutant.file} does not exist")
    original = path.read_text()
    count = original.count(mutant.old)
    if count != 1:
        raise ListError(f"{mutant.id}: the text to replace occurs {count} times in {mutant.file}, not once:\n"
                        f"{mutant.old}")
    path.write_text(original.replace(mutant.old, mutant.new))
    return original


def _ignore(directory: str, names: list[str]) -> set[str]:
    skipped = {n for n in names if n in SKIPPED_EVERYWHERE}
    if Path(directory).resolve() == REPO:
        skipped |= {n for n in names if n in SKIPPED_AT_TOP}
    return skipped


def copy_repo(dest: Path) -> Path:
    root = dest / "repo"
    shutil.copytree(REPO, root, ignore=_ignore, symlinks=True)
    return root


def environment(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    # The copy's packages come first on the path: the venv's editable install points at the working
    # tree, and its finder comes after the path entries.  Children (crash tests) inherit the same.
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.setdefault("GRPC_VERBOSITY", "ERROR")
    return env


def check_imports(python: str, root: Path, env: dict[str, str]) -> None:
    """The copy, not the working tree, is what the tests import."""
    code = f"import importlib; print('\\n'.join(importlib.import_module(p).__file__ for p in {PACKAGES!r}))"
    out = subprocess.run([python, "-c", code], cwd=root, env=env, capture_output=True, text=True, check=False)
    files = out.stdout.split()
    if out.returncode != 0 or len(files) != len(PACKAGES) or not all(Path(f).is_relative_to(root) for f in files):
        raise ListError(f"the copy in {root} is not what gets imported: {out.stdout}{out.stderr}")


@dataclass
class Outcome:
    verdict: str  # "killed", "survived", "error"
    seconds: float
    detail: str


def run_tests(python: str, root: Path, env: dict[str, str], tests: list[str], timeout: float) -> Outcome:
    cmd = [python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", f"--timeout={PER_TEST_TIMEOUT}", *tests]
    started = time.monotonic()
    try:
        done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Outcome("killed", time.monotonic() - started, f"no result within {timeout:.0f} s (a hang)")
    seconds = time.monotonic() - started
    output = done.stdout + done.stderr
    if done.returncode == 0:
        return Outcome("survived", seconds, "every named test passed")
    if done.returncode == 1:
        failed = [line.split(" - ")[0] for line in output.splitlines() if line.startswith(("FAILED ", "ERROR "))]
        return Outcome("killed", seconds, failed[0] if failed else "tests failed")
    tail = "\n".join(output.splitlines()[-25:])
    return Outcome("error", seconds, f"pytest exited with {done.returncode}:\n{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ids", nargs="*", help="run only these mutants")
    parser.add_argument("--list", action="store_true", help="print the ids and what each breaks, then exit")
    parser.add_argument("--python", default=str(REPO / ".venv" / "bin" / "python"),
                        help="the interpreter that runs the tests (default: the repository's venv)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per mutant's test run")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run of the tests unmodified")
    parser.add_argument("--keep", action="store_true", help="keep the temporary copy (its path is printed)")
    args = parser.parse_args(argv)

    try:
        mutants = load()
        if args.list:
            for m in mutants:
                print(f"{m.id:34} {m.file}: {m.why}")
            return 0
        unknown = sorted(set(args.ids) - {m.id for m in mutants})
        if unknown:
            raise ListError(f"unknown mutant ids: {unknown}")
        chosen = [m for m in mutants if not args.ids or m.id in args.ids]
        tmp = Path(tempfile.mkdtemp(prefix="streamingnode-mutation-"))
        try:
            root = copy_repo(tmp)
            env = environment(root)
            check_imports(args.python, root, env)
            for m in chosen:  # every text must be there exactly once before anything runs
                (root / m.file).write_text(plant(root, m))
            if not args.no_baseline:
                tests = list(dict.fromkeys(t for m in chosen for t in m.tests))
                base = run_tests(args.python, root, env, tests, args.timeout * 2)
                if base.verdict != "survived":
                    raise ListError(f"the named tests do not pass on the unmodified copy: {base.detail}")
                print(f"baseline: {len(tests)} test ids pass unmodified ({base.seconds:.1f} s)", flush=True)
            results: list[tuple[Mutant, Outcome]] = []
            for m in chosen:
                original = plant(root, m)
                try:
                    outcome = run_tests(args.python, root, env, m.tests, args.timeout)
                finally:
                    (root / m.file).write_text(original)
                results.append((m, outcome))
                print(f"{outcome.verdict:8} {m.id:34} {outcome.seconds:6.1f} s  {outcome.detail}", flush=True)
        finally:
            if args.keep:
                print(f"copy kept in {tmp}")
            else:
                shutil.rmtree(tmp, ignore_errors=True)
    except ListError as exc:
        print(f"mutation list error: {exc}", file=sys.stderr)
        return 2
    counts = {v: sum(1 for _, o in results if o.verdict == v) for v in ("killed", "survived", "error")}
    print(f"{counts['killed']} killed, {counts['survived']} survived, {counts['error']} errors "
          f"of {len(results)} mutants")
    if counts["error"]:
        return 2
    return 1 if counts["survived"] else 0


if __name__ == "__main__":
    sys.exit(main())
