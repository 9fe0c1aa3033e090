"""Can Spark's Python workers import the data source?  Checked once, on the driver, by ``register``.

A Python data source runs in Python workers that Spark starts with the interpreter the SparkContext
recorded when it started (``SparkContext.pythonExec``): ``$PYSPARK_PYTHON`` as it was then, else
``python3`` from the PATH.  A job started as ``.venv/bin/python job.py`` without the venv activated
gets a system ``python3`` there, without pyarrow or streamingnode, and fails only when the first
task runs, with a ModuleNotFoundError deep in an executor's trace.  ``spark.pyspark.python`` set in
the session builder of such a script does not change it (pyspark reads only the environment; the
setting counts for ``spark-submit``, which exports it as ``PYSPARK_PYTHON`` before the driver starts).

What is checked, and why it is cheap and reliable:

- only with a ``local`` master: on a cluster the workers run on other machines, and an import on
  the driver's machine says nothing about theirs;
- the driver's own interpreter, or another in the same directory (a venv's ``python``/``python3``),
  passes without a process: it has just imported this module;
- any other is started once (per interpreter path, per driver process), with the driver's
  environment and working directory as a local worker has them, to import what the source needs
  besides pyspark: pyarrow, and the client, flusher and wal packages (with grpc and protobuf).
  pyspark itself a worker gets from Spark (its own archive on the worker's PYTHONPATH); importing it
  from there here would compile it from source, several seconds, to learn nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

_CHECK_SECONDS = 120.0
_WORKER_IMPORTS = "import pyarrow, pyarrow.parquet, streamingnode.client, flusher, wal.bodies"
_checked: set[str] = set()
"""Worker interpreters that imported the source (checked once per process)."""


class WorkerPythonError(RuntimeError):
    """Spark's Python workers would start an interpreter that cannot import the data source."""


def _same_environment(exe: str) -> bool:
    found = shutil.which(exe)
    if found is None:
        return False
    # Not resolved through symlinks: a venv's python links to the system one, which lacks the venv's
    # packages.  The same directory is the same environment (bin/python, bin/python3).
    return Path(os.path.abspath(found)).parent == Path(os.path.abspath(sys.executable)).parent


def check_worker_python(spark: Any) -> None:
    """Raise WorkerPythonError when ``spark``'s local Python workers cannot import the data source."""
    try:
        context = spark.sparkContext
        master, exe = str(context.master), str(context.pythonExec)
    except Exception:  # noqa: BLE001  (Spark Connect has no SparkContext: nothing to check from here)
        return
    if not master.startswith("local") or exe in _checked or _same_environment(exe):
        return
    try:
        proc = subprocess.run([exe, "-c", _WORKER_IMPORTS], capture_output=True, text=True,  # noqa: S603
                              timeout=_CHECK_SECONDS, check=False)
        said = proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"]
        failure = None if proc.returncode == 0 else said[-1]
    except (OSError, subprocess.TimeoutExpired) as exc:
        failure = str(exc)
    if failure is None:
        _checked.add(exe)
        return
    how = ("$PYSPARK_PYTHON" if os.environ.get("PYSPARK_PYTHON") == exe
           else "the default: python3 from the PATH, as PYSPARK_PYTHON was not set when the SparkContext started")
    raise WorkerPythonError(
        f"Spark's Python workers would run {exe!r} ({how}), which cannot import the streamingnode data "
        f"source: {failure[:300]}.  Point them at this interpreter before the SparkSession starts: "
        f"export PYSPARK_PYTHON={sys.executable} (or os.environ['PYSPARK_PYTHON'] = sys.executable first "
        "thing in the job; with spark-submit, --conf spark.pyspark.python=...), or run the job with its "
        "venv activated.")


__all__ = ["WorkerPythonError", "check_worker_python"]
