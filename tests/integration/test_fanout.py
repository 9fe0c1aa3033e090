"""Fan-out through a real node: many consumers share encoded responses byte for byte, and one that
stops reading costs at most its cap while the producer and the other consumers go on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from streamingnode.server import ServerThread
from streamingnode.server.fanout import fanout_of
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from streamingnode.wire import codec
from tests.integration.conftest import node_config
from tests.integration.rpc_helpers import data, produce
from tests.waiting import until
from wal.message import MessageType
from wal.scanner import Scanner

pytestmark = pytest.mark.integration

CONSUME = "/streamingnode.v1.StreamingNode/Consume"
CAP = 256 << 10
BATCH = 192
"""Messages of 1 KiB per commit: a pack larger than the cap, so only responses cut to fit keep within it."""


@pytest.fixture
def small_cap(tmp_path: Path) -> Iterator[ServerThread]:
    srv = ServerThread(node_config(tmp_path / "data", consume_buffer_bytes=CAP))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def _sample(node: Any, name: str) -> float:
    value = node.metrics.registry.get_sample_value(f"streamingnode_{name}")
    assert value is not None, name
    return float(value)


def _ids(response: bytes) -> tuple[list[int], bool]:
    """The message ids of a pack response and whether it is continued; ([], False) for other answers."""
    r = spb.ConsumeResponse.FromString(response)
    if r.WhichOneof("response") != "pack":
        return [], False
    p = r.pack
    return [int.from_bytes(m.id.id, "big") for m in p.messages] + list(p.columns.ids), p.continued


async def _raw_read(channel: grpc.aio.Channel, open_: spb.ConsumeOpen, last_id: int) -> list[bytes]:
    """The pack responses' bytes, undecoded by gRPC, up to the one that completes the pack holding
    ``last_id``."""
    call = channel.stream_stream(CONSUME)()
    await call.write(spb.ConsumeRequest(open=open_).SerializeToString())
    out: list[bytes] = []
    seen = False
    try:
        async with asyncio.timeout(30):
            while True:
                raw = await call.read()
                assert raw is not grpc.aio.EOF
                ids, continued = _ids(raw)
                if spb.ConsumeResponse.FromString(raw).WhichOneof("response") != "pack":
                    continue
                out.append(raw)
                seen = seen or last_id in ids
                if seen and not continued:
                    return out
    finally:
        call.cancel()


def _opens() -> list[spb.ConsumeOpen]:
    """Options that each change the bytes: the form, the vchannel, the limits, a type filter."""
    only_data = pb.DeliverFilter(message_types=pb.MessageTypeSet(types=[pb.MESSAGE_TYPE_DATA]))
    out = []
    for columns in (False, True):
        out += [
            spb.ConsumeOpen(pchannel="p", columns=columns),
            spb.ConsumeOpen(pchannel="p", vchannel="v1", columns=columns),
            spb.ConsumeOpen(pchannel="p", vchannel="v2", columns=columns, filters=[only_data]),
            # Small limits: packs split into parts, the big transaction over continued responses.
            spb.ConsumeOpen(pchannel="p", vchannel="v1", columns=columns, max_pack_messages=7,
                            max_response_bytes=8 << 10),
            spb.ConsumeOpen(pchannel="p", columns=columns, max_pack_messages=3),
        ]
    return out


def _joined(packs: list[pb.MsgPack]) -> pb.MsgPack:
    """The one pack that consecutive packs make: the first's start, the last's end, all their messages."""
    first, last = packs[0], packs[-1]
    out = pb.MsgPack(begin_ts=first.begin_ts, end_ts=last.end_ts, start_positions=first.start_positions,
                     end_positions=last.end_positions)
    for p in packs:
        out.messages.extend(p.messages)
    return out


def _as_sent_alone(got: list[bytes], alone: list[bytes]) -> list[bytes]:
    """``got`` with each response that joins several of ``alone``'s (a reader that fell behind the one it
    follows sends the cached packs after it in one response) replaced by those, once it is checked to
    be exactly the pack they make together; any other response as it is."""
    out: list[bytes] = []
    k = 0
    for n, raw in enumerate(got):
        if k < len(alone) and raw == alone[k]:
            out.append(raw)
            k += 1
            continue
        joined = spb.ConsumeResponse.FromString(raw).pack
        covered: list[pb.MsgPack] = []
        while k < len(alone) and (not covered or covered[-1].end_positions != joined.end_positions):
            covered.append(spb.ConsumeResponse.FromString(alone[k]).pack)
            k += 1
        if not covered or any(p.continued for p in covered):
            return got
        expected = _joined(covered)
        if n == len(got) - 1 and k == len(alone):
            # The response holding the last message may end at another tick than the one the read
            # alone met: the persisted tick after the last message, or a not-persisted one made later
            # (each prompt reader that opens asks for one), which adds time but no message.  Which one
            # a read meets depends on when it got there; everything else about it must match.
            for p in (joined, expected):
                p.ClearField("end_ts")
                p.ClearField("end_positions")
        if (len(covered) < 2 and n < len(got) - 1) or expected != joined:
            return got  # not alone's packs, nor a join of them: the caller's comparison shows the difference
        out.extend(alone[k - len(covered):k])
    return out


async def test_shared_responses_are_byte_for_byte_what_each_consumer_would_be_sent_alone(
    server_thread: ServerThread,
) -> None:
    node = server_thread.node
    async with grpc.aio.insecure_channel(server_thread.address) as channel:
        stub = sgrpc.StreamingNodeStub(channel)
        await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
        await produce(stub, "p", [
            [data("v1", b"a", k="1"), data("v2", b"b"), data("", b"broadcast"), data("v1", b"c")],
            [data("v2", b"d", x="y", z="")] + [data("v1", bytes([i]) * 100) for i in range(40)],
        ])
        big = await stub.BeginTxn(spb.BeginTxnRequest(pchannel="p", vchannel="v1", keepalive_ms=30_000))
        dropped = await stub.BeginTxn(spb.BeginTxnRequest(pchannel="p", vchannel="v2"))
        await produce(stub, "p", [[data("v1", bytes([i]) * 1024, i=str(i)) for i in range(24)]],
                      txn=pb.TxnContext(txn_id=big.txn_id))
        await produce(stub, "p", [[data("v2", b"gone")]], txn=pb.TxnContext(txn_id=dropped.txn_id))
        await produce(stub, "p", [[data("v2", b"between")], [data("v1", b"x" * 3000) for _ in range(5)]])
        await stub.CommitTxn(spb.CommitTxnRequest(pchannel="p", vchannel="v1", txn_id=big.txn_id))
        await stub.RollbackTxn(spb.RollbackTxnRequest(pchannel="p", vchannel="v2", txn_id=dropped.txn_id))
        _, (last,) = await produce(stub, "p", [[data("", b"last")]])
        last_id = int.from_bytes(last.appended.results[0].id.id, "big")

        # A persisted tick after the last message releases everything the same way for every read
        # (a not-persisted one is seen only by readers at the head at the time).
        async def ticked() -> bool:
            (d,) = (await stub.DescribeChannels(spb.DescribeChannelsRequest(channel_names=["p"]))).descriptions
            return int.from_bytes(d.last_id.id, "big") > last_id

        await until(ticked, "a persisted tick after the last message")

        fan = fanout_of(node)
        cache = fan.cache
        assert cache is not None
        fan.cache = None  # each reference read encodes for itself
        try:
            alone = [await _raw_read(channel, o, last_id) for o in _opens()]
        finally:
            fan.cache = cache
        assert any(len(a) > 3 for a in alone)
        assert any(spb.ConsumeResponse.FromString(r).pack.continued for a in alone for r in a)

        hits, misses = _sample(node, "consume_cache_hits_total"), _sample(node, "consume_cache_misses_total")
        # Several consumers per option set, all at once: the first to reach a pack encodes it.
        reads = [_raw_read(channel, o, last_id) for o in _opens() for _ in range(4)]
        shared = await asyncio.gather(*reads)
        for i, got in enumerate(shared):
            assert _as_sent_alone(got, alone[i // 4]) == alone[i // 4], f"consumer {i} (options {i // 4})"
        # Each option set's packs up to the last message were encoded once (a miss) and sent three more
        # times (hits); the empty packs after it depend on when each read stopped.
        hits = _sample(node, "consume_cache_hits_total") - hits
        misses = _sample(node, "consume_cache_misses_total") - misses
        assert misses >= len(alone)
        assert hits >= 3 * len(alone)


async def test_a_consumer_that_stops_reading_holds_at_most_its_cap_and_blocks_nobody(
    small_cap: ServerThread,
) -> None:
    node = small_cap.node
    async with grpc.aio.insecure_channel(small_cap.address) as channel:
        stub = sgrpc.StreamingNodeStub(channel)
        await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
        fan = fanout_of(node)
        # Never reads after 'opened'.
        stalled = channel.stream_stream(CONSUME)()
        await stalled.write(spb.ConsumeRequest(open=spb.ConsumeOpen(pchannel="p", policy={"latest": {}}))
                            .SerializeToString())
        stalled_id = spb.ConsumeResponse.FromString(await stalled.read()).opened.consumer_id
        reader = stub.Consume()
        await reader.write(spb.ConsumeRequest(open=spb.ConsumeOpen(pchannel="p", policy={"latest": {}})))
        assert (await reader.read()).WhichOneof("response") == "opened"
        received = 0

        async def read_all(n: int) -> None:
            nonlocal received
            while received < n:
                resp = await reader.read()
                assert resp is not grpc.aio.EOF
                received += len(resp.pack.messages)

        payload = b"z" * 1024
        batches = total = 0
        gauge = 0.0
        held = fan.streams[stalled_id]
        try:
            # Appends go on and the other consumer gets everything, while the stalled one's stream is
            # full (its held bytes above 0: a write waiting for the client); 96 MiB at most.
            while batches < 8 or not held.held_bytes:
                assert batches < 512, "the stalled consumer never filled its stream"
                await produce(stub, "p", [[data("v", payload) for _ in range(BATCH)]])
                batches += 1
                total += BATCH
                await read_all(total)
                gauge = max(gauge, _sample(node, "consume_held_bytes"))
            for _ in range(16):  # stalled, it still blocks nothing
                await produce(stub, "p", [[data("v", payload) for _ in range(BATCH)]])
                total += BATCH
                await read_all(total)
                gauge = max(gauge, _sample(node, "consume_held_bytes"))
            # Each response within half the cap: what the node holds (the write in flight, twice) never
            # went over it.  (gRPC takes more once the client's window grows: held may drop to 0 again.)
            assert 0 < held.held_peak <= CAP
            assert gauge > 0  # the node-wide figure counts it
        finally:
            stalled.cancel()
            reader.cancel()


async def _ids_until(channel: grpc.aio.Channel, open_: spb.ConsumeOpen, last_id: int) -> list[int]:
    return [i for raw in await _raw_read(channel, open_, last_id) for i in _ids(raw)[0]]


async def test_readers_tailing_together_get_every_message_once_in_order_while_sharing(
    server_thread: ServerThread,
) -> None:
    node = server_thread.node
    async with grpc.aio.insecure_channel(server_thread.address) as channel:
        stub = sgrpc.StreamingNodeStub(channel)
        await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
        opens = [spb.ConsumeOpen(pchannel="p", vchannel=v, columns=c, max_pack_messages=50)
                 for v in ("", "v1") for c in (False, True)]
        hits = _sample(node, "consume_cache_hits_total")

        async def load() -> int:
            for r in range(40):
                txn = None
                if r % 5 == 0:
                    txn = await stub.BeginTxn(spb.BeginTxnRequest(pchannel="p", vchannel="v1", keepalive_ms=30_000))
                    await produce(stub, "p", [[data("v1", b"t" * 500) for _ in range(7)]],
                                  txn=pb.TxnContext(txn_id=txn.txn_id))
                await produce(stub, "p", [[data("v1" if i % 2 else "v2", bytes([r]) * 300) for i in range(20)]])
                if txn is not None:
                    await produce(stub, "p", [[data("v1", b"u" * 500) for _ in range(3)]],
                                  txn=pb.TxnContext(txn_id=txn.txn_id))
                    await stub.CommitTxn(spb.CommitTxnRequest(pchannel="p", vchannel="v1", txn_id=txn.txn_id))
            # A transaction left open at the end: every position from here on resumes at its BeginTxn,
            # before "last", so a read reopened there must skip "last" by its tick.
            still_open = await stub.BeginTxn(spb.BeginTxnRequest(pchannel="p", vchannel="v1", keepalive_ms=60_000))
            await produce(stub, "p", [[data("v1", b"open")]], txn=pb.TxnContext(txn_id=still_open.txn_id))
            _, (final,) = await produce(stub, "p", [[data("", b"last")]])
            return int.from_bytes(final.appended.results[0].id.id, "big")

        # Readers open before the load (policy all of an empty log): they tail it as it is written.
        lasts: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def tail(o: spb.ConsumeOpen) -> list[bytes]:
            call = channel.stream_stream(CONSUME)()
            await call.write(spb.ConsumeRequest(open=o).SerializeToString())
            out: list[bytes] = []
            seen: set[int] = set()
            try:
                async with asyncio.timeout(60):
                    while True:
                        raw = await call.read()
                        assert raw is not grpc.aio.EOF
                        ids, continued = _ids(raw)
                        if ids:
                            out.append(raw)
                        seen.update(ids)
                        if lasts.done() and lasts.result() in seen and not continued:
                            return out
            finally:
                call.cancel()

        readers = [asyncio.ensure_future(tail(o)) for o in opens for _ in range(3)]
        await until(lambda: len(fanout_of(node).streams) == len(readers), "every reader open")
        lasts.set_result(await load())
        got = await asyncio.gather(*readers)
        # Late readers from the start meet the tailing readers' responses in the cache: they take
        # them without reading, then read on from where the last one they took ended (to a message
        # that came after the tailing readers stopped: no response of theirs has it).  Each reopens
        # its read inside the open transaction, before "last": "last" must not come twice.
        _, (after,) = await produce(stub, "p", [[data("", b"after")]])
        after_id = int.from_bytes(after.appended.results[0].id.id, "big")
        late = [await _ids_until(channel, o, after_id) for o in opens]

        fan = fanout_of(node)
        cache, fan.cache = fan.cache, None
        try:
            alone = [await _ids_until(channel, o, lasts.result()) for o in opens]
            alone_after = [await _ids_until(channel, o, after_id) for o in opens]
        finally:
            fan.cache = cache
        last = lasts.result()
        for i, raws in enumerate(got):
            ids = [x for raw in raws for x in _ids(raw)[0]]
            # Up to "last": a read made after "after" was written may get both in one response (one
            # pack, when no stored tick lies between them), the tailing readers could not.
            expected = alone[i // 3]
            assert last in ids and last in expected
            assert len(set(ids)) == len(ids), f"reader {i}: a message twice"
            assert ids[: ids.index(last) + 1] == expected[: expected.index(last) + 1], f"reader {i} (options {i // 3})"
        assert late == alone_after
        assert _sample(node, "consume_cache_hits_total") > hits


async def test_a_reader_behind_the_one_it_follows_joins_the_cached_packs_into_fewer_responses(
    server_thread: ServerThread, monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with grpc.aio.insecure_channel(server_thread.address) as channel:
        stub = sgrpc.StreamingNodeStub(channel)
        await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
        open_ = spb.ConsumeOpen(pchannel="p", vchannel="v")
        # The first reader tails the log as it is written, one small pack per commit: each is encoded
        # once and cached.
        leader = channel.stream_stream(CONSUME)()
        await leader.write(spb.ConsumeRequest(open=open_).SerializeToString())
        sent: list[bytes] = []
        last_id = -1
        try:
            async with asyncio.timeout(30):
                assert spb.ConsumeResponse.FromString(await leader.read()).WhichOneof("response") == "opened"
                for k in range(12):
                    _, (result,) = await produce(stub, "p", [[data("v", b"%d" % k, k=str(k)), data("v", b"x" * 100)]])
                    last_id = int.from_bytes(result.appended.results[-1].id.id, "big")
                    while last_id not in [i for raw in sent for i in _ids(raw)[0]]:
                        raw = await leader.read()
                        if spb.ConsumeResponse.FromString(raw).WhichOneof("response") == "pack":
                            sent.append(raw)  # empty ones too (time advanced): the others join them
        finally:
            leader.cancel()
        assert sum(bool(_ids(raw)[0]) for raw in sent) >= 10, "the first reader's packs were not one per commit"

        # A reader from the start finds them all in the cache: after the first, it sends them joined.
        hits = _sample(server_thread.node, "consume_cache_hits_total")
        behind = await _raw_read(channel, open_, last_id)
        assert len(behind) < len(sent) / 2, (len(behind), len(sent))
        assert _as_sent_alone(behind, sent) == sent  # each joined response is exactly the packs it joins
        assert _sample(server_thread.node, "consume_cache_hits_total") - hits >= len(sent) - 1

        # A second reader from the start sends the same joined responses, built once for both: their
        # bytes are cached with the packs they join.
        builds: list[int] = []
        real = codec.joined_pack_response

        def counted(*args: Any) -> bytes | None:
            builds.append(1)
            return real(*args)

        monkeypatch.setattr(codec, "joined_pack_response", counted)
        assert await _raw_read(channel, open_, last_id) == behind
        assert not builds


async def test_readers_at_the_head_with_the_same_options_read_each_commit_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    loads = [0]
    real = Scanner._refill_from_memory

    def counting(self: Scanner) -> bool:
        got = real(self)
        loads[0] += got and any(m.message_type is MessageType.DATA for m in self._batch)
        return got

    monkeypatch.setattr(Scanner, "_refill_from_memory", counting)
    # No flusher: its read of the log is not a Consume stream's.
    with ServerThread(node_config(tmp_path / "data", flusher=False, channels=("p",))) as srv:
        async with grpc.aio.insecure_channel(srv.address) as channel:
            stub = sgrpc.StreamingNodeStub(channel)
            open_ = spb.ConsumeOpen(pchannel="p", vchannel="v", policy={"latest": {}})
            readers = []
            try:
                for _ in range(8):
                    call = channel.stream_stream(CONSUME)()
                    readers.append(call)
                    await call.write(spb.ConsumeRequest(open=open_).SerializeToString())
                    assert spb.ConsumeResponse.FromString(await call.read()).WhichOneof("response") == "opened"
                got = [0] * len(readers)
                async with asyncio.timeout(60):
                    for k in range(30):
                        if k == 10:
                            # Readers opened one after another start at different ticks, and are
                            # all at the same positions after the first commits.
                            loads[0] = 0
                        await produce(stub, "p", [[data("v", b"%d" % k)]])
                        for i, call in enumerate(readers):  # each reader has it before the next commit
                            while got[i] <= k:
                                got[i] += len(_ids(await call.read())[0])
                # Each commit read from the tail by one reader while the others wait for its response,
                # not by all eight (160): 20, with room for a reader that reads on its own meanwhile.
                assert loads[0] <= 40, loads[0]
            finally:
                for call in readers:
                    call.cancel()
