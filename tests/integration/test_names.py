"""Names never become paths: every kind of name a client sends is checked at the boundary, and what
the node builds from one stays under its Parquet root.

Hostile names (``..``, ``/abs``, separators, NUL, control characters, 10,000 characters, unicode
where a name becomes a directory) are refused with INVALID_ARGUMENT, an ErrorInfo naming the field,
and a message that quotes at most ~200 characters.  Decoy directories planted outside the data dir
and next to the Parquet root keep every byte and every entry through create, produce, flush, restart
and destroy attempts.  A destroyed and re-created pchannel never shares a directory with its former
incarnation.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import pyarrow as pa
import pytest
from google.protobuf import empty_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from streamingnode.client import AsyncClient
from streamingnode.node.channel import Owner
from streamingnode.node.node import Node
from streamingnode.server import ServerThread
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from tests.integration.conftest import node_config
from tests.integration.rpc_helpers import produce
from wal import bodies

pytestmark = pytest.mark.integration

LONG = "x" * 10_000
# Refused by every rule (vchannels and groups are printable Unicode without separators).
HOSTILE = ["..", ".", "/abs", "a/b", "tr/", "a\\b", "\x00", "a\x00b", "a\nb", "\x1b[31mred", "a\u2028b",
           "\u202eevil", LONG]
# Refused as directory names (pchannel, collection, partition) only.
HOSTILE_PATH = [*HOSTILE, "café", "a b", "-rf", ".hidden"]
SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("name", pa.string())])


def _error_info(exc: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    status = rpc_status.from_call(exc)
    assert status is not None, f"no rich status: {exc.code()} {exc.details()!r}"
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info
    raise AssertionError("no ErrorInfo in the status")


def _check_refusal(exc: grpc.aio.AioRpcError, field: str) -> None:
    assert exc.code() is grpc.StatusCode.INVALID_ARGUMENT, (exc.code(), (exc.details() or "")[:300])
    info = _error_info(exc)
    assert info.reason == "INVALID_ARGUMENT" and info.domain == "streamingnode"
    assert info.metadata["field"] == field, dict(info.metadata)
    assert len(exc.details() or "") < 500, "the message quotes at most ~200 characters of the value"
    assert LONG[:300] not in (exc.details() or "")
    assert all(len(v) <= 256 for v in info.metadata.values())


async def _refused(call: object, field: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call  # type: ignore[misc]
    _check_refusal(caught.value, field)


def _detail_refusal(err: pb.ErrorDetail, field: str) -> None:
    assert err.code == pb.ERROR_CODE_INVALID_ARGUMENT, err
    assert err.metadata["field"] == field, err
    assert len(err.message) < 500


async def _open_refused(call: grpc.aio.StreamStreamCall, open_request: object, field: str) -> None:
    await call.write(open_request)
    await call.done_writing()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in call:
            pass
    _check_refusal(caught.value, field)


async def test_every_kind_of_name_refuses_hostile_values(server: str) -> None:
    async with grpc.aio.insecure_channel(server) as ch:
        stub = sgrpc.StreamingNodeStub(ch)
        await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
        await stub.CreateConsumerGroup(spb.CreateConsumerGroupRequest(pchannel="p", group="g"))

        for bad in HOSTILE_PATH:  # pchannel
            await _refused(stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["ok", bad])),
                           "channel_names[1]")
            await _refused(stub.DestroyChannels(spb.DestroyChannelsRequest(channel_names=[bad])), "channel_names[0]")
            await _refused(stub.DescribeChannels(spb.DescribeChannelsRequest(channel_names=[bad])),
                           "channel_names[0]")
            await _refused(stub.CreateConsumerGroup(spb.CreateConsumerGroupRequest(pchannel=bad, group="g")),
                           "pchannel")
            await _refused(stub.GetLatestPosition(spb.GetLatestPositionRequest(pchannel=bad)), "pchannel")
            await _refused(stub.Flush(spb.FlushRequest(pchannel=bad, vchannel="v")), "pchannel")
            await _open_refused(stub.Produce(), spb.ProduceRequest(open=spb.ProduceOpen(pchannel=bad)),
                                "open.pchannel")
            await _open_refused(stub.Consume(), spb.ConsumeRequest(open=spb.ConsumeOpen(pchannel=bad)),
                                "open.pchannel")

        for bad in HOSTILE:  # vchannel and consumer group
            await _refused(stub.BeginTxn(spb.BeginTxnRequest(pchannel="p", vchannel=bad)), "vchannel")
            await _refused(stub.Flush(spb.FlushRequest(pchannel="p", vchannel=bad)), "vchannel")
            await _refused(stub.GetLatestPosition(spb.GetLatestPositionRequest(pchannel="p", vchannel=bad)),
                           "vchannel")
            await _open_refused(stub.Consume(), spb.ConsumeRequest(open=spb.ConsumeOpen(pchannel="p", vchannel=bad)),
                                "open.vchannel")
            good = pb.Message(type=pb.MESSAGE_TYPE_DATA, vchannel="v")
            hostile = pb.Message(type=pb.MESSAGE_TYPE_DATA, vchannel=bad)
            _, (refused, written) = await produce(stub, "p", [[hostile], [good]])
            _detail_refusal(refused.error, "messages[0].vchannel")
            assert not written.HasField("error"), "the stream stays open after an in-band refusal"
            _, (col,) = await produce(stub, "p", [[good, hostile]], as_columns=True)
            _detail_refusal(col.error, "columns.vchannels[1]")

            await _refused(stub.CreateConsumerGroup(spb.CreateConsumerGroupRequest(pchannel="p", group=bad)), "group")
            await _refused(stub.DestroyConsumerGroup(spb.DestroyConsumerGroupRequest(pchannel="p", group=bad)),
                           "group")
            await _refused(stub.SeekConsumerGroup(spb.SeekConsumerGroupRequest(
                pchannel="p", group=bad, policy=pb.DeliverPolicy(latest=empty_pb2.Empty()))), "group")
            await _refused(stub.SeekConsumerGroup(spb.SeekConsumerGroupRequest(
                pchannel="p", group="g", vchannel=bad, policy=pb.DeliverPolicy(latest=empty_pb2.Empty()))), "vchannel")
            await _refused(stub.DescribeConsumerGroups(spb.DescribeConsumerGroupsRequest(groups=[bad])), "groups[0]")
            await _open_refused(stub.Consume(), spb.ConsumeRequest(
                open=spb.ConsumeOpen(pchannel="p", vchannel="v", consumer_group=bad)), "open.consumer_group")

        create = bodies.create_collection("v", "c", SCHEMA, "pk")
        _, (made,) = await produce(stub, "p", [[pb.Message(type=pb.MESSAGE_TYPE_CREATE_COLLECTION, vchannel="v",
                                                           payload=create.payload, properties=create.properties)]])
        assert not made.HasField("error"), made
        for bad in HOSTILE_PATH:  # collection and partition
            await _refused(stub.Flush(spb.FlushRequest(pchannel="p", vchannel="v", collection=bad)), "collection")
            props = dict(create.properties, collection=bad)
            _, results = await produce(stub, "p", [
                [pb.Message(type=pb.MESSAGE_TYPE_CREATE_COLLECTION, vchannel="v", payload=create.payload,
                            properties=props)],
                [pb.Message(type=pb.MESSAGE_TYPE_DROP_COLLECTION, vchannel="v", properties={"collection": bad})],
                [pb.Message(type=pb.MESSAGE_TYPE_CREATE_PARTITION, vchannel="v",
                            properties={"collection": "c", "partition": bad})],
                [pb.Message(type=pb.MESSAGE_TYPE_DROP_PARTITION, vchannel="v",
                            properties={"collection": "c", "partition": bad})],
            ])
            for r, field in zip(results, ["collection", "collection", "partition", "partition"], strict=True):
                _detail_refusal(r.error, field)
        desc = await stub.DescribeChannels(spb.DescribeChannelsRequest())
        assert [d.channel_name for d in desc.descriptions] == ["p"]


async def test_a_10000_character_name_is_invalid_argument_not_resource_exhausted(server: str) -> None:
    """gRPC refuses response headers over 16 KiB: an error quoting the whole name would reach the
    client as RESOURCE_EXHAUSTED (which SDKs retry) instead of INVALID_ARGUMENT."""
    async with AsyncClient(server) as client, grpc.aio.insecure_channel(server) as ch:
        stub = sgrpc.StreamingNodeStub(ch)
        for request in (stub.CreateChannels(spb.CreateChannelsRequest(channel_names=[LONG])),
                        stub.DestroyChannels(spb.DestroyChannelsRequest(channel_names=[LONG])),
                        stub.GetLatestPosition(spb.GetLatestPositionRequest(pchannel=LONG))):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await request
            assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        from wal.errors import InvalidArgumentError  # noqa: PLC0415

        with pytest.raises(InvalidArgumentError) as raised:
            await client.create_channels([LONG])
        assert len(str(raised.value)) < 500


# --- decoys --------------------------------------------------------------------------------------
def _tree(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (and ``root`` itself): its kind and, for a file, its content hash."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        out[str(d.relative_to(root.parent))] = "dir"
        for name in dirnames:
            if (d / name).is_symlink():
                out[str((d / name).relative_to(root.parent))] = "link:" + os.readlink(d / name)
        for name in filenames:
            p = d / name
            out[str(p.relative_to(root.parent))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _plant(directory: Path) -> Path:
    """A directory that looks like a pchannel's Parquet directory to anything that would touch it."""
    (directory / "users" / "partition=_default" / "segment=1").mkdir(parents=True)
    (directory / ".leftover.parquet.tmp").write_bytes(b"crash leftover")
    (directory / "users" / "partition=_default" / "segment=1" / ".a.tmp").write_bytes(b"tmp")
    (directory / "users" / "keep.parquet").write_bytes(b"not parquet at all")
    (directory / "notes.txt").write_text("precious")
    return directory


