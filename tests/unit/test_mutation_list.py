"""The list of planted bugs stays runnable: every mutant's text is found exactly once in its file and
every test it names exists.  A refactor that moves the text would otherwise only show when someone runs
``tests/mutation/run.py`` (it stops at the first stale entry)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.mutation.run import Mutant, load

ROOT = Path(__file__).resolve().parents[2]
MUTANTS = load()


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.id for m in MUTANTS])
def test_each_mutant_plants_once_and_names_tests_that_exist(mutant: Mutant) -> None:
    path = ROOT / mutant.file
    assert path.is_file(), f"{mutant.file} does not exist"
    count = path.read_text().count(mutant.old)
    assert count == 1, f"the text to replace occurs {count} times in {mutant.file}"
    for test in mutant.tests:
        file, _, name = test.partition("::")
        test_path = ROOT / file
        assert test_path.exists(), f"{file} does not exist"
        if name:
            function = name.split("[")[0]
            defined = {n.name for n in ast.walk(ast.parse(test_path.read_text()))
                       if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            assert function in defined, f"{file} defines no {function}"
