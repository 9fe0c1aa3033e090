"""Bearer-token authentication and permissions: every RPC of the service, with no token, an unknown
token, a token without the permission and a permitted one; health stays open; the token never shows.

One node serves the whole table (module scope): its tokens file names four principals.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import structlog
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from streamingnode.client import AsyncClient, Client
from streamingnode.observability.logs import configure_logging
from streamingnode.server import ServerThread
from streamingnode.server.auth import RULES, TokenTable, hash_token
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from tests.integration.conftest import node_config
from wal.errors import InvalidArgumentError, PermissionDeniedError, UnauthenticatedError

pytestmark = pytest.mark.integration

TOKENS = {
    "ops": ("tok-ops-9f2c1e", ["admin"]),
    "ingest": ("tok-ingest-51ab7d", ["produce:orders-*"]),
    "reader": ("tok-reader-0c44e2", ["consume:orders-*"]),
    "other": ("tok-other-77d0aa", ["produce:other-*", "consume:other-*"]),
}
UNKNOWN_TOKEN = "tok-nobody-3e9b10"
PCH = "orders-1"


def tokens_file(path: Path) -> Path:
    entries = [f'[[token]]\nprincipal = "{name}"\nsha256 = "{hash_token(token)}"\npermissions = {json.dumps(perms)}\n'
               for name, (token, perms) in TOKENS.items()]
    path.write_text("\n".join(entries))
    return path


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = tmp_path_factory.mktemp("auth")
    srv = ServerThread(node_config(root / "data", channels=(PCH,), auth_tokens=tokens_file(root / "tokens.toml")))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


Call = Callable[[sgrpc.StreamingNodeStub, tuple[tuple[str, str], ...]], Awaitable[Any]]


async def _stream(call: Any, first: Any) -> Any:
    """Write the open request and read the first answer, or raise the status the call ended with.

    Read from the call, not from the write or read: either may race with the end of a refused call
    and fail locally (INTERNAL), whatever status the node sent."""
    try:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await call.write(first)
            answer = await call.read()
            if answer is not grpc.aio.EOF:
                return answer
        raise grpc.aio.AioRpcError(await call.code(), await call.initial_metadata(), await call.trailing_metadata(),
                                   await call.details())
    finally:
        call.cancel()


async def _first(call: Any) -> Any:
    """The first answer of a server-streaming call, or raise the status it ended with."""
    try:
        return await call.read()
    finally:
        call.cancel()


# Each RPC: how to call it on PCH, who may, who may not, and the permission a refusal names
# (with the pchannel, when the permission is on one).
CASES: dict[str, tuple[Call, str, str, str, bool]] = {
    "Produce": (lambda s, md: _stream(s.Produce(metadata=md), spb.ProduceRequest(open=spb.ProduceOpen(pchannel=PCH))),
                "ingest", "reader", f"produce:{PCH}", True),
    "Consume": (lambda s, md: _stream(s.Consume(metadata=md), spb.ConsumeRequest(open=spb.ConsumeOpen(pchannel=PCH))),
                "reader", "ingest", f"consume:{PCH}", True),
    "BeginTxn": (lambda s, md: s.BeginTxn(spb.BeginTxnRequest(pchannel=PCH, vchannel="v"), metadata=md),
                 "ingest", "reader", f"produce:{PCH}", True),
    "CommitTxn": (lambda s, md: s.CommitTxn(spb.CommitTxnRequest(pchannel=PCH, vchannel="v", txn_id=99), metadata=md),
                  "ingest", "other", f"produce:{PCH}", True),
    "RollbackTxn": (lambda s, md: s.RollbackTxn(spb.RollbackTxnRequest(pchannel=PCH, vchannel="v", txn_id=99),
                                                metadata=md), "ingest", "reader", f"produce:{PCH}", True),
    "CreateChannels": (lambda s, md: s.CreateChannels(spb.CreateChannelsRequest(channel_names=["orders-new"]),
                                                      metadata=md), "ops", "ingest", "admin", False),
    "DestroyChannels": (lambda s, md: s.DestroyChannels(spb.DestroyChannelsRequest(channel_names=["orders-none"]),
                                                        metadata=md), "ops", "ingest", "admin", False),
    "DescribeChannels": (lambda s, md: s.DescribeChannels(spb.DescribeChannelsRequest(channel_names=[PCH]),
                                                          metadata=md), "reader", "other", f"consume:{PCH}", True),
    "CreateConsumerGroup": (lambda s, md: s.CreateConsumerGroup(spb.CreateConsumerGroupRequest(pchannel=PCH, group="g"),
                                                                metadata=md), "ops", "reader", "admin", False),
    "DestroyConsumerGroup": (lambda s, md: s.DestroyConsumerGroup(
        spb.DestroyConsumerGroupRequest(pchannel=PCH, group="none"), metadata=md), "ops", "reader", "admin", False),
    "DescribeConsumerGroups": (lambda s, md: s.DescribeConsumerGroups(
        spb.DescribeConsumerGroupsRequest(pchannel=PCH), metadata=md), "reader", "ingest", f"consume:{PCH}", True),
    "SeekConsumerGroup": (lambda s, md: s.SeekConsumerGroup(spb.SeekConsumerGroupRequest(
        pchannel=PCH, group="none", policy=pb.DeliverPolicy(start_at_time=1)), metadata=md), "ops", "reader", "admin",
        False),
    "GetLatestPosition": (lambda s, md: s.GetLatestPosition(spb.GetLatestPositionRequest(pchannel=PCH), metadata=md),
                          "reader", "ingest", f"consume:{PCH}", True),
    "Flush": (lambda s, md: s.Flush(spb.FlushRequest(pchannel=PCH, vchannel="v"), metadata=md), "ops", "ingest",
              "admin", False),
    "Backup": (lambda s, md: _first(s.Backup(spb.BackupRequest(to="relative"), metadata=md)), "ops", "ingest",
               "admin", False),
}
AUTH_CODES = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


def test_the_table_covers_every_rpc() -> None:
    methods = {m.name for m in spb.DESCRIPTOR.services_by_name["StreamingNode"].methods}
    assert len(methods) == 15 and set(CASES) == methods == set(RULES)


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def reason(exc: grpc.aio.AioRpcError) -> str:
    status = rpc_status.from_call(exc)
    assert status is not None, f"{exc.code().name} without rich status: {exc.details()}"
    info = error_details_pb2.ErrorInfo()
    assert status.details and status.details[0].Unpack(info) and info.domain == "streamingnode"
    return str(info.reason)


Metadata = tuple[tuple[str, str], ...]


async def outcome(secured: ServerThread, rpc: str, metadata: Metadata) -> grpc.aio.AioRpcError | None:
    async with grpc.aio.insecure_channel(secured.address) as channel:
        try:
            await CASES[rpc][0](sgrpc.StreamingNodeStub(channel), metadata)
        except grpc.aio.AioRpcError as exc:
            return exc
    return None


@pytest.mark.parametrize("rpc", sorted(CASES))
@pytest.mark.parametrize("who", ["no token", "unknown token", "not permitted", "permitted"])
async def test_every_rpc(secured: ServerThread, rpc: str, who: str) -> None:
    _, allowed, denied, permission, on_pchannel = CASES[rpc]
    metadata = {
        "no token": (), "unknown token": bearer(UNKNOWN_TOKEN), "not permitted": bearer(TOKENS[denied][0]),
        "permitted": bearer(TOKENS[allowed][0]),
    }[who]
    failed = await outcome(secured, rpc, metadata)
    if who == "permitted":
        assert failed is None or failed.code() not in AUTH_CODES, failed
        return
    assert failed is not None, f"{rpc} served {who}"
    details = failed.details() or ""
    if who == "not permitted":
        assert failed.code() is grpc.StatusCode.PERMISSION_DENIED, failed
        assert reason(failed) == "PERMISSION_DENIED"
        assert permission in details and denied in details, details
        if on_pchannel:
            assert PCH in details
    else:
        assert failed.code() is grpc.StatusCode.UNAUTHENTICATED, failed
        assert reason(failed) == "UNAUTHENTICATED"
    for token, _ in TOKENS.values():
        assert token not in details
    assert UNKNOWN_TOKEN not in details


async def test_unparsable_request_with_a_good_token_is_the_handler_s_to_refuse(secured: ServerThread) -> None:
    """An authenticated caller's garbage is not an auth failure (nor a crash of the interceptor); a
    caller refused by its token alone (unknown, or without admin) is refused before anything parses it."""
    async with grpc.aio.insecure_channel(secured.address) as channel:
        raw = channel.unary_unary("/streamingnode.v1.StreamingNode/BeginTxn")
        with pytest.raises(grpc.aio.AioRpcError) as garbage:
            await raw(b"\xff\xff\xff", metadata=bearer(TOKENS["ingest"][0]))
        assert garbage.value.code() not in (*AUTH_CODES, grpc.StatusCode.INTERNAL), garbage.value
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await raw(b"\xff\xff\xff", metadata=bearer(UNKNOWN_TOKEN))
        assert unknown.value.code() is grpc.StatusCode.UNAUTHENTICATED
        admin_only = channel.unary_unary("/streamingnode.v1.StreamingNode/CreateChannels")
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await admin_only(b"\xff\xff\xff", metadata=bearer(TOKENS["ingest"][0]))
        assert denied.value.code() is grpc.StatusCode.PERMISSION_DENIED


async def test_health_and_reflection_stay_open(secured: ServerThread) -> None:
    async with grpc.aio.insecure_channel(secured.address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc  # noqa: PLC0415

        call = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        async for answer in call:
            names = {s.name for s in answer.list_services_response.service}
            assert "streamingnode.v1.StreamingNode" in names
            break
        call.cancel()


async def test_sdk_token_argument_and_environment(secured: ServerThread, monkeypatch: pytest.MonkeyPatch) -> None:
    async with AsyncClient(secured.address, token="") as anonymous:
        with pytest.raises(UnauthenticatedError):
            await anonymous.describe_channels([PCH])
    async with AsyncClient(secured.address, token=TOKENS["ingest"][0]) as ingest:
        async with ingest.producer(PCH) as producer:
            await producer.send("v", b"hello")
        with pytest.raises(PermissionDeniedError) as denied:
            await ingest.latest_position(PCH)
        assert denied.value.fields["permission"] == f"consume:{PCH}" and denied.value.fields["pchannel"] == PCH
    monkeypatch.setenv("STREAMINGNODE_TOKEN", TOKENS["reader"][0])
    async with AsyncClient(secured.address) as reader:
        last, _ = await reader.latest_position(PCH)
        assert last is not None
        async with reader.consumer(PCH, "v") as consumer:
            async for pack in consumer:
                if any(m.payload == b"hello" for m in pack.messages):
                    break
    with Client(secured.address) as sync_reader:  # the sync client reads the variable too
        now = sync_reader.latest_position(PCH)[0]  # other tests of the module may have produced since
        assert now is not None and now.message_id >= last.message_id


def test_token_never_logged(tmp_path: Path) -> None:
    out = io.StringIO()
    configure_logging("debug", out, cache=False)
    try:
        with ServerThread(node_config(tmp_path / "data", channels=(PCH,),
                                      auth_tokens=tokens_file(tmp_path / "tokens.toml"))) as srv:
            with Client(srv.address, token=TOKENS["other"][0]) as other, pytest.raises(PermissionDeniedError):
                other.create_channels(["x"])
            with Client(srv.address, token=UNKNOWN_TOKEN) as unknown, pytest.raises(UnauthenticatedError):
                unknown.describe_channels([PCH])
            with Client(srv.address, token=TOKENS["ingest"][0]) as ingest:
                ingest.producer(PCH).send("v", b"x")
                assert TOKENS["ingest"][0] not in repr(ingest) + repr(ingest.aio) + repr(ingest.aio._stub)
    finally:
        structlog.reset_defaults()
    logged = out.getvalue()
    assert "serving" in logged  # the capture worked
    for token in (*[t for t, _ in TOKENS.values()], UNKNOWN_TOKEN):
        assert token not in logged
        assert hash_token(token) not in logged


@pytest.mark.parametrize(("text", "problem"), [
    ('[[token]]\nprincipal = "a"\nsha256 = "%s"\npermissions = ["admin"]\nrole = "x"\n', "unknown key 'role'"),
    ('[[token]]\nprincipal = "a"\nsha256 = "tok-raw-secret"\npermissions = ["admin"]\n', "64 hex digits"),
    ('[[token]]\nprincipal = "a"\nsha256 = "%s"\npermissions = ["write:*"]\n', "unknown permission 'write:*'"),
    ('[[token]]\nprincipal = "a"\nsha256 = "%s"\npermissions = ["produce:"]\n', "unknown permission 'produce:'"),
    ('[[token]]\nprincipal = "a"\nsha256 = "%s"\n', "missing key 'permissions'"),
    ('tokens = 1\n', "unknown key 'tokens'"),
    ('[[token]]\nprincipal = "a"\nsha256 = "%s"\npermissions = []\n[[token]]\nprincipal = "b"\nsha256 = "%s"\n'
     'permissions = []\n', "the same sha256 as principal 'a'"),
    ('[[token]\n', "not valid TOML"),
])
def test_bad_tokens_file_refuses_to_start(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(text.replace("%s", hash_token("t")))
    with pytest.raises(InvalidArgumentError) as refused:
        TokenTable.load(path)
    assert problem in str(refused.value) and str(path) in str(refused.value)
    assert "tok-raw-secret" not in str(refused.value)  # a token pasted as a hash is never quoted
    srv = ServerThread(node_config(tmp_path / "data", auth_tokens=path))
    try:
        with pytest.raises(InvalidArgumentError, match="tokens file"):
            srv.start()
    finally:
        srv.stop()
    assert not (tmp_path / "data").exists(), "a refused configuration must not open the data dir"


def test_missing_tokens_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="cannot read tokens file"):
        TokenTable.load(tmp_path / "absent.toml")


@pytest.mark.parametrize(("mode", "writers"), [(0o666, "group and others"), (0o620, "group"), (0o602, "others")])
def test_a_tokens_file_others_may_write_refuses_to_start(tmp_path: Path, mode: int, writers: str) -> None:
    """As ssh refuses a key others may write: whoever may write the file may give themselves admin."""
    path = tokens_file(tmp_path / "tokens.toml")
    path.chmod(mode)
    with pytest.raises(InvalidArgumentError) as refused:
        TokenTable.load(path)
    message = str(refused.value)
    assert str(path) in message and f"writable by {writers}" in message and f"mode {mode:04o}" in message, message
    srv = ServerThread(node_config(tmp_path / "data", auth_tokens=path))
    try:
        with pytest.raises(InvalidArgumentError, match="writable by"):
            srv.start()
    finally:
        srv.stop()
    assert not (tmp_path / "data").exists(), "a refused configuration must not open the data dir"
    for fine in (0o600, 0o640, 0o644, 0o400):
        path.chmod(fine)
        assert len(TokenTable.load(path)) == len(TOKENS)


@pytest.mark.parametrize("text", ["", "# no tokens yet\n"])
def test_a_tokens_file_without_tokens_warns_at_start(tmp_path: Path, text: str) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(text)
    out = io.StringIO()
    configure_logging("info", out, cache=False, fmt="json")
    try:
        with (ServerThread(node_config(tmp_path / "data", auth_tokens=path)) as srv, Client(srv.address) as client,
              pytest.raises(UnauthenticatedError)):
            client.describe_channels()
    finally:
        structlog.reset_defaults()
    warnings = [json.loads(line) for line in out.getvalue().splitlines() if "holds no token" in line]
    assert len(warnings) == 1, out.getvalue()
    assert warnings[0]["level"] == "warning" and warnings[0]["auth_tokens"] == str(path)
    assert "every call" in warnings[0]["event"] and "UNAUTHENTICATED" in warnings[0]["event"]



def test_cli_token_flag_environment_and_hash(secured: ServerThread) -> None:
    from tests.integration.test_cli import _env, cli  # noqa: PLC0415

    env = _env()
    env.pop("STREAMINGNODE_TOKEN", None)
    anonymous = cli(secured.address, "channels", "describe", PCH, env=env)
    assert anonymous.returncode == 1 and "UNAUTHENTICATED" in anonymous.stderr and "--token" in anonymous.stderr
    token = TOKENS["ingest"][0]
    produced = cli(secured.address, "produce", "--channel", PCH, "--token", token, stdin='{"payload": "x"}\n', env=env)
    assert produced.returncode == 0, produced.stderr
    # The ingest token may not read: the refusal names the permission and pchannel, never the token.
    denied = cli(secured.address, "consume", "--channel", PCH, "--count", "1",
                 env={**env, "STREAMINGNODE_TOKEN": token})
    assert denied.returncode == 1 and "PERMISSION_DENIED" in denied.stderr and f"consume:{PCH}" in denied.stderr
    for proc in (anonymous, produced, denied):
        assert token not in proc.stdout + proc.stderr
    hashed = cli(None, "token", "hash", stdin=f"{token}\n", env=env)
    assert hashed.returncode == 0 and hashed.stdout.strip() == hash_token(token)


async def test_refusals_of_the_authentication_layer_are_counted_by_rpc_and_code(secured: ServerThread) -> None:
    registry = secured.node.metrics.registry

    def count(rpc: str, code: str) -> float:
        return registry.get_sample_value("streamingnode_refusals_total", {"rpc": rpc, "code": code}) or 0.0

    before = {(rpc, code): count(rpc, code) for rpc in ("GetLatestPosition", "Consume", "CreateChannels")
              for code in ("unauthenticated", "permission_denied")}
    assert (await outcome(secured, "GetLatestPosition", ())) is not None  # no token
    assert (await outcome(secured, "Consume", bearer(UNKNOWN_TOKEN))) is not None
    assert (await outcome(secured, "GetLatestPosition", bearer(TOKENS["ingest"][0]))) is not None  # checked request
    assert (await outcome(secured, "Consume", bearer(TOKENS["ingest"][0]))) is not None  # checked first read
    assert (await outcome(secured, "CreateChannels", bearer(TOKENS["reader"][0]))) is not None  # admin only
    after = {key: count(*key) for key in before}
    assert {key: after[key] - before[key] for key in before} == {
        ("GetLatestPosition", "unauthenticated"): 1, ("GetLatestPosition", "permission_denied"): 1,
        ("Consume", "unauthenticated"): 1, ("Consume", "permission_denied"): 1,
        ("CreateChannels", "unauthenticated"): 0, ("CreateChannels", "permission_denied"): 1,
    }
