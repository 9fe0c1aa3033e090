"""Cluster mode on the shared log (``--wal jetstream``): real node processes over real nats-servers.

The nodes keep nothing of their own: the log, its KV meta (recovery snapshots, consumer groups, the
flusher's checkpoint) and the leases are in NATS, the Parquet files under one shared root.  So a node
that takes a pchannel over (its owner SIGKILLed or SIGSTOPped past its lease) continues it exactly:
nothing acknowledged is lost or duplicated, the old term's open transactions are rolled back, the
flusher resumes from its checkpoint, and the old owner, woken up, can store nothing.

One NATS cluster per module; each test its own prefix (buckets and streams), nodes and Parquet root.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamingnode.client import AsyncClient, GroupDescription
from streamingnode.cluster.ownership import preferred
from streamingnode.config import load_config
from tests.cluster.conftest import start_cluster
from tests.natscluster import NatsCluster
from tests.node_process import NodeProcess
from tests.waiting import until
from wal.errors import InvalidArgumentError, NotOwnerError, UnavailableError

pytestmark = pytest.mark.integration

LEASE = 2.0  # seconds: short, so an owner's death shows within a few seconds
_prefixes = itertools.count()


@pytest.fixture(scope="module")
def natsc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("nats"), 3)
    yield cluster
    cluster.stop()


class Nodes:
    """Streaming node processes sharing one log (a prefix on ``natsc``) and one Parquet root."""

    def __init__(self, natsc: NatsCluster, root: Path, replicas: int, *extra: str) -> None:
        self.prefix = f"w{next(_prefixes)}"
        self.parquet = root / "parquet"
        self.common = ("--wal", "jetstream", "--nats", natsc.url, "--nats-replicas", str(replicas),
                       "--cluster-prefix", self.prefix, "--lease-seconds", str(LEASE), "--drain-seconds", "1",
                       "--parquet-root", self.parquet.as_uri(), *extra)
        self.root = root
        self.procs: dict[str, NodeProcess] = {}

    def add(self, node_id: str) -> NodeProcess:
        proc = self.procs[node_id] = NodeProcess(self.root / node_id, None, "--node-id", node_id, *self.common)
        return proc.start()

    @property
    def seeds(self) -> list[str]:
        return [p.address for p in self.procs.values()]

    def by_address(self, address: str) -> str:
        return next(n for n, p in self.procs.items() if p.address == address)

    def close(self) -> None:
        for proc in self.procs.values():
            proc.kill()

    def dead(self) -> dict[str, str]:
        """Every node's address, exit code (None: running) and last log lines, for a failure message."""
        return {n: f"{p.address} rc={p.proc.poll()}" + "".join(p.stderr[-8:]) for n, p in self.procs.items()
                if p.proc is not None}


@pytest.fixture
def nodes(natsc: NatsCluster, tmp_path: Path) -> Iterator[Nodes]:
    group = Nodes(natsc, tmp_path, 1)
    try:
        yield group
    finally:
        group.close()


async def _served(client: AsyncClient, pchannel: str) -> None:
    """Wait until the pchannel's owner has opened it (its lease is taken before it opens)."""

    async def answers() -> bool:
        try:
            await client.latest_position(pchannel)
        except UnavailableError:
            return False
        return True

    await until(answers, f"pchannel {pchannel!r} served", timeout=30)


async def _owner(client: AsyncClient, pchannel: str) -> str:
    [desc] = await client.describe_channels([pchannel])
    return desc.owner.address


async def _owner_per(address: str, pchannel: str) -> str:
    """The owner as node ``address`` reads it from the leases (asked there, not routed to the owner)."""
    async with AsyncClient(address, timeout=5) as client:
        try:
            found = [d for d in await client.describe_channels() if d.name == pchannel]
        except UnavailableError:
            return ""  # just restarted: gRPC may still be backing off from its refused connections
    return found[0].owner.address if found else ""


async def test_channels_created_on_one_node_are_served_by_their_preferred_node_and_destroyed_everywhere(
    nodes: Nodes,
) -> None:
    nodes.add("a")
    nodes.add("b")
    async with AsyncClient(nodes.seeds) as client:
        names = [f"c{i}" for i in range(4)]
        assert await client.create_channels(names) == names
        want = {n: nodes.procs[str(preferred(n, nodes.procs))].address for n in names}
        for name in names:
            assert await _owner(client, name) == want[name]
        async with client.producer(names[0]) as producer:
            await producer.send("v", b"hello")
        await client.destroy_channels(names)
        assert [d.name for d in await client.describe_channels()] == []


# --- takeover under load ---------------------------------------------------------------------------
ROUNDS = 20
VCHANNELS = ("v0", "v1", "v2")
TXN_SIZE = 5


@pytest.fixture
def nodes_r3(natsc: NatsCluster, tmp_path: Path) -> Iterator[Nodes]:
    group = Nodes(natsc, tmp_path, 3)
    try:
        yield group
    finally:
        group.close()


