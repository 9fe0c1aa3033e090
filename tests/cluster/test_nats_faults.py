"""NATS faults under a serving node: the JetStream server that leads the pchannel's stream is SIGKILLed
during an idempotent produce, five times, and restarted each time as an operator would.

A node on ``--wal jetstream`` at R3 keeps appending through each leader loss once the two remaining
servers elect a new stream leader; the SDK producer buffers and resends what the node could not
append meanwhile.  After the last kill the log is read from the start: every acknowledged message is
there, once, in order (a send that failed, its fate unknown, is there at most once).

Resume time.  The time from each kill to the next acknowledged appends is printed, with the time
since the last election of a leader for one of the test's streams before it (from the servers'
logs).  The election alone takes 4-9 s (nats-server's Raft waits a random 4-9 s without heartbeats
before a follower campaigns), so the issue's 10 s cannot be promised whole: what the backend adds is
bounded instead.  It asks a dead leader's stream again after a one-second attempt, where it used to
wait out a five-second request timeout.  The times are printed (run with ``-s``; bench/RESULTS.md
quotes them), not asserted: a timed assertion fails on a loaded machine, and the project keeps its
performance targets in benchmarks.  Asserted: appends resume after every kill (within RESUME_WAIT).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from streamingnode.client import AsyncClient
from tests.cluster.conftest import start_cluster
from tests.natscluster import NatsCluster
from tests.node_process import NodeProcess
from tests.waiting import until
from wal.errors import ErrorCode, StreamingError
from wal.message import MessageType

pytestmark = pytest.mark.integration

KILLS = 5
PCHANNEL = "faults"
VCHANNEL = "v"
PREFIX = "nf"
RESUME_WAIT = 60.0  # seconds before a resume that never comes stops the wait


@pytest.fixture(scope="module")
def natsc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("nats"), 3)
    yield cluster
    cluster.stop()


@pytest.fixture
def node(natsc: NatsCluster, tmp_path: Path) -> Iterator[NodeProcess]:
    proc = NodeProcess(tmp_path / "a", None, "--wal", "jetstream", "--nats", natsc.url, "--nats-replicas", "3",
                       "--cluster-prefix", PREFIX, "--node-id", "a", "--lease-seconds", "5",
                       "--parquet-root", str(tmp_path / "parquet")).start()
    try:
        yield proc
    finally:
        proc.kill()


class StreamLeader:
    """Which server leads the pchannel's stream, and whether all three replicas are current, from the
    JetStream API (stream info's cluster section), asked of any server that answers."""

    def __init__(self, natsc: NatsCluster) -> None:
        self.natsc = natsc

    async def info(self) -> object | None:
        for url in self.natsc.urls:
            try:
                nc = await nats.connect(url, connect_timeout=1, allow_reconnect=False, max_reconnect_attempts=0,
                                        error_cb=_quiet)
            except Exception:  # this server is down: ask the next
                continue
            try:
                js = nc.jetstream(timeout=2)
                streams = [s for s in await js.streams_info() if s.config.name.startswith(f"SN_{PREFIX}_")]
                if len(streams) == 1:
                    return streams[0]
            except Exception:  # no meta leader for a moment: ask the next
                continue
            finally:
                await nc.close()
        return None

    async def leader(self) -> int | None:
        info = await self.info()
        name = getattr(getattr(info, "cluster", None), "leader", None)
        return int(name[1:]) if name else None

    async def all_current(self) -> bool:
        info = await self.info()
        cluster = getattr(info, "cluster", None)
        if cluster is None or not cluster.leader:
            return False
        replicas = cluster.replicas or []
        return len(replicas) == 2 and all(r.current and not r.offline for r in replicas)


_ELECTED = re.compile(r"^\[\d+\] (\S+ \S+) \[INF\] JetStream cluster new stream leader for '\$G > (?:SN|KV)_"
                      + PREFIX + "_")


def _elections(natsc: NatsCluster) -> list[float]:
    """When (wall clock) a server took the lead of one of the test's streams (its blocks' or its KV
    buckets'), from the servers' logs: asking the cluster while it elects hangs for seconds."""
    times = []
    for i in range(natsc.size):
        for line in (natsc.root / f"n{i}.log").read_text(errors="replace").splitlines():
            found = _ELECTED.match(line)
            if found:
                times.append(datetime.datetime.strptime(found[1], "%Y/%m/%d %H:%M:%S.%f").timestamp())
    return times


async def _quiet(exc: Exception) -> None:
    """A killed server's connection errors are the point of the test."""


async def test_stream_leader_killed_five_times_during_produce_loses_nothing(
    natsc: NatsCluster, node: NodeProcess,
) -> None:
    acked: list[bytes] = []
    unknown: list[bytes] = []  # sends that failed: the node could not say whether they were stored
    failed_batches: list[str] = []
    stop = asyncio.Event()
    leader = StreamLeader(natsc)
    resumed_after: list[float] = []
    after_election: list[float] = []  # resume time minus the time a new leader was first seen

    async with AsyncClient([node.address]) as client:
        await client.create_channels([PCHANNEL])

        async def produce() -> None:
            i = 0
            while not stop.is_set():
                # A producer session ends when a batch fails: its fate is unknown, so its sequences
                # cannot go on (see the Producer's docstring); the next session has a new id.
                async with client.producer(PCHANNEL, producer_id=uuid.uuid4().hex, linger=0.002) as producer:
                    while not stop.is_set():
                        # A small window in flight: a kill always finds sends unanswered.
                        batch = [f"m{i + j:07d}".encode() for j in range(20)]
                        i += len(batch)
                        results = await asyncio.gather(*(producer.send_nowait(VCHANNEL, p) for p in batch),
                                                       return_exceptions=True)
                        failures = [r for r in results if isinstance(r, BaseException)]
                        for payload, result in zip(batch, results, strict=True):
                            (unknown if isinstance(result, BaseException) else acked).append(payload)
                        if failures:
                            if not all(isinstance(f, StreamingError) and f.code is ErrorCode.UNAVAILABLE
                                       for f in failures):
                                raise failures[0]
                            failed_batches.append(repr(failures[0])[:200])
                            break

        producing = asyncio.create_task(produce())
        try:
            await until(lambda: len(acked) >= 200, "the first appends", timeout=30)
            for kill in range(KILLS):
                await until(leader.all_current, "a stream leader with both followers current", timeout=60)
                victim = await leader.leader()
                assert victim is not None
                before = len(acked)
                killed_at, killed_wall = time.monotonic(), time.time()
                natsc.kill(victim)
                await until(lambda: producing.done() or len(acked) > before + 20,  # noqa: B023
                            f"appends after killing stream leader n{victim} (kill {kill + 1})",
                            timeout=RESUME_WAIT, interval=0.01)
                resumed_at, resumed_wall = time.monotonic(), time.time()
                if producing.done():
                    producing.result()  # the producer failed: raise its error
                resumed_after.append(resumed_at - killed_at)
                elected = [t for t in _elections(natsc) if killed_wall < t <= resumed_wall]
                after_election.append(resumed_wall - max(elected, default=killed_wall))
                natsc.start(victim)
                await natsc.ready()
            stop.set()
            await asyncio.wait_for(producing, 60)
        finally:
            stop.set()
            if not producing.done():
                producing.cancel()
        print(f"\nappends resumed after stream leader SIGKILL: {', '.join(f'{t:.2f} s' for t in resumed_after)}"
              f" (max {max(resumed_after):.2f} s); after the last leader election: "
              f"{', '.join(f'{t:.2f} s' for t in after_election)}; {len(acked)} messages acknowledged, "
              f"{len(unknown)} failed in {len(failed_batches)} batches: {failed_batches[:2]}")

        # Every acknowledged message is in the log, once, in the order it was sent; a failed send is
        # there at most once.
        read: list[bytes] = []
        wanted = set(acked)
        with contextlib.suppress(TimeoutError):  # a lost message would keep the read waiting: assert below
            async with asyncio.timeout(RESUME_WAIT), client.consumer(PCHANNEL, VCHANNEL) as consumer:
                async for pack in consumer:
                    read.extend(m.payload for m in pack.messages if m.message_type is MessageType.DATA)
                    if wanted <= set(read):
                        break
        assert len(read) == len(set(read)), f"{len(read) - len(set(read))} messages stored twice"
        assert [p for p in read if p in wanted] == acked, (
            f"{len(acked)} acknowledged, {len(wanted & set(read))} read; missing {sorted(wanted - set(read))[:5]}")
        assert set(read) <= wanted | set(unknown)
    assert len(resumed_after) == KILLS


async def test_the_cluster_buckets_are_replicated_like_the_log(natsc: NatsCluster, node: NodeProcess) -> None:
    # On an R3 log the nodes and leases buckets must be R3 too: one server holding them alone would take
    # every lease renewal down with it (a timing-free check of what the leader kills above exercise).
    nc = await nats.connect(natsc.urls, connect_timeout=2, error_cb=_quiet)
    try:
        js = nc.jetstream(timeout=5)
        for bucket in ("nodes", "leases"):
            info = await js.stream_info(f"KV_{PREFIX}_{bucket}")
            assert info.config.num_replicas == 3, f"bucket {PREFIX}_{bucket} has {info.config.num_replicas} replica(s)"
    finally:
        await nc.close()
