"""``register(spark)`` fails on the driver, saying how to fix it, when Spark's Python workers would run an
interpreter that cannot import the data source, instead of a ModuleNotFoundError in the first task.

Real local Spark: the worker interpreter is the one the SparkContext recorded (``pythonExec``); each
case sets it, checks what ``register`` says, and then reads through the source with it to show the
prediction is Spark's own outcome.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamingnode.client import Client
from streamingnode.server import ServerThread
from streamingnode.spark import StreamingNodeDataSource, WorkerPythonError, _workers, register

pytestmark = pytest.mark.integration


@pytest.fixture
def worker_python(spark: Any) -> Iterator[Any]:
    """Sets the session's worker interpreter for one test; the driver's again after it (re-registered)."""
    context = spark.sparkContext
    was = context.pythonExec

    def use(exe: str) -> None:
        context.pythonExec = exe

    try:
        yield use
    finally:
        context.pythonExec = was
        _workers._checked.clear()
        register(spark)


def _read(spark: Any, addr: str) -> list[bytes]:
    df = spark.read.format("streamingnode").option("addr", addr).option("pchannel", "p").load()
    return [bytes(r.payload) for r in df.orderBy("id").collect()]


def _bare_python(tmp_path: Path) -> str:
    """An interpreter of the driver's Python version without any of its packages (no pyarrow)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True, timeout=120)
    return str(tmp_path / "bare" / "bin" / "python")


def test_workers_without_the_packages_fail_register_with_what_to_set(spark: Any, node: ServerThread, tmp_path: Path,
                                                                     worker_python: Any) -> None:
    with Client(node.address) as client:
        client.create_channels(["p"])
        with client.producer("p") as producer:
            producer.send("v", b"m")
    bare = _bare_python(tmp_path)
    worker_python(bare)
    with pytest.raises(WorkerPythonError) as caught:
        register(spark)
    said = str(caught.value)
    assert f"Spark's Python workers would run {bare!r}" in said, said
    assert "No module named 'pyarrow'" in said, said
    assert f"PYSPARK_PYTHON={sys.executable}" in said, said
    # What register foresaw is what Spark does: the source registered anyway fails in its workers.
    spark.dataSource.register(StreamingNodeDataSource)
    with pytest.raises(Exception, match=r"ModuleNotFoundError|No module named") as failed:
        _read(spark, node.address)
    assert "pyarrow" in str(failed.value)


def test_another_path_to_a_python_that_has_the_packages_passes(spark: Any, node: ServerThread, tmp_path: Path,
                                                               worker_python: Any) -> None:
    with Client(node.address) as client:
        client.create_channels(["p"])
        with client.producer("p") as producer:
            producer.send("v", b"m")
    # Not the driver's path, nor its directory: the check starts it once and it imports the source.
    wrapper = tmp_path / "bin" / "python-for-workers"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    worker_python(str(wrapper))
    register(spark)
    assert str(wrapper) in _workers._checked
    assert _read(spark, node.address) == [b"m"]


def test_the_driver_interpreter_and_a_cluster_master_start_no_check(spark: Any, worker_python: Any,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[object] = []
    monkeypatch.setattr(_workers.subprocess, "run", lambda *a, **k: started.append(a))
    worker_python(os.path.join(os.path.dirname(sys.executable), "python3"))  # a venv's other name
    register(spark)
    worker_python("/nonexistent/python")

    class Remote:
        master = "spark://elsewhere:7077"
        pythonExec = "/nonexistent/python"

    class OnACluster:
        sparkContext = Remote()
        dataSource = spark.dataSource

    register(OnACluster())  # its workers run on other machines: nothing to learn on this one
    assert started == []
