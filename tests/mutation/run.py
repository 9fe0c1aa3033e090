"""Plant curated bugs, one at a time, in a copy of the repository, and check that the tests catch each.

    .venv/bin/python tests/mutation/run.py              # every mutant in mutants.toml
    .venv/bin/python tests/mutation/run.py ID [ID ...]  # only these
    .venv/bin/python tests/mutation/run.py --list       # ids and what each one breaks

Every entry of ``mutants.toml`` names a file, a text that must occur in it exactly once, the text that
replaces it, and the tests that must fail once it is replaced.  The repository is copied once to a
temporary directory (without .venv, .git, caches and a top-level data dir); the named tests first run
there unmodified (they must pass, or "killed" would mean nothing), then each mutant is planted, its
tests run with the repository's own interpreter (``-q -p no:cacheprovider``, a per-test and an
overall time limit), and the file is restored before the next one.  The working tree is never touched.

Each run loads the plugin in ``verdicts.py``, which records why each test failed, and the mutant gets
one of four verdicts:

- ``killed``: a named test failed on a check: an assertion (``assert``, ``pytest.fail``, a wait of
  ``tests/waiting.py`` whose condition never came, a ``pytest.raises`` that saw nothing), an error
  other than the one a ``pytest.raises`` waited for, or an error the entry lists under ``raises``;
- ``survived``: every named test passed;
- ``timeout``: no test failed on a check, and one hung (the whole run passed ``--timeout``), was
  stopped by pytest-timeout, or ran out a bounded wait (``TimeoutError``);
- ``error``: no test failed on a check, and one could not be collected or set up, broke in teardown,
  or failed on an error no test expected (a ``TypeError`` from the product, a warning turned error).

The plugin stops the session at the first catch, so a setup error in one test does not hide the catch
of the next.  The report ends with the counts per verdict and every mutant not killed, with why.

Exit status: 0 when every mutant was killed, 1 when any was not, 2 when the list or the copy is wrong
(a text not found exactly once, an unknown id, tests that do not pass unmodified).  ``--part K/N`` runs
the K-th of N slices of the list, for a long run done in pieces; ``--json FILE`` keeps the verdicts.

Not a test module: pytest collects only ``test_*.py``, and nothing here is a test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MUTANTS = HERE / "mutants.toml"
# The pytest plugin that says why each test failed (verdicts.py, imported from this directory).
PLUGIN = "verdicts"
REPORT_ENV = "MUTATION_VERDICTS"
EXPECTED_ENV = "MUTATION_EXPECTED"
# Never copied: the environment, history, caches, and a node's data dir left by `make run`.
SKIPPED_EVERYWHERE = {".venv", ".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis",
                      "node_modules"}
SKIPPED_AT_TOP = {"data", "streamingnode.egg-info"}
PER_TEST_TIMEOUT = 300.0
"""Seconds per test (the suite's own limit): a planted bug may turn a wait into a hang, and a Spark test's
session alone takes two minutes on a loaded machine (a lower limit made those timeouts of the machine)."""
PACKAGES = ("wal", "interceptors", "flusher", "streamingnode")


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str
    old: str
    new: str
    tests: list[str]
    why: str
    raises: tuple[str, ...] = ()


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
        unknown = set(entry) - {"id", "file", "old", "new", "tests", "why", "raises"}
        if unknown:
            raise ListError(f"mutant {entry['id']!r} has unknown keys {sorted(unknown)}")
        out.append(Mutant(entry["id"], entry["file"], entry["old"], entry["new"], list(entry["tests"]), entry["why"],
                          tuple(entry.get("raises", ()))))
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
    # The verdict plugin is imported from this directory, after the copy (it is the same file there).
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(HERE), *filter(None, [env.get("PYTHONPATH")])])
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


VERDICTS = ("killed", "survived", "timeout", "error")


@dataclass
class Outcome:
    verdict: str  # one of VERDICTS
    seconds: float
    detail: str


@dataclass(frozen=True)
class Line:
    """One line of the plugin's report (see verdicts.py)."""

    nodeid: str
    when: str
    kind: str
    detail: str


def read_lines(path: Path) -> list[Line]:
    if not path.exists():
        return []
    out: list[Line] = []
    for text in path.read_text(encoding="utf-8").splitlines():
        try:
            raw = json.loads(text)
        except json.JSONDecodeError:
            continue  # the last line of a run killed mid-write
        out.append(Line(raw["nodeid"], raw["when"], raw["kind"], raw["detail"]))
    return out


def judge(lines: list[Line], returncode: int | None, seconds: float, timeout: float, output: str) -> Outcome:
    """The verdict on one mutant from what each of its tests did; ``returncode`` None means the run hung.

    Killed only when a test failed on a check (the plugin's "killed"): a timeout, a hang, a setup or
    collection error, or an error no test expected is never counted as a catch, whatever else happened.
    """
    def first(kind: str) -> Line | None:
        return next((line for line in lines if line.kind == kind), None)

    def where(line: Line) -> str:
        return f"{line.nodeid or '(collection)'}: {line.detail}"

    killed = first("killed")
    if killed is not None:
        return Outcome("killed", seconds, where(killed))
    if returncode is None:
        started = [line.nodeid for line in lines if line.when == "start"]
        finished = {line.nodeid for line in lines if line.when == "teardown"}
        hung = next((n for n in reversed(started) if n not in finished), None)
        return Outcome("timeout", seconds, f"no result within {timeout:.0f} s (a hang) in {hung or 'collection'}")
    timed_out = first("timeout")
    if timed_out is not None:
        return Outcome("timeout", seconds, where(timed_out))
    for kind, what in (("error", ""), ("crashed", "failed on an error it did not expect: ")):
        line = first(kind)
        if line is not None:
            return Outcome("error", seconds, f"{line.nodeid or '(collection)'}: {what}{line.detail}")
    ran = [line for line in lines if line.when == "call"]
    if returncode == 0 and any(line.kind == "passed" for line in ran):
        return Outcome("survived", seconds, "every named test passed")
    tail = "\n".join(output.splitlines()[-25:])
    if returncode == 0:
        return Outcome("error", seconds, f"no named test ran (all skipped or deselected):\n{tail}")
    return Outcome("error", seconds, f"pytest exited with {returncode} and no test failed on a check:\n{tail}")


def run_tests(python: str, root: Path, env: dict[str, str], tests: list[str], timeout: float,
              expected: list[str] | None = None, per_test: float = PER_TEST_TIMEOUT) -> Outcome:
    """Run ``tests`` under ``root`` with the verdict plugin and judge the result.

    No ``-x``: the plugin stops the session at the first test that fails on a check, so a setup error in
    one test does not hide the catch of the next.  The run is its own process group, killed whole when it
    hangs (a crash test's servers would otherwise hold the output open)."""
    with tempfile.TemporaryDirectory(prefix="mutation-run-") as scratch:
        report = Path(scratch) / "verdicts.jsonl"
        log = Path(scratch) / "output.txt"
        run_env = dict(env)
        run_env[REPORT_ENV] = str(report)
        run_env[EXPECTED_ENV] = ",".join(expected or [])
        # The named tests run in the order listed (no random order), so a verdict can be replayed.
        cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-p", PLUGIN,
               f"--timeout={per_test:g}", *tests]
        started = time.monotonic()
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, cwd=root, env=run_env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                returncode: int | None = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                returncode = None
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        seconds = time.monotonic() - started
        return judge(read_lines(report), returncode, seconds, timeout, log.read_text(errors="replace"))


