"""The WAL conformance suite (tests/unit/test_wal_conformance.py, unchanged) on the JetStream backend,
replicas 1 (one nats-server) and 3 (a three-server cluster): only the ``harness`` fixture differs, and
backup, which this backend refuses (see wal/backends/jetstream.py), is expected to be refused."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from tests.cluster.conftest import JetStreamHarness
from tests.conftest import ManagerFactory
from tests.natscluster import NatsCluster
from tests.unit import test_wal_conformance as suite
from wal import InvalidArgumentError

globals().update({name: test for name, test in vars(suite).items()
                  if name.startswith("test_") and name != "test_backup_is_consistent_and_opens"})


@pytest.fixture(params=["jetstream-r1", "jetstream-r3"])
def harness(request: pytest.FixtureRequest) -> Iterator[JetStreamHarness]:
    cluster: NatsCluster = request.getfixturevalue("nats_r1" if request.param == "jetstream-r1" else "nats_r3")
    h = JetStreamHarness(cluster, 1 if request.param == "jetstream-r1" else 3)
    yield h
    h.close()


async def test_backup_is_refused_precisely(open_manager: ManagerFactory, tmp_path: pathlib.Path) -> None:
    m = await open_manager()
    await m.create_channel("p")
    with pytest.raises(InvalidArgumentError, match="not supported by the JetStream WAL backend"):
        await m.backup(tmp_path / "backup")
    assert not (tmp_path / "backup").exists()
