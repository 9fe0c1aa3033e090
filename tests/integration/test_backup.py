"""Online backup of a node under load, and restore: against the acknowledged history.

A producer and a transaction loop run while ``streamingnode backup`` (the command, over gRPC) backs the
node up; ``streamingnode restore`` builds a new data directory; ``verify`` passes on it; a node served
from it delivers exactly the acknowledged messages below the printed cut, each once, in order, with
transactions whole; its Parquet files hold the rows flushed before the backup.
"""

from __future__ import annotations

import asyncio
import io
import json
import random
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamingnode.client import AsyncClient
from streamingnode.offline import restore as restore_cmd
from streamingnode.offline.manifest import read_manifest, resolve_backup
from streamingnode.offline.verify import open_read_only
from streamingnode.server import ServerThread
from tests.integration.conftest import node_config
from wal import Message, MessageType
from wal._codec import decode_block
from wal.backends.rocks_layout import KEY_ID, U32, data_key
from wal.clock import physical_ms

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("name", pa.string())])
PCH = "p"

pytestmark = pytest.mark.integration


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streamingnode", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=240, check=False)


@dataclass
class History:
    """What the node acknowledged: plain messages (id, timetick, payload) and committed transactions
    (commit id, commit timetick, payloads)."""

    sent: list[tuple[int, int, bytes]] = field(default_factory=list)
    txns: list[tuple[int, int, list[bytes]]] = field(default_factory=list)
    rows: dict[int, int] = field(default_factory=dict)
    """pk -> insert message id, for every insert acknowledged."""
    flushed: set[int] = field(default_factory=set)
    """pks of inserts a Flush that returned covered."""


class Load:
    """A producer on vchannel 'v', a transaction loop on 't' and inserts + flushes on 'd', until stopped."""

    def __init__(self, client: AsyncClient, history: History) -> None:
        self.client = client
        self.h = history
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []
        self.n = 0
        self.pk = 0

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._produce()), asyncio.create_task(self._txns()),
                      asyncio.create_task(self._rows())]

    async def _produce(self) -> None:
        async with self.client.producer(PCH, linger=0.002) as producer:
            while not self.stop.is_set():
                payloads = [f"m-{self.n + i}".encode() for i in range(20)]
                self.n += 20
                results = await asyncio.gather(*(producer.send("v", p) for p in payloads))
                self.h.sent.extend((r.message_id, r.timetick, p) for r, p in zip(results, payloads, strict=True))
                await asyncio.sleep(0)

    async def _txns(self) -> None:
        k = 0
        while not self.stop.is_set():
            payloads = [f"t-{k}-{j}".encode() for j in range(3)]
            k += 1
            async with self.client.txn(PCH, "t") as tx:
                for p in payloads:
                    await tx.send(p)
            commit = tx._committed
            assert commit is not None
            self.h.txns.append((commit.message_id, commit.timetick, payloads))

    async def _rows(self) -> None:
        data = self.client.data(PCH)
        while not self.stop.is_set():
            pks = list(range(self.pk, self.pk + 10))
            self.pk += 10
            batch = pa.record_batch([pa.array(pks, pa.int64()), pa.array([f"r{i}" for i in pks])], schema=SCHEMA)
            r = await data.insert("d", "coll", batch)
            self.h.rows.update(dict.fromkeys(pks, r.message_id))
            if self.pk % 50 == 0:
                await data.flush("d", "coll")
                self.h.flushed.update(pk for pk in self.h.rows if pk < self.pk)

    async def run_for(self, messages: int) -> None:
        target = self.n + messages
        while self.n < target:
            await asyncio.sleep(0.01)
            for t in self.tasks:
                if t.done():
                    t.result()

    async def aclose(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[ServerThread, AsyncClient]]:
    srv = ServerThread(node_config(tmp_path / "data", flush_max_age_seconds=0.5))
    srv.start()
    client = AsyncClient(srv.address)
    try:
        await client.create_channels([PCH])
        await client.data(PCH).create_collection("d", "coll", SCHEMA, "pk")
        yield srv, client
    finally:
        await client.aclose()
        srv.stop()


