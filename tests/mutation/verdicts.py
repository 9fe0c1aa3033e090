"""A pytest plugin for ``tests/mutation/run.py``: why each test failed, one JSON line per test phase.

A planted bug is caught only when a test *checks* something and the check fails: an assertion (``assert``,
``pytest.fail``, a ``pytest.raises`` that saw nothing, or a wait in ``tests/waiting.py`` whose condition
never came), or an error other than the one a ``pytest.raises`` block was waiting for.  Anything else is
not a catch and gets its own verdict:

- ``timeout``: pytest-timeout stopped the test, a bounded wait (``asyncio.wait_for``) ran out, or
  hypothesis found an example too slow.  A planted bug that turns a wait into a hang is not proven caught
  by a test that never reached its check.
- ``error``: the test could not start (a fixture or an import failed: that is the setup, not the test),
  or its teardown broke on something other than an assertion.
- ``crashed``: the body raised an error nobody expected (a ``TypeError`` from the product, a
  ``ResourceWarning`` turned into an error): the test failed, but not on what it checks.

The runner loads this module with ``-p mutation_verdicts`` (its directory on ``PYTHONPATH``) and names the
file to write in ``MUTATION_VERDICTS``.  ``MUTATION_EXPECTED`` (comma-separated class names) lists errors
that count as a catch for one mutant, where the test's check is an error the product raises by design.
Each line is ``{"nodeid", "when", "kind", "detail"}`` with ``when`` one of collect, start, setup, call,
teardown; ``start`` is written before a test runs, so a run killed for hanging still names its test.

Not a test module: pytest collects only ``test_*.py``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Generator
from typing import Any

import pytest

REPORT_ENV = "MUTATION_VERDICTS"
EXPECTED_ENV = "MUTATION_EXPECTED"
_TIMEOUT_PREFIX = "Timeout (>"  # pytest-timeout's failure message (signal method)
_SLOW_EXAMPLE = {"DeadlineExceeded"}  # hypothesis: an example ran past its deadline

# Errors that went through a ``pytest.raises`` block waiting for another type: id -> the types it waited for.
# The exception objects are kept alive alongside, so an id is not reused within the test.
_escaped: dict[int, tuple[BaseException, str]] = {}


def _describe(exc: BaseException) -> str:
    """The error's class and the first line of its message; a gRPC error by its status and details
    (its own first line says only that an RPC terminated)."""
    name = type(exc).__name__
    code, details = getattr(exc, "code", None), getattr(exc, "details", None)
    if callable(code) and callable(details):
        try:
            return f"{name}: {code()}: {details()}"
        except Exception:  # a look at the error must not hide it
            pass
    text = str(exc).strip()
    return f"{name}: {text.splitlines()[0]}" if text else name


def classify(exc: BaseException, expected: frozenset[str] = frozenset()) -> tuple[str, str]:
    """``(kind, detail)`` for an exception that ended a test's body: killed, timeout or crashed."""
    name = type(exc).__name__
    detail = _describe(exc)
    if isinstance(exc, pytest.fail.Exception):
        if str(exc).startswith(_TIMEOUT_PREFIX):
            return "timeout", detail
        return "killed", detail
    if isinstance(exc, AssertionError):
        return "killed", detail
    escaped = _escaped.get(id(exc))
    if escaped is not None and escaped[0] is exc:
        return "killed", f"{detail} (the test expected {escaped[1]})"
    if name in expected or f"{type(exc).__module__}.{type(exc).__qualname__}" in expected:
        return "killed", f"{detail} (the error this mutant is listed to raise)"
    if isinstance(exc, TimeoutError) or name in _SLOW_EXAMPLE:
        return "timeout", detail
    if isinstance(exc, BaseExceptionGroup):
        kinds = [classify(e, expected) for e in exc.exceptions]
        for wanted in ("killed", "timeout"):
            for kind, inner in kinds:
                if kind == wanted:
                    return kind, f"{name} holding {inner}"
        return "crashed", f"{name} holding {kinds[0][1]}" if kinds else detail
    return "crashed", detail


def _watch_raises() -> None:
    """Remember errors that a ``pytest.raises`` block let through because it waited for another type."""
    cls: Any = pytest.RaisesExc
    if getattr(cls, "_mutation_watched", False):
        return
    original = cls.__exit__

    def __exit__(self: Any, exc_type: Any, exc_val: BaseException | None, exc_tb: Any) -> bool:
        __tracebackhide__ = True
        handled: bool = original(self, exc_type, exc_val, exc_tb)
        if not handled and exc_val is not None:
            waited = ", ".join(getattr(e, "__name__", repr(e)) for e in self.expected_exceptions)
            _escaped[id(exc_val)] = (exc_val, waited or "an error")
        return handled

    cls.__exit__ = __exit__
    cls._mutation_watched = True


class _Writer:
    def __init__(self, path: str, expected: frozenset[str]) -> None:
        self.path = path
        self.expected = expected

    def write(self, nodeid: str, when: str, kind: str, detail: str = "") -> None:
        # Appended and closed line by line: a run killed for hanging keeps every line written before.
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"nodeid": nodeid, "when": when, "kind": kind, "detail": detail}) + "\n")

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logstart(self, nodeid: str, location: object) -> None:
        self.write(nodeid, "start", "started")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
        report = yield
        when = call.when
        if report.passed:
            kind, detail = "passed", ""
        elif report.skipped:
            kind, detail = "skipped", ""
        else:
            exc = call.excinfo.value if call.excinfo is not None else None
            if exc is None:
                kind, detail = "error", f"{when} failed without an exception"
            else:
                kind, detail = classify(exc, self.expected)
                if when != "call":
                    # A fixture's own check failing at teardown is a check; anything else outside the body
                    # (a fixture that cannot start, a teardown that breaks) is an error, never a catch.
                    if not (when == "teardown" and kind == "killed"):
                        kind = "error"
                    detail = f"in {when}: {detail}"
        self.write(item.nodeid, when, kind, detail)
        if when == "call":
            _escaped.clear()
        if kind == "killed":
            item.session.shouldstop = "a planted bug was caught"
        return report

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            text = str(report.longrepr).strip().splitlines()
            self.write(report.nodeid, "collect", "error", f"collection failed: {text[-1] if text else ''}")


def pytest_configure(config: pytest.Config) -> None:
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    expected = frozenset(n.strip() for n in os.environ.get(EXPECTED_ENV, "").split(",") if n.strip())
    _watch_raises()
    config.pluginmanager.register(_Writer(path, expected), "mutation-verdicts-writer")
