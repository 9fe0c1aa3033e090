"""Shared fixtures: every WAL-level test runs against both backends (the conformance suite); one Spark
session per run; an in-memory tracing provider per test.  And one check for every test: what it left
unclosed fails its own teardown (tests/leaks.py)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests import leaks
from tests.seeds import draw_seed
from wal import Durability, WALManager
from wal.backend import Backend
from wal.backends import MemoryBackend, RocksBackend

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tiers by marker, whatever each file declares: ``-m "not spark and not crash and not
    cluster"`` is the quick run (tests/README.md)."""
    tests = Path(__file__).parent
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)
        folder = item.path.relative_to(tests).parts[0] if item.path.is_relative_to(tests) else ""
        if folder in ("crash", "cluster"):
            item.add_marker(folder)


def pytest_collection_finish(session: pytest.Session) -> None:
    leaks.freeze_imports()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the test's fixtures (and its event loop) are closed: whatever the garbage collector still
    has to close was left open by this test."""
    yield
    found = leaks.collect()
    if found:
        pytest.fail(f"{item.nodeid} left resources for the garbage collector to close:\n" + "\n".join(found),
                    pytrace=False)


class BackendHarness:
    """Creates a backend and can 'reopen' it as a restarted process would."""

    def __init__(self, kind: str, path: Path) -> None:
        self.kind = kind
        self.path = path
        self._memory: MemoryBackend | None = None

    def new(self) -> Backend:
        if self.kind == "memory":
            if self._memory is None:
                self._memory = MemoryBackend()
            else:
                self._memory = self._memory.reopen()
            return self._memory
        return RocksBackend(self.path)

    def restore(self, backup_dir: str) -> Backend:
        if self.kind == "memory":
            return MemoryBackend.restore(backup_dir)
        return RocksBackend(backup_dir)


@pytest.fixture(params=["memory", "rocksdb"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> BackendHarness:
    return BackendHarness(request.param, tmp_path / "db")


ManagerFactory = Callable[..., Awaitable[WALManager]]


@pytest.fixture
def seed(record_property: Callable[[str, object], None]) -> int:
    """For a randomized test: a fresh seed per run, printed and recorded; ``STREAMINGNODE_TEST_SEED``
    replays one."""
    return draw_seed("STREAMINGNODE_TEST_SEED", record_property)


@pytest.fixture
async def open_manager(harness: BackendHarness) -> AsyncIterator[ManagerFactory]:
    """Start a manager over the harness backend; reopen by closing the previous one first."""
    opened: list[WALManager] = []

    async def factory(**kwargs: object) -> WALManager:
        kwargs.setdefault("durability", Durability.SYNC)
        m = await WALManager.start(harness.new(), **kwargs)  # type: ignore[arg-type]
        opened.append(m)
        return m

    yield factory
    for m in opened:
        await m.aclose()


@pytest.fixture
async def manager(open_manager: ManagerFactory) -> WALManager:
    return await open_manager()


# One local SparkSession for the whole run (a cold start costs ~10 s, a read on a warm session well under
# one), shared by the Spark tests and the flusher crash test; pyspark is imported only when asked for.
@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from pyspark import SparkConf, SparkContext  # noqa: PLC0415  (only the tests that ask pay for it)
    from pyspark.sql import SparkSession  # noqa: PLC0415

    # Spark binds the machine's external interface unless told otherwise; tests stay on loopback.
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    conf = (
        SparkConf()
        .setMaster("local[2]")
        .setAppName("streamingnode-tests")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.sql.shuffle.partitions", "2")
        .set("spark.default.parallelism", "2")
        .set("spark.sql.session.timeZone", "UTC")
    )
    log = tmp_path_factory.mktemp("spark") / "jvm.log"
    gateway = launch_spark_gateway(conf, log)
    session = SparkSession(SparkContext(conf=conf, gateway=gateway))
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def launch_spark_gateway(conf: Any, log: Path) -> Any:
    """Start Spark's JVM with its output in ``log``, so that a JVM that exits before it starts says why.

    pyspark's own launch sends the JVM's output to the terminal, which pytest's capture of a session
    fixture does not show; all a failed start then reports is "exited before sending its port number".
    """
    import gc  # noqa: PLC0415
    import warnings  # noqa: PLC0415

    from pyspark.errors import PySparkRuntimeError  # noqa: PLC0415
    from pyspark.java_gateway import launch_gateway  # noqa: PLC0415

    with log.open("ab") as out:
        try:
            return launch_gateway(conf, popen_kwargs={"stdout": out, "stderr": out})
        except PySparkRuntimeError as e:
            failure = str(e)
    # pyspark drops the failed JVM's Popen with its stdin pipe open; collect it here, where its
    # ResourceWarning is expected, rather than let it surface later as an unraisable error that ends
    # the whole run.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    text = log.read_text(errors="replace")
    raise RuntimeError(f"Spark's JVM did not start ({failure}); its output ({log}):\n{text[-6000:]}")


# --- tracing: each test its own provider, spans kept in memory (the global provider is never set)
@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    p = TracerProvider()
    p.add_span_processor(SimpleSpanProcessor(exporter))
    yield p
    p.shutdown()