@pytest.fixture
def decoys(tmp_path: Path) -> Iterator[tuple[Path, list[Path]]]:
    data = tmp_path / "data"
    data.mkdir()
    outside = _plant(tmp_path / "outside")
    sibling = _plant(data / "victim")  # next to the Parquet root (data/parquet)
    yield data, [outside, sibling]


async def _hostile_traffic(address: str, names: list[str]) -> None:
    async with grpc.aio.insecure_channel(address) as ch:
        stub = sgrpc.StreamingNodeStub(ch)
        for name in names:
            for call in (stub.CreateChannels(spb.CreateChannelsRequest(channel_names=[name])),
                         stub.Flush(spb.FlushRequest(pchannel=name, vchannel="v")),
                         stub.DestroyChannels(spb.DestroyChannelsRequest(channel_names=[name]))):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await call
                assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT, name
            await _open_refused(stub.Produce(), spb.ProduceRequest(open=spb.ProduceOpen(pchannel=name)),
                                "open.pchannel")


async def test_decoys_outside_the_data_dir_keep_every_byte(decoys: tuple[Path, list[Path]], tmp_path: Path) -> None:
    data, planted = decoys
    before = [_tree(d) for d in planted]
    outside, sibling = planted
    names = ["../victim", "../../outside", str(outside), str(sibling), "..", ".", "victim/../../outside",
             "../victim/users"]
    for round_ in range(2):  # the second round runs on a restarted node
        srv = ServerThread(node_config(data, channels=("p",)))
        srv.start()
        try:
            await _hostile_traffic(srv.address, names)
            async with AsyncClient(srv.address) as client:  # the node still works, beside the decoys
                d = client.data("p")
                if round_ == 0:
                    await d.create_collection("v", "users", SCHEMA, primary_key="pk")
                await d.insert("v", "users", pa.record_batch(
                    [pa.array([round_], pa.int64()), pa.array(["n"])], schema=SCHEMA))
                files, _ = await d.flush("v", "users")
                assert files
        finally:
            srv.stop()
    assert [_tree(d) for d in planted] == before


