"""The chaos runs need root and network namespaces.  Where the machine cannot make them, every chaos
test fails with the reason (never quietly skipped): `make test` and CI run as root, and a run that
cannot build them is broken.  Without root, leave the folder out (`pytest --ignore=tests/chaos`)."""

from __future__ import annotations

import pytest

from tests.chaos.netns import NamespacesUnavailableError, check_capable


@pytest.fixture(scope="session")
def namespaces_ok() -> None:
    try:
        check_capable()
    except NamespacesUnavailableError as exc:
        pytest.fail(str(exc))
