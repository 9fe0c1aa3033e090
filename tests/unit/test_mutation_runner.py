"""The mutation runner's verdicts: a planted bug counts as caught only when a test fails on a check.

The classifier (``tests/mutation/verdicts.py``) on exceptions, the judge on the lines it writes, and
the whole path end to end: ``run_tests`` on a tiny repository of fake tests, one per way a test can end
(an assertion, a ``pytest.raises`` that got another error, a pass, a fixture that cannot start, an
error nobody expected, a module that cannot be imported, pytest-timeout, a hang), each with the verdict
it must get.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from tests.mutation.run import Line, ListError, Mutant, environment, judge, load, report, run_tests, select_part
from tests.mutation.verdicts import classify


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # the object as a test's body would have raised it
        return caught


@pytest.mark.parametrize(("exc", "kind"), [
    (AssertionError("assert 1 == 2"), "killed"),
    (pytest.fail.Exception("DID NOT RAISE ValueError"), "killed"),
    (pytest.fail.Exception("Timeout (>120.0s) from pytest-timeout."), "timeout"),
    (TimeoutError(), "timeout"),
    (ValueError("boom"), "crashed"),
    (ExceptionGroup("two", [ValueError("x"), AssertionError("y")]), "killed"),
    (ExceptionGroup("two", [ValueError("x"), TimeoutError()]), "timeout"),
    (ExceptionGroup("two", [ValueError("x"), KeyError("y")]), "crashed"),
])
def test_classify_by_what_ended_the_body(exc: BaseException, kind: str) -> None:
    assert classify(_raised(exc))[0] == kind


def test_an_error_the_mutant_is_listed_to_raise_is_a_catch() -> None:
    assert classify(KeyError("k"), frozenset({"KeyError"}))[0] == "killed"
    assert classify(KeyError("k"), frozenset({"builtins.KeyError"}))[0] == "killed"
    assert classify(KeyError("k"), frozenset({"ValueError"}))[0] == "crashed"
    # A test whose bound is its check (``asyncio.timeout`` around "not retried forever").
    assert classify(TimeoutError(), frozenset({"TimeoutError"}))[0] == "killed"


def _line(kind: str, when: str = "call", nodeid: str = "t.py::t") -> Line:
    return Line(nodeid, when, kind, kind)


@pytest.mark.parametrize(("lines", "returncode", "verdict"), [
    ([_line("passed")], 0, "survived"),
    ([_line("error", "setup"), _line("killed", nodeid="t.py::u")], 1, "killed"),  # a setup error hides no catch
    ([_line("error", "setup")], 1, "error"),
    ([_line("crashed")], 1, "error"),
    ([_line("error", "collect", nodeid="")], 2, "error"),
    ([_line("timeout"), _line("crashed")], 1, "timeout"),
    ([_line("started", "start")], None, "timeout"),
    ([_line("skipped")], 0, "error"),  # nothing ran: proves nothing
    ([_line("passed")], 4, "error"),  # every line passed, but pytest itself failed (a usage error)
])
def test_judge(lines: list[Line], returncode: int | None, verdict: str) -> None:
    assert judge(lines, returncode, 1.0, 60.0, "output").verdict == verdict


def test_a_hang_names_the_test_that_did_not_finish() -> None:
    lines = [_line("started", "start", "t.py::a"), _line("passed", "teardown", "t.py::a"),
             _line("started", "start", "t.py::b")]
    outcome = judge(lines, None, 60.0, 60.0, "")
    assert outcome.verdict == "timeout" and "t.py::b" in outcome.detail


def test_the_report_separates_the_verdicts() -> None:
    from tests.mutation.run import Outcome  # noqa: PLC0415

    def m(i: str) -> Mutant:
        return Mutant(i, "f.py", "a", "b", ["t.py"], "why")

    text = report([(m("k"), Outcome("killed", 1, "t.py::t: AssertionError")),
                   (m("s"), Outcome("survived", 1, "every named test passed")),
                   (m("h"), Outcome("timeout", 1, "a hang")), (m("e"), Outcome("error", 1, "in setup"))])
    assert text.splitlines()[0] == "1 killed, 1 survived, 1 timeouts, 1 errors of 4 mutants"
    for title, mid in (("survivors", "s"), ("timeouts", "h"), ("errors", "e")):
        section = text.split(f"\n{title}")[1].split("\n\n")[0]
        assert f"  {mid} (f.py)" in section
    assert "  k (f.py)" not in text


def test_parts_cover_the_list_once() -> None:
    mutants = [Mutant(str(i), "f.py", "a", "b", ["t.py"], "why") for i in range(10)]
    parts = [select_part(mutants, f"{k}/3") for k in (1, 2, 3)]
    assert [m.id for p in parts for m in p] == [m.id for m in mutants]
    with pytest.raises(ListError):
        select_part(mutants, "4/3")


def test_the_list_takes_raises_and_refuses_unknown_keys(tmp_path: Path) -> None:
    entry = 'id = "x"\nfile = "f.py"\nwhy = "w"\nold = "a"\nnew = "b"\ntests = ["t.py"]\n'
    path = tmp_path / "m.toml"
    path.write_text(f'[[mutant]]\n{entry}raises = ["KeyError"]\n')
    assert load(path)[0].raises == ("KeyError",)
    path.write_text(f'[[mutant]]\n{entry}expect = ["KeyError"]\n')
    with pytest.raises(ListError, match="unknown keys"):
        load(path)


FAKE_TESTS = '''
import threading

import pytest


@pytest.fixture
def broken():
    raise RuntimeError("the fixture cannot start")


def test_assertion():
    assert 1 + 1 == 3


def test_wrong_error():
    with pytest.raises(ValueError):
        {}["missing"]


def test_passes():
    assert True


def test_setup_error(broken):
    assert True


def test_unexpected_error():
    raise TypeError("the product broke in a way no test checks")


@pytest.mark.timeout(1)
def test_stopped_by_pytest_timeout():
    threading.Event().wait(600)


def test_hangs():
    threading.Event().wait(600)
'''


@pytest.fixture(scope="module")
def fake_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fake-repo")
    (root / "test_fake.py").write_text(textwrap.dedent(FAKE_TESTS))
    (root / "test_unimportable.py").write_text("import a_module_that_does_not_exist\n\ndef test_x():\n    pass\n")
    return root


@pytest.mark.parametrize(("tests", "verdict", "named"), [
    (["test_fake.py::test_assertion"], "killed", "AssertionError"),
    (["test_fake.py::test_wrong_error"], "killed", "the test expected ValueError"),
    (["test_fake.py::test_passes"], "survived", "every named test passed"),
    (["test_fake.py::test_setup_error"], "error", "in setup: RuntimeError"),
    (["test_fake.py::test_unexpected_error"], "error", "TypeError"),
    (["test_unimportable.py"], "error", "collection"),
    (["test_fake.py::test_stopped_by_pytest_timeout"], "timeout", "pytest-timeout"),
    # A setup error first does not hide the catch that follows.
    (["test_fake.py::test_setup_error", "test_fake.py::test_assertion"], "killed", "test_assertion"),
])
def test_run_tests_end_to_end(fake_repo: Path, tests: list[str], verdict: str, named: str) -> None:
    outcome = run_tests(sys.executable, fake_repo, environment(fake_repo), tests, timeout=600)
    assert outcome.verdict == verdict, outcome.detail
    assert named in outcome.detail


def test_a_hang_is_a_timeout_that_names_the_test(fake_repo: Path) -> None:
    outcome = run_tests(sys.executable, fake_repo, environment(fake_repo), ["test_fake.py::test_hangs"], timeout=8)
    assert outcome.verdict == "timeout", outcome.detail
    # Under heavy load pytest may still be starting when the run is stopped: then it names collection.
    assert "test_hangs" in outcome.detail or "collection" in outcome.detail
