"""The chaos runs need root and network namespaces.  Where the machine cannot make them, every chaos
test fails with the reason under CI (CI runs as root: a run that cannot build them there is broken,
never quietly skipped); elsewhere, without root, they are skipped with that reason."""

from __future__ import annotations

import os

import pytest

from tests.chaos.netns import NamespacesUnavailableError, check_capable


@pytest.fixture(scope="session")
def namespaces_ok() -> None:
    try:
        check_capable()
    except NamespacesUnavailableError as exc:
        if os.environ.get("CI") or os.geteuid() == 0:
            pytest.fail(str(exc))
        pytest.skip(str(exc))