async def test_the_path_check_alone_refuses_names_that_escape(
    decoys: tuple[Path, list[Path]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Defence in depth: with every name rule accepting anything, what the node would build from
    ``../victim`` or an absolute path is still refused before it touches the disk."""
    from flusher import commit, incarnation  # noqa: PLC0415
    from wal.names import NameRule  # noqa: PLC0415

    data, planted = decoys
    before = [_tree(d) for d in planted]
    monkeypatch.setattr(NameRule, "check", lambda self, value, field=None, **_: value)
    monkeypatch.setattr(NameRule, "is_valid", lambda self, value, **_: True)
    node = await Node.start(node_config(data))
    try:
        await node.open_all()
        for name in ["../victim", str(planted[0]), str(planted[1])]:
            with pytest.raises(commit.PathOutsideRootError):
                await node.create_channels([name], 0, Owner())
    finally:
        await node.aclose()
    assert [_tree(d) for d in planted] == before
    root = data / "parquet"
    for rel in ("../victim", "/abs", "a/../../victim"):
        with pytest.raises(commit.PathOutsideRootError):
            commit.inside(root, rel)
    with pytest.raises(commit.PathOutsideRootError):
        commit.inside(root, ".")
    root.mkdir(exist_ok=True)
    (root / "link").symlink_to(planted[0])
    with pytest.raises(commit.PathOutsideRootError):
        incarnation.claim(root, "link", 1, new=True)
    assert [_tree(d) for d in planted] == before


# --- incarnations --------------------------------------------------------------------------------
def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.parquet"))}


async def _flush_rows(client: AsyncClient, *pks: int) -> list[str]:
    d = client.data("p")
    await d.insert("v", "users", pa.record_batch(
        [pa.array(list(pks), pa.int64()), pa.array([f"n{p}" for p in pks])], schema=SCHEMA))
    files, _ = await d.flush("v", "users")
    assert files
    return files


async def test_a_recreated_pchannel_never_mixes_with_its_former_incarnation(server_thread: ServerThread) -> None:
    parquet = server_thread.node.config.parquet_root
    async with AsyncClient(server_thread.address) as client:
        await client.create_channels(["p"])
        await client.data("p").create_collection("v", "users", SCHEMA, primary_key="pk")
        await _flush_rows(client, 1, 2)
        first = _files(parquet / "p")
        await client.destroy_channels(["p"])
        (moved,) = (parquet / ".destroyed").iterdir()
        assert _files(moved) == first, "destroy moves the files aside, byte for byte"
        assert not (parquet / "p").exists()

        # A destroy that crashed after removing the channel but before moving its files leaves the
        # directory in place: the next channel of that name must not adopt it.
        shutil.move(moved, parquet / "p")
        await client.create_channels(["p"])
        await client.data("p").create_collection("v", "users", SCHEMA, primary_key="pk")
        new_files = await _flush_rows(client, 10, 11)
        second = _files(parquet / "p")
        assert set(second) == set(new_files), "the new incarnation's directory holds only its own files"
        (aside,) = (parquet / ".destroyed").iterdir()
        assert _files(aside) == first, "the old incarnation's files are kept, byte for byte, apart"

        # And a plain destroy and re-create: three incarnations, three directories.
        await client.destroy_channels(["p"])
        await client.create_channels(["p"])
        await client.data("p").create_collection("v", "users", SCHEMA, primary_key="pk")
        third_files = await _flush_rows(client, 20)
        assert set(_files(parquet / "p")) == set(third_files)
        kept = {frozenset(_files(d).items()) for d in (parquet / ".destroyed").iterdir()}
        assert kept == {frozenset(first.items()), frozenset(second.items())}


async def test_a_stored_pchannel_whose_name_breaks_the_rule_is_not_opened(
    decoys: tuple[Path, list[Path]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A database written before the rules may hold a pchannel named like a path: the node serves the
    others and leaves that one (and the directory its name points at) alone."""
    from wal.manager import WALManager  # noqa: PLC0415
    from wal.names import NameRule  # noqa: PLC0415

    data, planted = decoys
    before = [_tree(d) for d in planted]
    with monkeypatch.context() as patched:
        patched.setattr(NameRule, "check", lambda self, value, field=None, **_: value)
        async with await WALManager.start_rocksdb(data) as manager:
            await manager.create_channel("../victim")
            await manager.create_channel("ok")
    node = await Node.start(node_config(data))
    try:
        await node.open_all()
        assert node.channel_names() == ["ok"]
        # Not even tried (so nothing is built from its name), rather than tried and FAILED.
        assert "../victim" not in node.failed_states()
    finally:
        await node.aclose()
    assert [_tree(d) for d in planted] == before
