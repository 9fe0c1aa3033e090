"""Producer identity is the node's: epochs fence an older producer of the same id, the next sequence
comes from the node, and a resend must repeat its batch (over the SDK, its spool, and raw gRPC)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from streamingnode.client import AsyncClient, DuplicateSequenceMismatchError, ProducerFencedError
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.wire.codes import from_rpc_error
from tests.integration.rpc_helpers import consume, data, payloads
from tests.integration.test_client import data_of, read_until
from wal.errors import ErrorCode

pytestmark = pytest.mark.integration

CHILD = Path(__file__).with_name("child_spool_producer.py")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
async def client(server: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server, timeout=10.0, reconnect_timeout=10.0) as c:
        yield c


async def _read_all(client: AsyncClient, pchannel: str, marker: bytes) -> list[bytes]:
    async with client.consumer(pchannel, "v") as consumer:
        return data_of(await read_until(consumer, marker))


# --- the reproduction: one id, one spool, two runs ------------------------------------------------
async def test_two_runs_with_one_id_and_one_spool_deliver_all_twenty_messages_once_in_order(
        client: AsyncClient, tmp_path: Path) -> None:
    """The first run's spool truncates itself once everything is answered; the second run used to
    start again at sequence 0 and be answered with the first run's results (nothing written)."""
    await client.create_channels(["p"])
    spool = tmp_path / "spool"
    sent: list[bytes] = []
    ids: list[int] = []
    for run in range(2):
        async with client.producer("p", producer_id="app-1", spool_dir=spool) as producer:
            for i in range(10):
                payload = b"run%d-%d" % (run, i)
                ids.append((await producer.send("v", payload)).message_id)
                sent.append(payload)
    assert len(set(ids)) == 20, "every acknowledged message has its own id"
    async with client.producer("p") as tail:
        await tail.send("v", b"end")
    assert await _read_all(client, "p", b"end") == [*sent, b"end"]


async def test_the_sdk_continues_from_the_next_sequence_the_node_hands_out(client: AsyncClient) -> None:
    await client.create_channels(["p"])
    async with client.producer("p", producer_id="counter") as first:
        for i in range(7):
            await first.send("v", b"%d" % i)
        assert first.epoch == 1 and first.next_sequence == 7
    async with client.producer("p", producer_id="counter") as second:
        await second.send("v", b"7")
        assert second.epoch == 2 and second.next_sequence == 8


def _child(server: str, spool: Path, tag: str, batches: int, stop_after: int | None) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), GRPC_VERBOSITY="ERROR")
    argv = [sys.executable, str(CHILD), server, str(spool), tag, str(batches)]
    if stop_after is not None:
        argv.append(str(stop_after))
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


async def _lines_until(proc: subprocess.Popen[str], last: str) -> list[str]:
    """The child's stdout lines up to the one starting with ``last`` (read in a thread)."""
    def read() -> list[str]:
        assert proc.stdout is not None
        out: list[str] = []
        for line in proc.stdout:
            out.append(line.strip())
            if line.startswith(last):
                return out
        err = proc.stderr.read() if proc.stderr else ""
        raise AssertionError(f"the child ended before {last!r}: {out}; stderr: {err}")
    async with asyncio.timeout(60):
        return await asyncio.to_thread(read)


async def test_a_client_sigkilled_between_batches_loses_and_duplicates_nothing(
        client: AsyncClient, server: str, tmp_path: Path) -> None:
    """Run one writes two batches and is SIGKILLed once its third is written (answered or not);
    run two, with the same id and spool, resends what was not answered and goes on.  Every
    acknowledged message is in the log once, in order, and so is the spooled third batch."""
    await client.create_channels(["p"])
    spool = tmp_path / "spool"
    first = _child(server, spool, "a", batches=5, stop_after=2)
    try:
        lines = await _lines_until(first, "written")
    finally:
        first.kill()  # SIGKILL: no close, no flush of anything not already in the spool
        first.communicate()
    acked_first = [p for line in lines if line.startswith("acked") for p in line.split()[1:]]
    assert acked_first == [f"a-{b}-{i}" for b in range(2) for i in range(3)]
    second = _child(server, spool, "b", batches=3, stop_after=None)
    try:
        lines = await _lines_until(second, "done")
    finally:
        second.kill()
        second.communicate()
    # The third batch was written before the kill; its answer may have come back first (the spool
    # then let it go) or not (the spool resends it, and the node answers from its dedup table).
    # Either way it is in the log once.
    assert [line for line in lines if line.startswith("recovered")] in ([], ["recovered 3"]), lines
    recovered = [f"a-2-{i}" for i in range(3)]
    acked_second = [p for line in lines if line.startswith("acked") for p in line.split()[1:]]
    async with client.producer("p") as tail:
        await tail.send("v", b"end")
    got = [p.decode() for p in await _read_all(client, "p", b"end")][:-1]
    assert got == acked_first + recovered + acked_second


