"""A real node per test and the session's Spark with the ``streamingnode`` source registered.

Python data sources run in Python workers that Spark starts with ``PYSPARK_PYTHON``: set it to this
interpreter (the venv that has pyspark and streamingnode) before the session fixture starts Spark.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamingnode.server import ServerThread
from tests.integration.conftest import node_config

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

pytestmark = pytest.mark.integration


@pytest.fixture
def node(tmp_path: Path) -> Iterator[ServerThread]:
    with ServerThread(node_config(tmp_path / "data")) as srv:
        yield srv


@pytest.fixture
def sspark(spark: Any) -> Any:
    """The session's Spark with ``format("streamingnode")`` registered."""
    from streamingnode.spark import register  # noqa: PLC0415

    register(spark)
    return spark
