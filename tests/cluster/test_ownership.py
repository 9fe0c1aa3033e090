"""Cluster mode, ownership and routing on the server side: placement by rendezvous hashing, leases by
compare-and-set in NATS KV, and real nodes (in-process servers, and processes for SIGKILL) that each
serve only the pchannels they hold, refuse the others with NOT_OWNER naming the owner, and hand
pchannels over when a node joins, stops or dies.

One single-server NATS for the module; each test uses its own bucket prefix, so tests never see each
other's nodes or leases.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path

import grpc
import nats
import pytest

from streamingnode.cluster import connection as cluster_module
from streamingnode.cluster.kv import bucket
from streamingnode.cluster.leases import Lease, Leases
from streamingnode.cluster.membership import Membership
from streamingnode.cluster.ownership import placement, preferred
from streamingnode.server import ServerThread
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from streamingnode.wire.codes import from_rpc_error
from tests.integration.conftest import node_config
from tests.natscluster import NatsCluster
from tests.node_process import NodeProcess, free_port
from tests.waiting import until, until_sync
from wal.errors import ErrorCode, UnavailableError
from wal.kv_key import encode_key

pytestmark = pytest.mark.integration

PCHANNELS = tuple(f"p{i}" for i in range(6))
LEASE = 1.5  # seconds: short, so expiry and hand-off show within a few seconds
_prefixes = itertools.count()


@pytest.fixture(scope="module")
def natsc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    with NatsCluster(tmp_path_factory.mktemp("nats"), 1) as cluster:
        asyncio.run(cluster.ready())
        yield cluster


@pytest.fixture
def prefix() -> str:
    return f"t{next(_prefixes)}"


# --- placement (pure) ----------------------------------------------------------------------------
def test_placement_is_stable_and_a_joining_node_takes_about_a_share_from_the_others() -> None:
    names = [f"pchannel_{i}" for i in range(600)]
    three = placement(names, ["a", "b", "c"])
    assert three == placement(names, ["c", "a", "b", "a"])  # order and duplicates do not matter
    assert set(three.values()) == {"a", "b", "c"}
    four = placement(names, ["a", "b", "c", "d"])
    moved = [n for n in names if three[n] != four[n]]
    assert all(four[n] == "d" for n in moved)  # only towards the new node
    assert 0.15 * len(names) < len(moved) < 0.35 * len(names)  # about 1/4
    back = placement(names, ["a", "b", "c"])  # it leaves: exactly its pchannels go back where they were
    assert back == three
    assert preferred("x", []) is None


def test_keys_are_kv_safe_and_distinct() -> None:
    keys = {encode_key(n) for n in ("a", "A", "a.b", "a_b", "ä/ö", "x" * 200)}
    assert len(keys) == 6
    assert all(k.replace("=", "").isalnum() and k == k.lower() for k in keys)


# --- leases by CAS on real NATS KV ---------------------------------------------------------------
async def _leases(natsc: NatsCluster, prefix: str, ttl: float, *nodes: str) -> tuple[nats.NATS, list[Leases]]:
    nc = await nats.connect(natsc.url)
    kv = await bucket(nc.jetstream(), f"{prefix}_leases")
    return nc, [Leases(kv, n, f"addr-{n}", ttl) for n in nodes]


async def test_two_contenders_for_a_lease_exactly_one_wins(natsc: NatsCluster, prefix: str) -> None:
    nc, (a, b) = await _leases(natsc, prefix, 30.0, "a", "b")
    try:
        absent = await a.read("p0")
        assert absent == Lease("p0")
        won = await asyncio.gather(a.take(absent), b.take(absent))
        assert sum(x is not None for x in won) == 1
        stored = await a.read("p0")
        winner = next(x for x in won if x is not None)
        assert (stored.node, stored.term, stored.revision) == (winner.node, 1, winner.revision)
        # Both now read it: the loser may not take a held lease; a stale read of the winner cannot renew
        # over a newer write.
        loser = b if winner.node == "a" else a
        assert await loser.take(stored) is None
        owner = a if winner.node == "a" else b
        renewed = await owner.renew(stored)
        assert renewed is not None and renewed.term == 1
        assert await owner.renew(stored) is None  # its revision is old now
    finally:
        await nc.close()


async def test_an_expired_lease_is_taken_and_the_term_goes_up(natsc: NatsCluster, prefix: str) -> None:
    nc, (a, b) = await _leases(natsc, prefix, 0.3, "a", "b")
    try:
        first = await a.take(await a.read("p0"))
        assert first is not None and first.term == 1
        assert await b.take(await b.read("p0")) is None  # still held
        await until(lambda: not first.held(), "the lease to expire")
        taken = await b.take(await b.read("p0"))
        assert taken is not None and (taken.node, taken.address, taken.term) == ("b", "addr-b", 2)
        assert await a.renew(first) is None  # the old holder's renewal finds another owner
        released = await b.release(taken)
        assert released is not None and (released.node, released.term) == ("", 2)
        again = await a.take(await a.read("p0"))  # free: taken at once, term bumped again
        assert again is not None and again.term == 3
    finally:
        await nc.close()


async def test_live_nodes_are_those_with_a_recent_heartbeat(natsc: NatsCluster, prefix: str) -> None:
    nc = await nats.connect(natsc.url)
    try:
        kv = await bucket(nc.jetstream(), f"{prefix}_nodes")
        a, b = Membership(kv, "a", "h:1", 0.3), Membership(kv, "b", "h:2", 0.3)
        assert await a.live() == {}
        await a.heartbeat()
        await b.heartbeat()
        assert await a.live() == {"a": "h:1", "b": "h:2"}
        await b.leave()
        assert await a.live() == {"a": "h:1"}

        async def a_is_stale() -> bool:
            return await b.live() == {}
        await until(a_is_stale, "a's heartbeat to age past the TTL")
    finally:
        await nc.close()


# --- real nodes ----------------------------------------------------------------------------------
def _start(natsc: NatsCluster, root: Path, prefix: str, node_id: str) -> ServerThread:
    config = node_config(root / node_id, cluster_nats=natsc.url, node_id=node_id, lease_seconds=LEASE,
                         cluster_prefix=prefix, channels=PCHANNELS, flusher=False)
    return ServerThread(config).start()


def _held(srv: ServerThread) -> set[str]:
    async def read() -> set[str]:
        assert srv.node.ownership is not None
        return {n for n in srv.node.ownership.held if n in srv.node.channel_names()}
    return srv.run(read())


def _settled(nodes: dict[str, ServerThread]) -> bool:
    """Every pchannel served by exactly the node rendezvous hashing prefers among ``nodes``."""
    want = placement(PCHANNELS, nodes)
    held = {name: _held(srv) for name, srv in nodes.items()}
    return all(held[n] == {p for p, o in want.items() if o == n} for n in nodes)


async def _describe(address: str) -> dict[str, tuple[str, int]]:
    async with grpc.aio.insecure_channel(address) as channel:
        resp = await sgrpc.StreamingNodeStub(channel).DescribeChannels(spb.DescribeChannelsRequest())
    return {d.channel_name: (d.owner.address, d.term) for d in resp.descriptions}


@pytest.fixture
def cluster(natsc: NatsCluster, tmp_path: Path, prefix: str) -> Iterator[dict[str, ServerThread]]:
    nodes: dict[str, ServerThread] = {}
    try:
        for node_id in ("n1", "n2", "n3"):
            nodes[node_id] = _start(natsc, tmp_path, prefix, node_id)
        until_sync(lambda: _settled(nodes), "each pchannel served by its preferred node", timeout=20)
        yield nodes
    finally:
        for srv in nodes.values():
            srv.stop()


def _when_naming(address: str, owners: dict[str, str]) -> dict[str, tuple[str, int]]:
    """The node's description of its pchannels once it names ``owners`` (pchannel: address).  The
    fixture waited for each node to hold its own pchannels; another node learns of an owner from the
    lease bucket's watch, a moment later on a loaded machine (the owner is '' until then)."""
    seen: list[dict[str, tuple[str, int]]] = []

    def named() -> bool:
        seen.append(asyncio.run(_describe(address)))
        return {p: a for p, (a, _) in seen[-1].items()} == owners

    until_sync(named, f"{address} naming the owner of every pchannel", timeout=20)
    return seen[-1]


