"""Permissions name pchannels, never vchannels: streams and calls that carry a vchannel are judged by
their pchannel alone.

A glob that matches a request's vchannel but not its pchannel grants nothing (``consume:shard-*`` does
not read vchannel ``shard-1`` of pchannel ``orders-1``), and a glob that matches the pchannel grants
every vchannel of it.  Produce (the vchannel rides on each message), Consume (the vchannel is in its
open), BeginTxn and GetLatestPosition (a field of the request), each both ways.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterator

import pytest

from streamingnode.client import AsyncClient
from streamingnode.server import ServerThread
from streamingnode.server.auth import hash_token
from tests.integration.conftest import node_config
from wal.errors import PermissionDeniedError

pytestmark = pytest.mark.integration

PCH = "orders-1"
VCH = "shard-1"  # matched by the shard-* globs, never by orders-*
TOKENS = {
    "pch-writer": ("tok-pw-4b7e21", ["produce:orders-*"]),
    "pch-reader": ("tok-pr-93c0d5", ["consume:orders-*"]),
    "vch-writer": ("tok-vw-1f6a88", ["produce:shard-*"]),
    "vch-reader": ("tok-vr-c2e417", ["consume:shard-*"]),
}
WAIT = 30.0  # seconds for a delivery that must come (a missing one fails the test by name)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = tmp_path_factory.mktemp("auth-vchannel")
    tokens = root / "tokens.toml"
    tokens.write_text("\n".join(
        f'[[token]]\nprincipal = "{name}"\nsha256 = "{hash_token(token)}"\npermissions = {json.dumps(perms)}\n'
        for name, (token, perms) in TOKENS.items()))
    srv = ServerThread(node_config(root / "data", channels=(PCH,), auth_tokens=tokens))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def _client(secured: ServerThread, who: str) -> AsyncClient:
    return AsyncClient(secured.address, token=TOKENS[who][0])


def _denied_on_the_pchannel(exc: PermissionDeniedError, need: str) -> None:
    assert exc.fields.get("permission") == f"{need}:{PCH}", exc.fields
    assert exc.fields.get("pchannel") == PCH, exc.fields


@contextlib.contextmanager
def _allowed(what: str) -> Iterator[None]:
    """A refusal here is the failure under test, reported as such (not as an error of the test)."""
    try:
        yield
    except PermissionDeniedError as exc:
        raise AssertionError(f"{what} was refused: {exc}") from None


async def _read(client: AsyncClient, vchannel: str, done: Callable[[list[bytes]], bool]) -> list[bytes]:
    """The payloads of ``vchannel`` of PCH read from the start until ``done(payloads so far)``; an
    assertion names the wait if that does not come within ``WAIT``."""
    seen: list[bytes] = []

    async def read() -> None:
        async with client.consumer(PCH, vchannel) as consumer:
            async for pack in consumer:
                seen.extend(m.payload for m in pack.messages)
                if done(seen):
                    return

    try:
        with _allowed(f"reading {vchannel!r} of {PCH!r}"):
            await asyncio.wait_for(read(), WAIT)
    except TimeoutError:
        raise AssertionError(f"reading {vchannel!r} did not reach its end within {WAIT} s: {seen}") from None
    return seen


async def _delivered(client: AsyncClient, vchannel: str, payload: bytes) -> None:
    await _read(client, vchannel, lambda seen: payload in seen)


async def test_produce_to_a_vchannel_is_judged_by_the_pchannel(secured: ServerThread) -> None:
    async with _client(secured, "vch-writer") as vglob:
        with pytest.raises(PermissionDeniedError) as denied:
            async with vglob.producer(PCH) as producer:
                await producer.send(VCH, b"from a vchannel glob")
        _denied_on_the_pchannel(denied.value, "produce")
    async with _client(secured, "pch-writer") as pglob:
        with _allowed("produce:orders-* writing to vchannel shard-1"):
            async with pglob.producer(PCH) as producer:
                written = await producer.send(VCH, b"from a pchannel glob")
        assert written.message_id >= 0
    async with _client(secured, "pch-reader") as reader:
        # The refused producer's message, had it been written, would come first (its send came first).
        seen = await _read(reader, VCH, lambda seen: b"from a pchannel glob" in seen)
        assert b"from a vchannel glob" not in seen


async def test_consume_of_a_vchannel_is_judged_by_the_pchannel(secured: ServerThread) -> None:
    async with _client(secured, "pch-writer") as writer:
        with _allowed("produce:orders-* writing to vchannel shard-1"):
            async with writer.producer(PCH) as producer:
                await producer.send(VCH, b"for the readers")
    async with _client(secured, "vch-reader") as vglob:
        with pytest.raises(PermissionDeniedError) as denied:
            async with vglob.consumer(PCH, VCH) as consumer:
                async for _ in consumer:
                    break
        _denied_on_the_pchannel(denied.value, "consume")
    async with _client(secured, "pch-reader") as pglob:
        await _delivered(pglob, VCH, b"for the readers")


async def test_a_transaction_on_a_vchannel_is_judged_by_the_pchannel(secured: ServerThread) -> None:
    async with _client(secured, "vch-writer") as vglob:
        with pytest.raises(PermissionDeniedError) as denied:
            await vglob.begin_txn(PCH, VCH)
        _denied_on_the_pchannel(denied.value, "produce")
    async with _client(secured, "pch-writer") as pglob:
        with _allowed("produce:orders-* beginning a transaction on vchannel shard-1"):
            txn = await pglob.begin_txn(PCH, VCH)
            await pglob.rollback_txn(PCH, VCH, txn.txn_id)


async def test_the_latest_position_of_a_vchannel_is_judged_by_the_pchannel(secured: ServerThread) -> None:
    async with _client(secured, "vch-reader") as vglob:
        with pytest.raises(PermissionDeniedError) as denied:
            await vglob.latest_position(PCH, VCH)
        _denied_on_the_pchannel(denied.value, "consume")
    async with _client(secured, "pch-reader") as pglob:
        with _allowed("consume:orders-* asking the latest position of vchannel shard-1"):
            await pglob.latest_position(PCH, VCH)