# --- fencing ---------------------------------------------------------------------------------------
async def test_a_second_producer_with_the_same_id_fences_the_first(client: AsyncClient) -> None:
    await client.create_channels(["p"])
    old = client.producer("p", producer_id="twin", linger=0)
    await old.send("v", b"old-1")
    async with client.producer("p", producer_id="twin") as new:
        await new.send("v", b"new-1")
        with pytest.raises(ProducerFencedError) as caught:
            await old.send("v", b"zombie")
        assert caught.value.fields == {"producer_id": "twin", "epoch": "1", "current_epoch": "2"}
        with pytest.raises(ProducerFencedError):  # the zombie stays fenced, reconnecting or not
            await old.send("v", b"zombie-2")
        await new.send("v", b"new-2")
    await old.aclose()
    async with client.producer("p") as tail:
        await tail.send("v", b"end")
    assert await _read_all(client, "p", b"end") == [b"old-1", b"new-1", b"new-2", b"end"]


async def test_an_old_client_that_sends_no_epoch_gets_one_and_is_fenced_by_a_newer_open(stub, server: str) -> None:
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    old = stub.Produce()
    await old.write(spb.ProduceRequest(open=spb.ProduceOpen(pchannel="p", producer_id="legacy")))
    opened = (await old.read()).opened
    assert (opened.producer_epoch, opened.next_sequence) == (1, 0)
    await old.write(spb.ProduceRequest(batch=spb.ProduceBatch(request_id=1, messages=[data("v", b"one")])))
    assert (await old.read()).result.HasField("appended")

    new = stub.Produce()
    await new.write(spb.ProduceRequest(open=spb.ProduceOpen(pchannel="p", producer_id="legacy")))
    reopened = (await new.read()).opened
    assert (reopened.producer_epoch, reopened.next_sequence) == (2, 1)

    await old.write(spb.ProduceRequest(batch=spb.ProduceBatch(request_id=2, first_sequence=1,
                                                              messages=[data("v", b"zombie")])))
    # The stream ends with the status (as for CHANNEL_FENCED), ErrorInfo naming both epochs.
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        await old.read()
    assert ended.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    fenced = from_rpc_error(ended.value)
    assert fenced.code is ErrorCode.PRODUCER_FENCED and not fenced.retriable
    assert fenced.fields == {"producer_id": "legacy", "epoch": "1", "current_epoch": "2"}

    # The zombie cannot come back by presenting its old epoch either.
    again = stub.Produce()
    await again.write(spb.ProduceRequest(open=spb.ProduceOpen(pchannel="p", producer_id="legacy", producer_epoch=1)))
    with pytest.raises(grpc.aio.AioRpcError) as refused_open:
        await again.read()
    assert refused_open.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    err = from_rpc_error(refused_open.value)
    assert err.code is ErrorCode.PRODUCER_FENCED and err.fields["current_epoch"] == "2"

    await new.write(spb.ProduceRequest(batch=spb.ProduceBatch(request_id=1, first_sequence=1,
                                                              messages=[data("v", b"two")])))
    assert (await new.read()).result.HasField("appended")
    await new.write(spb.ProduceRequest(close=spb.ProduceClose()))
    await new.done_writing()
    packs = await consume(stub, spb.ConsumeOpen(pchannel="p", vchannel="v"), until=2)
    assert payloads(packs) == [b"one", b"two"]


async def test_an_open_refuses_an_epoch_without_a_producer_id_and_an_epoch_below_one(stub) -> None:
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    for open_ in (spb.ProduceOpen(pchannel="p", producer_epoch=3),
                  spb.ProduceOpen(pchannel="p", producer_id="x", producer_epoch=0)):
        call = stub.Produce()
        await call.write(spb.ProduceRequest(open=open_))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call.read()
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "producer_epoch" in (refused.value.details() or "")


