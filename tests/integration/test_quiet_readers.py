"""A reader of a quiet vchannel on a busy pchannel: every commit of the other vchannels brings a tick,
and the reader is told its position moved once per ``consume_quiet_pack_seconds``, not once per tick.
What it skipped is joined into the next pack it is sent: that pack starts where the last one ended."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from google.protobuf import empty_pb2

from streamingnode.server import ServerThread
from streamingnode.v1 import common_pb2 as pb
from streamingnode.v1 import streaming_pb2 as spb
from streamingnode.v1 import streaming_pb2_grpc as sgrpc
from tests.integration.conftest import node_config
from tests.integration.rpc_helpers import data, produce
from tests.waiting import until

pytestmark = pytest.mark.integration


class _Reader:
    """A Consume stream of vchannel "quiet", its packs collected as they come."""

    def __init__(self, stub: sgrpc.StreamingNodeStub) -> None:
        self.call = stub.Consume()
        self.packs: list[pb.MsgPack] = []
        self.task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        await self.call.write(spb.ConsumeRequest(open=spb.ConsumeOpen(
            pchannel="p", vchannel="quiet", policy=pb.DeliverPolicy(latest=empty_pb2.Empty()))))
        first = await self.call.read()
        assert first.WhichOneof("response") == "opened", first
        self.task = asyncio.create_task(self._collect())
        await until(lambda: bool(self.packs), "the reader's first pack (it is at the head)")

    async def _collect(self) -> None:
        while True:
            resp = await self.call.read()
            if resp is grpc.aio.EOF:
                return
            if resp.WhichOneof("response") == "pack":
                self.packs.append(resp.pack)

    def empty(self) -> int:
        return sum(1 for p in self.packs if not p.messages)

    async def close(self) -> None:
        self.call.cancel()
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


async def _busy(stub: sgrpc.StreamingNodeStub, k: int) -> None:
    await produce(stub, "p", [[data("busy", b"%d" % k)]])


@pytest.mark.parametrize("quiet", [0.0, 3600.0])
async def test_a_quiet_vchannels_reader_is_not_sent_a_pack_per_tick(tmp_path: Path, quiet: float) -> None:
    with ServerThread(node_config(tmp_path / "data", consume_quiet_pack_seconds=quiet)) as srv:
        async with grpc.aio.insecure_channel(srv.address) as channel:
            stub = sgrpc.StreamingNodeStub(channel)
            await stub.CreateChannels(spb.CreateChannelsRequest(channel_names=["p"]))
            reader = _Reader(stub)
            try:
                await reader.open()
                before = reader.empty()
                if quiet == 0:
                    # A pack at every tick, as before the setting: commits of "busy" bring them.
                    commits = iter(range(10**6))

                    async def three_more() -> bool:
                        await _busy(stub, next(commits))
                        return reader.empty() >= before + 3

                    await until(three_more, "three packs without messages after commits of another vchannel",
                                timeout=30)
                    return
                for k in range(30):  # 30 ticks at least: each commit with a prompt reader open brings one
                    await _busy(stub, k)
                sent = len(reader.packs)
                await produce(stub, "p", [[data("quiet", b"at last")]])
                await until(lambda: any(p.messages for p in reader.packs), "the quiet vchannel's message")
            finally:
                await reader.close()
    got = reader.packs[sent:]
    with_message = next(i for i, p in enumerate(got) if p.messages)
    # One empty pack at most (the clock crossed an hour's boundary during the test), not one per tick.
    assert reader.empty() - before <= 1, [len(p.messages) for p in reader.packs]
    assert [m.payload for m in got[with_message].messages] == [b"at last"]
    # The ticks skipped are joined into the pack sent: it starts where the one before it ended.
    previous = reader.packs[sent + with_message - 1]
    assert got[with_message].start_positions[0] == previous.end_positions[0]
    assert got[with_message].begin_ts == previous.end_ts