def select_part(mutants: list[Mutant], part: str) -> list[Mutant]:
    """``K/N``: the K-th of N contiguous slices of the list (1-based), for a long run done in pieces."""
    k_text, _, n_text = part.partition("/")
    try:
        k, n = int(k_text), int(n_text)
    except ValueError:
        raise ListError(f"--part wants K/N, not {part!r}") from None
    if not 1 <= k <= n:
        raise ListError(f"--part {part}: K must be between 1 and N")
    size = -(-len(mutants) // n)
    return mutants[(k - 1) * size:k * size]


def report(results: list[tuple[Mutant, Outcome]]) -> str:
    """The summary: counts per verdict, then every mutant that was not killed, grouped by verdict."""
    counts = {v: sum(1 for _, o in results if o.verdict == v) for v in VERDICTS}
    lines = [f"{counts['killed']} killed, {counts['survived']} survived, {counts['timeout']} timeouts, "
             f"{counts['error']} errors of {len(results)} mutants"]
    for verdict, title in (("survived", "survivors (the tests passed with the bug planted)"),
                           ("timeout", "timeouts (no test reached a failing check in time)"),
                           ("error", "errors (setup, collection, or an error no test expected)")):
        chosen = [(m, o) for m, o in results if o.verdict == verdict]
        if chosen:
            lines.append(f"\n{title}:")
            lines.extend(f"  {m.id} ({m.file}): {o.detail}" for m, o in chosen)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ids", nargs="*", help="run only these mutants")
    parser.add_argument("--list", action="store_true", help="print the ids and what each breaks, then exit")
    parser.add_argument("--part", help="K/N: run only the K-th of N contiguous slices of the list")
    parser.add_argument("--python", default=str(REPO / ".venv" / "bin" / "python"),
                        help="the interpreter that runs the tests (default: the repository's venv)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per mutant's test run")
    parser.add_argument("--test-timeout", type=float, default=PER_TEST_TIMEOUT,
                        help="seconds allowed per test (pytest-timeout); default: the suite's own limit")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run of the tests unmodified")
    parser.add_argument("--keep", action="store_true", help="keep the temporary copy (its path is printed)")
    parser.add_argument("--json", type=Path, help="also write each mutant's verdict to this file (JSON)")
    args = parser.parse_args(argv)

    results: list[tuple[Mutant, Outcome]] = []
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
        if args.part:
            chosen = select_part(chosen, args.part)
        tmp = Path(tempfile.mkdtemp(prefix="streamingnode-mutation-"))
        try:
            root = copy_repo(tmp)
            env = environment(root)
            check_imports(args.python, root, env)
            for m in chosen:  # every text must be there exactly once before anything runs
                (root / m.file).write_text(plant(root, m))
            if not args.no_baseline:
                tests = list(dict.fromkeys(t for m in chosen for t in m.tests))
                base = run_tests(args.python, root, env, tests, args.timeout * 2, per_test=args.test_timeout)
                if base.verdict != "survived":
                    raise ListError(f"the named tests do not pass on the unmodified copy ({base.verdict}): "
                                    f"{base.detail}")
                print(f"baseline: {len(tests)} test ids pass unmodified ({base.seconds:.1f} s)", flush=True)
            for m in chosen:
                original = plant(root, m)
                try:
                    outcome = run_tests(args.python, root, env, m.tests, args.timeout, list(m.raises),
                                        per_test=args.test_timeout)
                finally:
                    (root / m.file).write_text(original)
                results.append((m, outcome))
                first_line = outcome.detail.splitlines()[0] if outcome.detail else ""
                print(f"{outcome.verdict:8} {m.id:34} {outcome.seconds:6.1f} s  {first_line}", flush=True)
                if args.json:
                    write_json(args.json, results)
        finally:
            if args.keep:
                print(f"copy kept in {tmp}")
            else:
                shutil.rmtree(tmp, ignore_errors=True)
    except ListError as exc:
        print(f"mutation list error: {exc}", file=sys.stderr)
        return 2
    print("\n" + report(results))
    return 0 if all(o.verdict == "killed" for _, o in results) else 1


def write_json(path: Path, results: list[tuple[Mutant, Outcome]]) -> None:
    rows = [{"id": m.id, "file": m.file, "verdict": o.verdict, "seconds": round(o.seconds, 1), "detail": o.detail}
            for m, o in results]
    path.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
