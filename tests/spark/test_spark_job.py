"""flusher.spark_job as a user runs it: `python -m flusher.spark_job` and spark-submit, in subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import flusher.spark_job

from .layout import write_history

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 180  # a cold JVM on a busy two-core machine; normally ~15 s


def run(args: list[str], extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", **(extra_env or {})}
    return subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=REPO, check=False)


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("history")
    write_history(root)
    return root


@pytest.mark.spark
def test_module_count_and_show_as_of_an_iso_time(history: Path) -> None:
    # 35 ms after the base: ids 1, 3 and 5 (2 and 4 deleted, 2's re-insert not yet written).
    as_of_35ms = "2026-01-01T00:00:00.035Z"
    job = ["--root", str(history), "--collection", "books", "--as-of", as_of_35ms, "--count", "--show", "10"]
    result = run([sys.executable, "-m", "flusher.spark_job", *job])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "3"
    table = "\n".join(lines[1:])
    assert {"title 1", "title 3", "title 5"} <= {cell.strip() for line in lines for cell in line.split("|")}
    assert "title 2" not in table and "title 4" not in table


def test_runs_as_a_file_as_spark_submit_runs_it(tmp_path: Path) -> None:
    # spark-submit runs the file as a script, not as a module. A real spark-submit run costs a second cold JVM
    # (~20 s), so the suite checks only that the file works as a script; spark-submit itself was run by hand:
    #   PYSPARK_PYTHON=.venv/bin/python .venv/bin/spark-submit --master 'local[1]' flusher/spark_job.py --root R ...
    result = run([sys.executable, str(REPO / "flusher" / "spark_job.py"), "--root", str(tmp_path), "--collection", "c"])
    assert result.returncode == 2
    assert str(tmp_path / "c") in result.stderr


def test_missing_collection_fails_before_starting_spark(tmp_path: Path) -> None:
    result = run([sys.executable, "-m", "flusher.spark_job", "--root", str(tmp_path), "--collection", "nope"])
    assert result.returncode == 2
    assert str(tmp_path / "nope") in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("text", ["2026-01-01T00:00:00", "yesterday", "-5"])
def test_bad_as_of_is_a_usage_error(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        flusher.spark_job.main(["--root", ".", "--collection", "c", "--as-of", text])
    assert exited.value.code == 2
    assert "--as-of" in capsys.readouterr().err


def test_as_of_accepts_a_timetick_or_an_aware_iso_time() -> None:
    assert flusher.spark_job.parse_as_of("123") == 123
    assert flusher.spark_job.parse_as_of("1970-01-01T00:00:00.001+00:00") == 1 << 18 | 0x3FFFF
