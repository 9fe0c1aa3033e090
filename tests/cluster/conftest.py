"""Fixtures of the cluster-mode tests: real nats-servers (one, or a three-server JetStream cluster) per
test module, and a backend harness over them that the WAL conformance suite runs on."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.natscluster import NatsCluster
from wal.backend import Backend
from wal.backends.jetstream import JetStreamBackend

_prefixes = itertools.count(1)


def start_cluster(root: Path, size: int) -> NatsCluster:
    cluster = NatsCluster(root, size)
    cluster.start()
    try:
        asyncio.run(cluster.ready())
    except BaseException:
        cluster.stop()
        raise
    return cluster


async def owner_seen_by(ask: str, pchannel: str) -> str | None:
    """The owner's address of ``pchannel`` as node ``ask`` describes it (None: no answer yet, or the
    pchannel unknown there; another node may be stopped, so only ``ask`` is asked)."""
    from streamingnode.client import AsyncClient, NotOwnerError, UnavailableError  # noqa: PLC0415

    async with AsyncClient(ask, timeout=5) as one:
        try:
            found = [d for d in await one.describe_channels() if d.name == pchannel]
        except (UnavailableError, NotOwnerError):
            return None
    return found[0].owner.address if found else None


@pytest.fixture(scope="module")
def nats_r1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("nats1"), 1)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def nats_r3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("nats3"), 3)
    yield cluster
    cluster.stop()


class JetStreamHarness:
    """The conformance suite's harness on JetStream: each test its own prefix; ``new`` 'reopens'
    as a restarted node would (a new backend instance on the same prefix)."""

    def __init__(self, cluster: NatsCluster, replicas: int) -> None:
        self.kind = f"jetstream-r{replicas}"
        self.cluster = cluster
        self.replicas = replicas
        self.prefix = f"t{next(_prefixes)}"
        self.path = cluster.root
        self.opened: list[JetStreamBackend] = []

    def new(self) -> Backend:
        backend = JetStreamBackend(self.cluster.url, prefix=self.prefix, replicas=self.replicas)
        self.opened.append(backend)
        return backend

    def restore(self, backup_dir: str) -> Backend:
        raise AssertionError("the JetStream backend refuses backup; nothing to restore")

    def close(self) -> None:
        for backend in self.opened:
            backend.close()
