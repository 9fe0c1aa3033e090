"""Consumer-group permissions (``consume:<pchannel glob>:<group glob>``): a token with group rules
reads without a group, or with the groups its rules name, and nothing else; a token with no group
rule (every token written before group rules existed) keeps its documented behaviour, any group of
the pchannels it may consume."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from streamingnode.server import ServerThread
from streamingnode.server.auth import TokenTable, hash_token
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from tests.integration.conftest import node_config
from wal.errors import InvalidArgumentError

pytestmark = pytest.mark.integration

TOKENS = {
    "ops": ("tok-ops-41d0", ["admin"]),
    "legacy": ("tok-legacy-7a21", ["consume:orders-*"]),
    "team": ("tok-team-c3e9", ["consume:orders-*:team-a-*"]),
    "readonly": ("tok-readonly-09bb", ["consume:orders-*:"]),
    "mixed": ("tok-mixed-5f5f", ["consume:*", "consume:orders-*:team-b"]),
}
PCH = "orders-1"
GROUPS = ("billing", "team-a-x", "team-b")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = tmp_path_factory.mktemp("auth-groups")
    path = root / "tokens.toml"
    path.write_text("\n".join(
        f'[[token]]\nprincipal = "{name}"\nsha256 = "{hash_token(token)}"\npermissions = {json.dumps(perms)}\n'
        for name, (token, perms) in TOKENS.items()))
    srv = ServerThread(node_config(root / "data", channels=(PCH, "other-1"), auth_tokens=path))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def _md(who: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TOKENS[who][0]}"),)


async def _open(secured: ServerThread, who: str, group: str, pchannel: str = PCH) -> grpc.StatusCode | None:
    """Open a Consume as ``who`` with ``group`` (or none); None when it opened, else the status."""
    await _groups(secured)
    async with grpc.aio.insecure_channel(secured.address) as channel:
        call = sgrpc.StreamingNodeStub(channel).Consume(metadata=_md(who))
        try:
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                await call.write(spb.ConsumeRequest(open=spb.ConsumeOpen(pchannel=pchannel, consumer_group=group)))
                answer = await call.read()
                if answer is not grpc.aio.EOF and answer.WhichOneof("response") == "opened":
                    return None
            code: grpc.StatusCode = await call.code()
            details = await call.details()
            if code is grpc.StatusCode.PERMISSION_DENIED:
                assert f"consume:{pchannel}:{group}" in details and who in details, details
            return code
        finally:
            call.cancel()


async def _describe(secured: ServerThread, who: str, groups: list[str]) -> Any:
    async with grpc.aio.insecure_channel(secured.address) as channel:
        try:
            return await sgrpc.StreamingNodeStub(channel).DescribeConsumerGroups(
                spb.DescribeConsumerGroupsRequest(pchannel=PCH, groups=groups), metadata=_md(who))
        except grpc.aio.AioRpcError as exc:
            return exc.code()


async def _groups(secured: ServerThread) -> None:
    async with grpc.aio.insecure_channel(secured.address) as channel:
        stub = sgrpc.StreamingNodeStub(channel)
        for group in GROUPS:
            try:
                await stub.CreateConsumerGroup(spb.CreateConsumerGroupRequest(pchannel=PCH, group=group),
                                               metadata=_md("ops"))
            except grpc.aio.AioRpcError as exc:
                assert exc.code() is grpc.StatusCode.ALREADY_EXISTS, exc


DENIED = grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize(("who", "group", "expected"), [
    # A token with no group rule: today's documented behaviour, any group of its pchannels.
    ("legacy", "", None), ("legacy", "billing", None), ("legacy", "team-a-x", None),
    # Group rules: only the groups they name; reading without a group stays allowed.
    ("team", "", None), ("team", "team-a-x", None), ("team", "billing", DENIED), ("team", "team-b", DENIED),
    ("readonly", "", None), ("readonly", "billing", DENIED),
    ("mixed", "", None), ("mixed", "team-b", None), ("mixed", "billing", DENIED),
])
async def test_who_may_open_which_group(secured: ServerThread, who: str, group: str, expected: object) -> None:
    assert await _open(secured, who, group) == expected


async def test_a_group_rule_is_scoped_to_its_pchannels(secured: ServerThread) -> None:
    # "mixed" reads other-1 (consume:*) but its group rule covers orders-* only.
    assert await _open(secured, "mixed", "", "other-1") is None
    assert await _open(secured, "mixed", "team-b", "other-1") == DENIED


async def test_describing_groups_follows_the_same_rule(secured: ServerThread) -> None:
    await _groups(secured)
    listed = await _describe(secured, "legacy", [])
    assert {g.group for g in listed.groups} >= set(GROUPS), "a token with no group rule lists every group"
    assert [g.group for g in (await _describe(secured, "team", ["team-a-x"])).groups] == ["team-a-x"]
    assert await _describe(secured, "team", ["billing"]) == DENIED
    assert await _describe(secured, "team", []) == DENIED, "listing every group would show other teams'"


def test_group_rules_parse_and_malformed_ones_are_refused(tmp_path: Path) -> None:
    def load(perms: list[str]) -> Any:
        path = tmp_path / "tokens.toml"
        path.write_text(f'[[token]]\nprincipal = "p"\nsha256 = "{hash_token("t")}"\n'
                        f'permissions = {json.dumps(perms)}\n')
        return TokenTable.load(path).authenticate("t")

    p = load(["consume:orders-*:team:a*"])  # a group name may hold ':'
    assert p.groups == (("orders-*", "team:a*"),) and p.may_use_group("orders-1", "team:a1")
    assert not p.may_use_group("orders-1", "team-b") and not p.may_use_group("other", "team:a1")
    assert load(["consume:orders-*"]).groups is None
    for bad in ("consume::g", "consume:"):
        with pytest.raises(InvalidArgumentError, match="consume:<pchannel glob>:<group glob>"):
            load([bad])