async def test_an_open_refuses_an_epoch_whose_successor_would_not_fit_and_the_id_still_opens(stub) -> None:
    """The node does not know producer "big": a presented epoch of 2^63-1 would be taken as current,
    and the next open (current + 1) could not be answered in ProduceOpened's int64."""
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    call = stub.Produce()
    await call.write(spb.ProduceRequest(open=spb.ProduceOpen(pchannel="p", producer_id="big",
                                                             producer_epoch=(1 << 63) - 1)))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call.read()
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "producer_epoch" in (refused.value.details() or "")
    fresh = stub.Produce()
    await fresh.write(spb.ProduceRequest(open=spb.ProduceOpen(pchannel="p", producer_id="big")))
    opened = (await fresh.read()).opened
    assert opened.producer_epoch == 1
    await fresh.done_writing()
    fresh.cancel()


# --- a resend must be the same batch ---------------------------------------------------------------
async def test_a_resend_with_changed_content_is_refused_and_an_identical_one_gets_the_original_ids(
        client: AsyncClient) -> None:
    await client.create_channels(["p"])
    async with client.producer("p", producer_id="w") as first:
        original = [await first.send("v", b"a%d" % i) for i in range(3)]
    for changed in ({"payload": b"A0"}, {"vchannel": "other"}, {"properties": {"k": "v"}}):
        async with client.producer("p", producer_id="w", first_sequence=0) as liar:
            kwargs = {"vchannel": "v", "payload": b"a0", **changed}
            with pytest.raises(DuplicateSequenceMismatchError) as caught:
                await liar.send(**kwargs)  # type: ignore[arg-type]
            assert caught.value.fields == {"producer_id": "w", "sequence": "0"}
            assert "sequence 0" in str(caught.value)
    async with client.producer("p", producer_id="w", first_sequence=0) as honest:
        again = [await honest.send("v", b"a%d" % i) for i in range(3)]
        assert again == original
        fresh = await honest.send("v", b"end")
    assert fresh.message_id > original[-1].message_id
    assert await _read_all(client, "p", b"end") == [b"a0", b"a1", b"a2", b"end"]


async def test_a_batch_mixing_resends_and_a_changed_message_writes_nothing(stub) -> None:
    await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
    call = stub.Produce()
    await call.write(spb.ProduceRequest(open=spb.ProduceOpen(pchannel="p", producer_id="m")))
    await call.read()
    await call.write(spb.ProduceRequest(batch=spb.ProduceBatch(
        request_id=1, messages=[data("v", b"x0"), data("v", b"x1")])))
    assert (await call.read()).result.HasField("appended")
    # Sequence 0 repeated as it was, sequence 1 changed, sequence 2 new: the whole batch is refused.
    await call.write(spb.ProduceRequest(batch=spb.ProduceBatch(
        request_id=2, messages=[data("v", b"x0"), data("v", b"CHANGED"), data("v", b"x2")])))
    refused = (await call.read()).result
    assert refused.error.code == pb.ERROR_CODE_DUPLICATE_SEQUENCE_MISMATCH
    assert dict(refused.error.metadata) == {"producer_id": "m", "sequence": "1"}
    await call.write(spb.ProduceRequest(batch=spb.ProduceBatch(
        request_id=3, first_sequence=2, messages=[data("v", b"x2")])))
    assert (await call.read()).result.HasField("appended"), "the refused batch left no hole and no mark"
    await call.write(spb.ProduceRequest(close=spb.ProduceClose()))
    await call.done_writing()
    packs = await consume(stub, spb.ConsumeOpen(pchannel="p", vchannel="v"), until=3)
    assert payloads(packs) == [b"x0", b"x1", b"x2"]


# --- the spool -------------------------------------------------------------------------------------
async def test_two_producers_cannot_share_one_spool(client: AsyncClient, tmp_path: Path) -> None:
    from wal.errors import ResourceExhaustedError  # noqa: PLC0415

    await client.create_channels(["p"])
    async with client.producer("p", producer_id="s", spool_dir=tmp_path) as first:
        with pytest.raises(ResourceExhaustedError, match="in use by another producer"):
            client.producer("p", producer_id="s", spool_dir=tmp_path)
        await first.send("v", b"x")
    async with client.producer("p", producer_id="s", spool_dir=tmp_path) as after:  # released on close
        await after.send("v", b"y")