class Load:
    """An idempotent producer and a transaction loop on one pchannel, recording what was acknowledged."""

    def __init__(self, client: AsyncClient, pchannel: str) -> None:
        self.client = client
        self.pchannel = pchannel
        self.acked: dict[str, list[int]] = {v: [] for v in VCHANNELS}
        self.txn_committed: set[int] = set()
        self.txn_tried = 0
        self.txn_failed = 0
        self.stop = asyncio.Event()

    async def produce(self) -> None:
        async with self.client.producer(self.pchannel, producer_id="load", max_in_flight=4,
                                        max_batch_messages=100) as producer:
            seq = 0
            while not self.stop.is_set():
                futures = [(v, seq, producer.send_nowait(v, f"m:{v}:{seq}".encode())) for v in VCHANNELS]
                for v, n, fut in futures:
                    await fut
                    self.acked[v].append(n)
                seq += 1

    async def transactions(self) -> None:
        k = 0
        while not self.stop.is_set():
            k += 1
            self.txn_tried += 1
            try:
                async with self.client.txn(self.pchannel, "tx", keepalive_ms=5000) as tx:
                    for j in range(TXN_SIZE):
                        await tx.send(f"t:{k}:{j}".encode())
                self.txn_committed.add(k)
            except Exception:  # its owner died under it: rolled back, or committed unseen
                self.txn_failed += 1
                await asyncio.sleep(0.05)  # not ordering anything: a pause before the next attempt


async def _read_to_end(client: AsyncClient, pchannel: str) -> list[tuple[str, bytes]]:
    seen: list[tuple[str, bytes]] = []
    async with client.consumer(pchannel) as consumer:
        async for pack in consumer:
            for msg in pack.messages:
                seen.append((msg.vchannel, bytes(msg.payload)))
                if msg.payload == b"END":
                    return seen
    raise AssertionError("the log ended before END")


async def _rounds(nodes: Nodes, client: AsyncClient, load: Load, p: str,
                  group_positions: list[tuple[int, int]]) -> None:
    """SIGKILL the owner of ``p`` ROUNDS times, restarting it each time, with the load running."""
    for _ in range(ROUNDS):
        owners: list[str] = []

        async def owned(found: list[str] = owners) -> bool:
            found[:] = [o for o in [await _owner_per(a, p) for a in nodes.seeds] if o]
            return bool(found)

        await until(owned, "a node to own the pchannel", timeout=30)
        owner = owners[0]
        before = sum(len(a) for a in load.acked.values())
        victim = nodes.procs[nodes.by_address(owner)]
        survivor = next(a for a in nodes.seeds if a != owner)
        victim.kill()

        async def taken_over(old: str = owner, ask: str = survivor) -> bool:
            now = await _owner_per(ask, p)
            return bool(now) and now != old

        await until(taken_over, "another node to take the pchannel over", timeout=30)
        await asyncio.to_thread(victim.start)
        await until(lambda b=before: sum(len(a) for a in load.acked.values()) > b + 30,
                    "acknowledged appends after the takeover", timeout=30)
        groups: list[GroupDescription] = []

        async def described(found: list[GroupDescription] = groups) -> bool:
            try:  # a hand-off back to the restarted node may be under way: no owner for a moment
                found[:] = await client.describe_groups(p, ["g"])
            except (NotOwnerError, UnavailableError):
                return False
            return True

        await until(described, "the group described", timeout=30)
        committed = groups[0].committed("v0")
        if committed is not None:
            group_positions.append((int(committed.message_id), committed.timetick))


async def test_owner_sigkilled_twenty_times_under_idempotent_produce_and_transactions_loses_and_duplicates_nothing(
    nodes_r3: Nodes,
) -> None:
    nodes = nodes_r3
    for node_id in ("a", "b"):
        nodes.add(node_id)
    p = "hot"
    async with AsyncClient(nodes.seeds, reconnect_timeout=60) as client:
        await client.create_channels([p])
        await _served(client, p)
        await client.create_group(p, "g")
        load = Load(client, p)
        tasks = [asyncio.create_task(load.produce()), asyncio.create_task(load.transactions())]
        group_positions: list[tuple[int, int]] = []
        consumer = client.consumer(p, "v0", group="g")

        async def consume() -> None:
            async for pack in consumer:
                await consumer.ack(pack)

        consuming = asyncio.create_task(consume())
        try:
            await _rounds(nodes, client, load, p, group_positions)
        except Exception as exc:
            raise AssertionError(f"{exc!r}; nodes: {nodes.dead()}") from exc
        finally:
            load.stop.set()
            await asyncio.gather(*tasks)
            consuming.cancel()
            (ended,) = await asyncio.gather(consuming, return_exceptions=True)
            await consumer.aclose()
        # Every ack across the takeovers was taken: an ack the closing owner answers ON_SHUTDOWN, or one
        # unanswered when the stream broke, goes again once the new owner's stream delivered it.
        assert isinstance(ended, asyncio.CancelledError), f"the consumer's ack loop failed: {ended!r}"
        # The end mark goes in once both loads have stopped: a transaction still committing when the
        # producer stopped would land after an earlier mark, and the read below would stop before it.
        async with client.producer(p) as producer:
            await producer.send("end", b"END")
        seen = await _read_to_end(client, p)

    # Per vchannel: every acknowledged message once, no duplicate of anything, sequences in order.
    for v in VCHANNELS:
        got = [int(payload.split(b":")[2]) for vch, payload in seen if vch == v]
        assert len(got) == len(set(got)), f"{v}: duplicates"
        assert got == sorted(got), f"{v}: out of order"
        assert set(load.acked[v]) <= set(got), f"{v}: acknowledged messages lost"
        assert len(load.acked[v]) > ROUNDS * 10
    # Transactions: all or nothing; every acknowledged commit visible.
    parts: dict[int, list[int]] = {}
    for vch, payload in seen:
        if vch == "tx" and payload.startswith(b"t:"):
            _, k, j = payload.split(b":")
            parts.setdefault(int(k), []).append(int(j))
    assert all(sorted(js) == list(range(TXN_SIZE)) for js in parts.values()), "a transaction half visible"
    assert load.txn_committed <= set(parts), "an acknowledged commit is not visible"
    assert load.txn_committed and load.txn_failed, (load.txn_tried, load.txn_failed)
    # Consumer group positions never go backwards.
    assert group_positions == sorted(group_positions)