def test_each_pchannel_has_one_owner_and_every_node_names_it(cluster: dict[str, ServerThread]) -> None:
    addresses = {n: srv.address for n, srv in cluster.items()}
    want = placement(PCHANNELS, cluster)
    owners = {p: addresses[n] for p, n in want.items()}  # type: ignore[index]
    assert set(owners) == set(PCHANNELS)
    for srv in cluster.values():
        seen = _when_naming(srv.address, owners)
        assert all(term >= 1 for _, term in seen.values()), seen


async def test_a_call_on_another_nodes_pchannel_fails_fast_with_not_owner_naming_the_owner(
    cluster: dict[str, ServerThread],
) -> None:
    want = placement(PCHANNELS, cluster)
    p = PCHANNELS[0]
    owner = cluster[want[p]]  # type: ignore[index]
    other = next(srv for n, srv in cluster.items() if n != want[p])
    term = (await _describe(owner.address))[p][1]
    caught: list[grpc.aio.AioRpcError] = []
    async with grpc.aio.insecure_channel(other.address) as channel:
        stub = sgrpc.StreamingNodeStub(channel)

        async def refused_naming_the_owner() -> bool:
            # A refusal names the owner as of the node's last pass over the leases (at most a third
            # of the lease old): right after settling it may still say "nobody".
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await stub.GetLatestPosition(spb.GetLatestPositionRequest(pchannel=p, vchannel="v"))
            caught.append(exc.value)
            return from_rpc_error(exc.value).fields.get("owner") == owner.address
        await until(refused_naming_the_owner, "a refusal naming the owner", timeout=5)
    assert caught[-1].code() is grpc.StatusCode.FAILED_PRECONDITION
    err = from_rpc_error(caught[-1])
    assert err.code is ErrorCode.NOT_OWNER and err.retriable
    assert err.fields["owner"] == owner.address
    assert err.fields["term"] == str(term)
    assert err.fields["channel"] == p
    # A name no node knows of is not "owned elsewhere".
    async with grpc.aio.insecure_channel(other.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await sgrpc.StreamingNodeStub(channel).GetLatestPosition(
                spb.GetLatestPositionRequest(pchannel="nowhere", vchannel="v"))
    assert from_rpc_error(unknown.value).code is ErrorCode.CHANNEL_NOT_EXIST
    # The owner itself serves it.
    async with grpc.aio.insecure_channel(owner.address) as channel:
        await sgrpc.StreamingNodeStub(channel).GetLatestPosition(spb.GetLatestPositionRequest(pchannel=p, vchannel="v"))


def test_a_node_stopped_gracefully_hands_its_pchannels_to_the_others(cluster: dict[str, ServerThread]) -> None:
    gone = "n1"
    cluster.pop(gone).stop()
    until_sync(lambda: _settled(cluster), "the stopped node's pchannels served by the others", timeout=30)
    owners = {p: cluster[n].address for p, n in placement(PCHANNELS, cluster).items()}  # type: ignore[index]
    seen = _when_naming(cluster["n2"].address, owners)
    assert {a for a, _ in seen.values()} <= {cluster["n2"].address, cluster["n3"].address}


def test_a_joining_node_takes_the_pchannels_hashing_gives_it(
    natsc: NatsCluster, tmp_path: Path, prefix: str, cluster: dict[str, ServerThread],
) -> None:
    before = placement(PCHANNELS, cluster)
    cluster["n4"] = _start(natsc, tmp_path, prefix, "n4")
    after = placement(PCHANNELS, cluster)
    until_sync(lambda: _settled(cluster), "the joining node serving its share", timeout=30)
    moved = {p for p in PCHANNELS if before[p] != after[p]}
    assert moved, "hashing gave n4 nothing; pick other node ids"
    assert _held(cluster["n4"]) == moved
    # The metrics follow: owned 1 on the new owner, 0 on the old; one change each, taken and released.
    p = sorted(moved)[0]
    old = cluster[before[p]]  # type: ignore[index]

    async def sample(srv: ServerThread, name: str, **labels: str) -> float | None:
        return srv.node.metrics.registry.get_sample_value(name, labels)
    new = cluster["n4"]
    assert new.run(sample(new, "streamingnode_pchannel_owned", pchannel=p)) == 1
    assert new.run(sample(new, "streamingnode_ownership_changes_total", pchannel=p, reason="taken")) == 1
    assert 0 < new.run(sample(new, "streamingnode_lease_expiry_seconds", pchannel=p)) <= LEASE  # type: ignore[operator]
    # Live nodes are read each pass from heartbeats: on a loaded machine one pass may find a heartbeat
    # late, so wait for the view rather than sample one moment of it.
    until_sync(lambda: new.run(sample(new, "streamingnode_cluster_nodes")) == 4, "n4 to see four live nodes",
               timeout=15)
    assert old.run(sample(old, "streamingnode_pchannel_owned", pchannel=p)) == 0
    assert old.run(sample(old, "streamingnode_ownership_changes_total", pchannel=p, reason="released")) == 1


def test_a_killed_node_loses_its_leases_by_expiry_and_another_node_takes_them(
    natsc: NatsCluster, tmp_path: Path, prefix: str,
) -> None:
    common = ("--cluster-nats", natsc.url, "--lease-seconds", str(LEASE), "--cluster-prefix", prefix,
              "--channels", ",".join(PCHANNELS), "--drain-seconds", "1")
    procs = {n: NodeProcess(tmp_path / n, None, "--node-id", n, *common) for n in ("k1", "k2")}
    try:
        for proc in procs.values():
            proc.start()
        addresses = {n: p.address for n, p in procs.items()}

        def owners() -> dict[str, str]:
            return {p: a for p, (a, _) in asyncio.run(_describe(procs["k2"].address)).items()}

        want = placement(PCHANNELS, procs)
        until_sync(lambda: owners() == {p: addresses[o] for p, o in want.items()},  # type: ignore[index]
                   "both processes serving their share", timeout=20)
        victims = {p for p, o in want.items() if o == "k1"}
        assert victims, "placement gave k1 nothing; pick other node ids"
        procs["k1"].kill()  # no hand-off: its leases must expire
        until_sync(lambda: set(owners().values()) == {addresses["k2"]}, "k2 serving every pchannel", timeout=15)
    finally:
        for proc in procs.values():
            proc.kill()


def test_a_node_that_cannot_reach_nats_refuses_to_start_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cluster_module, "CONNECT_SECONDS", 0.5)
    nowhere = f"nats://127.0.0.1:{free_port()}"
    config = node_config(tmp_path / "n", cluster_nats=nowhere, node_id="n", flusher=False)
    srv = ServerThread(config)
    try:
        with pytest.raises(UnavailableError, match="cannot reach the NATS servers") as caught:
            srv.start()
    finally:
        srv.stop()  # its loop and thread (the server never started)
    assert caught.value.fields["field"] == "cluster_nats"