async def backup(addr: str, target: Path) -> dict[str, object]:
    done = await asyncio.to_thread(cli, "backup", "--addr", addr, "--to", str(target), "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout)
    return result


def restore(source: Path, data_dir: Path, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    until = args[args.index("--until") + 1] if "--until" in args else None
    pchannels = [args[i + 1] for i, a in enumerate(args) if a == "--pchannel"] or None
    code = restore_cmd.run(str(source), str(data_dir), pchannels, until, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


async def read_restored(data_dir: Path) -> tuple[list[tuple[int, bytes]], list[list[bytes]]]:
    """Serve ``data_dir`` and read it (``read_through``)."""
    srv = ServerThread(node_config(data_dir))
    srv.start()
    try:
        return await read_through(srv.address)
    finally:
        srv.stop()


async def read_through(addr: str) -> tuple[list[tuple[int, bytes]], list[list[bytes]]]:
    """Write a marker on 'v' and 't', read both vchannels up to their marker: the plain messages (id,
    payload) and the transactions' bodies, in delivery order."""
    async with AsyncClient(addr) as client:
        async with client.producer(PCH) as producer:
            await producer.send("v", b"marker")
            await producer.send("t", b"marker")
        plain: list[tuple[int, bytes]] = []
        txns: dict[int, list[bytes]] = {}
        order: list[int] = []
        for vchannel in ("v", "t"):
            async with asyncio.timeout(60), client.consumer(PCH, vchannel) as consumer:
                done = False
                async for pack in consumer:
                    for m in pack.messages:
                        if m.message_type is not MessageType.DATA:
                            continue
                        if m.payload == b"marker":
                            done = True
                            break
                        if m.txn is not None:
                            if m.txn.txn_id not in txns:
                                order.append(m.txn.txn_id)
                            txns.setdefault(m.txn.txn_id, []).append(m.payload)
                        else:
                            assert m.message_id is not None
                            plain.append((m.message_id, m.payload))
                    if done:
                        break
        return plain, [txns[t] for t in order]


def parquet_pks(root: Path) -> list[int]:
    files = sorted((root / PCH / "coll").rglob("*.parquet"))
    return sorted(pk for f in files for pk in pq.read_table(f).column("pk").to_pylist())


def expected(h: History, next_id: int) -> tuple[list[tuple[int, bytes]], list[list[bytes]]]:
    plain = sorted((i, p) for i, _, p in h.sent if i < next_id)
    txns = [ps for i, _, ps in sorted(h.txns) if i < next_id]
    return plain, txns


async def test_backup_under_load_restores_exactly_the_acknowledged_history(
    node: tuple[ServerThread, AsyncClient], tmp_path: Path,
) -> None:
    srv, client = node
    h = History()
    load = Load(client, h)
    load.start()
    await load.run_for(1500)
    flushed_before = set(h.flushed)
    target = tmp_path / "backups"
    first = await backup(srv.address, target)
    await load.run_for(1500)
    flushed_before_second = set(h.flushed)
    second = await backup(srv.address, target)
    await load.aclose()

    (pos1,) = first["positions"]  # type: ignore[misc]
    (pos2,) = second["positions"]  # type: ignore[misc]
    assert 0 < pos1["next_id"] < pos2["next_id"]

    # The second backup copied only what changed: its count is the files the first did not hold.
    b1, b2 = Path(str(first["path"])), Path(str(second["path"]))
    m1, m2 = read_manifest(b1), read_manifest(b2)
    old = {(f.path, f.sha256) for f in m1.files}
    new = [f for f in m2.files if (f.path, f.sha256) not in old]
    assert second["files_copied"] == len(new)
    assert second["files_reused"] == len(m2.files) - len(new) > 0
    assert second["bytes_copied"] == sum(f.size for f in new)
    assert resolve_backup(target) == b2

    # The first backup, restored with the command: verify passes, the history below its cut is all there.
    restored = tmp_path / "restored1"
    done = cli("restore", "--from", str(b1), "--data-dir", str(restored))
    assert done.returncode == 0, done.stderr
    check = cli("verify", "--data-dir", str(restored))
    assert check.returncode == 0, check.stdout + check.stderr
    pks = parquet_pks(restored / "parquet")
    assert flushed_before <= set(pks), "rows flushed before the backup are in its Parquet files"
    assert len(pks) == len(set(pks)), "no row twice"
    assert all(h.rows[pk] < pos1["next_id"] for pk in pks), "no row of a message after the cut"
    plain, txns = await read_restored(restored)
    assert (plain, txns) == expected(h, pos1["next_id"])
    assert 0 < len(plain) < len(h.sent) and txns, "the cut is mid-way through the history"

    # The later one (from the target: the newest complete backup), to the later state.
    restored2 = tmp_path / "restored2"
    code, _, err = restore(target, restored2)
    assert code == 0, err
    assert cli("verify", "--data-dir", str(restored2)).returncode == 0
    assert flushed_before_second <= set(parquet_pks(restored2 / "parquet"))
    plain, txns = await read_restored(restored2)
    assert (plain, txns) == expected(h, pos2["next_id"])


async def test_a_flipped_byte_in_any_file_of_a_backup_fails_the_restore_naming_it(
    node: tuple[ServerThread, AsyncClient], tmp_path: Path,
) -> None:
    srv, client = node
    load = Load(client, History())
    load.start()
    await load.run_for(300)
    await load.aclose()
    result = await backup(srv.address, tmp_path / "b")
    path = Path(str(result["path"]))
    manifest = read_manifest(path)
    names = [f.path.rsplit("/", 1)[-1] for f in manifest.files]
    for kind in (".sst", ".parquet", "CURRENT", "MANIFEST-", "OPTIONS-", ".incarnation"):
        assert any(kind in n for n in names), (kind, names)
    rng = random.Random(33)
    for f in manifest.files:
        target = path / f.path
        original = target.read_bytes()
        damaged = bytearray(original or b"\0")  # an empty file is damaged by a byte more
        if original:
            damaged[rng.randrange(len(damaged))] ^= 0x01
        target.write_bytes(bytes(damaged))
        into = tmp_path / "restored"
        try:
            code, _, err = restore(path, into)
        finally:
            target.write_bytes(original)
        assert code == 1, f.path
        assert str(target) in err, (f.path, err)
        assert not into.exists(), f"{f.path}: the restore wrote something"
    code, _, err = restore(path, tmp_path / "restored")
    assert code == 0, err


async def test_restore_refuses_a_non_empty_target_and_a_backup_without_manifest(
    node: tuple[ServerThread, AsyncClient], tmp_path: Path,
) -> None:
    srv, _ = node
    result = await backup(srv.address, tmp_path / "b")
    path = Path(str(result["path"]))
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("mine")
    code, _, err = restore(path, full)
    assert code == 2 and "not empty" in err
    assert sorted(p.name for p in full.iterdir()) == ["x"]
    (path / "manifest.json").rename(path / "manifest.json.away")
    code, _, err = restore(tmp_path / "b", tmp_path / "new")
    assert code == 2 and "did not finish" in err, err
    assert not (tmp_path / "new").exists()


def stored_messages(data_dir: Path, key: int) -> list[Message]:
    """Every message of the pchannel with channel key ``key`` in the database of ``data_dir``."""
    db = open_read_only(str(data_dir))
    out: list[Message] = []
    try:
        it = db.iter()
        it.seek(data_key(key, 0))
        while it.valid() and bytes(it.key()).startswith(b"D" + U32.pack(key)):
            out.extend(decode_block(bytes(it.value()), KEY_ID.unpack_from(bytes(it.key()), 1)[1]))
            it.next()
        del it
    finally:
        db.close()
    return out


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


async def test_until_restores_exactly_the_messages_at_or_before_the_time(
    node: tuple[ServerThread, AsyncClient], tmp_path: Path,
) -> None:
    srv, client = node
    h = History()
    load = Load(client, h)
    load.start()
    await load.run_for(2000)
    await load.aclose()
    result = await backup(srv.address, tmp_path / "b")
    path = Path(str(result["path"]))
    times = sorted({physical_ms(ts) for _, ts, _ in h.sent})
    cut_ms = times[len(times) // 2]
    restored = tmp_path / "until"
    code, out, err = restore(path, restored, "--until", iso(cut_ms))
    assert code == 0, err
    assert cli("verify", "--data-dir", str(restored)).returncode == 0
    plain, txns = await read_restored(restored)
    assert plain == sorted((i, p) for i, ts, p in h.sent if physical_ms(ts) <= cut_ms)
    assert txns == [ps for _, ts, ps in sorted(h.txns) if physical_ms(ts) <= cut_ms]
    assert 0 < len(plain) < len(h.sent)
    # Parquet rows of the restored directory never come from a message after the cut.
    last_kept = max(i for i, _ in plain)
    assert all(h.rows[pk] <= last_kept + 100 for pk in parquet_pks(restored / "parquet"))
    assert "cut at id" in out


async def test_random_cuts_keep_a_prefix_that_matches_a_plain_model(
    node: tuple[ServerThread, AsyncClient], tmp_path: Path,
) -> None:
    """Random --until points (times and ids) against the acked history, read straight from the restored
    database: the messages kept are exactly those the model keeps, and a commit is kept only with its
    whole body."""
    srv, client = node
    h = History()
    load = Load(client, h)
    load.start()
    await load.run_for(1500)
    await load.aclose()
    result = await backup(srv.address, tmp_path / "b")
    path = Path(str(result["path"]))
    rng = random.Random(3333)
    history = sorted([(i, ts, p) for i, ts, p in h.sent] + [(i, ts, b"commit") for i, ts, _ in h.txns])
    for n in range(8):
        by_id = n % 2 == 1
        i, ts, _ = rng.choice(history)
        into = tmp_path / f"cut{n}"
        if by_id:
            code, _, err = restore(path, into, "--until", str(i), "--pchannel", PCH)
            keep = {p for j, _, p in h.sent if j <= i}
            commits = {j for j, _, _ in h.txns if j <= i}
        else:
            code, _, err = restore(path, into, "--until", iso(physical_ms(ts)))
            keep = {p for _, t, p in h.sent if physical_ms(t) <= physical_ms(ts)}
            commits = {j for j, t, _ in h.txns if physical_ms(t) <= physical_ms(ts)}
        assert code == 0, err
        stored = stored_messages(into, read_manifest(path).pchannels[0].key)
        plain = {m.payload for m in stored if m.message_type is MessageType.DATA and m.txn is None}
        stored_commits = {m.message_id for m in stored if m.message_type is MessageType.COMMIT_TXN}
        assert plain == keep, n
        assert stored_commits == commits, n


async def test_backup_refuses_what_it_cannot_do_with_a_precise_error(
    node: tuple[ServerThread, AsyncClient], tmp_path: Path,
) -> None:
    import grpc  # noqa: PLC0415

    from streamingnode.v1 import streaming_pb2 as spb  # noqa: PLC0415
    from streamingnode.v1 import streaming_pb2_grpc as sgrpc  # noqa: PLC0415

    srv, _ = node
    data_dir = srv.node.config.data_dir
    cases = [
        (spb.BackupRequest(to="relative/dir"), grpc.StatusCode.INVALID_ARGUMENT, "absolute path"),
        (spb.BackupRequest(to=str(data_dir / "inside")), grpc.StatusCode.INVALID_ARGUMENT, "overlaps"),
        (spb.BackupRequest(to=str(tmp_path)), grpc.StatusCode.INVALID_ARGUMENT, "overlaps"),
        (spb.BackupRequest(to=str(tmp_path / "b"), pchannels=["nope"]), grpc.StatusCode.NOT_FOUND, "nope"),
    ]
    async with grpc.aio.insecure_channel(srv.address) as channel:
        stub = sgrpc.StreamingNodeStub(channel)
        for request, code, text in cases:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in stub.Backup(request):
                    pass
            assert err.value.code() == code, (request, err.value)
            assert text in (err.value.details() or ""), err.value.details()
    assert not (tmp_path / "b").exists()


async def test_a_backup_of_one_pchannel_restores_only_it(
    node: tuple[ServerThread, AsyncClient], tmp_path: Path,
) -> None:
    srv, client = node
    await client.create_channels(["other"])
    async with client.producer("other") as producer:
        await producer.send("v", b"not in the backup")
    h = History()
    load = Load(client, h)
    load.start()
    await load.run_for(200)
    await load.aclose()
    done = await asyncio.to_thread(cli, "backup", "--addr", srv.address, "--to", str(tmp_path / "b"), "--pchannel", PCH,
                                   "--progress")
    assert done.returncode == 0, done.stderr
    assert f"pchannel '{PCH}': up to id" in done.stdout and "copied" in done.stdout
    for phase in ("checkpoint", "copy"):
        assert f"backup: {phase}" in done.stderr, done.stderr
    restored = tmp_path / "restored"
    code, _, err = restore(tmp_path / "b", restored)
    assert code == 0, err
    assert cli("verify", "--data-dir", str(restored)).returncode == 0
    srv2 = ServerThread(node_config(restored))
    srv2.start()
    try:
        async with AsyncClient(srv2.address) as c2:
            assert [d.name for d in await c2.describe_channels()] == [PCH]
    finally:
        srv2.stop()
    assert (await read_restored(restored)) == expected(h, 1 << 62)


async def test_a_backup_that_cannot_write_its_target_says_why_and_leaves_nothing(
    node: tuple[ServerThread, AsyncClient], tmp_path: Path,
) -> None:
    import grpc  # noqa: PLC0415

    from streamingnode.v1 import streaming_pb2 as spb  # noqa: PLC0415
    from streamingnode.v1 import streaming_pb2_grpc as sgrpc  # noqa: PLC0415

    srv, _ = node
    afile = tmp_path / "afile"
    afile.write_text("x")
    async with grpc.aio.insecure_channel(srv.address) as channel:
        stub = sgrpc.StreamingNodeStub(channel)
        # A file where the target should be; a file where a directory above it should be (found only
        # when the node creates the backup's directory, after the checkpoint).
        for target, text in ((afile, "not a directory"), (afile / "b", "Not a directory")):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in stub.Backup(spb.BackupRequest(to=str(target))):
                    pass
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
            assert text in (err.value.details() or ""), err.value.details()
    assert afile.read_text() == "x"
    assert not list(srv.node.config.data_dir.glob(".backup-*")), "the checkpoint is removed"


async def test_a_caller_that_goes_away_abandons_the_backup_and_nothing_of_it_stays(
    node: tuple[ServerThread, AsyncClient], tmp_path: Path,
) -> None:
    import grpc  # noqa: PLC0415

    from streamingnode.v1 import streaming_pb2 as spb  # noqa: PLC0415
    from streamingnode.v1 import streaming_pb2_grpc as sgrpc  # noqa: PLC0415
    from tests.waiting import until  # noqa: PLC0415

    srv, client = node
    async with client.producer(PCH) as producer:
        block = random.Random(5).randbytes(1 << 20)
        await asyncio.gather(*(producer.send("v", block[i << 10:(i + 1) << 10]) for i in range(1024)))
    target = tmp_path / "b"
    async with grpc.aio.insecure_channel(srv.address) as channel:
        call = sgrpc.StreamingNodeStub(channel).Backup(spb.BackupRequest(to=str(target),
                                                                         max_bytes_per_second=64 << 10))
        first = await call.read()
        assert first.phase == "checkpoint"
        # One at a time: a second one meanwhile is refused, retriable.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in sgrpc.StreamingNodeStub(channel).Backup(spb.BackupRequest(to=str(tmp_path / "c"))):
                pass
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "one at a time" in str(err.value.details())
        call.cancel()
    data_dir = srv.node.config.data_dir

    def gone() -> bool:
        return not list(data_dir.glob(".backup-*")) and not any(p.is_dir() for p in target.glob("*"))

    await until(gone, "the abandoned backup's checkpoint and directory removed")
    # The node takes the next backup as usual.
    result = await backup(srv.address, target)
    assert result["files_copied"] and (Path(str(result["path"])) / "manifest.json").is_file()


async def rpc_backup(addr: str, target: Path) -> dict[str, object]:
    """A backup through the RPC itself, its result as the command's --json prints it."""
    import grpc  # noqa: PLC0415

    from streamingnode.v1 import streaming_pb2 as spb  # noqa: PLC0415
    from streamingnode.v1 import streaming_pb2_grpc as sgrpc  # noqa: PLC0415

    async with grpc.aio.insecure_channel(addr) as channel:
        async for update in sgrpc.StreamingNodeStub(channel).Backup(spb.BackupRequest(to=str(target))):
            if update.HasField("result"):
                r = update.result
                return {"path": r.path, "files_copied": r.files_copied, "files_reused": r.files_reused,
                        "positions": [{"pchannel": p.pchannel, "next_id": p.next_id} for p in r.positions]}
    raise AssertionError("no result")


async def test_a_random_walk_of_appends_flushes_and_backups_copies_only_what_changed(
    node: tuple[ServerThread, AsyncClient], tmp_path: Path,
) -> None:
    """Each backup into one target copies exactly the files (path and SHA-256) that the newest complete
    backup before it lacks, reuses the rest, and any of them restores to its own cut."""
    srv, client = node
    rng = random.Random(3301)
    h = History()
    target = tmp_path / "b"
    taken: list[dict[str, object]] = []
    data = client.data(PCH)
    async with client.producer(PCH) as producer:
        for step in range(10):
            op = rng.choice(["produce", "produce", "rows", "backup"]) if step < 9 else "backup"
            if op == "produce":
                payloads = [f"w-{step}-{i}".encode() for i in range(rng.randrange(1, 3000))]
                results = await asyncio.gather(*(producer.send("v", p) for p in payloads))
                h.sent.extend((r.message_id, r.timetick, p) for r, p in zip(results, payloads, strict=True))
            elif op == "rows":
                pks = list(range(step * 1000, step * 1000 + rng.randrange(1, 500)))
                batch = pa.record_batch([pa.array(pks, pa.int64()), pa.array([f"r{i}" for i in pks])], schema=SCHEMA)
                await data.insert("d", "coll", batch)
                await data.flush("d", "coll")
            else:
                before = resolve_backup(target) if taken else None
                result = await rpc_backup(srv.address, target)
                new_m = read_manifest(Path(str(result["path"])))
                old = {(f.path, f.sha256) for f in read_manifest(before).files} if before is not None else set()
                fresh = [f for f in new_m.files if (f.path, f.sha256) not in old]
                assert result["files_copied"] == len(fresh), step
                assert result["files_reused"] == len(new_m.files) - len(fresh), step
                taken.append(result)
    assert len(taken) >= 3 and any(r["files_reused"] for r in taken), "the walk took incremental backups"
    for n, result in enumerate(taken):
        into = tmp_path / f"r{n}"
        code, _, err = restore(Path(str(result["path"])), into)
        assert code == 0, err
        (pos,) = result["positions"]  # type: ignore[misc]
        kept = stored_messages(into, read_manifest(Path(str(result["path"]))).pchannels[0].key)
        payloads = [m.payload for m in kept if m.message_type is MessageType.DATA]
        assert payloads == [p for i, _, p in sorted(h.sent) if i < pos["next_id"]], n


async def test_a_node_shutting_down_abandons_its_backup_and_stops(tmp_path: Path) -> None:
    import grpc  # noqa: PLC0415

    from streamingnode.v1 import streaming_pb2 as spb  # noqa: PLC0415
    from streamingnode.v1 import streaming_pb2_grpc as sgrpc  # noqa: PLC0415

    srv = ServerThread(node_config(tmp_path / "data"))
    srv.start()
    stopped = False
    try:
        async with AsyncClient(srv.address) as client:
            await client.create_channels([PCH])
            async with client.producer(PCH) as producer:
                block = random.Random(6).randbytes(1 << 20)
                await asyncio.gather(*(producer.send("v", block[i << 10:(i + 1) << 10]) for i in range(1024)))
        async with grpc.aio.insecure_channel(srv.address) as channel:
            call = sgrpc.StreamingNodeStub(channel).Backup(spb.BackupRequest(
                to=str(tmp_path / "b"), max_bytes_per_second=64 << 10))
            assert (await call.read()).phase == "checkpoint"
            await asyncio.to_thread(srv.stop)  # returns: the backup does not hold the drain
            stopped = True
            with pytest.raises(grpc.aio.AioRpcError):
                while (await call.read()) is not grpc.aio.EOF:
                    pass
    finally:
        if not stopped:
            srv.stop()
    assert not list((tmp_path / "data").glob(".backup-*"))
    assert not any(p.is_dir() for p in (tmp_path / "b").glob("*"))


async def test_until_before_every_message_restores_an_empty_log_that_opens_and_verifies(
    node: tuple[ServerThread, AsyncClient], tmp_path: Path,
) -> None:
    srv, client = node
    async with client.producer(PCH) as producer:
        await asyncio.gather(*(producer.send("v", b"x%d" % i) for i in range(100)))
    result = await backup(srv.address, tmp_path / "b")
    into = tmp_path / "empty"
    code, out, err = restore(Path(str(result["path"])), into, "--until", "@1")
    assert code == 0, err
    assert "no messages" in out and "cut at id 0" in out, out
    check = cli("verify", "--data-dir", str(into))
    assert check.returncode == 0, check.stdout + check.stderr
    plain, txns = await read_restored(into)
    assert (plain, txns) == ([], [])