# --- configuration -------------------------------------------------------------------------------
@pytest.mark.parametrize(("overrides", "field", "words"), [
    ({"parquet_dir": "s3://bucket/x"}, "parquet_dir", "s3:// is not supported yet"),
    ({"parquet_dir": "gs://bucket/x"}, "parquet_dir", "atomic rename"),
    ({"wal": "jetstream"}, "cluster_nats", "needs cluster mode"),
    ({"wal": "kafka"}, "wal", "'rocksdb' or 'jetstream'"),
    ({"nats_replicas": 2}, "nats_replicas", "1 or 3"),
])
def test_shared_log_settings_refused_naming_the_field(overrides: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(InvalidArgumentError, match=words) as caught:
        load_config(env={}, overrides=overrides)
    assert caught.value.fields["field"] == field


def test_a_file_uri_parquet_root_is_its_path(tmp_path: Path) -> None:
    config = load_config(env={"STREAMINGNODE_PARQUET_DIR": tmp_path.as_uri()},
                         overrides={"wal": "jetstream", "cluster_nats": "nats://127.0.0.1:4222", "node_id": "a"})
    assert config.parquet_root == tmp_path and config.shared_log and config.nats_replicas == 3


# --- producer identity across a takeover ----------------------------------------------------------
async def test_producer_epoch_and_high_water_hold_across_an_owner_takeover(nodes: Nodes) -> None:
    """Epochs live in the pchannel's KV metadata and sequences in the log: the node that takes the
    pchannel over hands out the next epoch and sequence, fences the zombie of an older epoch, and
    still refuses a changed resend."""
    from streamingnode.client import DuplicateSequenceMismatchError, ProducerFencedError  # noqa: PLC0415

    nodes.add("a")
    nodes.add("b")
    async with AsyncClient(nodes.seeds, timeout=30, reconnect_timeout=60) as client:
        await client.create_channels(["pid"])
        await _served(client, "pid")
        async with client.producer("pid", producer_id="owned") as first:
            original = [await first.send("v", b"m%d" % i) for i in range(5)]
            assert first.epoch == 1
        zombie = client.producer("pid", producer_id="owned", linger=0)
        await zombie.send("v", b"m5")
        assert zombie.epoch == 2 and zombie.next_sequence == 6
        owner = await _owner(client, "pid")
        survivor = next(a for a in nodes.seeds if a != owner)
        nodes.procs[nodes.by_address(owner)].kill()

        async def taken_over() -> bool:
            return await _owner_per(survivor, "pid") == survivor

        await until(taken_over, "the survivor to take the pchannel over", timeout=30)
        async with client.producer("pid", producer_id="owned") as after:
            fresh = await after.send("v", b"m6")
            assert after.epoch == 3 and after.next_sequence == 7
            assert fresh.message_id > original[-1].message_id
            with pytest.raises(ProducerFencedError):
                await zombie.send("v", b"zombie")
        await zombie.aclose()
        async with client.producer("pid", producer_id="owned", first_sequence=0) as resend:
            with pytest.raises(DuplicateSequenceMismatchError):
                await resend.send("v", b"changed")
        async with client.producer("pid", producer_id="owned", first_sequence=0) as resend:
            assert await resend.send("v", b"m0") == original[0]
        async with client.producer("pid") as tail:
            await tail.send("v", b"END")
        got = [payload for _, payload in await _read_to_end(client, "pid")]
        assert [g for g in got if g.startswith(b"m") or g == b"END"] == [
            *(b"m%d" % i for i in range(7)), b"END"]
